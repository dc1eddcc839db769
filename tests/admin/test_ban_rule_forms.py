"""Ban rules in words (admin/ban_rule_forms.py, BanRule.describe): the sentence of each event
kind and its edges, a form per kind asked first, durations typed as a number and a unit and
stored in seconds, bad input as form errors, the list's words equal to the preview's, and the
empty bans list saying how a ban appears and is lifted."""

import re

import pytest
from django.urls import reverse

from ratelimit_app.admin.ban_rule_forms import BAN_FORM_KINDS, ban_rule_from_input
from ratelimit_app.models import BanRule

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def url(view, *args):
    return reverse(f"admin:ratelimit_protection_banrule_{view}", args=args)


def scraper_rule(**fields):
    return BanRule(**{"name": "scrapers", "scope": "ip", "events": "statuses",
                      "statuses": "404", "threshold": 20, "window_s": 60, "ban_s": 600,
                      **fields})


@pytest.mark.parametrize("fields, words", [
    ({"factor": 2, "max_ban_s": 86400},
     "Ban a client IP for 10 minutes after 20 responses 404 within a minute, doubling each "
     "time up to a day; a ban more than a day after the last one is 10 minutes again"),
    ({"events": "refusals", "statuses": "", "threshold": 5},
     "Ban a client IP for 10 minutes after 5 refusals by its own quotas within a minute"),
    ({"events": "failed_auth", "statuses": "", "threshold": 10, "scope": "user",
      "window_s": 3600, "ban_s": 7200},
     "Ban a user or API key for 2 hours after 10 failed authentications within an hour"),
    # no longest ban: up to the engine's cap; a factor of 3 and a short memory
    ({"factor": 3, "memory_s": 3600},
     "Ban a client IP for 10 minutes after 20 responses 404 within a minute, tripling each "
     "time up to 366 days; a ban more than an hour after the last one is 10 minutes again"),
    ({"factor": 1, "max_ban_s": 86400}, "Ban a client IP for 10 minutes after 20 responses "
                                         "404 within a minute"),
    ({"mode": "shadow"}, "Would ban a client IP for 10 minutes after 20 responses 404 within "
                         "a minute (shadow: records only)"),
    ({"statuses": "401,403, 4xx", "path_prefix": "/login", "threshold": 1, "scope": "tenant"},
     "Ban a tenant for 10 minutes after 1 response 401, 403 or 4xx under /login within a "
     "minute"),
    ({"factor": 10, "max_ban_s": 604800, "extend_on_retry": True, "enabled": False},
     "Ban a client IP for 10 minutes after 20 responses 404 within a minute, 10 times longer "
     "each time up to a week; a ban more than a day after the last one is 10 minutes again; "
     "requests during a ban make it longer (disabled)"),
    ({"threshold": None}, ""),  # a form not typed in full: no sentence yet
])
def test_a_ban_rule_reads_as_a_sentence(fields, words):
    assert scraper_rule(**fields).describe() == words


def test_the_add_page_asks_which_events_count_first(admin_client):
    response = admin_client.get(url("add"))
    html = response.content.decode()
    links = re.findall(r'<li data-kind="([a-z_]+)"><a href="([^"]+)">', html)
    assert [key for key, _ in links] == list(BAN_FORM_KINDS) == \
        ["refusals", "statuses", "failed_auth"]
    assert "Add a ban rule" in html and "<form" not in html.split('id="content-main"')[1]


@pytest.mark.parametrize("key, shown, hidden", [
    ("statuses", {"statuses", "path_prefix", "threshold", "window_s", "ban_s", "status"},
     {"events", "mode", "enabled"}),
    ("refusals", {"threshold", "window_s", "ban_s", "factor", "memory_s"},
     {"statuses", "events", "mode"}),
    ("failed_auth", {"threshold", "path_prefix", "max_ban_s"}, {"statuses", "events"}),
])
def test_each_kind_shows_only_its_fields_in_words(admin_client, key, shown, hidden):
    response = admin_client.get(url("add") + f"?kind={key}")
    fields = set(response.context["adminform"].form.fields)
    assert shown <= fields and not hidden & fields
    html = response.content.decode()
    for fail2ban in ("maxretry", "findtime", "bantime", "(seconds)"):
        assert fail2ban not in html
    assert 'name="window_s_0"' in html and 'name="window_s_1"' in html
    assert "Type the numbers to read the rule in words." in html
    # the model's defaults shown in their units: memory 86400 s as 1 day, factor 1
    assert re.search(r'name="memory_s_0"[^>]*value="1"', html)
    assert re.search(r'name="memory_s_1"[^>]*>(?:(?!</select>).)*<option value="day" selected>',
                     html, re.S)


def post_rule(client, key, **fields):
    data = {"name": "scrapers", "scope": "ip", "statuses": "404", "threshold": "20",
            "window_s_0": "1", "window_s_1": "minute", "ban_s_0": "10", "ban_s_1": "minute",
            "factor": "2", "max_ban_s_0": "1", "max_ban_s_1": "day",
            "memory_s_0": "12", "memory_s_1": "hour", "status": "enforce", **fields}
    return client.post(url("add") + f"?kind={key}", {k: v for k, v in data.items()
                                                      if v is not None})


