"""What staff see of the penalty box and how they end a ban: the dashboard's "Banned now",
the Bans admin's lift action, ``manage.py ratelimit bans`` (on the real clock: the dashboard and
the command list the bans in force now); bans and lifts are in the ban log, which the dashboard
shows, not in the audit trail (issue 56)."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client

from ratelimit_app.models import AuditEntry, Ban, BanLogEntry, BanRule

from ..helpers import limiter, load_demo_data

pytestmark = pytest.mark.django_db

SCRAPER = "203.0.113.77"


@pytest.fixture
def banned_scraper():
    load_demo_data()
    BanRule.objects.create(name="scrapers", scope="ip", events="statuses", statuses="404",
                           threshold=3, window_s=60, ban_s=600)
    limiter().policies.reset()
    client = Client(REMOTE_ADDR=SCRAPER)
    for i in range(3):
        client.get(f"/missing-{i}/")
    assert client.get("/hello/").status_code == 429
    limiter().protection.ban_log.drain()  # what its thread does, off in unit tests
    return client


def staff_client():
    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    return client


def test_the_dashboard_lists_the_bans_in_force(banned_scraper):
    data = staff_client().get("/admin/ratelimit_monitoring/dashboard/data.json").json()
    [row] = data["bans"]
    assert (row["who"], row["rule"], row["times"]) == (SCRAPER, "scrapers", 1)
    assert "Banned now" in data["html"]["bans"] and SCRAPER in data["html"]["bans"]
    [entry] = data["ban_log"]
    assert entry["what"] == f"scrapers banned 1 caller: {SCRAPER}"
    assert "Ban log" in data["html"]["ban_log"] and entry["what"] in data["html"]["ban_log"]


def test_the_dashboard_and_the_command_count_the_bans_without_a_row(banned_scraper, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "BAN_ROWS_PER_INTERVAL": 1}
    for i in range(3):
        Client(REMOTE_ADDR="203.0.113.78").get(f"/missing-{i}/")
    limiter().protection.ban_log.drain()
    assert Ban.objects.count() == 1  # the first ban's row: the interval's one
    data = staff_client().get("/admin/ratelimit_monitoring/dashboard/data.json").json()
    assert [(row["bans"], row["unlisted"]) for row in data["unlisted_bans"]] == [(2, 1)]
    assert "1 of them are not listed here" in data["html"]["bans"]
    out = io.StringIO()
    call_command("ratelimit", "bans", "list", stdout=out)
    assert "(and 1 more banned by scrapers" in out.getvalue()


def test_staff_lift_a_ban_from_the_admin(banned_scraper):
    ban = Ban.objects.get()
    audited = AuditEntry.objects.count()
    response = staff_client().post("/admin/ratelimit_protection/ban/", {
        "action": "lift_bans", "_selected_action": [ban.pk]}, follow=True)
    assert "1 ban lifted." in response.content.decode()
    assert banned_scraper.get("/hello/").status_code == 200
    ban.refresh_from_db()
    assert ban.lifted_by == "admin"
    entry = BanLogEntry.objects.get(kind="lifted")
    assert str(entry) == f"admin lifted the ban of {SCRAPER} by scrapers"
    assert AuditEntry.objects.count() == audited  # the audit trail keeps to configuration
    data = staff_client().get("/admin/ratelimit_monitoring/dashboard/data.json").json()
    assert data["ban_log"][0]["what"] == str(entry)
    log_page = staff_client().get("/admin/ratelimit_protection/banlogentry/")
    assert log_page.status_code == 200 and str(entry) in log_page.content.decode()


def test_the_command_lists_and_lifts_bans(banned_scraper):
    out = io.StringIO()
    call_command("ratelimit", "bans", stdout=out)
    ban = Ban.objects.get()
    assert f"#{ban.pk}  {SCRAPER}  by scrapers" in out.getvalue()
    with pytest.raises(CommandError) as refused:
        call_command("ratelimit", "bans", "lift", str(ban.pk), "--user", "alice",
                     stdout=io.StringIO())
    assert refused.value.returncode == 2  # not staff with lift_ban
    out = io.StringIO()
    call_command("ratelimit", "bans", "lift", str(ban.pk), "--user", "admin", stdout=out)
    assert f"Lifted ban #{ban.pk} of {SCRAPER} by scrapers." in out.getvalue()
    assert banned_scraper.get("/hello/").status_code == 200
    out = io.StringIO()
    call_command("ratelimit", "bans", "list", stdout=out)
    assert "No ban in force." in out.getvalue()


def test_a_ban_rule_is_explained_in_words_and_checked(db):
    rule = BanRule(name="scrapers", scope="ip", events="statuses", statuses="404",
                   threshold=20, window_s=60, ban_s=600, factor=2, max_ban_s=86400)
    assert rule.describe() == ("Ban a client IP for 10 minutes after 20 responses 404 within a "
                               "minute, doubling each time up to a day; a ban more than a day "
                               "after the last one is 10 minutes again")
    rule.full_clean()
    from django.core.exceptions import ValidationError
    rule.statuses, rule.max_ban_s = "40x", 60
    with pytest.raises(ValidationError) as error:
        rule.full_clean()
    assert set(error.value.message_dict) == {"statuses", "max_ban_s"}


def test_the_ban_rules_list_names_its_modes_in_a_bans_words(db):
    load_demo_data()
    response = staff_client().get("/admin/ratelimit_protection/banrule/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Shadow (count would-be bans, ban no one)" in page
    assert "would-be denials" not in page
