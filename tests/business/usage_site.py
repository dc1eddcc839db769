"""Settings for the worker processes of tests/business/test_usage_records.py: the demo project with
calendar days in Berlin, its own SQLite file (SQLITE_PATH) and the suite's Redis (REDIS_URL)."""

from project.settings import *  # noqa: F401,F403
from project.settings import CACHES, RATELIMIT_APP

RATELIMIT_APP = {**RATELIMIT_APP, "CALENDAR_TIME_ZONE": "Europe/Berlin"}
# a loaded test machine must not turn answers into fail-open ones (they charge nothing); the
# test still tells them apart (tests/business/usage_traffic.py) should one happen
CACHES = {"default": {**CACHES["default"],
                      "OPTIONS": {**CACHES["default"].get("OPTIONS", {}),
                                  "SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5}}}
