"""The admin's smaller pages at 1280 × 800 in Debian's Chromium: the rules list (its status in
one word, its filters in Django's sidebar, no horizontal overflow)."""

import pytest
from playwright.sync_api import expect

from ratelimit_app.models import ApiKey, Rule

from ..helpers import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]

# how far the page and the list's own table scroll sideways (0: they fit)
OVERFLOW = """() => {
    const results = document.querySelector('#changelist .results');
    return {page: document.documentElement.scrollWidth - window.innerWidth,
            table: results ? results.scrollWidth - results.clientWidth : 0,
            height: document.documentElement.scrollHeight};
}"""


def test_the_rules_list_fits_1280_with_its_filters_beside_it_and_a_status_word(signed_in_page):
    page = signed_in_page
    page.set_viewport_size({"width": 1280, "height": 800})
    rules = list(Rule.objects.order_by("name")[:3])
    Rule.objects.filter(pk=rules[0].pk).update(enabled=True, mode="enforce")
    Rule.objects.filter(pk=rules[1].pk).update(enabled=True, mode="shadow")
    Rule.objects.filter(pk=rules[2].pk).update(enabled=False, mode="shadow")
    page.goto(f"{page.base}/admin/ratelimit_app/rule/")

    layout = page.evaluate(OVERFLOW)
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "rules-list.png"), full_page=True)
    assert layout["page"] <= 0 and layout["table"] <= 0
    assert layout["height"] < 1533
    table = page.locator("#changelist .results").bounding_box()
    filters = page.locator("#changelist-filter").bounding_box()
    assert filters["x"] >= table["x"] + table["width"]  # beside the table, not below it
    assert filters["y"] < table["y"] + table["height"]

    headers = page.locator("#result_list thead th").all_inner_texts()
    assert "STATUS" in [h.strip().upper() for h in headers]
    assert not {"MODE", "ENABLED"} & {h.strip().upper() for h in headers}
    for rule, word in zip(rules, ["enforced", "shadow", "off"]):
        row = page.locator("#result_list tbody tr", has=page.locator(f"th a:text-is('{rule.name}')"))
        assert row.locator("td.field-status_cell").inner_text() == word

    page.click("#changelist-filter a:text-is('Off')")
    # (the click loads the filtered list: wait for it before reading its rows)
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    assert page.locator("#result_list tbody tr").all_inner_texts()[0].split("\t")[1] == rules[2].name
    assert page.problems == []


def test_the_simulator_is_an_admin_form_and_picks_a_caller_by_searching_its_keys_prefix(
        signed_in_page):
    page = signed_in_page
    page.set_viewport_size({"width": 1280, "height": 800})
    carol = ApiKey.objects.get(user__username="carol", name="demo")
    page.goto(f"{page.base}/admin/ratelimit_app/rule/")
    page.click("text=Simulate a request")
    # (the click loads the simulator: wait for its form, and for its style sheets before
    # measuring where its fields are)
    expect(page.locator("#simulator-form fieldset.module.aligned h2")).to_have_count(2)
    page.wait_for_load_state("load")
    headings = page.locator("#simulator-form fieldset.module.aligned h2").all_inner_texts()
    assert [h.strip().upper() for h in headings] == ["CALLER", "REQUEST"]
    # a search picker (Django's autocomplete), not a select of every key
    assert page.locator("#simulator-form select#id_api_key option").count() == 1
    # each help text sits under its own field, as on the admin's forms
    field = page.locator("#id_ip").bounding_box()
    helptext = page.locator("#id_ip_helptext").bounding_box()
    assert abs(helptext["x"] - field["x"]) <= 10 and helptext["y"] > field["y"]  # (its padding)

    page.click(".field-api_key .select2-selection")
    page.fill(".select2-search__field", carol.prefix[:6])
    page.click(f".select2-results__option:has-text('{carol.prefix}')")
    page.select_option("#id_endpoint", "api:items")
    page.click("input[value=Simulate]")
    page.wait_for_selector("#simulation-buckets")
    assert "(key)" in page.locator("#simulation-result").inner_text()
    assert page.locator("tr[data-rule=enterprise-tenant] td").nth(3).inner_text() == \
        "20,000 requests per minute, bursts up to 3,000"
    assert page.evaluate(OVERFLOW)["page"] <= 0
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "simulator.png"), full_page=True)
    assert page.problems == []
