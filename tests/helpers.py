"""Small helpers shared by the tests (plain functions, no factories)."""

import contextlib
import threading
import time
from pathlib import Path

from ratelimit_app.config.snapshot import CompiledRule
from ratelimit_app.decision.buckets import Bucket, CalendarQuota
from ratelimit_app.decision.engine import statuses_from
from ratelimit_app.decision.keys import bucket_key
from ratelimit_app.runtime.limiter import default_limiter, install_limiter

# where the browser tests save screenshots for a person to look at (git-ignored)
SCREENSHOTS = Path(__file__).resolve().parents[1] / "screenshots"

_next_id = iter(range(1, 10**9))


def make_rule(rate=10, period_s=1, burst=10, *, name=None, scope="user", shadow=False,
              endpoint="", plan=None, fail_open=None, calendar="", debt=0):
    """Return a CompiledRule with a fresh id (``calendar="day"``/``"month"``: a calendar quota
    of ``rate`` units; ``debt``: the tokens a settle may take it below empty)."""
    rule_id = next(_next_id)
    return CompiledRule(id=rule_id, name=name or f"rule-{rule_id}", scope=scope, plan=plan,
                        endpoint=endpoint, rate=rate, period_s=period_s, burst=burst,
                        shadow=shadow, fail_open=fail_open, calendar=calendar, debt=debt)


def make_bucket(rule, cost=1, token="user.test"):
    return (CalendarQuota if rule.calendar else Bucket)(rule, bucket_key("rl", token), cost)


class FakeClock:
    """One test-controlled time for the scripts (``now_ms``), the deny cache and the breaker."""

    def __init__(self, now_ms):
        self.now_ms = now_ms

    def advance(self, ms):
        self.now_ms += ms

    def seconds(self):
        return self.now_ms / 1000

    # the Limiter's clock interface
    def redis_now_ms(self):
        return self.now_ms

    def monotonic(self):
        return self.now_ms / 1000

    def wall_time(self):
        return self.now_ms / 1000


def use_fake_clock(monkeypatch=None, now_ms=1_700_000_000_000):
    """Make the process's Limiter run at ``clock.now_ms`` (Redis time, deny cache, breaker) and
    return the clock; the next test gets the real clock again (conftest)."""
    clock = FakeClock(now_ms)
    install_limiter(clock=clock, metrics_autostart=False)
    return clock


def limiter():
    """The process's Limiter (a new one per test, see conftest)."""
    return default_limiter()


def count_version_writes(monkeypatch):
    """Return a list that every config version the process's store writes from now on is
    appended to (each version makes every worker reload)."""
    store, writes = limiter().store, []
    write_version = store.write_version

    def counting(key, value, changes=None):
        writes.append(value)
        return write_version(key, value, changes)

    monkeypatch.setattr(store, "write_version", counting)
    return writes


def decide(request, user, endpoint, *, now_ms=None):
    """Decide ``request`` with the process's Limiter (what the adapters do)."""
    return default_limiter().decide(request, user, endpoint, now_ms=now_ms)


def take(buckets, *, now_ms=None, debit=True):
    """Run take.lua for ``buckets``; return ``(allowed, statuses, config version)``."""
    reply = default_limiter().take(buckets, now_ms=now_ms, debit=debit)
    return reply.allowed, statuses_from(buckets, reply), reply.version


def load_demo_data():
    """Run ``load_demo`` quietly, hashing the demo passwords with a fast (test-only) hasher:
    the users can then sign in only while that hasher is enabled (use ``force_login``)."""
    import io

    from django.core.management import call_command
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        call_command("load_demo", stdout=io.StringIO())


def api_key(username, tenant="acme"):
    """Create a user with an API key in ``tenant``; return ``(ApiKey, raw key)``."""
    from django.contrib.auth import get_user_model

    from ratelimit_app.models import ApiKey

    user = get_user_model().objects.create_user(username)
    return ApiKey.create_key(user, f"{username}'s key", tenant=tenant)


def server_store(request, store, env, redis_server):
    """Point ``env``, a server's environment, at ``store``: "redis", the suite's redis-server
    (REDIS_URL, set here), or "cluster", the session's Cluster, made healthy and empty; return
    a client of that store."""
    env["REDIS_URL"] = redis_server.url
    if store != "cluster":
        return redis_server.client()
    cluster = request.getfixturevalue("redis_cluster")
    cluster.ensure_healthy()
    cluster.flushall()
    env["REDIS_CLUSTER_NODES"] = cluster.nodes_env
    return cluster.client()


