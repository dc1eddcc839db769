"""bench/latency.py's choice of rate and its comparison: each round's rate is LOAD_SHARE of the
slowest variant of a server kind (read again every round), and a bare throttle whose added p99
is lost in the noise is not a divisor."""

import math

from bench import latency


class FakeServer:
    def __init__(self, name):
        self.name = name

    def url(self, path):
        return f"http://{self.name}{path}"


def test_each_kind_runs_at_its_share_of_its_slowest_variant(monkeypatch):
    readings = {"none": 2000.0, "lua": 1000.0, "ours": 1200.0,
                "none-asgi": 600.0, "lua-asgi": 500.0, "ours-asgi": 450.0}
    monkeypatch.setattr(latency.servers, "wrk", lambda url, seconds: {
        "rps": readings[url.split("/")[2]], "non_2xx": 0, "socket_errors": ""})
    running = {name: FakeServer(name) for name in readings}
    rates, read = latency.measure_rates(running)
    assert rates == {"wsgi": round(1000 * latency.LOAD_SHARE),
                     "asgi": round(450 * latency.LOAD_SHARE)}
    assert {name: reading["rps"] for name, reading in read.items()} == readings


def test_the_rates_of_the_rounds_are_shown_as_a_range():
    assert latency.rate_text([400, 400]) == "400"
    assert latency.rate_text([412, 349, 566]) == "349–566"


def test_a_bare_throttle_lost_in_the_noise_is_no_divisor():
    assert latency.added_ratio(2.0, 4.0) == 0.5
    assert latency.added_ratio(-0.5, -0.7) == 0.0  # neither adds anything
    assert math.isinf(latency.added_ratio(1.68, -0.70))  # ours adds, the bare throttle not


def test_the_rounds_are_pooled():
    assert latency.pooled([[1.0, 2.0], [3.0]]) == [1.0, 2.0, 3.0]
