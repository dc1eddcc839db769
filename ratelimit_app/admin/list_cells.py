"""Short list cells shared by the app's model admins: a list reads at a glance when each cell
is a few words on one or two lines (issue 49: rows at most 60 px high, no list wider than a
1280 px screen beside the admin's sidebars)."""

from django.utils import timezone
from django.utils.html import format_html

__all__ = ["day", "moment", "wrapping"]


def day(value):
    """Return the local day of the datetime ``value`` as '01 Dec 2026' ('—' for None)."""
    return timezone.localtime(value).strftime("%d %b %Y") if value else "—"


def moment(value):
    """Return the datetime ``value`` as '01 Dec 21:39' in the current zone, with the year
    only when it is not this year's ('—' for None)."""
    if not value:
        return "—"
    local = timezone.localtime(value)
    same_year = local.year == timezone.localtime().year
    return local.strftime("%d %b %H:%M" if same_year else "%d %b %Y %H:%M")


def wrapping(text):
    """Return ``text`` (a URL, a long identifier) as HTML that wraps anywhere instead of
    widening its column (``.rl-wrap`` in static/ratelimit_app/admin.css)."""
    return format_html('<span class="rl-wrap">{}</span>', text)
