"""The dashboard's 429 rate over the last hour and the last day, per plan and per rule: read from
the counts the metrics flush writes per minute and per hour, for a known set of decisions made
at known times (the recorder's and the flusher's clock seam; no sleeps)."""

import re

import pytest

from ratelimit_app.admin.dashboard.charts import rate_chart
from ratelimit_app.admin.dashboard.data import dashboard_data, hottest_callers
from ratelimit_app.admin.dashboard.rates import rate_rows, rates_over_time
from ratelimit_app.metrics import Flusher, Recorder

from ..helpers import limiter
from ..metrics.test_metrics import FakeClock, decision, ip_identity, key_identity, status

pytestmark = pytest.mark.django_db

HOUR = 3600
NOW = 1_700_020_000.0 + 30  # 30 s into a minute, 46 min 10 s into an hour (UTC)


def metrics_client():
    return limiter().store.metrics_client()


def record(clock, at, decisions):
    """Count ``decisions`` made at unix time ``at`` and flush them to the suite's Redis."""
    clock.now = at
    recorder = Recorder(clock=clock)
    for made in decisions:
        recorder.record(made)
    assert Flusher(recorder, metrics_client, clock=clock).flush_now() > 0


def free(allowed):
    """A free-plan client's decision on the rule free-ip (refused by it when not allowed)."""
    return decision(allowed, identity=ip_identity(plan="free"),
                    policies=[status("free-ip", short=not allowed)])


def pro(allowed):
    """A pro key's decision on the rules pro-key and global."""
    return decision(allowed, identity=key_identity(plan="pro"),
                    policies=[status("pro-key", short=not allowed, token="key.7"),
                              status("global", token="global")])


@pytest.fixture
def known_traffic():
    """50 minutes ago: free 4 allowed, 1 refused. 3 hours ago: pro 10 allowed, free 2
    refused. This minute: free 1 allowed, 3 refused; pro 1 refused by pro-key."""
    clock = FakeClock()
    record(clock, NOW - 50 * 60, [free(True)] * 4 + [free(False)])
    record(clock, NOW - 3 * HOUR, [pro(True)] * 10 + [free(False)] * 2)
    record(clock, NOW - 5, [free(True)] + [free(False)] * 3 + [pro(False)])


def totals(lines):
    return {line["name"]: (line["total_requests"], line["total_denied"], line["total_rate"])
            for line in lines}


def test_rates_per_plan_and_rule_over_the_last_hour_and_the_last_day(known_traffic):
    over_time = rates_over_time(limiter().reader, NOW)
    hour, day = over_time["hour"], over_time["day"]
    assert totals(hour["plan"]) == {"free": (9, 4, 44.4), "pro": (1, 1, 100.0)}
    assert totals(day["plan"]) == {"free": (11, 6, 54.5), "pro": (11, 1, 9.1)}
    # a rule's requests are those it was checked on; global refused none of pro's
    assert totals(hour["rule"]) == {"free-ip": (9, 4, 44.4), "pro-key": (1, 1, 100.0),
                                    "global": (1, 0, 0.0)}
    assert totals(day["rule"]) == {"free-ip": (11, 6, 54.5), "pro-key": (11, 1, 9.1),
                                   "global": (11, 0, 0.0)}
    assert (hour["requests"], hour["denied"], day["requests"], day["denied"]) == (10, 5, 22, 7)
    # the most refused first
    assert [line["name"] for line in day["plan"]] == ["free", "pro"]


