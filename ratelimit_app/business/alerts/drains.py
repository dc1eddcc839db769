"""What the alerts' background writers share (the threshold crossings, crossings.py, and the ban
log, bans.py): each holds what the request path noted and writes it from a WorkerThread; a round
that fails is retried at the next, and what is still pending at exit gets one last try."""

import logging

__all__ = ["drain_logged", "drain_at_exit"]

logger = logging.getLogger("ratelimit_app")


def drain_logged(writer, pending_words):
    """``writer.drain()`` as the thread runs it: a database that is down or locked is retried at
    the next round (``pending_words``, e.g. "alerts not stored yet", says what waits)."""
    try:
        writer.drain()
    except Exception as exc:
        logger.warning("ratelimit_app: %s (%s: %s); retrying", pending_words,
                       type(exc).__name__, exc)


def drain_at_exit(writer_ref, lost_words):
    """At exit: stop the writer (a weakref's target) and drain what it still holds; log how much
    is lost if that fails (``lost_words``: "alert crossing(s)", "ban tally(ies)")."""
    writer = writer_ref()
    if writer is None or not writer.pending():
        return
    writer.stop()
    try:
        writer.drain()
    except Exception as exc:
        logger.error("ratelimit_app: %d %s lost at exit (%s: %s)", writer.pending(), lost_words,
                     type(exc).__name__, exc)
