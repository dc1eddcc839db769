"""Requests that never reach a view are charged too (issue 50 §2): an unresolved URL, and a
request a middleware above QuotaMiddleware refuses (CSRF), get the charge and the RateLimit
headers of the rules for every endpoint; an exempt path stays free."""

import pytest
from django.test import Client

from ..helpers import limiter, load_demo_data, use_fake_clock

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo():
    load_demo_data()
    use_fake_clock()
    limiter().policies.reset()


@pytest.mark.parametrize("path", ["/HELLO/", "/hello//", "/no/such/page"])
def test_an_unresolved_url_is_charged_with_the_global_rule(demo, path):
    response = Client().get(path)
    assert response.status_code == 404
    assert '"global"' in response["RateLimit-Policy"]
    decision = response.wsgi_request.ratelimit
    assert decision.allowed and decision.endpoint == ""
    assert "global" in [status.name for status in decision.policies]


def test_a_request_refused_by_csrf_above_is_charged(demo):
    client = Client(enforce_csrf_checks=True)
    response = client.generic("PROPFIND", "/hello/")
    assert response.status_code == 403  # CsrfViewMiddleware, before QuotaMiddleware's turn
    assert '"global"' in response["RateLimit-Policy"]


def test_a_flood_of_unresolved_urls_is_refused_when_its_quota_is_spent(demo):
    from ratelimit_app.models import Rule

    Rule.objects.filter(name="global").update(burst=3)  # (policies reset below)
    limiter().policies.reset()
    client = Client()
    statuses = [client.get(f"/missing-{i}/").status_code for i in range(5)]
    assert statuses[:3] == [404] * 3 and 429 in statuses[3:]


def test_exempt_paths_stay_free(demo):
    response = Client().get("/admin/no-such-page/")
    assert "RateLimit-Policy" not in response
