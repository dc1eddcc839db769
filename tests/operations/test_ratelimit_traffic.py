"""The ratelimit_traffic command: loopback only, bounded, and its traffic reaches the limiter."""

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from project.demo.management.commands.ratelimit_traffic import check_loopback
from project.demo.models import ReceivedWebhook
from ratelimit_app.models import QuotaAlert, WebhookDelivery

from ..helpers import free_port, limiter, poll_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("url", ["http://example.com", "http://10.0.0.1:8000", "ftp://127.0.0.1",
                                 "http://0.0.0.0:8000", "not a url"])
def test_refuses_anything_but_loopback(url):
    with pytest.raises(CommandError):
        check_loopback(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/", "http://localhost:1", "http://[::1]:80",
                                 "https://127.8.9.10"])
def test_accepts_loopback(url):
    assert check_loopback(url) == url.rstrip("/")


@pytest.mark.parametrize("option", [{"duration": 0}, {"duration": 601}, {"requests": 0},
                                    {"rps": -1}])
def test_bounds_are_enforced(option):
    with pytest.raises(CommandError):
        call_command("ratelimit_traffic", **option, stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_sends_bounded_traffic_with_an_abusive_client(live_server, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    call_command("load_demo", stdout=io.StringIO())
    out = io.StringIO()
    call_command("ratelimit_traffic", url=live_server.url, requests=90, rps=0, stdout=out)
    report = out.getvalue()
    assert "Sent 90 requests" in report
    assert "scraper (anonymous, abusive)" in report and "429:" in report
    counts = limiter().recorder.counts()
    assert counts["all", "", "allowed"] + counts["all", "", "denied"] == 90
    assert counts["all", "", "denied"] > 0


def stored_thresholds():
    """Store the crossings queued in this process (the live server's settles queue them; tests
    run no alert thread) and return the thresholds of the stored alerts."""
    limiter().alerts.drain()
    return sorted(QuotaAlert.objects.values_list("threshold", flat=True))


@pytest.mark.django_db(transaction=True)
def test_one_run_crosses_the_studio_quotas_thresholds_and_the_receiver_gets_them(live_server,
                                                                                 settings):
    """dana's three streams of 200 words spend AI Studio's 500 a day (needs metered costs:
    admitted on their estimate, each would cost 20)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    call_command("load_demo", server_url=live_server.url, stdout=io.StringIO())
    out = io.StringIO()
    call_command("ratelimit_traffic", url=live_server.url, requests=90, rps=0, stdout=out)
    # (her fourth stream finds the quota spent)
    assert re.search(r"dana \(AI Studio key, streams\) +200: 3, 429: \d", out.getvalue())
    poll_until(lambda: stored_thresholds() == [50, 80, 100], what="the alerts of 50, 80, 100 %")
    assert set(QuotaAlert.objects.values_list("rule__name", flat=True)) == {"studio-daily"}

    call_command("ratelimit", "deliver", "--once", stdout=io.StringIO())
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"sent"}
    received = ReceivedWebhook.objects.all()
    assert sorted(row.alert()["threshold_percent"] for row in received) == [50, 80, 100]
    assert all(row.signature_valid for row in received)
    assert sorted(row.event for row in received) == [
        "quota.exhausted", "quota.threshold_crossed", "quota.threshold_crossed"]


def test_says_in_one_line_that_nothing_answers_and_sends_nothing():
    with pytest.raises(CommandError, match=r"^Nothing answers at http://127\.0\.0\.1:\d+: start "
                       r"the demo \(make run\) or pass the address it serves on, e\.g\. --url "):
        call_command("ratelimit_traffic", url=f"http://127.0.0.1:{free_port()}",
                     stdout=io.StringIO())


def test_in_a_second_terminal_it_warns_of_no_redis_it_does_not_use(tmp_path):
    """The demo's traffic command talks HTTP only: run from a terminal where nothing points at
    the demo (Redis on a port where none listens, a database without the demo, no server on
    $PORT), it prints one line and no system check about Redis; ``check`` still warns."""
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
           "SQLITE_PATH": str(tmp_path / "empty.sqlite3"), "PORT": str(free_port())}
    traffic = subprocess.run([sys.executable, "manage.py", "ratelimit_traffic"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=60)
    assert traffic.returncode == 1
    assert traffic.stdout == ""
    assert traffic.stderr.splitlines() == [
        f"CommandError: Nothing answers at http://127.0.0.1:{env['PORT']}: start the demo (make "
        f"run) or pass the address it serves on, e.g. --url http://127.0.0.1:8001."]
    check = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert "ratelimit_app.W004" in check.stderr + check.stdout
