"""Settings for the worker processes of tests/test_usage_records.py: the demo project with
calendar days in Berlin, its own SQLite file (SQLITE_PATH) and the suite's Redis (REDIS_URL)."""

from project.settings import *  # noqa: F401,F403
from project.settings import RATELIMIT_APP

RATELIMIT_APP = {**RATELIMIT_APP, "CALENDAR_TIME_ZONE": "Europe/Berlin"}
