"""The versions of the libraries ratelimit_app is known to work with: the one place that says so.

Each entry names a distribution, its floor (the lowest version that works: below it the app
fails, often silently, so the system check reports an Error, ``ratelimit_app.E009``) and the
newest major.minor the pinned cells of the test matrix run (``newest_tested``: a record for the
docs and the matrix's own tests, never a warning). A release newer than that is not suspect in
itself: the matrix's "newest" cell installs the newest release of every dependency at each run,
so a new release is tested the week it ships, and a fresh ``pip install`` checks quietly.
``KNOWN_BAD`` lists the releases above a floor that are known not to work; the check warns about
those only (``ratelimit_app.W005``), saying what breaks and which versions to pin instead. When
a release is found to break the app, add it there; when a floor changes, change it here and in
pyproject.toml.

Why the floors are where they are:

- redis-py 5.3: 5.0–5.2's ``ConnectionPool.get_connection()`` requires a command name, which the
  decision path (``stores/connections.py``, ``stores/cluster.py``) does not pass: every decision
  raises TypeError and every request is let through unlimited.
- hiredis 3.2: the first with ``hiredis.PushNotification``; with 3.0 or 3.1 the decision path's
  own reader (``stores/connections.py``) would hand a RESP3 push message back as a reply.
- Django 5.2 (the LTS), djangorestframework 3.16, django-redis 5.4: the lowest versions the
  floor cell of the test matrix installs.
- django-ninja 1.3: 1.2 runs no throttle on ``async def`` operations, so they would go
  unlimited. django-ninja and drf-spectacular are extras: the ninja cell tests their floors,
  the main cell (``requirements.txt``, which caps them) their newest versions.

Versions are read with ``importlib.metadata`` and compared by their release numbers only (a
small tolerant parser; the ``packaging`` library is not a dependency): ``5.3.0rc1`` counts as
5.3.0, ``3.16.0.post1`` as 3.16.0, and a version that does not start with a number is not
judged at all.
"""

import re
from importlib import metadata
from typing import NamedTuple

__all__ = ["Supported", "SUPPORTED", "KnownBad", "KNOWN_BAD", "Finding", "BELOW_FLOOR",
           "KNOWN_NOT_TO_WORK", "MISSING", "parse_version", "installed_versions",
           "version_findings"]


class Supported(NamedTuple):
    """One library's supported range."""

    distribution: str        # the name pip installs it under
    floor: str               # the lowest version that works
    newest_tested: str       # the newest major.minor the pinned cells run (a record only)
    required: bool = True    # False: an optional extra (checked only when installed)
    why_floor: str = ""      # what breaks below the floor (shown in the check's hint)


SUPPORTED = (
    Supported("Django", "5.2", "6.1"),
    Supported("djangorestframework", "3.16", "3.18", required=False),
    Supported("django-redis", "5.4", "7.0"),
    Supported("redis", "5.3", "8.1",
              why_floor="redis-py 5.0–5.2's ConnectionPool.get_connection() requires a command "
                        "name: every decision fails with TypeError and requests go unlimited"),
    Supported("hiredis", "3.2", "3.5",
              why_floor="the decision path's reader needs hiredis.PushNotification to skip "
                        "RESP3 push messages"),
    Supported("django-ninja", "1.3", "1.7", required=False,
              why_floor="Django Ninja 1.2 runs no throttle on async operations: they go "
                        "unlimited"),
    Supported("drf-spectacular", "0.28", "0.30", required=False),
)



class KnownBad(NamedTuple):
    """Releases of one library known not to work: from ``first`` up to and including ``last``
    (a version prefix: "8.2" covers 8.2.0, 8.2.1...; None: every later release too)."""

    distribution: str
    first: str
    last: str | None
    why: str                 # what breaks (the check's message)
    instead: str             # the requirement to pin instead (the check's hint)


# Empty while no release above a floor is known to break the app. An entry looks like
# KnownBad("redis", "8.2.0", "8.2.1", why="...", instead="redis!=8.2.0,!=8.2.1").
KNOWN_BAD: tuple = ()

BELOW_FLOOR, KNOWN_NOT_TO_WORK, MISSING = "below floor", "known not to work", "missing"


class Finding(NamedTuple):
    """A library outside its supported range: ``kind`` is BELOW_FLOOR, KNOWN_NOT_TO_WORK or
    MISSING; ``installed`` the version found (None when MISSING); ``known_bad`` the KnownBad
    entry of a KNOWN_NOT_TO_WORK finding."""

    kind: str
    supported: Supported
    installed: str | None
    known_bad: KnownBad | None = None


_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


def parse_version(text):
    """Return the release numbers at the start of a version string as a tuple of ints
    (``"5.3.0rc1"`` -> ``(5, 3, 0)``), or None when it does not start with one."""
    match = _RELEASE.match(text or "")
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def _padded(numbers, length):
    return numbers + (0,) * (length - len(numbers))


def installed_versions():
    """Return ``{distribution: installed version or None}`` for every library in SUPPORTED."""
    found = {}
    for supported in SUPPORTED:
        try:
            found[supported.distribution] = metadata.version(supported.distribution)
        except metadata.PackageNotFoundError:
            found[supported.distribution] = None
    return found


def _within(numbers, first, last):
    """Whether release ``numbers`` lies from ``first`` up to ``last`` (a prefix), inclusive."""
    first_numbers = parse_version(first)
    length = max(len(numbers), len(first_numbers))
    if _padded(numbers, length) < _padded(first_numbers, length):
        return False
    if last is None:
        return True
    last_numbers = parse_version(last)
    return numbers[:len(last_numbers)] <= last_numbers


def version_findings(installed, supported=SUPPORTED, known_bad=None):
    """Return the Findings for ``installed`` (``{distribution: version or None}``, as
    ``installed_versions`` returns): each library below its floor, in a range of ``known_bad``
    (``KNOWN_BAD`` unless given), or required and missing. Versions that cannot be parsed are
    not judged; a version newer than the newest tested is not a finding."""
    known_bad = KNOWN_BAD if known_bad is None else known_bad
    findings = []
    for entry in supported:
        version = installed.get(entry.distribution)
        if version is None:
            if entry.required:
                findings.append(Finding(MISSING, entry, None))
            continue
        numbers = parse_version(version)
        if numbers is None:
            continue
        floor = parse_version(entry.floor)
        length = max(len(numbers), len(floor))
        if _padded(numbers, length) < _padded(floor, length):
            findings.append(Finding(BELOW_FLOOR, entry, version))
            continue
        for bad in known_bad:
            if bad.distribution == entry.distribution and _within(numbers, bad.first, bad.last):
                findings.append(Finding(KNOWN_NOT_TO_WORK, entry, version, bad))
                break
    return findings
