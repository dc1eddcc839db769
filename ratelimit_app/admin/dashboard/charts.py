"""Server-rendered SVG: requests per minute, allowed and denied stacked; the 429 rate over time,
a line per plan or rule.

Colours come from CSS classes (``static/ratelimit_app/dashboard.css``) that use the admin's CSS
variables, so the chart follows the admin's light and dark themes; no charting library, no CDN.
"""

import datetime

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from .rates import duration_words, range_summary

__all__ = ["requests_chart", "since_traffic", "rate_chart", "count_axis"]

WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 24, 44
Y_TICKS = 4
# the requests chart spans the minutes since traffic began, never fewer than these: light or
# recent traffic is spread over the chart instead of being one bar against its right edge
MIN_MINUTES_SHOWN = 15


def _whole_steps():
    """Yield 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, … (readable whole steps)."""
    yield from (1, 2, 5)
    magnitude = 10
    while True:
        yield from (magnitude, 2 * magnitude, 5 * magnitude // 2, 5 * magnitude)
        magnitude *= 10


def count_axis(value, ticks=Y_TICKS):
    """Return ``(top, step)`` of a y axis for counts up to ``value``: ``ticks`` intervals of a
    whole, readable step, so every tick label is an integer (the old axis split a top of 5 in
    four and labelled 1.25 requests)."""
    for step in _whole_steps():
        if step * ticks >= value:
            return step * ticks, step


def _px(value):
    """Format a coordinate (format_html escapes its arguments to strings first, so numbers are
    formatted here)."""
    return f"{value:.1f}"


def _minute_label(unix_s):
    moment = datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc)
    return timezone.localtime(moment).strftime("%H:%M")


def since_traffic(series, least=MIN_MINUTES_SHOWN):
    """Return the tail of ``series`` (oldest minute first) from its first minute with traffic,
    at least its last ``least`` minutes (all of it when it is that short)."""
    first = next((index for index, row in enumerate(series)
                  if row["allowed"] or row["denied"]), len(series))
    return series[min(first, max(0, len(series) - least)):]


def requests_chart(series):
    """Return the SVG (safe HTML) of ``series`` as ``metrics.read_series`` returns it, from
    the minute its traffic began (``since_traffic``).

    Every bar is a ``<g class="rl-bar">`` carrying ``data-minute``, ``data-allowed`` and
    ``data-denied`` (and a ``<title>`` tooltip), so tests and people can read the numbers.
    """
    series = since_traffic(series)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top, step = count_axis(max((row["allowed"] + row["denied"] for row in series), default=0))
    slot = plot_w / max(1, len(series))
    bar_w = max(1.0, slot * 0.8)

    def y(value):
        return TOP + plot_h - plot_h * value / top

    grid = []
    for index in range(Y_TICKS + 1):
        value = step * index
        label = str(value)
        grid.append(format_html(
            '<line class="rl-grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
            '<text class="rl-tick" x="{}" y="{}" text-anchor="end">{}</text>',
            LEFT, WIDTH - RIGHT, _px(y(value)), _px(y(value)), LEFT - 6, _px(y(value) + 4), label))

    bars, ticks = [], []
    for index, row in enumerate(series):
        x = LEFT + index * slot + (slot - bar_w) / 2
        label = _minute_label(row["minute"])
        allowed_top, denied_top = y(row["allowed"]), y(row["allowed"] + row["denied"])
        bars.append(format_html(
            '<g class="rl-bar" data-minute="{}" data-allowed="{}" data-denied="{}">'
            '<title>{}: {} allowed, {} denied</title>'
            '<rect class="rl-allowed" x="{}" y="{}" width="{}" height="{}"/>'
            '<rect class="rl-denied" x="{}" y="{}" width="{}" height="{}"/></g>',
            label, row["allowed"], row["denied"], label, row["allowed"], row["denied"],
            _px(x), _px(allowed_top), _px(bar_w), _px(TOP + plot_h - allowed_top),
            _px(x), _px(denied_top), _px(bar_w), _px(allowed_top - denied_top)))
        if index % max(1, len(series) // 6) == 0 or index == len(series) - 1:
            ticks.append(format_html(
                '<text class="rl-tick" x="{}" y="{}" text-anchor="middle">{}</text>',
                _px(x + bar_w / 2), TOP + plot_h + 16, label))

    zone = timezone.get_current_timezone_name()
    axes = format_html(
        '<line class="rl-axis" x1="{l}" x2="{r}" y1="{b}" y2="{b}"/>'
        '<line class="rl-axis" x1="{l}" x2="{l}" y1="{t}" y2="{b}"/>'
        '<text class="rl-axis-title" x="{cx}" y="{h}" text-anchor="middle">Time ({zone})</text>'
        '<text class="rl-axis-title" x="14" y="{cy}" text-anchor="middle" '
        'transform="rotate(-90 14 {cy})">Requests per minute</text>',
        l=LEFT, r=WIDTH - RIGHT, b=TOP + plot_h, t=TOP, cx=LEFT + plot_w / 2, h=HEIGHT - 6,
        zone=zone, cy=TOP + plot_h / 2)
    legend = format_html(
        '<rect class="rl-allowed" x="{}" y="6" width="10" height="10"/>'
        '<text class="rl-legend" x="{}" y="15">allowed</text>'
        '<rect class="rl-denied" x="{}" y="6" width="10" height="10"/>'
        '<text class="rl-legend" x="{}" y="15">denied (429)</text>',
        WIDTH - RIGHT - 190, WIDTH - RIGHT - 176, WIDTH - RIGHT - 100, WIDTH - RIGHT - 86)
    return format_html(
        '<svg class="rl-chart" viewBox="0 0 {} {}" role="img" '
        'aria-label="Requests per minute over the last {} minutes, allowed and denied">'
        '{}{}{}{}{}</svg>',
        WIDTH, HEIGHT, len(series), mark_safe("".join(grid)), mark_safe("".join(bars)),
        mark_safe("".join(ticks)), axes, legend)


RATE_W, RATE_H = 600, 210
# the right margin holds each line's label at its last point ("free 56.2 %")
RATE_LEFT, RATE_RIGHT, RATE_TOP, RATE_BOTTOM = 48, 128, 12, 38
END_LABEL_GAP = 13  # px between two end labels' baselines
END_LABEL_CHARS = 16  # a longer name is cut (the table beside the chart has it whole)


def _clock(unix_s):
    moment = timezone.localtime(datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc))
    return moment.strftime("%H:%M")


