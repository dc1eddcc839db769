"""ratelimit_exempt: decorated views are never limited by the middleware."""

import io

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client, override_settings

from ratelimit_app.models import Rule

pytestmark = pytest.mark.django_db


def test_exempt_view_is_never_limited_nor_charged(redis_client):
    call_command("load_demo", stdout=io.StringIO())
    Rule.objects.filter(name="free-ip").update(burst=1)
    client = Client()
    config = {**settings.RATELIMIT_APP, "PROMETHEUS_ENABLED": True, "PROMETHEUS_TOKEN": "t"}
    with override_settings(RATELIMIT_APP=config):
        codes = {client.get("/ratelimit/metrics/", HTTP_AUTHORIZATION="Bearer t").status_code
                 for _ in range(5)}
    assert codes == {200}
    assert not list(redis_client.scan_iter("rl:{*"))  # no bucket was touched
    # the same client on a limited view: the 1-token IP bucket denies the second call
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
