"""The demo's metered endpoint, /api/generate/: a stream of generated words, each event's words
reported to the limiter (``request.ratelimit.charge``) before it is sent, and the caller charged
the words it was sent instead of the estimate it was admitted on."""

import json
import re

import pytest
from django.test import Client

from project.demo.views import MAX_WORDS, WORDS_PER_EVENT, _events, _words_asked
from ratelimit_app.models import EndpointCost
from tests.helpers import load_demo_data

DANA = {"X-Api-Key": "rk_dana_studio"}  # AI Studio: studio-daily, 500 words a day
DAILY = 500


class ChargesSeen:
    """Stands in for the request's Decision: records what the view reports."""

    def __init__(self):
        self.charges = []

    def charge(self, units):
        self.charges.append(units)


def parsed(events):
    """Return ``[(event name, data), ...]`` of server-sent event texts."""
    found = []
    for text in events:
        name, data = re.fullmatch(r"event: (\w+)\ndata: (.*)\n\n", text).groups()
        found.append((name, json.loads(data)))
    return found


@pytest.mark.parametrize("words", [1, WORDS_PER_EVENT, WORDS_PER_EVENT + 1, 123])
def test_each_event_is_charged_its_words_before_it_is_sent(words):
    decision = ChargesSeen()
    sent = []
    for text in _events(decision, words):
        name, data = parsed([text])[0]
        if name == "words":
            # reported before the client could see it: a client leaving now still pays it
            assert sum(decision.charges) == sum(sent) + data["words"]
            assert len(data["text"].split()) == data["words"]
            sent.append(data["words"])
    assert decision.charges == sent and sum(sent) == words
    assert max(sent) <= WORDS_PER_EVENT
    assert parsed([text]) == [("done", {"words": words})]


@pytest.mark.parametrize("raw, words", [
    (None, 50), ("7", 7), ("0", 1), (str(MAX_WORDS), MAX_WORDS), ("501", MAX_WORDS),
    ("9" * 5000, MAX_WORDS), ("-3", 50), ("2.5", 50), ("abc", 50), ("٣", 50),
])
def test_the_words_asked_are_clamped(raw, words):
    assert _words_asked(raw) == words


# What follows goes through the middleware: admitted on the estimate, settled at the close.

def remaining(response, policy):
    """Return the ``r`` of ``policy`` in the RateLimit header."""
    return int(re.search(rf'"{policy}";r=(\d+)', response["RateLimit"]).group(1))


def stream(client, words, *, read_events=None):
    """GET /api/generate/ as dana; read ``read_events`` events (all by default), then close
    the response (what the server does when the client has it all, or is gone). Returns the
    response and the events read."""
    response = client.get(f"/api/generate/?words={words}", headers=DANA)
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    events = []
    for text in response.streaming_content:
        events.append(text.decode())
        if read_events is not None and len(events) == read_events:
            break
    response.close()
    return response, parsed(events)


@pytest.fixture
def client(db):
    load_demo_data()
    return Client()


def test_a_stream_is_charged_the_words_it_sent_not_its_estimate(client):
    response, events = stream(client, 123)
    assert remaining(response, "studio-daily") == DAILY - 20  # admitted on the estimate
    assert events[-1] == ("done", {"words": 123})
    after = client.get("/api/items/", headers=DANA)
    assert remaining(after, "studio-daily") == DAILY - 123 - 1


def test_a_client_that_leaves_pays_for_the_words_generated_so_far(client):
    stream(client, 200, read_events=1)
    after = client.get("/api/items/", headers=DANA)
    assert remaining(after, "studio-daily") == DAILY - WORDS_PER_EVENT - 1


def test_streams_past_the_daily_quota_are_refused_once_it_is_spent(client):
    stream(client, 300)
    stream(client, 300)  # admitted on what was left (200), then charged past empty
    refused = client.get("/api/generate/?words=10", headers=DANA)
    assert refused.status_code == 429
    assert "studio-daily" in refused.json()["violated-policies"]


def test_without_metering_the_stream_costs_its_estimate(client):
    cost = EndpointCost.objects.get(endpoint="api:generate")
    cost.metered, cost.minimum = False, 0
    cost.save()
    stream(client, 123)  # its charge() calls are only logged
    after = client.get("/api/items/", headers=DANA)
    assert remaining(after, "studio-daily") == DAILY - 20 - 1