def _runs(rates):
    """Return the runs of consecutive indexes of ``rates`` that hold a rate (not None)."""
    runs, run = [], []
    for index, rate in enumerate(rates):
        if rate is None:
            runs, run = runs + [run] if run else runs, []
        else:
            run.append(index)
    return runs + [run] if run else runs


def _rate_axis(lines):
    """Return ``(top, step)`` of the y axis in percent: whole steps, at most 100 %."""
    highest = max((rate for line in lines for rate in line["rate"] if rate is not None),
                  default=0)
    top, step = count_axis(max(highest, 1))
    return (100, 25) if top > 100 else (top, step)


def rate_chart(range_name, range_data, dimension, drawn):
    """Return the SVG (safe HTML) of the 429 rate over ``range_data`` (one range of
    ``rates.rates_over_time``) per ``dimension`` ("plan" or "rule"): a line per name in
    ``drawn`` ({name: colour index}), a dot at every point that had requests (a lone request is
    seen, not lost at an edge), broken where there were none (no rate, not 0 %). Its time axis
    spans the range's span (``rates.py``: the shortest that holds its traffic) with clock
    times. Every dot is a ``<circle class="rl-point">`` with ``data-line``, ``data-at``,
    ``data-requests``, ``data-denied`` and a ``<title>``; the ``aria-label`` says the range in
    words (the table beside it has the numbers)."""
    points = range_data["points"]
    lines = [line for line in range_data[dimension] if line["name"] in drawn]
    plot_w, plot_h = RATE_W - RATE_LEFT - RATE_RIGHT, RATE_H - RATE_TOP - RATE_BOTTOM
    top, step = _rate_axis(lines)
    slot = plot_w / max(1, len(points))

    def x(index):
        return RATE_LEFT + (index + 0.5) * slot

    def y(rate):
        return RATE_TOP + plot_h - plot_h * rate / top

    parts = []
    for index in range(Y_TICKS + 1):
        value = step * index
        parts.append(format_html(
            '<line class="rl-grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
            '<text class="rl-tick" x="{}" y="{}" text-anchor="end">{} %</text>',
            RATE_LEFT, RATE_W - RATE_RIGHT, _px(y(value)), _px(y(value)), RATE_LEFT - 5,
            _px(y(value) + 4), value))
    every = range_data["label_every"]
    step_s = range_data["step_s"]
    for index, start in enumerate(points):
        if index % every == 0:
            parts.append(format_html(
                '<line class="rl-axis" x1="{x}" x2="{x}" y1="{b}" y2="{t}"/>'
                '<text class="rl-tick" x="{x}" y="{ty}" text-anchor="middle">{label}</text>',
                x=_px(x(index)), b=RATE_TOP + plot_h, t=RATE_TOP + plot_h + 4,
                ty=RATE_TOP + plot_h + 16, label=_clock(start)))
    parts.append(format_html(
        '<line class="rl-axis" x1="{l}" x2="{r}" y1="{b}" y2="{b}"/>'
        '<text class="rl-axis-title" x="{cx}" y="{h}" text-anchor="middle">{title}</text>',
        l=RATE_LEFT, r=RATE_W - RATE_RIGHT, b=RATE_TOP + plot_h, cx=RATE_LEFT + plot_w / 2,
        h=RATE_H - 4, title=f"Last {duration_words(range_data['span_s']).removeprefix('an ')}, "
                            f"{duration_words(step_s)} a point "
                            f"({timezone.get_current_timezone_name()})"))
    for line in lines:
        colour = drawn[line["name"]]
        for run in _runs(line["rate"]):
            if len(run) > 1:
                coordinates = " ".join(f"{x(i):.1f},{y(line['rate'][i]):.1f}" for i in run)
                parts.append(format_html('<polyline class="rl-line rl-line-{}" points="{}"/>',
                                         colour, coordinates))
        for index, rate in enumerate(line["rate"]):
            if rate is None:
                continue
            start = points[index]
            parts.append(format_html(
                '<circle class="rl-point rl-line-{}" cx="{}" cy="{}" r="3" data-line="{}" '
                'data-at="{}" data-requests="{}" data-denied="{}"><title>{}, {} to {}: '
                '{} of {} refused ({} %)</title></circle>',
                colour, _px(x(index)), _px(y(rate)), line["name"], start,
                line["requests"][index], line["denied"][index], line["name"], _clock(start),
                _clock(start + step_s), line["denied"][index], line["requests"][index], rate))
    parts.extend(_end_labels(lines, x, y))
    if not lines:
        parts.append(format_html(
            '<text class="rl-chart-empty" x="{}" y="{}" text-anchor="middle">'
            'No requests in the {}</text>', RATE_LEFT + plot_w / 2, RATE_TOP + plot_h / 2,
            range_data["words"]))
    return format_html(
        '<svg class="rl-chart rl-rate-chart" viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'data-range="{}" data-dimension="{}">{}</svg>',
        RATE_W, RATE_H, _rate_label(range_data, dimension), range_name, dimension,
        mark_safe("".join(parts)))


