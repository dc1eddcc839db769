"""The one entry point for the app's settings: ``settings.RATELIMIT_APP`` merged over DEFAULTS.

Read lazily through :func:`get_config` and cached; the cache is cleared on ``setting_changed`` so
``override_settings`` works (see ``apps.py``). Never copy values into module or class attributes
at import time.
"""

import functools
from types import MappingProxyType

from django.conf import settings

DEFAULTS = {
    # django-redis cache alias whose connection holds the buckets (a single node, or a Sentinel
    # group when the cache uses django_redis.client.SentinelClient).
    "CACHE_ALIAS": "default",
    # A Redis Cluster instead: "host:port" of any of its nodes (the rest are discovered), and
    # keyword arguments for redis-py's RedisCluster. Empty: the cache alias above.
    "CLUSTER_NODES": [],
    "CLUSTER_OPTIONS": {"socket_timeout": 0.25, "socket_connect_timeout": 0.25},
    # The embedded server (the [embedded] extra: a private Valkey started when first needed,
    # stores/embedded.py), for trying the app and for tests. None: used when the settings name
    # no Redis (no django-redis cache under CACHE_ALIAS, no CLUSTER_NODES) and the extra is
    # installed; system check E020 refuses that when DEBUG is off. True: always, DEBUG or not
    # (the buckets then never leave this machine). False: never.
    "EMBEDDED_SERVER": None,
    # False: every request is allowed and charged nothing, with no rate-limit headers (tests
    # that do not care about limits; the pytest plugin's ``ratelimit_off`` marker).
    "ENABLED": True,
    # Prefix of every Redis key the app writes.
    "KEY_PREFIX": "rl",
    # What to do when Redis cannot answer: True lets requests through, False refuses them.
    # A rule's own "on Redis failure" field overrides this.
    "FAIL_OPEN": True,
    # Header that carries an API key (as sent by the client, e.g. "X-Api-Key").
    "API_KEY_HEADER": "X-Api-Key",
    # Dotted path to callable(request) -> str | None naming the caller's tenant. None: the tenant
    # stored on the caller's API key or plan assignment.
    "TENANT_RESOLVER": None,
    # Dotted path to callable(request, identity) -> plan slug | None, for projects that keep plans
    # elsewhere. None (or a None result): API key plan, then plan assignment, then the defaults.
    "PLAN_RESOLVER": None,
    # Addresses or networks (CIDR) of reverse proxies whose X-Forwarded-For is believed.
    "TRUSTED_PROXIES": [],
    # IPv6 clients are limited per network of this prefix length (a /64 is one subscriber).
    "IPV6_PREFIX_LENGTH": 64,
    # Optional request header that sets a request's cost (e.g. "X-Request-Cost"). None: off.
    "COST_HEADER": None,
    # Upper bound for a cost taken from COST_HEADER.
    "MAX_COST": 100,
    # The response header in which a metered endpoint's view may report what the request
    # consumed (instead of request.ratelimit.charge()); read and removed before the response
    # leaves. None: only charge().
    "REPORTED_COST_HEADER": "X-Quota-Consumed",
    # Paths the middleware never limits, matched on whole path segments: "/health" exempts
    # "/health" and "/health/...", not "/healthcare/"; an entry ending in "/" exempts what lies
    # beneath it; one ending in "*" is a plain string prefix ("/health*" also "/healthcare/").
    # The admin site's own paths are never limited nor counted, whatever this list says
    # (config/endpoints.py, unlimited_paths). /favicon.ico: what a browser asks for by itself
    # (a staff member's browser on a page without an icon), never a caller's API traffic.
    "EXEMPT_PATHS": ["/admin/", "/static/", "/health", "/favicon.ico"],
    # Whether the middleware also limits DRF views (the throttle then reuses its decision).
    "MIDDLEWARE_INCLUDES_DRF": False,
    # Retry-After jitter: a deterministic per-identity 0..spread seconds added to the wait, where
    # spread = max(RETRY_AFTER_JITTER_S, wait * RETRY_AFTER_JITTER_RATIO) rounded up, so clients
    # refused together (a shared bucket) come back spread out. Both 0: no jitter.
    "RETRY_AFTER_JITTER_S": 2,
    "RETRY_AFTER_JITTER_RATIO": 0.25,
    # Give the RateLimit item (remaining tokens) of shared buckets (scopes global, plan, tenant)
    # on every response. Off: their level is other clients' traffic, so it is shown only when
    # that bucket refused the request; RateLimit-Policy always lists every policy.
    "DISCLOSE_SHARED_REMAINING": False,
    # Charge CORS preflight requests (OPTIONS with Origin and Access-Control-Request-Method).
    # Off: a browser would report a refused preflight as a CORS failure, not as a 429.
    "CHARGE_PREFLIGHT": False,
    # Consecutive Redis failures that open the circuit breaker, and how long it stays open
    # before one trial request is let through.
    "BREAKER_FAILURES": 3,
    "BREAKER_COOLDOWN_S": 2.0,
    # A worker that has not seen the config version for this long asks Redis for it (on the
    # request path: what a worker does when its watcher cannot, e.g. while Redis is down).
    "CONFIG_CHECK_INTERVAL_S": 1.0,
    # How often each worker's watcher thread reads the config version (one GET), to compile
    # the rules of a new version before a request needs them.
    "CONFIG_WATCH_INTERVAL_S": 0.05,
    # How long before its version is published an edit's record of changed rows is written:
    # each worker's watcher compiles the new rules meanwhile, and installs them when the version
    # comes (instead of compiling them in the first request the new version fences). An admin
    # save takes this much longer. At least twice CONFIG_WATCH_INTERVAL_S to be of use; 0: off.
    "CONFIG_PUBLISH_LEAD_S": 0.1,
    # Tests and benchmarks: each limited response says which config version decided it
    # (RateLimit-Config-Version) and which worker process (RateLimit-Worker). Off in production.
    "EXPOSE_CONFIG_VERSION": False,
    # Rows changed without save() or delete() on a model instance (a queryset's update(),
    # bulk_create, raw SQL, a data migration) send no signal: a worker compares a digest of the
    # quota rows with its rules at most this often (one query) and applies them within this
    # many seconds. At least 1; 0 or None: never (only signals and `ratelimit reload` apply).
    "CONFIG_RELOAD_INTERVAL_S": 30,
    # IANA time zone whose midnights start the days and months of calendar quotas.
    "CALENDAR_TIME_ZONE": "UTC",
    # Seconds a worker keeps tokens leased from a rule with a lease size (see decision/leases.py):
    # what it has not spent by then is dropped, so a lease never holds tokens back for long.
    "LEASE_TTL_S": 1.0,
    # Remember denials in-process until Redis would certainly deny again (see
    # decision/deny_cache.py).
    "LOCAL_DENY_CACHE": True,
    # How long a credential (API key or user) used from a client address stays proven there:
    # while it is, that address's failed-authentication gates let it through even when other
    # callers' failures emptied them (see protection/failed_auth.py). 0: never proven.
    "FAILED_AUTH_PROOF_S": 14 * 24 * 3600,
    # Metrics: flush interval, per-minute series retention, hot-key tracker capacity.
    "METRICS_ENABLED": True,
    "METRICS_FLUSH_INTERVAL_S": 1.0,
    "METRICS_RETENTION_S": 24 * 3600,
    "HOT_KEYS_CAPACITY": 1000,
    # Identities kept per metric (tokens, denials, requests) in each per-minute and per-hour
    # hot-key sorted set in Redis (each flush trims the sets to this size).
    "METRICS_HOT_KEYS_STORED": 100,
    # Seconds between the dashboard's live refreshes.
    "DASHBOARD_REFRESH_S": 3,
    # Prometheus endpoint (ratelimit_app.urls, "metrics/"): off unless enabled. With a token,
    # scrapers send "Authorization: Bearer <token>"; staff with the dashboard permission may
    # always read it.
    "PROMETHEUS_ENABLED": False,
    "PROMETHEUS_TOKEN": None,
    # Quota alerts (business/alerts/crossings.py): crossings waiting in a worker for its background
    # thread to store them (beyond this many, new ones are dropped and counted), and how often it
    # stores them.
    "ALERTS_QUEUE_SIZE": 10_000,
    "ALERTS_DRAIN_INTERVAL_S": 1.0,
    # A client-IP rule's alert is one row for every address (business/alerts/crossings.py): its
    # webhook deliveries wait this many seconds, so that they say how many addresses crossed.
    "ALERTS_AGGREGATE_S": 60.0,
    # The penalty box's records (business/alerts/bans.py, written by a background thread every
    # ALERTS_DRAIN_INTERVAL_S): a ban rule's bans are logged in one entry per rule, mode and
    # interval of BAN_LOG_INTERVAL_S seconds, with a Ban row (what staff list and lift) for at
    # most BAN_ROWS_PER_INTERVAL of them; its caller.banned deliveries leave at the interval's
    # end, one per endpoint.
    "BAN_LOG_INTERVAL_S": 60,
    "BAN_ROWS_PER_INTERVAL": 20,
    # Webhooks (business/alerts/webhooks.py, `manage.py ratelimit deliver`): seconds a whole POST
    # may take (connect, send, the answer's head), how long a delivery is retried before it is
    # marked failed, the first retry's delay (doubled each attempt, with jitter, up to the max),
    # how often the sender looks for work, how many receivers one sender posts to at once (one
    # delivery per endpoint at a time), and the networks that are not public but may receive
    # webhooks (loopback, private and link-local addresses are refused otherwise), as CIDRs.
    "WEBHOOK_TIMEOUT_S": 5.0,
    "WEBHOOK_RETRY_FOR_S": 24 * 3600,
    "WEBHOOK_BACKOFF_BASE_S": 10.0,
    "WEBHOOK_BACKOFF_MAX_S": 3600.0,
    "WEBHOOK_POLL_INTERVAL_S": 1.0,
    "WEBHOOK_CONCURRENCY": 4,
    "WEBHOOK_ALLOWED_NETWORKS": [],
    # The plans an OpenAPI schema may name (its x-ratelimit-cost, and the policies its 429 and
    # 402 list; see openapi/limits.py): "defaults", the plans a caller gets without an
    # assignment (every caller can learn those anyway); "all", every plan; or a list of plan
    # slugs ([]: none). Rules for every plan are always described.
    "OPENAPI_PLANS": "defaults",
}


