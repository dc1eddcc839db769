"""The demo's settings without the index's group apps: a project that has not opted in
(test_index_groups.py runs ``manage.py`` with it in a subprocess)."""

from project.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS  # noqa: F405
                  if not app.startswith("ratelimit_app.groups.")]
