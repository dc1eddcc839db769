"""Settings of the demo project (and of the test suite)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "ratelimit_app",
    # the admin index by task: each a section of its own (docs/howto/install.md)
    "ratelimit_app.groups.callers",
    "ratelimit_app.groups.billing",
    "ratelimit_app.groups.alerts",
    "ratelimit_app.groups.monitoring",
    "ratelimit_app.groups.protection",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ratelimit_app.middleware.QuotaMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "project" / "templates"],  # admin/base_site.html: a favicon
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

# The SQLite file SQLITE_PATH, or the PostgreSQL database POSTGRES_DB when that is set (the test
# suite's PostgreSQL cell gives each server it starts a database of its own this way).
if os.environ.get("POSTGRES_DB"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["POSTGRES_DB"],
            "USER": os.environ.get("POSTGRES_USER", "postgres"),
            "PASSWORD": os.environ.get("POSTGRES_PASSWORD", ""),
            "HOST": os.environ.get("POSTGRES_HOST", "127.0.0.1"),
            "PORT": os.environ.get("POSTGRES_PORT", "5432"),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SQLITE_PATH", BASE_DIR / "db.sqlite3"),
        }
    }

# Where the buckets live (a contract, see docs/howto/sentinel.md): a Redis Cluster
# (REDIS_CLUSTER_NODES, any of its nodes), a Sentinel group (REDIS_SENTINELS and
# REDIS_SENTINEL_SERVICE) or one node (REDIS_URL). Cluster and Sentinel take precedence over
# REDIS_URL, which the single-node default always has.
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
REDIS_CLUSTER_NODES = os.environ.get("REDIS_CLUSTER_NODES", "")
REDIS_SENTINELS = os.environ.get("REDIS_SENTINELS", "")
REDIS_SENTINEL_SERVICE = os.environ.get("REDIS_SENTINEL_SERVICE", "") or "mymaster"

# Short timeouts: a hung Redis must cost a request milliseconds, not seconds.
REDIS_TIMEOUTS = {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25}


def redis_addresses(variable, value):
    """``"host:port,host:port"`` as ``[(host, port), ...]``; a malformed entry stops start-up
    with a message naming the variable."""
    from django.core.exceptions import ImproperlyConfigured

    addresses = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ImproperlyConfigured(f"{variable}: {item!r} is not host:port "
                                       f"(expected e.g. 127.0.0.1:26379,127.0.0.1:26380)")
        addresses.append((host, int(port)))
    return addresses


def sentinel_cache(sentinels, service_name, timeouts=REDIS_TIMEOUTS):
    """A django-redis cache on the master of Sentinel group ``service_name`` (the app then uses
    its SentinelStore). ``sentinels``: ``[(host, port), ...]``."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{service_name}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            # per cache (django-redis >= 5.4), so other caches keep the plain factory
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": list(sentinels),
            **timeouts,
        },
    }


CLUSTER_NODES = [f"{host}:{port}" for host, port in
                 redis_addresses("REDIS_CLUSTER_NODES", REDIS_CLUSTER_NODES)]
SENTINELS = redis_addresses("REDIS_SENTINELS", REDIS_SENTINELS)
if CLUSTER_NODES and SENTINELS:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("Set REDIS_CLUSTER_NODES or REDIS_SENTINELS, not both.")

if CLUSTER_NODES:
    # The buckets live in the cluster (RATELIMIT_APP["CLUSTER_NODES"]); Django's own cache
    # needs no Redis, and django-redis has no cluster client anyway.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
elif SENTINELS:
    CACHES = {"default": sentinel_cache(SENTINELS, REDIS_SENTINEL_SERVICE)}
else:
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": dict(REDIS_TIMEOUTS),
        }
    }

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "rest_framework.authentication.BasicAuthentication",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["ratelimit_app.throttling.QuotaThrottle"],
}

RATELIMIT_APP = {
    "API_KEY_HEADER": "X-Api-Key",
    "COST_HEADER": "X-Request-Cost",
    "MAX_COST": 50,
    "TRUSTED_PROXIES": ["127.0.0.1/32"] if os.environ.get("DEMO_BEHIND_PROXY") else [],
    "CLUSTER_NODES": CLUSTER_NODES,
    # the demo's own webhook receiver is on this machine (project/demo/receiver.py)
    "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.0/8", "::1/128"],
}
if os.environ.get("DEMO_ALERTS_AGGREGATE_S"):  # tests: a client-IP rule's webhooks sent at once
    RATELIMIT_APP["ALERTS_AGGREGATE_S"] = float(os.environ["DEMO_ALERTS_AGGREGATE_S"])

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"ratelimit_app": {"handlers": ["console"], "level": "WARNING"}},
}