@functools.cache
def get_config():
    """Return the merged, read-only settings mapping."""
    user = getattr(settings, "RATELIMIT_APP", {}) or {}
    unknown = set(user) - set(DEFAULTS)
    if unknown:
        # Reported by system check ratelimit_app.E003; keep going with the known keys.
        user = {k: v for k, v in user.items() if k in DEFAULTS}
    return MappingProxyType({**DEFAULTS, **user})


class ExemptPaths:
    """EXEMPT_PATHS compiled for matching a request path (see DEFAULTS for the entry forms).

    An entry ``/health`` is the path itself (``exact``) and the prefix ``/health/``: matching on
    segments, so that an exempt ``/health`` does not exempt ``/healthcare/``. Hashable: the
    endpoint listing is cached per value.
    """

    __slots__ = ("exact", "prefixes")

    def __init__(self, entries):
        exact, prefixes = set(), []
        for entry in entries:
            if entry.endswith("*"):
                prefixes.append(entry[:-1])
            elif entry.endswith("/"):
                prefixes.append(entry)
            else:
                exact.add(entry)
                prefixes.append(entry + "/")
        self.exact = frozenset(exact)
        self.prefixes = tuple(prefixes)

    def matches(self, path):
        """True if ``path`` (a request's ``path_info``) is exempt."""
        return path in self.exact or path.startswith(self.prefixes)

    def __eq__(self, other):
        return isinstance(other, ExemptPaths) and \
            (self.exact, self.prefixes) == (other.exact, other.prefixes)

    def __hash__(self):
        return hash((self.exact, self.prefixes))


