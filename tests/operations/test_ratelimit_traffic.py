"""The ratelimit_traffic command: loopback only, bounded, and its traffic reaches the limiter."""

import io

import pytest
from django.core.management import CommandError, call_command

from project.demo.management.commands.ratelimit_traffic import check_loopback

from ..helpers import limiter


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