def _end_labels(lines, x, y):
    """Label each line at its last point with its name and rate there, so a line reads without
    the legend and a lone point of light traffic is named where it stands. Labels are moved
    apart vertically (never more than needed) so that lines at the same rate stay readable."""
    labels = []
    for line in lines:
        last = max((i for i, rate in enumerate(line["rate"]) if rate is not None), default=None)
        if last is not None:
            name, rate = line["name"], line["rate"][last]
            name = name if len(name) <= END_LABEL_CHARS else name[:END_LABEL_CHARS - 1] + "…"
            labels.append([y(rate) + 4, x(last) + 8, f"{name} {rate} %"])
    labels.sort()
    for above, below in zip(labels, labels[1:]):  # down, apart
        below[0] = max(below[0], above[0] + END_LABEL_GAP)
    lowest = RATE_H - RATE_BOTTOM + 4
    for label in reversed(labels):  # then up, where the pile went below the plot
        label[0] = min(label[0], lowest)
        lowest = label[0] - END_LABEL_GAP
    return [format_html('<text class="rl-end-label" x="{}" y="{}">{}</text>', _px(lx), _px(ly),
                        text) for ly, lx, text in labels]


def _rate_label(range_data, dimension):
    """The chart's accessible name: what it draws and, in words, what it holds."""
    return f"429 rate per {dimension} over the {range_summary(range_data)}"