@functools.cache
def exempt_paths():
    """Return EXEMPT_PATHS as ExemptPaths (built once per settings, like ``get_config``: the
    middleware asks on every request)."""
    return ExemptPaths(get_config()["EXEMPT_PATHS"])


@functools.cache
def meta_key(header):
    """Return the ``request.META`` name of an HTTP header: ``X-Api-Key`` -> ``HTTP_X_API_KEY``."""
    return "HTTP_" + header.upper().replace("-", "_")


def ensure_installed(adapter):
    """Raise ImproperlyConfigured if ``adapter`` is used without ``ratelimit_app`` installed
    (without the app there are no models, no signals and no system checks)."""
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    if not apps.is_installed("ratelimit_app"):
        raise ImproperlyConfigured(
            f"{adapter} needs 'ratelimit_app' in INSTALLED_APPS (its models hold the quotas).")


QUOTA_MIDDLEWARE = "ratelimit_app.middleware.QuotaMiddleware"


def quota_middleware_installed():
    """True if QuotaMiddleware is in MIDDLEWARE: only it sees every response, and so only
    with it can a metered request be settled after its response."""
    return QUOTA_MIDDLEWARE in settings.MIDDLEWARE


def reload_interval_s(config):
    """Return CONFIG_RELOAD_INTERVAL_S of ``config`` in seconds (a float), or None when off.

    A value ``reload_interval_problem`` refuses counts as the default: check E010 reports it,
    and edits are still applied meanwhile.
    """
    value = _valid_or_default(config, "CONFIG_RELOAD_INTERVAL_S", reload_interval_problem)
    return float(value) if value else None


