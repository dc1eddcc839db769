"""Server-rendered SVG: requests per minute, allowed and denied stacked.

Colours come from CSS classes (``static/ratelimit_app/dashboard.css``) that use the admin's CSS
variables, so the chart follows the admin's light and dark themes; no charting library, no CDN.
"""

import datetime

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

__all__ = ["requests_chart", "count_axis"]

WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 24, 44
Y_TICKS = 4


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


def requests_chart(series):
    """Return the SVG (safe HTML) of ``series`` as ``metrics.read_series`` returns it.

    Every bar is a ``<g class="rl-bar">`` carrying ``data-minute``, ``data-allowed`` and
    ``data-denied`` (and a ``<title>`` tooltip), so tests and people can read the numbers.
    """
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
        if index % 10 == 0 or index == len(series) - 1:
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
        'aria-label="Requests per minute over the last hour, allowed and denied">'
        '{}{}{}{}{}</svg>',
        WIDTH, HEIGHT, mark_safe("".join(grid)), mark_safe("".join(bars)),
        mark_safe("".join(ticks)), axes, legend)
