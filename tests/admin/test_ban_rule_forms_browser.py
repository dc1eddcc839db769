"""A ban rule added in Debian's Chromium as an operator would: the kind of events chosen first,
the numbers typed with their units, the sentence following the typing, the same sentence in the
list once saved; the ban pages at 1280 px without sideways scrolling and without a serious axe
violation, light and dark."""

import pytest
from playwright.sync_api import expect

from ratelimit_app.admin.ban_rule_forms import BAN_FORM_KINDS
from ratelimit_app.models import Ban, BanRule

from ..helpers import SCREENSHOTS
from .test_pages_browser import content_width, serious_violations

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]

WORDS = ("Ban a client IP for 10 minutes after 20 responses 404 within a minute, doubling each "
         "time up to a day; a ban more than a day after the last one is 10 minutes again")


def test_an_operator_adds_a_ban_rule_reading_it_as_typed(signed_in_page):
    page = signed_in_page
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{page.base}/admin/ratelimit_protection/banrule/")
    page.click(".object-tools a.addlink")
    page.click('li[data-kind="statuses"] a')
    words = page.locator("#rule-in-words")
    expect(words).to_have_text("Type the numbers to read the rule in words.")
    page.fill("#id_name", "walkers")
    page.fill("#id_statuses", "404")
    page.fill("#id_threshold", "20")
    page.fill("#id_window_s_0", "1")
    page.select_option("#id_window_s_1", "minute")
    page.fill("#id_ban_s_0", "10")
    page.select_option("#id_ban_s_1", "minute")
    expect(words).to_have_text("Ban a client IP for 10 minutes after 20 responses 404 within "
                               "a minute")
    page.click("fieldset.collapse summary")  # repeat offenders, folded away
    page.fill("#id_factor", "2")
    page.fill("#id_max_ban_s_0", "1")
    page.select_option("#id_max_ban_s_1", "day")
    expect(words).to_have_text(WORDS)
    page.select_option("#id_status", "shadow")
    expect(words).to_have_text("Would b" + WORDS[1:] + " (shadow: records only)")
    page.select_option("#id_status", "enforce")
    expect(words).to_have_text(WORDS)

    width, where = content_width(page)
    assert width <= 1280, f"{width} px ({where})"
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        assert serious_violations(page) == [], scheme
    SCREENSHOTS.mkdir(exist_ok=True)
    page.emulate_media(color_scheme="light")
    page.screenshot(path=SCREENSHOTS / "ban-rule-form.png", full_page=True)

    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    rule = BanRule.objects.get(name="walkers")
    assert (rule.events, rule.window_s, rule.ban_s, rule.max_ban_s, rule.factor) == \
        ("statuses", 60, 600, 86400, 2)
    row = page.locator("#result_list tr", has_text="walkers")
    expect(row.locator("td.field-in_words")).to_have_text(WORDS)
    assert page.problems == []


def test_the_ban_pages_fit_1280_px_without_a_serious_axe_violation(signed_in_page):
    page = signed_in_page
    page.set_viewport_size({"width": 1280, "height": 800})
    root = f"{page.base}/admin/ratelimit_protection"
    pages = [f"{root}/banrule/add/", *(f"{root}/banrule/add/?kind={key}"
                                      for key in BAN_FORM_KINDS),
             f"{root}/ban/", f"{root}/banrule/"]
    failures = {}
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for url in pages:
            assert page.goto(url).status == 200, url
            width, where = content_width(page)
            found = serious_violations(page)
            if width > 1280 or found:
                failures[f"{scheme} {url}"] = (width, where, found)
    assert failures == {}
    assert not Ban.objects.exists()  # the demo's: so the list below is the empty one
    # the empty bans list says how a ban appears and is lifted
    page.goto(f"{root}/ban/")
    expect(page.locator("#bans-empty")).to_contain_text("Lift the selected bans")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "bans-empty.png")
