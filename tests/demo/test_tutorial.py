"""docs/tutorial/demo.md followed as written, step after step in its order, on the demo served
over HTTP (a live server whose address ``load_demo --server-url`` recorded, as ``make run``
does): each step answers as the page says it does, whatever the steps before it spent."""

import io
import re
import urllib.error
import urllib.request

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from ratelimit_app.models import QuotaAlert, Rule

from ..helpers import limiter, poll_until

pytestmark = pytest.mark.django_db(transaction=True)
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def curl(url, method="GET", **headers):
    """Return ``(status, headers, body)`` of one request, as curl shows them."""
    request = urllib.request.Request(url, method=method, headers=headers,
                                     data=b"" if method == "POST" else None)
    try:
        with OPENER.open(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.headers, refused.read()


def post_free_ip(admin, **numbers):
    """Send free-ip's admin form with ``numbers`` typed, the rest as it is; return the
    response."""
    rule = Rule.objects.get(name="free-ip")
    form = {"name": rule.name, "plan": rule.plan_id, "scope": rule.scope, "endpoint": "",
            "status": "enforce", "on_redis_failure": rule.on_redis_failure,
            "period_s_0": "1", "period_s_1": "minute", "lease": "0", "debt": "0",
            "alert_thresholds": "", **numbers}
    return admin.post(reverse("admin:ratelimit_app_rule_change", args=[rule.pk]), form)


def edit_free_ip(admin, **numbers):
    """Save free-ip with ``numbers`` typed; return the page's warnings."""
    response = post_free_ip(admin, **numbers)
    assert response.status_code == 302, response.context["adminform"].form.errors
    return [str(m) for m in get_messages(response.wsgi_request) if m.level_tag == "warning"]


def studio_daily_left(base):
    _, headers, _ = curl(f"{base}/api/items/", **{"X-Api-Key": "rk_dana_studio"})
    return int(re.search(r'"studio-daily";r=(\d+)', headers["RateLimit"])[1])


def test_the_demo_tutorial_works_in_the_order_written(live_server, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    base = live_server.url
    call_command("load_demo", server_url=base, stdout=io.StringIO())

    # Send requests: about 40 quick anonymous requests pass, then 429
    statuses = [curl(f"{base}/api/items/")[0] for _ in range(50)]
    assert 38 <= statuses.count(200) <= 45 and statuses[-1] == 429, statuses

    # Change a limit live: rate 30, burst 50, saved without a MAX_COST warning
    admin = Client()
    admin.force_login(get_user_model().objects.get(username="admin"))
    assert edit_free_ip(admin, rate="30", burst="50") == []
    poll_until(lambda: '"free-ip";q=50;w=100' in curl(f"{base}/api/items/")[1]["RateLimit-Policy"],
               what="the new burst served")
    # (a smaller burst saves with the warning the page explains; below 20 it is refused)
    assert "below MAX_COST (50)" in " ".join(edit_free_ip(admin, rate="30", burst="40"))
    refused = post_free_ip(admin, rate="30", burst="5")
    assert refused.status_code == 200
    assert "(20 tokens)" in refused.context["adminform"].form.errors["burst"][0]

    # Metered streams: dana's 40 words, then studio-daily has dropped by 41
    status, _, body = curl(f"{base}/api/generate/?words=40", **{"X-Api-Key": "rk_dana_studio"})
    assert status == 200 and b"event: done" in body
    assert studio_daily_left(base) == 500 - 41

    # Prepaid credits: the trial pays one report, the welcome credit five, then 402
    erin = {"X-Api-Key": "rk_erin_prepaid"}
    assert [curl(f"{base}/api/reports/", "POST", **erin)[0] for _ in range(7)] == \
        [202] * 6 + [402]

    # Watch it on the dashboard: the traffic command, no --url, finds the demo
    out = io.StringIO()
    call_command("ratelimit_traffic", requests=90, rps=0, stdout=out)
    report = out.getvalue()
    assert f"to {base}" in report and "error" not in report, report
    assert re.search(r"dana \(AI Studio key, streams\) +200: 3, 429: \d", report), report

    # Alerts and webhooks: the 50, 80 and 100 % of studio-daily crossed
    def thresholds():
        limiter().alerts.drain()  # (the live server's settles queue them; no alert thread here)
        return sorted(QuotaAlert.objects.values_list("threshold", flat=True))
    poll_until(lambda: thresholds() == [50, 80, 100], what="the alerts of 50, 80, 100 %")
    assert curl(f"{base}/api/generate/?words=10", **{"X-Api-Key": "rk_dana_studio"})[0] == 429
