"""System checks: each id appears when misconfigured, not when configured right, with a hint."""

import pytest
from django.conf import settings as django_settings
from django.core.checks import run_checks
from django.test import override_settings

MIDDLEWARE_PATH = "ratelimit_app.middleware.QuotaMiddleware"
THROTTLE_PATH = "ratelimit_app.throttling.QuotaThrottle"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
REDIS_CACHE = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0",
               "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25}}


def messages():
    """Return {id: message} of this app's checks under the current settings."""
    found = {}
    for message in run_checks(tags=["ratelimit_app"]):  # no model checks: no database
        if message.id.startswith("ratelimit_app."):
            assert message.hint, message.id
            found[message.id] = message
    return found


def ratelimit(**changes):
    return override_settings(RATELIMIT_APP={**django_settings.RATELIMIT_APP, **changes})


def without_middleware():
    return [m for m in django_settings.MIDDLEWARE if m != MIDDLEWARE_PATH]


def test_demo_settings_pass_every_check():
    assert messages() == {}


@pytest.mark.parametrize("caches, alias", [
    ({"default": REDIS_CACHE}, "buckets"),                                      # no such alias
    ({"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}, "default"),
    ({"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",     # Django's own
                  "LOCATION": "redis://127.0.0.1:1/0"}}, "default"),
])
def test_e001_cache_alias_must_be_a_django_redis_cache(caches, alias):
    # (the embedded server refused: with it installed, no Redis means the embedded server,
    # tests/embedded/test_embedded_server.py)
    with override_settings(CACHES=caches), ratelimit(CACHE_ALIAS=alias, EMBEDDED_SERVER=False):
        found = messages()
    assert "ratelimit_app.E001" in found
    assert alias in found["ratelimit_app.E001"].msg


def test_e001_not_raised_for_a_django_redis_alias():
    with override_settings(CACHES={"default": REDIS_CACHE, "buckets": REDIS_CACHE}), \
            ratelimit(CACHE_ALIAS="buckets"):
        assert "ratelimit_app.E001" not in messages()


def test_e002_middleware_before_authentication():
    order = [m for m in without_middleware() if m != AUTH_MIDDLEWARE]
    with override_settings(MIDDLEWARE=[MIDDLEWARE_PATH, *order[:-1], AUTH_MIDDLEWARE, order[-1]]):
        assert "ratelimit_app.E002" in messages()
    with override_settings(MIDDLEWARE=[*order, AUTH_MIDDLEWARE, MIDDLEWARE_PATH]):
        assert "ratelimit_app.E002" not in messages()


def test_e002_says_where_the_middleware_is_and_names_the_line_it_belongs_after():
    stock = ["django.middleware.security.SecurityMiddleware",
             "django.contrib.sessions.middleware.SessionMiddleware",
             "django.middleware.common.CommonMiddleware",
             "django.middleware.csrf.CsrfViewMiddleware", AUTH_MIDDLEWARE,
             "django.contrib.messages.middleware.MessageMiddleware"]
    with override_settings(MIDDLEWARE=[MIDDLEWARE_PATH, *stock]):  # appended at the top
        error = messages()["ratelimit_app.E002"]
    assert error.msg == ("QuotaMiddleware is entry 1 of MIDDLEWARE, before "
                         "AuthenticationMiddleware (entry 6): it would limit every signed-in "
                         "user as an anonymous client.")
    assert error.hint == ("Move 'ratelimit_app.middleware.QuotaMiddleware' to the line right "
                          "after 'django.contrib.auth.middleware.AuthenticationMiddleware' in "
                          "MIDDLEWARE.")
    # a middleware that replaces request.user after authentication: the place is after it
    remote = "django.contrib.auth.middleware.RemoteUserMiddleware"
    with override_settings(MIDDLEWARE=[*stock[:5], MIDDLEWARE_PATH, remote, stock[5]]):
        error = messages()["ratelimit_app.E002"]
    assert "before RemoteUserMiddleware (entry 7)" in error.msg
    assert f"right after '{remote}'" in error.hint
    with override_settings(MIDDLEWARE=[*stock[:5], remote, MIDDLEWARE_PATH, stock[5]]):
        assert "ratelimit_app.E002" not in messages()
    # appended at the end is a right place too
    with override_settings(MIDDLEWARE=[*stock, MIDDLEWARE_PATH]):
        assert "ratelimit_app.E002" not in messages()


def test_e003_unknown_setting():
    with ratelimit(TRUSTED_PROXY=["10.0.0.1"]):
        found = messages()
    assert "TRUSTED_PROXY" in found["ratelimit_app.E003"].msg
    with ratelimit(TRUSTED_PROXIES=["10.0.0.1"]):
        assert "ratelimit_app.E003" not in messages()


@pytest.mark.parametrize("proxies", [["10.0.0.1", "proxy.local"], ["10.0.0.0/33"], "10.0.0.1"])
def test_e004_bad_trusted_proxies(proxies):
    with ratelimit(TRUSTED_PROXIES=proxies):
        assert "ratelimit_app.E004" in messages()


def test_e004_says_a_string_is_not_a_list():
    with ratelimit(TRUSTED_PROXIES="10.0.0.1"):
        found = [m for m in run_checks(tags=["ratelimit_app"]) if m.id == "ratelimit_app.E004"]
    assert len(found) == 1 and "not a list" in found[0].msg


def test_e004_not_raised_for_addresses_and_networks():
    with ratelimit(TRUSTED_PROXIES=["10.0.0.1", "10.0.0.0/8", "2001:db8::/32", "::1"]):
        assert "ratelimit_app.E004" not in messages()


@pytest.mark.parametrize("name", ["TENANT_RESOLVER", "PLAN_RESOLVER"])
def test_e005_unimportable_resolver(name):
    for path in ("no.such.module.resolver", "tests.operations.test_checks.no_such_function",
                 "nodots"):
        with ratelimit(**{name: path}):
            found = messages()
        assert "ratelimit_app.E005" in found and name in found["ratelimit_app.E005"].msg
    with ratelimit(**{name: "tests.operations.test_checks.resolver"}):
        assert "ratelimit_app.E005" not in messages()


def resolver(*args):
    return None


def test_w001_throttle_without_middleware():
    with override_settings(MIDDLEWARE=without_middleware()):
        found = messages()
    # the text says what the code checks: the throttle in DEFAULT_THROTTLE_CLASSES (a view's
    # own throttle_classes are not settings and are not looked at)
    assert found["ratelimit_app.W001"].msg == (
        "QuotaThrottle is in REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES'] but QuotaMiddleware is "
        "not in MIDDLEWARE.")
    assert "plain Django views are not limited" in found["ratelimit_app.W001"].hint
    assert "concurrency slots are freed only at their timeout" in found["ratelimit_app.W001"].hint
    assert MIDDLEWARE_PATH in found["ratelimit_app.W001"].hint


def test_w008_ninja_throttle_without_middleware():
    pytest.importorskip("ninja")
    with override_settings(ROOT_URLCONF="tests.adapters.ninja_urls",
                           MIDDLEWARE=without_middleware()):
        found = messages()
    warning = found["ratelimit_app.W008"]
    # the operations of tests/adapters/ninja_api.py that have the throttle, by name
    assert warning.msg.startswith(
        "Django Ninja operations use ratelimit_app.ninja.QuotaThrottle but QuotaMiddleware is "
        "not in MIDDLEWARE (ninja-parts:routed, ninja-parts:throttled_operation, ninja:bearer "
        "and ")
    assert "middleware_decided" not in warning.msg  # no QuotaThrottle there
    assert "exempt_from_the_throttle" not in warning.msg  # @ratelimit_exempt
    assert "no RateLimit or RateLimit-Policy header" in warning.hint
    assert MIDDLEWARE_PATH in warning.hint
    with override_settings(ROOT_URLCONF="tests.adapters.ninja_urls"):  # the middleware installed
        assert "ratelimit_app.W008" not in messages()
    with override_settings(MIDDLEWARE=without_middleware()):  # no Ninja API in the URLconf
        assert "ratelimit_app.W008" not in messages()


def test_w002_cache_without_socket_timeouts():
    bare = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
    with override_settings(CACHES={"default": bare}):
        assert "ratelimit_app.W002" in messages()
    with override_settings(CACHES={"default": REDIS_CACHE}):
        assert "ratelimit_app.W002" not in messages()


def test_w003_neither_adapter_configured():
    rest = {**django_settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": []}
    with override_settings(MIDDLEWARE=without_middleware(), REST_FRAMEWORK=rest):
        found = messages()
    assert "ratelimit_app.W003" in found and "ratelimit_app.W001" not in found
    with override_settings(REST_FRAMEWORK=rest):  # the middleware alone is enough
        assert "ratelimit_app.W003" not in messages()


def test_adapters_refuse_to_load_without_the_app_installed():
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import ratelimit_app.middleware
    import ratelimit_app.throttling

    apps_without = [a for a in django_settings.INSTALLED_APPS if a != "ratelimit_app"]
    with override_settings(INSTALLED_APPS=apps_without):
        for module in (ratelimit_app.throttling, ratelimit_app.middleware):
            with pytest.raises(ImproperlyConfigured, match="INSTALLED_APPS"):
                importlib.reload(module)
    for module in (ratelimit_app.throttling, ratelimit_app.middleware):
        importlib.reload(module)  # and they load again once it is back


# --- supported versions (operations/support.py): the range logic on given version maps ---------

CURRENT = {"Django": "5.2.19", "djangorestframework": "3.18.3", "django-redis": "7.0.0",
           "redis": "8.1.0", "hiredis": "3.5.0"}


def findings(**changes):
    """Return ``{distribution: kind}`` of the findings for CURRENT with ``changes``."""
    from ratelimit_app.operations.support import version_findings

    installed = {**CURRENT, **{name.replace("_", "-"): v for name, v in changes.items()}}
    return {f.supported.distribution: f.kind for f in version_findings(installed)}


def test_versions_in_range_give_no_finding():
    assert findings() == {}
    assert findings(Django="6.1.3", redis="5.3.0", django_redis="5.4.0", hiredis="3.2.0",
                    djangorestframework="3.16.0") == {}


@pytest.mark.parametrize("name, version", [
    ("redis", "5.0.8"), ("redis", "5.2.1"), ("redis", "4.6"), ("Django", "4.2.30"),
    ("Django", "5.1.15"), ("djangorestframework", "3.14.0"), ("django-redis", "5.3.0"),
    ("hiredis", "2.4.0"), ("hiredis", "3.1.1"), ("django-ninja", "1.2.2"),
    ("drf-spectacular", "0.27.2")])
def test_below_the_floor(name, version):
    assert findings(**{name.replace("-", "_"): version}) == {name: "below floor"}


@pytest.mark.parametrize("name, version", [
    ("Django", "6.2"), ("Django", "6.2a1"), ("Django", "7.0"), ("redis", "8.2.0"),
    ("redis", "9.0.0b1"), ("hiredis", "4.0.0"), ("django-redis", "7.1.0"),
    ("django-ninja", "1.8.0"), ("drf-spectacular", "0.31.0")])
def test_a_release_newer_than_the_pinned_cells_is_no_finding(name, version):
    # a fresh install resolves the newest releases: they check quietly (the newest cell tests
    # them); only a release known not to work is reported
    assert findings(**{name.replace("-", "_"): version}) == {}


def known_bad_findings(known_bad, **changes):
    """Return ``{distribution: kind}`` for CURRENT with ``changes`` and a known-bad list."""
    from ratelimit_app.operations.support import version_findings

    installed = {**CURRENT, **{name.replace("_", "-"): v for name, v in changes.items()}}
    return {f.supported.distribution: f.kind
            for f in version_findings(installed, known_bad=known_bad)}


def test_releases_in_a_known_bad_range_are_reported():
    from ratelimit_app.operations.support import KnownBad

    bad = (KnownBad("redis", "8.2.0", "8.2", why="x", instead="redis!=8.2.*"),
           KnownBad("hiredis", "4.0", None, why="y", instead="hiredis<4"))
    for version in ("8.2.0", "8.2.1", "8.2.10rc1"):
        assert known_bad_findings(bad, redis=version) == {"redis": "known not to work"}, version
    for version in ("8.1.9", "8.3.0", "9.0"):
        assert known_bad_findings(bad, redis=version) == {}, version
    # an open range: every later release too
    assert known_bad_findings(bad, hiredis="4.0.0") == {"hiredis": "known not to work"}
    assert known_bad_findings(bad, hiredis="5.1") == {"hiredis": "known not to work"}
    assert known_bad_findings(bad, hiredis="3.5.0") == {}
    # below the floor stays E009's, whatever the list says
    low = (KnownBad("redis", "5.0", None, why="x", instead="redis>=9"),)
    assert known_bad_findings(low, redis="5.2.1") == {"redis": "below floor"}


def test_the_known_bad_list_is_well_formed():
    from ratelimit_app.operations.support import KNOWN_BAD, SUPPORTED, parse_version

    names = {entry.distribution for entry in SUPPORTED}
    for bad in KNOWN_BAD:
        assert bad.distribution in names and parse_version(bad.first), bad
        assert bad.last is None or parse_version(bad.last) >= parse_version(bad.first), bad
        assert bad.why and bad.instead.startswith(bad.distribution), bad


def test_versions_are_parsed_tolerantly():
    from ratelimit_app.operations.support import parse_version

    assert parse_version("5.3.0rc1") == (5, 3, 0)
    assert parse_version("3.16.0.post1") == (3, 16, 0)
    assert parse_version("v6.1") == (6, 1)
    assert parse_version("6.1.3+local.7") == (6, 1, 3)
    assert parse_version("unknown") is None and parse_version("") is None
    # a pre-release of a floor counts as the floor; something unreadable is not judged
    assert findings(redis="5.3.0rc1") == {} and findings(redis="main") == {}


def test_optional_drf_may_be_absent_hiredis_may_not():
    assert findings(djangorestframework=None) == {}
    # the ninja and openapi extras are judged only when installed
    assert findings(django_ninja=None, drf_spectacular=None) == {}
    assert findings(django_ninja="1.3.0", drf_spectacular="0.28.0") == {}
    assert findings(django_ninja="1.7.1", drf_spectacular="0.30.0") == {}
    assert findings(hiredis=None) == {"hiredis": "missing"}


def test_version_messages_name_the_library_and_the_fix():
    from ratelimit_app.operations.support import version_findings
    from ratelimit_app.operations.system_checks import _version_message

    from ratelimit_app.operations.support import KnownBad

    bad = (KnownBad("Django", "6.2", "6.2.1", why="its admin drops the rule forms' scripts",
                    instead="Django!=6.2.0,!=6.2.1"),)
    installed = {**CURRENT, "redis": "5.0.8", "Django": "6.2", "hiredis": None}
    by_id = {m.id: m for m in map(_version_message, version_findings(installed, known_bad=bad))}
    assert by_id["ratelimit_app.E009"].msg == (
        "redis 5.0.8 is installed; ratelimit_app needs redis >= 5.3 (redis-py 5.0–5.2's "
        "ConnectionPool.get_connection() requires a command name: every decision fails with "
        "TypeError and requests go unlimited).")
    assert by_id["ratelimit_app.E009"].hint == "pip install 'redis>=5.3'."
    assert by_id["ratelimit_app.W005"].msg == (
        "Django 6.2 is known not to work with ratelimit_app: its admin drops the rule forms' "
        "scripts.")
    assert by_id["ratelimit_app.W005"].hint == "pip install 'Django!=6.2.0,!=6.2.1'."
    assert by_id["ratelimit_app.W006"].msg == "hiredis is not installed."
    ninja = {m.id: m for m in map(_version_message, version_findings(
        {**CURRENT, "django-ninja": "1.2.2", "drf-spectacular": "0.31.0"}))}
    assert ninja["ratelimit_app.E009"].msg == (
        "django-ninja 1.2.2 is installed; ratelimit_app needs django-ninja >= 1.3 (Django Ninja "
        "1.2 runs no throttle on async operations: they go unlimited).")
    assert "ratelimit_app.W005" not in ninja  # newer than the pinned cells: no finding


def test_app_checks_carry_their_own_tag():
    ids = {m.id for m in run_checks(tags=["ratelimit_app"])}
    with override_settings(MIDDLEWARE=without_middleware()):
        assert "ratelimit_app.W001" in {m.id for m in run_checks(tags=["ratelimit_app"])}
    assert ids == set()


def test_no_warning_when_the_group_apps_are_left_out():
    # the admin index's grouping by task is optional: one section is a fine index
    without_groups = [app for app in django_settings.INSTALLED_APPS
                      if not app.startswith("ratelimit_app.groups.")]
    partial = [app for app in django_settings.INSTALLED_APPS
               if app not in ("ratelimit_app.groups.billing", "ratelimit_app.groups.alerts")]
    for apps in (without_groups, partial):
        with override_settings(INSTALLED_APPS=apps):
            assert run_checks(tags=["ratelimit_app"]) == []


@pytest.mark.parametrize("argv, uses", [
    (["manage.py", "runserver", "8001"], True),
    (["manage.py", "check"], True),
    (["manage.py", "test"], True),                     # its tests' requests are decided
    (["manage.py", "ratelimit", "top"], True),         # the app's own commands
    (["manage.py", "migrate"], False),
    (["manage.py", "createsuperuser"], False),
    (["manage.py", "ratelimit_traffic"], False),       # the demo's HTTP client
    (["gunicorn", "project.wsgi"], True),              # not a command: a server, a script
    (["pytest", "tests/operations"], True),
    (["manage.py"], True),
])
def test_the_store_check_concerns_the_commands_that_use_the_store(argv, uses):
    from ratelimit_app.operations.system_checks import command_uses_store

    assert command_uses_store(argv) is uses
