"""A caller's day as an SVG chart: requests per hour, allowed and refused stacked.

Drawn in the dashboard chart's style (admin/dashboard/charts.py: the same classes, so the same
colours in light and dark, and the same whole-step axis); bars per hour instead of per minute.
"""

import datetime

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from ..dashboard.charts import count_axis

__all__ = ["hours_chart"]

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 24, 44
Y_TICKS = 4


def _px(value):
    """A coordinate as text (format_html escapes its arguments to strings before formatting)."""
    return f"{value:.1f}"


def _hour_label(unix_s):
    moment = datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc)
    return timezone.localtime(moment).strftime("%H:%M")


def hours_chart(hours, what="Requests per hour over the last 24 hours"):
    """Return the SVG (safe HTML) of ``hours`` (``{"hour", "allowed", "refused"}``, oldest
    first). Each bar is a ``<g class="rl-bar">`` with ``data-hour``, ``data-allowed`` and
    ``data-refused`` and a ``<title>`` tooltip."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top, step = count_axis(max((row["allowed"] + row["refused"] for row in hours), default=0),
                           Y_TICKS)
    slot = plot_w / max(1, len(hours))
    bar_w = max(1.0, slot * 0.8)

    def y(value):
        return TOP + plot_h - plot_h * value / top

    grid = format_html_join("", '<line class="rl-grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                            '<text class="rl-tick" x="{}" y="{}" text-anchor="end">{}</text>',
                            ((LEFT, WIDTH - RIGHT, _px(y(step * i)), _px(y(step * i)), LEFT - 6,
                              _px(y(step * i) + 4), step * i) for i in range(Y_TICKS + 1)))
    bars, ticks = [], []
    for index, row in enumerate(hours):
        x = LEFT + index * slot + (slot - bar_w) / 2
        label = _hour_label(row["hour"])
        allowed_top, refused_top = y(row["allowed"]), y(row["allowed"] + row["refused"])
        bars.append(format_html(
            '<g class="rl-bar" data-hour="{}" data-allowed="{}" data-refused="{}">'
            '<title>{}: {} allowed, {} refused</title>'
            '<rect class="rl-allowed" x="{}" y="{}" width="{}" height="{}"/>'
            '<rect class="rl-denied" x="{}" y="{}" width="{}" height="{}"/></g>',
            label, row["allowed"], row["refused"], label, row["allowed"], row["refused"],
            _px(x), _px(allowed_top), _px(bar_w), _px(TOP + plot_h - allowed_top),
            _px(x), _px(refused_top), _px(bar_w), _px(allowed_top - refused_top)))
        if index % 3 == 0 or index == len(hours) - 1:
            ticks.append(format_html(
                '<text class="rl-tick" x="{}" y="{}" text-anchor="middle">{}</text>',
                _px(x + bar_w / 2), TOP + plot_h + 16, label))
    axes = format_html(
        '<line class="rl-axis" x1="{l}" x2="{r}" y1="{b}" y2="{b}"/>'
        '<line class="rl-axis" x1="{l}" x2="{l}" y1="{t}" y2="{b}"/>'
        '<text class="rl-axis-title" x="{cx}" y="{h}" text-anchor="middle">Hour ({zone})</text>'
        '<text class="rl-axis-title" x="14" y="{cy}" text-anchor="middle" '
        'transform="rotate(-90 14 {cy})">Requests per hour</text>',
        l=LEFT, r=WIDTH - RIGHT, b=TOP + plot_h, t=TOP, cx=LEFT + plot_w / 2, h=HEIGHT - 6,
        zone=timezone.get_current_timezone_name(), cy=TOP + plot_h / 2)
    legend = format_html(
        '<rect class="rl-allowed" x="{}" y="6" width="10" height="10"/>'
        '<text class="rl-legend" x="{}" y="15">allowed</text>'
        '<rect class="rl-denied" x="{}" y="6" width="10" height="10"/>'
        '<text class="rl-legend" x="{}" y="15">refused (429)</text>',
        WIDTH - RIGHT - 196, WIDTH - RIGHT - 182, WIDTH - RIGHT - 106, WIDTH - RIGHT - 92)
    return format_html(
        '<svg class="rl-chart" viewBox="0 0 {} {}" role="img" aria-label="{}">{}{}{}{}{}</svg>',
        WIDTH, HEIGHT, what, grid, mark_safe("".join(bars)), mark_safe("".join(ticks)), axes,
        legend)
