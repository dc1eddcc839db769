"""project.settings with the Ninja APIs of tests/adapters/ninja_api.py in the URLconf, for the
servers tests/adapters/test_ninja_servers.py starts."""

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.adapters.ninja_urls"
