"""What users write stays valid whatever the package's folders: every dotted path the docs and the
README name, the models under their app label, the command, the URL names, the templates, the
migrations and the logger."""

import importlib
import logging
import re
from io import StringIO
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import call_command, get_commands
from django.template.loader import get_template
from django.urls import reverse

REPO = Path(__file__).resolve().parents[2]
DOTTED = re.compile(r"ratelimit_app(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
# dotted words in the docs that are not import paths: check ids, permissions, a format's name
NOT_PATHS = re.compile(r"^ratelimit_app\.(?:[EW]\d{3}|(?:view|reset|restore|add|change|delete|lift)_\w+"
                       r"|quotas)$")

# the names of the first releases' models (app label ratelimit_app), all in ratelimit_app.models
MODELS = ["Plan", "PlanAssignment", "ApiKey", "Rule", "EndpointCost", "IdentityOverride",
          "AuditEntry", "Dashboard", "UsageRecord", "RollupBatch", "WebhookEndpoint",
          "QuotaAlert", "WebhookDelivery"]


def documented_paths():
    texts = [path.read_text() for path in sorted((REPO / "docs").rglob("*.md"))]
    texts.append((REPO / "README.md").read_text())
    found = {match for text in texts for match in DOTTED.findall(text)}
    return sorted(path for path in found if not NOT_PATHS.match(path))


def resolve(dotted):
    """Import the longest module prefix of ``dotted`` and get the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            target = getattr(target, name)
        return target
    raise ModuleNotFoundError(dotted)


def test_the_docs_name_the_paths_users_write():
    paths = documented_paths()
    for expected in ("ratelimit_app.middleware.QuotaMiddleware",
                     "ratelimit_app.throttling.QuotaThrottle",
                     "ratelimit_app.webhooks.verify_signature",
                     "ratelimit_app.usage.usage_view", "ratelimit_app.reload_config"):
        assert expected in paths


@pytest.mark.parametrize("dotted", documented_paths())
def test_every_documented_path_imports(dotted):
    # a path of an optional extra imports only where the extra is installed (the main and the
    # ninja cells install django-ninja)
    if dotted == "ratelimit_app.ninja" or dotted.startswith(("ratelimit_app.ninja.",
                                                             "ratelimit_app.openapi.ninja")):
        pytest.importorskip("ninja")
    assert resolve(dotted) is not None


def test_the_public_paths_are_the_objects_the_app_uses():
    from ratelimit_app import alerts, usage, webhooks
    from ratelimit_app.business.alerts import crossings
    from ratelimit_app.business.alerts import webhooks as deliveries
    from ratelimit_app.runtime.limiter import default_limiter
    from ratelimit_app.views import usage as usage_views

    assert alerts.quota_threshold_crossed is crossings.quota_threshold_crossed
    assert webhooks.verify_signature is deliveries.verify_signature
    assert usage.usage_view is usage_views.usage_view
    import ratelimit_app

    assert callable(ratelimit_app.reload_config) and ratelimit_app.__version__
    assert default_limiter.__module__ == "ratelimit_app.runtime.limiter"


def test_the_test_helpers_users_import():
    from ratelimit_app.testing import RedisCluster, RedisServer, SentinelSetup

    assert all(callable(helper) for helper in (RedisCluster, RedisServer, SentinelSetup))


def test_every_model_keeps_its_app_label_and_name():
    import ratelimit_app.models

    for name in MODELS:
        model = getattr(ratelimit_app.models, name)
        assert model is apps.get_model("ratelimit_app", name)
        assert model._meta.db_table == f"ratelimit_app_{name.lower()}"


@pytest.mark.django_db
def test_the_moves_need_no_migration():
    out = StringIO()
    call_command("makemigrations", "ratelimit_app", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_the_command_the_url_names_the_templates_and_the_logger():
    assert get_commands()["ratelimit"] == "ratelimit_app"
    assert reverse("ratelimit_app:usage").endswith("/usage/")
    assert reverse("ratelimit_app:usage-records").endswith("/usage-records/")
    assert reverse("ratelimit_app:prometheus").endswith("/metrics/")
    for template in ("ratelimit_app/dashboard.html", "ratelimit_app/caller.html"):
        assert get_template(template)
    from ratelimit_app.runtime import limiter

    assert limiter.logger is logging.getLogger("ratelimit_app")
