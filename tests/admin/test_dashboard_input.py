"""D5: no input to a staff view gives a 500 — the dashboard page and its JSON, the caller
search and its actions, the reset and the simulator, with odd Unicode, NUL, huge numbers and
4 kB strings."""

import io
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

import ratelimit_app.admin.dashboard.admin  # noqa: F401  (registers the dashboard with the admin)
from ratelimit_app.admin.dashboard.inspector import find_identity

from ..helpers import limiter

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/ratelimit_monitoring/dashboard/"
SIMULATE = "/admin/ratelimit_monitoring/simulator/"

ODD = [
    "key:²", "user:²", "key:١٢٣", "user:𝟙", "key:" + "9" * 30, "user:-1", "key:1e3", "key:",
    "ip:²", "ip:1.2.3.4/²", "ip:1.2.3.4/٣٢", "ip:fe80::1%eth0", "fe80::1%²", "ip:", ":",
    "\x00", "alice\x00", "key:\x00", "ip:127.0.0.1\x00", "rk_\x00", "\u202ealice", "\ud7ff",
    "𝟙𝟚𝟛", "Ⅻ", "ß" * 2000, "😀" * 1024, "a" * 4096, "key:" + "1" * 4096,
    "ip:" + "1" * 4096, "user:" + "٣" * 4096, "key …", "…", "%", "key %…", "rk_alice…" * 500,
]


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def admin():
    call_command("load_demo", stdout=io.StringIO())
    client = Client(raise_request_exception=False)
    client.force_login(get_user_model().objects.get(username="admin"))
    return client


def assert_no_500(response, what):
    assert response.status_code < 500, (what, response.status_code)


def test_d5_superscript_digits_were_a_500_and_are_now_no_match(admin):
    for query in ("key:²", "user:²"):
        response = admin.get(DASHBOARD + "callers/", {"q": query})
        assert response.status_code == 200 and b"No caller matches" in response.content
        assert find_identity(query, limiter().snapshot()).identity is None


@pytest.mark.parametrize("value", ODD)
def test_d5_inspector_and_reset_answer_every_odd_input(admin, value):
    assert_no_500(admin.get(DASHBOARD + "callers/", {"q": value}), "inspect")
    for data in ({"ref": value}, {"ref": value, "confirm": "yes"}, {"ref": "ip:10.0.0.1",
                                                                   "confirm": value}):
        assert_no_500(admin.post(DASHBOARD + "reset/", data), ("reset", data))
    for action, field in (("end-override", "override"), ("lift-ban", "ban")):
        for data in ({"ref": value, field: "1"}, {"ref": "ip:10.0.0.1", field: value}):
            assert_no_500(admin.post(f"{DASHBOARD}callers/{action}/", data), (action, data))


@pytest.mark.parametrize("value", ODD)
def test_d5_dashboard_and_json_answer_every_odd_window(admin, value):
    page = admin.get(DASHBOARD, {"window": value})
    data = admin.get(DASHBOARD + "data.json", {"window": value})
    assert page.status_code == 200 and data.status_code == 200
    assert data.json()["window"] == "1h"


@pytest.mark.parametrize("value", ODD)
def test_d5_simulator_answers_every_odd_field(admin, value):
    base = {"user": "", "api_key": "", "ip": "203.0.113.10", "endpoint": "api:items",
            "method": "GET"}
    for field in base:
        response = admin.get(SIMULATE, {**base, field: value})
        assert response.status_code == 200, field  # a form error or a simulation, never a 500


@pytest.mark.parametrize("raw", ["%ff%fe", "%00%00", "%c0%af", "%ed%a0%80", "key%3A%b2"])
def test_d5_bytes_that_are_not_utf8_are_answered_too(admin, raw):
    for url in (f"{DASHBOARD}callers/?q={raw}", f"{DASHBOARD}data.json?window={raw}",
                f"{SIMULATE}?user={raw}&ip=203.0.113.10&endpoint=api:items&method=GET"):
        assert_no_500(admin.get(url), url)
    assert_no_500(admin.post(DASHBOARD + "reset/", f"ref={raw}&confirm=yes",
                             content_type="application/x-www-form-urlencoded"), "reset")


def test_d5_a_long_query_is_cut_and_still_finds_nothing_quietly(admin):
    response = admin.get(DASHBOARD + "callers/", {"q": quote("x" * 4096)})
    assert response.status_code == 200 and len(response.context["lookup"].query) == 200
