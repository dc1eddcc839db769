"""X-Forwarded-For from an address outside TRUSTED_PROXIES: warned of once per process, and
published for the readiness report (decision/forwarding.py), against the suite's real Redis."""

import json
import logging

import pytest
from django.test import Client

from ratelimit_app.decision.forwarding import (
    UntrustedForwarding,
    read_sighting,
    untrusted_forwarding_key,
)

from ..helpers import limiter, load_demo_data

WARNING_START = "ratelimit_app: a request from 127.0.0.1 carried X-Forwarded-For"


@pytest.fixture
def demo(db):
    load_demo_data()


def trust(settings, proxies):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "TRUSTED_PROXIES": proxies}


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "carried X-Forwarded-For" in r.getMessage()]


def test_requests_forwarded_by_an_untrusted_address_are_warned_of_once(demo, settings, caplog):
    trust(settings, ["10.0.0.0/8"])
    client = Client()
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        assert client.get("/hello/").status_code == 200  # no header: nothing to say
        assert limiter().untrusted_forwarding.seen is None
        for hop in ("203.0.113.5", "203.0.113.6", "198.51.100.1"):
            response = client.get("/hello/", HTTP_X_FORWARDED_FOR=hop)
            assert response.wsgi_request.ratelimit.identity.ip == "127.0.0.1"  # ignored
    found = warnings_of(caplog)
    assert len(found) == 1 and found[0].startswith(WARNING_START)
    assert "not in RATELIMIT_APP['TRUSTED_PROXIES']" in found[0]
    assert limiter().untrusted_forwarding.seen[0] == "127.0.0.1"


def test_a_trusted_proxy_forwarding_is_not_warned_of(demo, settings, caplog):
    trust(settings, ["127.0.0.1"])
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        response = Client().get("/hello/", HTTP_X_FORWARDED_FOR="203.0.113.5")
    assert response.wsgi_request.ratelimit.identity.ip == "203.0.113.5"
    assert warnings_of(caplog) == [] and limiter().untrusted_forwarding.seen is None


def test_the_sighting_is_published_once_by_the_flush(demo, settings, redis_client):
    trust(settings, [])
    Client().get("/hello/", HTTP_X_FORWARDED_FOR="203.0.113.5")
    key = untrusted_forwarding_key("rl")
    assert redis_client.get(key) is None  # not on the request path
    limiter().flusher.flush_now()
    stored = json.loads(redis_client.get(key))
    assert stored["address"] == "127.0.0.1" and 0 < redis_client.ttl(key) <= 24 * 3600
    assert read_sighting(redis_client, "rl")["address"] == "127.0.0.1"
    redis_client.delete(key)
    limiter().flusher.flush_now()
    assert redis_client.get(key) is None  # once per process


def test_a_failed_publish_is_tried_again(redis_server):
    watch = UntrustedForwarding(lambda: 1_700_000_000.0)
    watch.observe({"REMOTE_ADDR": "192.0.2.1", "HTTP_X_FORWARDED_FOR": "203.0.113.5"})
    redis_server.kill()
    client = redis_server.client()
    try:
        watch.publish(lambda: client, "rl")
        assert not watch.published
    finally:
        client.close()
    redis_server.start()
    client = redis_server.client()
    try:
        watch.publish(lambda: client, "rl")
        sighting = read_sighting(client, "rl")
    finally:
        client.close()
    assert watch.published
    assert (sighting["address"], sighting["at"]) == ("192.0.2.1", 1_700_000_000.0)


def test_a_broken_published_value_reads_as_none(redis_client):
    redis_client.set(untrusted_forwarding_key("rl"), b"{not json")
    assert read_sighting(redis_client, "rl") is None
