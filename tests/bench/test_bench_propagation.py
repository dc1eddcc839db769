"""make bench's config propagation section: what it makes of the responses it recorded (the
delays from an edit's publication to each worker's first decision on it, the stale decisions)
and the verdicts it prints."""

import math

from bench.propagation import Edit, Response, analyse, percentile, report, summary

EDITS = [Edit(published_at=10.0, version="v1"), Edit(published_at=11.0, version="v2")]


def response(started, ended, version, worker=1, status=200):
    return Response(started=started, ended=ended, status=status, version=version, worker=worker)


def test_delay_runs_from_the_publication_and_answer_from_the_later_request_start():
    responses = [
        response(9.9, 9.95, "v0", worker=1),
        response(9.99, 10.02, "v1", worker=1),   # started before the publication
        response(10.30, 10.31, "v1", worker=2),  # the first request to reach worker 2
        response(10.40, 10.41, "v1", worker=2),  # not its first: ignored
        response(11.05, 11.06, "v2", worker=1),
        response(11.50, 11.52, "v2", worker=2),
    ]
    analysis = analyse(responses, EDITS, workers=[1, 2], initial_version="v0")
    assert [round(d) for d in analysis["delays_ms"]] == [20, 310, 60, 520]
    assert [round(a) for a in analysis["answer_ms"]] == [20, 10, 10, 20]
    assert analysis["unobserved"] == 0 and analysis["pairs"] == 4
    assert analysis["stale_per_edit"] == [0, 0]


def test_a_request_started_after_a_publication_and_decided_on_older_rules_is_stale():
    responses = [
        response(9.98, 10.05, "v0"),   # started before the edit: not stale
        response(10.10, 10.11, "v0"),  # after edit 0, on the version before it
        response(11.20, 11.21, "v1"),  # after edit 1, on edit 0's
        response(11.30, 11.31, "v0"),  # after edit 1, on the first version
        response(11.40, 11.41, "v2"),
    ]
    analysis = analyse(responses, EDITS, workers=[1], initial_version="v0")
    assert analysis["stale_per_edit"] == [1, 2]
    assert summary(analysis)["stale_total"] == 3
    assert summary(analysis)["stale_max_per_edit"] == 2


def test_a_worker_that_never_answered_on_an_edits_version_is_unobserved_not_delayed():
    # worker 2 got no request between the two edits, then answered on the second's version
    responses = [response(10.2, 10.21, "v1", worker=1), response(11.2, 11.21, "v2", worker=2)]
    analysis = analyse(responses, EDITS, workers=[1, 2], initial_version="v0")
    assert analysis["unobserved"] == 2  # (edit 0, worker 2) and (edit 1, worker 1)
    assert len(analysis["delays_ms"]) == 2


def test_failed_requests_and_versions_from_elsewhere_are_counted_apart():
    responses = [response(10.1, 10.2, None, status=0), response(10.1, 10.2, "v1", status=429),
                 response(10.3, 10.31, "someone-elses"), response(10.4, 10.41, "v1")]
    analysis = analyse(responses, EDITS, workers=[1], initial_version="v0")
    assert (analysis["errors"], analysis["unknown_versions"]) == (2, 1)
    assert analysis["stale_per_edit"] == [0, 0]


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile([7.0], 0.99) == 7.0
    assert math.isnan(percentile([], 0.5))


def phase(delays_ms, answer_ms, stale_per_edit):
    analysis = {"delays_ms": delays_ms, "answer_ms": answer_ms, "unobserved": 0,
                "pairs": len(delays_ms), "stale_per_edit": stale_per_edit, "errors": 0,
                "unknown_versions": 0, "requests": 100, "latency_p50_ms": 2.0,
                "latency_p99_ms": 9.0, "save_ms": [30.0, 40.0]}
    return analysis


def test_the_verdicts():
    cpu = {"watching_ms_per_s": 3.0, "baseline_ms_per_s": 1.0, "added_ms_per_s": 2.0,
           "seconds": 5.0}
    phases = {"idle": phase([400.0, 900.0], [5.0, 12.0], [0, 0]),
              "load": phase([20.0, 160.0], [20.0, 160.0], [0, 1])}
    result = report(phases, cpu, watch_interval_s=0.05, edits={"idle": 2, "load": 2})
    verdicts = result["results"]["verdicts"]
    # idle is judged from each worker's first request after the edit; load from the publication
    assert verdicts == {"stale": "NOT met", "idle_p99": "met", "load_p99": "NOT met",
                        "watcher_cpu": "met"}
    assert result["results"]["targets_ms"] == {"delay_p99": 150.0}
    assert result["results"]["watcher_cpu"]["share_of_core"] == 0.002
    assert all(row[0].startswith("6. ") for row in result["targets"])