def test_durations_typed_with_a_unit_are_stored_in_seconds(admin_client):
    response = post_rule(admin_client, "statuses")
    assert response.status_code == 302, response.context["adminform"].form.errors
    rule = BanRule.objects.get()
    assert (rule.events, rule.threshold, rule.window_s, rule.ban_s, rule.max_ban_s,
            rule.memory_s, rule.factor, rule.mode, rule.enabled) == \
        ("statuses", 20, 60, 600, 86400, 43200, 2, "enforce", True)
    # the change page shows them back in their units
    page = admin_client.get(url("change", rule.pk)).content.decode()
    assert re.search(r'name="memory_s_0"[^>]*value="12"', page)
    assert re.search(r'<option value="hour" selected>', page)


def test_a_refusals_rule_drops_statuses_and_a_shadow_status_is_its_mode(admin_client):
    response = post_rule(admin_client, "refusals", status="shadow", max_ban_s_0="")
    assert response.status_code == 302
    rule = BanRule.objects.get()
    assert (rule.events, rule.statuses, rule.mode, rule.max_ban_s) == \
        ("refusals", "", "shadow", None)


@pytest.mark.parametrize("fields, mode, enabled", [
    ({"mode": "shadow", "enabled": "on"}, "shadow", True),
    ({"mode": "enforce"}, "enforce", False),  # an unticked box is not sent
    ({}, "enforce", True),
])
def test_a_post_of_the_former_single_form_keeps_its_mode(admin_client, fields, mode, enabled):
    assert post_rule(admin_client, "statuses", status=None, **fields).status_code == 302
    assert (BanRule.objects.get().mode, BanRule.objects.get().enabled) == (mode, enabled)


@pytest.mark.parametrize("fields, field, message", [
    ({"ban_s_0": "0"}, "ban_s", "The ban must be at least 1 second."),
    ({"ban_s_0": "ten"}, "ban_s", "Enter a whole number."),
    ({"window_s_0": "400", "window_s_1": "day"}, "window_s",
     "The window can be at most 366 days"),
    ({"ban_s_0": "99999999999999999999999"}, "ban_s", "at most 366 days"),
    ({"ban_s_0": ""}, "ban_s", "Type the ban as a number and a unit."),
    ({"max_ban_s_0": "5", "max_ban_s_1": "minute"}, "max_ban_s",
     "The longest ban cannot be shorter than the first one."),
    ({"statuses": "40x"}, "statuses", ""),
    ({"statuses": ""}, "statuses", "Name the response statuses"),
    ({"threshold": "0"}, "threshold", ""),
    ({"window_s_1": "fortnight"}, "window_s", "Select a valid choice"),
])
def test_bad_input_is_a_form_error_never_a_500(admin_client, fields, field, message):
    response = post_rule(admin_client, "statuses", **fields)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors and message in " ".join(errors[field]), errors
    assert not BanRule.objects.exists()


def test_the_list_says_what_the_preview_says_for_the_same_values(admin_client):
    typed = {"name": "scrapers", "scope": "ip", "statuses": "404", "threshold": "20",
             "window_s_0": "1", "window_s_1": "minute", "ban_s_0": "10", "ban_s_1": "minute",
             "factor": "2", "max_ban_s_0": "1", "max_ban_s_1": "day", "memory_s_0": "1",
             "memory_s_1": "day", "status": "shadow"}
    preview = admin_client.get(url("preview"), {**typed, "kind": "statuses"})
    assert preview.status_code == 200 and "no-store" in preview["Cache-Control"]
    words = preview.json()["words"]
    assert words.startswith("Would ban a client IP for 10 minutes after 20 responses 404")
    assert post_rule(admin_client, "statuses", **typed).status_code == 302
    listed = admin_client.get(url("changelist")).content.decode()
    assert f"<td class=\"field-in_words\">{words}</td>" in listed


@pytest.mark.parametrize("query", [
    {}, {"kind": "nonsense"},
    {"kind": "statuses", "threshold": "x" * 5000, "ban_s_0": "-1", "window_s_1": "year"},
])
def test_the_preview_answers_bad_input_without_a_500(admin_client, query):
    response = admin_client.get(url("preview"), query)
    assert response.status_code in (200, 400)
    assert ("words" in response.json()) == (response.status_code == 200)


def test_the_preview_reads_partly_typed_input_and_never_guesses():
    rule = ban_rule_from_input("failed_auth", {"threshold": "10", "window_s_0": "2",
                                               "window_s_1": "minute", "ban_s_0": "",
                                               "scope": "planet"})
    assert (rule.threshold, rule.window_s, rule.ban_s, rule.scope, rule.events) == \
        (10, 120, None, "ip", "failed_auth")
    assert rule.describe() == ""


def test_the_empty_bans_list_says_how_a_ban_appears_and_is_lifted(admin_client):
    html = admin_client.get(reverse("admin:ratelimit_protection_ban_changelist")) \
        .content.decode()
    assert "No ban yet." in html
    assert 'href="/admin/ratelimit_protection/banrule/"' in html
    assert "Lift the selected bans" in html and "manage.py ratelimit bans lift" in html
    assert "at most 20 bans of a rule per minute get a row" in html


def test_a_saved_rule_opens_in_its_kind_form_with_its_sentence(admin_client):
    rule = scraper_rule(events="refusals", statuses="", threshold=5, mode="shadow")
    rule.save()
    response = admin_client.get(url("change", rule.pk))
    html = response.content.decode()
    assert "statuses" not in response.context["adminform"].form.fields
    assert rule.describe() in html and rule.describe().startswith("Would ban")
    assert re.search(r'<option value="shadow" selected>', html)