def _valid_or_default(config, name, problem_of):
    """Return ``config[name]``, or its default when ``problem_of`` finds something wrong with
    it (a system check reports it)."""
    value = config[name]
    return DEFAULTS[name] if problem_of(value) else value


def reload_interval_problem(value):
    """Return what is wrong with a CONFIG_RELOAD_INTERVAL_S value, or "" if it is valid."""
    if value is None or value == 0 and not isinstance(value, bool):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {value!r}, not a number of seconds"
    if 0 < value < 1:
        return f"is {value!r}: below 1 second a worker would query the database nearly on " \
               f"every request"
    if not 1 <= value < float("inf"):  # (False for NaN too)
        return f"is {value!r}, not a finite number of seconds"
    return ""


def watch_interval_s(config):
    """Return CONFIG_WATCH_INTERVAL_S of ``config`` in seconds; a value
    ``watch_interval_problem`` refuses counts as the default (check E011 reports it)."""
    return float(_valid_or_default(config, "CONFIG_WATCH_INTERVAL_S", watch_interval_problem))


def publish_lead_s(config):
    """Return CONFIG_PUBLISH_LEAD_S of ``config`` in seconds; a value ``publish_lead_problem``
    refuses counts as the default (check E012 reports it)."""
    return float(_valid_or_default(config, "CONFIG_PUBLISH_LEAD_S", publish_lead_problem))


def openapi_plans_problem(value):
    """Return what is wrong with an OPENAPI_PLANS value, or "" if it is valid."""
    if value in ("defaults", "all"):
        return ""
    if isinstance(value, str):
        return f"is {value!r}, neither \"defaults\" nor \"all\" nor a list of plan slugs"
    if not isinstance(value, (list, tuple, set, frozenset)) or \
            not all(isinstance(slug, str) for slug in value):
        return f"is {value!r}, not a list of plan slugs"
    return ""


def publish_lead_problem(value):
    """Return what is wrong with a CONFIG_PUBLISH_LEAD_S value, or "" if it is valid."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {value!r}, not a number of seconds"
    if not 0 <= value <= 1:  # (False for NaN too)
        return f"is {value!r}: each admin save would wait that long to publish its edit"
    return ""


def watch_interval_problem(value):
    """Return what is wrong with a CONFIG_WATCH_INTERVAL_S value, or "" if it is valid."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {value!r}, not a number of seconds"
    if not 0.01 <= value <= 10:  # (False for NaN too)
        return f"is {value!r}: the watcher would poll Redis nearly without pause, or let " \
               f"workers learn of edits seconds late"
    return ""


def unknown_keys():
    """Return the RATELIMIT_APP keys that are not settings of this app."""
    return sorted(set(getattr(settings, "RATELIMIT_APP", {}) or {}) - set(DEFAULTS))


def reset_config(**kwargs):
    """``setting_changed`` receiver: forget the cached settings (``apps.py`` connects the
    receivers that forget what was built from them)."""
    if kwargs.get("setting") in (None, "RATELIMIT_APP", "CACHES"):
        get_config.cache_clear()
        exempt_paths.cache_clear()
