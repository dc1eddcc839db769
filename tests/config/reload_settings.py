"""project.settings with CONFIG_RELOAD_INTERVAL_S taken from the environment (RELOAD_INTERVAL_S),
for the servers tests/config/test_reload_live.py starts."""

import os

from project.settings import *  # noqa: F403
from project.settings import RATELIMIT_APP

RATELIMIT_APP = {**RATELIMIT_APP,
                 "CONFIG_RELOAD_INTERVAL_S": float(os.environ["RELOAD_INTERVAL_S"])}