def poll_until(condition, timeout_s=5, what="the condition"):
    """Return once ``condition()`` is true; fail after ``timeout_s`` (for what a real process
    does in its own time, such as a server's release or a breaker's cooldown), naming ``what``
    was awaited."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.02)


def free_port():
    """Return a port of 127.0.0.1 that was free a moment ago (nothing listens on it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live_server_requests():
    """Return the live server's request threads still alive (socketserver's threads run
    ``process_request_thread``; one lives as long as its client keeps the connection open)."""
    return [thread for thread in threading.enumerate()
            if "process_request_thread" in thread.name]


@contextlib.contextmanager
def commands_sent(redis_client):
    """Collect the commands clients send to the server, from the slow log with a zero threshold:
    each as its text with the name in lower case (``"set rl:config:version 17…"``). Commands a Lua
    script runs inside are logged from the fake address "?:0" (and would be counted by INFO
    commandstats): they are not round trips, so they are left out."""
    sent = []
    redis_client.config_set("slowlog-log-slower-than", 0)
    redis_client.config_set("slowlog-max-len", 10_000)
    redis_client.slowlog_reset()
    try:
        yield sent
        entries = redis_client.slowlog_get(10_000)
    finally:
        redis_client.config_set("slowlog-log-slower-than", 10_000)
        redis_client.slowlog_reset()
    for entry in reversed(entries):
        name, _, args = entry["command"].decode(errors="replace").partition(" ")
        if name.lower() not in ("slowlog", "config") and entry["client_address"] != b"?:0":
            sent.append(f"{name.lower()} {args}".rstrip())


# What the browser shows of the admin's breadcrumbs bar (the element inside the admin's
# <nav aria-label="Breadcrumbs">): its computed colours and padding, the links' colour and size,
# how many rows the crumbs take, and the crumbs' text. Styles, not class names: a bar whose markup
# the running Django no longer styles renders as plain links and fails a comparison with a stock
# admin page.
_BREADCRUMBS_JS = """nav => {
    const bar = nav.firstElementChild;
    const links = [...bar.querySelectorAll('a')];
    const barStyle = getComputedStyle(bar), linkStyle = getComputedStyle(links[0]);
    return {
        look: {background: barStyle.backgroundColor, padding: barStyle.padding,
               color: barStyle.color, linkColor: linkStyle.color, fontSize: linkStyle.fontSize,
               rows: new Set(links.map(a => Math.round(a.getBoundingClientRect().top))).size},
        links: links.map(a => a.textContent.trim()),
        text: bar.textContent.replace(/\\s+/g, ' ').trim(),
    };
}"""


def breadcrumbs_of(page):
    """Return the breadcrumbs of the admin ``page`` as the browser renders them: a dict with
    ``look`` (computed styles and the number of rows), ``links`` (the linked crumbs' texts) and
    ``text`` (the whole bar's text, the current page last)."""
    return page.locator('nav[aria-label="Breadcrumbs"]').evaluate(_BREADCRUMBS_JS)


def first_option_text(page, select):
    """Return the text of the first option (the blank choice) of the ``select`` selector."""
    return page.locator(f"{select} option").first.text_content().strip()


def create_usage_records(display="{identity}", other_tenant="globex"):
    """Store usage records of two callers, one of them over three days across February and
    March; ``display`` formats each record's display name, ``other_tenant`` is the second
    caller's tenant."""
    from ratelimit_app.models import UsageRecord

    for day, identity, tenant, rule, units, allowed, refused in (
            ("2026-02-28", "key:1", "acme", "daily-units", 5, 5, 0),
            ("2026-03-01", "key:1", "acme", "daily-units", 7, 3, 1),
            ("2026-03-02", "key:1", "acme", "daily-units", 10, 4, 2),
            ("2026-03-02", "user:9", other_tenant, "daily-units", 1, 1, 0)):
        UsageRecord.objects.create(day=day, identity=identity, tenant=tenant, rule=rule,
                                   display=display.format(identity=identity), units=units,
                                   allowed=allowed, refused=refused)
