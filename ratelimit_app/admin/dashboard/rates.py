"""The 429 rate over the last hour and the last day, per plan and per rule: the dashboard's lead
chart and the table beside it.

Read from the per-minute and per-hour counts the metrics flush already writes (each holds every
plan's and rule's allowed, denied and checked counts: ``metrics/fields.py``), so the chart costs
the request path and the flush nothing; its size is bounded by the configured plans and rules,
never by what clients send.

The time axis fits the traffic: a range is drawn over the shortest of its spans that holds all
its requests (the last 15 minutes a minute a point, when traffic began 10 minutes ago; the last
hour 5 minutes a point, once it began 40 minutes ago), so light or recent traffic is spread
over the chart instead of being one point squeezed against its right edge. The totals are
always the whole range's.
"""

from .text import counted

__all__ = ["RANGES", "LINES_SHOWN", "rates_over_time", "rate_rows", "range_summary",
           "duration_words"]

# Range name -> (its words, resolution read, slots read, its spans). A span is (slots drawn,
# slots a point, a time label every so many points), the shortest first.
RANGES = {
    "hour": ("last hour", "minute", 60, ((15, 1, 3), (30, 2, 3), (60, 5, 3))),
    "day": ("last day", "hour", 24, ((6, 1, 1), (12, 1, 2), (24, 1, 4))),
}
# Lines drawn per chart (the most refused first); every plan and rule is in the table.
LINES_SHOWN = 5


def _rate(denied, requests):
    """The 429 rate in percent, rounded to 0.1; None without requests (no rate, not 0 %)."""
    return round(100 * denied / requests, 1) if requests else None


def _requests_and_denied(dimension, outcomes):
    """A plan's requests are what it allowed and refused; a rule's, the requests it was checked
    on (a rule that never refused was still checked)."""
    denied = outcomes.get("denied", 0)
    if dimension == "rule":
        return outcomes.get("checked", 0), denied
    return outcomes.get("allowed", 0) + denied, denied


def _points(slots, per_point):
    """Group ``slots`` (``[(start, counts)]``, oldest first) into points of ``per_point``."""
    return [(slots[index][0], [counts for _, counts in slots[index:index + per_point]])
            for index in range(0, len(slots), per_point)]


def _lines(points, dimension):
    """Return one line per name of ``dimension`` seen in ``points``, the most refused first."""
    names = {name for _, group in points for counts in group for name in counts[dimension]}
    lines = []
    for name in names:
        requests, denied = [], []
        for _, group in points:
            pairs = [_requests_and_denied(dimension, counts[dimension].get(name, {}))
                     for counts in group]
            requests.append(sum(pair[0] for pair in pairs))
            denied.append(sum(pair[1] for pair in pairs))
        total_requests, total_denied = sum(requests), sum(denied)
        if not total_requests and not total_denied:
            continue
        lines.append({"name": name, "requests": requests, "denied": denied,
                      "rate": [_rate(d, r) for r, d in zip(requests, denied)],
                      "total_requests": total_requests, "total_denied": total_denied,
                      "total_rate": _rate(total_denied, total_requests) or 0.0})
    return sorted(lines, key=lambda line: (-line["total_denied"], -line["total_requests"],
                                           line["name"]))


def _span(slots, spans):
    """Return the shortest of ``spans`` that holds every slot with a count."""
    counted = [index for index, (_, counts) in enumerate(slots)
               if any(items for items in counts.values())]
    needed = len(slots) - counted[0] if counted else 0
    return next((span for span in spans if span[0] >= needed), spans[-1])


def rates_over_time(reader, now):
    """Return ``{range name: {"words", "span_s", "step_s", "label_every", "points": [unix
    start], "plan": lines, "rule": lines, "requests", "denied", "first_at"}}`` for each of
    RANGES, read with ``reader`` (a ``metrics.Reader``) at unix time ``now``. ``points`` are
    the starts of the points drawn (the span that fits the traffic, see the module docstring),
    ``step_s`` their length. A line is ``{"name", "requests", "denied", "rate"}`` (lists, one
    item per point; a rate is None where there was no request) plus its totals over the whole
    range (``total_requests``, ``total_denied``, ``total_rate``); ``first_at`` is the start of
    the first point with a request (None without any). Raises what the reader raises (Redis
    errors)."""
    result = {}
    for name, (words, resolution, count, spans) in RANGES.items():
        slots = reader.slot_breakdowns(resolution, count, now=now)
        drawn, per_point, label_every = _span(slots, spans)
        # the slots before the span hold no count: the span's totals are the range's
        points = _points(slots[-drawn:], per_point)
        plans = _lines(points, "plan")
        slot_s = slots[1][0] - slots[0][0] if len(slots) > 1 else 60
        with_requests = [start for index, (start, _) in enumerate(points)
                         if any(line["requests"][index] for line in plans)]
        result[name] = {
            "words": words, "span_s": drawn * slot_s, "step_s": per_point * slot_s,
            "label_every": label_every, "points": [start for start, _ in points],
            "plan": plans, "rule": _lines(points, "rule"),
            "requests": sum(line["total_requests"] for line in plans),
            "denied": sum(line["total_denied"] for line in plans),
            "first_at": with_requests[0] if with_requests else None,
        }
    return result


def rate_rows(over_time, dimension):
    """Return the table beside the chart: one row per plan or rule (``dimension``) with its
    requests, refusals and 429 rate over each range, the most refused in the last hour first,
    then over the day: ``{"name", "hour": {"requests", "denied", "rate"}, "day": {...},
    "drawn"}`` (``drawn``: its index among the chart's lines, or None)."""
    rows = {}
    for range_name in RANGES:
        for line in over_time[range_name][dimension]:
            row = rows.setdefault(line["name"], {"name": line["name"]})
            row[range_name] = {"requests": line["total_requests"], "denied": line["total_denied"],
                               "rate": line["total_rate"]}
    empty = {"requests": 0, "denied": 0, "rate": 0.0}
    for row in rows.values():
        for range_name in RANGES:
            row.setdefault(range_name, empty)
    ordered = sorted(rows.values(), key=lambda row: (
        -row["hour"]["denied"], -row["day"]["denied"], -row["day"]["requests"], row["name"]))
    for index, row in enumerate(ordered):
        row["drawn"] = index if index < LINES_SHOWN else None
    return ordered


def duration_words(seconds):
    """Return a span or a step in words: "15 minutes", "an hour", "6 hours", "a minute"."""
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return "an hour" if hours == 1 else f"{hours} hours"
    minutes = seconds // 60
    return "a minute" if minutes == 1 else f"{minutes} minutes"


def range_summary(range_data):
    """Return a range in words, for the chart's accessible name and its caption: "last hour:
    120 requests, 45 refused (37.5 %), since 10:40" (the times are the caller's to format:
    ``first_at`` stays a unix time here)."""
    requests, denied = range_data["requests"], range_data["denied"]
    if not requests:
        return f"{range_data['words']}: no requests"
    return (f"{range_data['words']}: {counted(requests, 'request')}, {denied} refused "
            f"({_rate(denied, requests)} %)")
