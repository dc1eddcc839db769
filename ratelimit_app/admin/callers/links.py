"""Links to a caller's page from the other admin pages' lists (API keys, overrides, plan
assignments, credit accounts, bans)."""

from django.contrib.admin.utils import quote
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from ..dashboard.data import inspect_url

__all__ = ["caller_link", "ref_of_user", "ref_of_key", "admin_url"]


def ref_of_user(user_id):
    return f"user:{user_id}"


def ref_of_key(key_id):
    return f"key:{key_id}"


def caller_link(ref, text):
    """Return ``text`` linked to the page of the caller ``ref`` (HTML)."""
    return format_html('<a href="{}" class="rl-caller-link">{}</a>', inspect_url(ref), text)


def admin_url(name, *args):
    """Return the admin URL ``name`` reversed with ``args``, or "" where the project does not
    register that page (a user model without an admin, say)."""
    try:
        return reverse(name, args=[quote(arg) for arg in args])
    except NoReverseMatch:
        return ""