def test_the_time_axis_fits_the_traffic(known_traffic):
    """Traffic began 50 minutes ago: the last hour in 12 points of 5 minutes, the free plan's
    dots where its requests were; it began 3 hours ago: the last 6 hours, an hour a point."""
    over_time = rates_over_time(limiter().reader, NOW)
    hour, day = over_time["hour"], over_time["day"]
    minute = int(NOW // 60) * 60
    assert (len(hour["points"]), hour["step_s"], hour["span_s"]) == (12, 300, HOUR)
    assert hour["points"][-1] == minute - 4 * 60 and hour["points"][0] == minute - 59 * 60
    free_line = next(line for line in hour["plan"] if line["name"] == "free")
    with_requests = [(start, r, d) for start, r, d, rate in zip(
        hour["points"], free_line["requests"], free_line["denied"], free_line["rate"]) if r]
    assert with_requests == [(minute - 54 * 60, 5, 1), (minute - 4 * 60, 4, 3)]
    assert free_line["rate"].count(None) == 10  # no requests: no rate, not 0 %
    assert hour["first_at"] == minute - 54 * 60
    assert (len(day["points"]), day["step_s"], day["span_s"]) == (6, HOUR, 6 * HOUR)
    assert day["points"][-1] == int(NOW // HOUR) * HOUR


def test_light_recent_traffic_is_spread_over_a_short_span():
    """Only this minute's requests: the last 15 minutes a minute a point, the last 6 hours an
    hour a point; nothing at all: the same spans and no line."""
    empty = rates_over_time(limiter().reader, NOW)
    assert empty["hour"]["plan"] == [] and empty["hour"]["first_at"] is None
    record(FakeClock(), NOW - 5, [free(False)])
    hour = rates_over_time(limiter().reader, NOW)["hour"]
    assert (len(hour["points"]), hour["step_s"]) == (15, 60)
    assert totals(hour["plan"]) == {"free": (1, 1, 100.0)}


def test_the_table_beside_the_chart_and_the_chart_agree(known_traffic):
    over_time = rates_over_time(limiter().reader, NOW)
    rows = rate_rows(over_time, "plan")
    assert [(row["name"], row["hour"], row["day"], row["drawn"]) for row in rows] == [
        ("free", {"requests": 9, "denied": 4, "rate": 44.4},
         {"requests": 11, "denied": 6, "rate": 54.5}, 0),
        ("pro", {"requests": 1, "denied": 1, "rate": 100.0},
         {"requests": 11, "denied": 1, "rate": 9.1}, 1)]
    svg = str(rate_chart("hour", over_time["hour"], "plan", {"free": 0, "pro": 1}))
    dots = re.findall(r'data-line="(\w+)" data-at="(\d+)" data-requests="(\d+)" '
                      r'data-denied="(\d+)"', svg)
    assert sorted((line, int(r), int(d)) for line, _at, r, d in dots) == [
        ("free", 4, 3), ("free", 5, 1), ("pro", 1, 1)]
    assert 'aria-label="429 rate per plan over the last hour: 10 requests, 5 refused (50.0 %)"' \
        in svg
    assert "free 75.0 %" in svg and "pro 100.0 %" in svg  # each line named at its last dot
    assert "Last hour, 5 minutes a point" in svg


def test_dashboard_data_carries_the_rates_and_one_table_of_callers(known_traffic):
    data = dashboard_data(now=NOW)
    assert totals(data["rates_over_time"]["day"]["plan"])["free"] == (11, 6, 54.5)
    assert [row["name"] for row in data["rate_table"]["rule"]] == ["free-ip", "pro-key",
                                                                   "global"]
    # the hot-key tables stay in the JSON; the page shows them as one, each caller once
    callers = data["callers"]
    assert [row["ref"] for row in callers] == ["ip:10.0.0.1", "key:7"]
    # (the pro key used no token in the last hour: it is in one ranking only)
    assert [row["ref"] for row in data["hot_keys"]["tokens"]] == ["ip:10.0.0.1"]
    assert [row["ref"] for row in data["hot_keys"]["denials"]] == ["ip:10.0.0.1", "key:7"]
    assert 'data-table="callers"' in data["html"]["callers"]
    assert data["html"]["callers"].count("<tr data-identity=") == 2
    assert 'data-rates-by="rule"' in data["html"]["rate_chart"]


def test_hottest_callers_merges_both_rankings_most_refused_first():
    def row(member, tokens, denials):
        return {"member": member, "display": member, "tokens": tokens, "denials": denials,
                "requests": tokens + denials}
    hot = {"denials": [row("a", 1, 9), row("b", 5, 2)],
           "tokens": [row("c", 50, 0), row("b", 5, 2), row("a", 1, 9)]}
    assert [r["member"] for r in hottest_callers(hot)] == ["a", "b", "c"]
    assert [r["member"] for r in hottest_callers(hot, limit=2)] == ["a", "b"]
