"""The admin index by task in Debian's Chromium: the six sections of the stock index, an entry
opened from its section, the sidebar and breadcrumbs naming the group, an old address followed,
and the index no wider than a desktop's or a phone's screen."""

import pytest

from tests.helpers import SCREENSHOTS, breadcrumbs_of

from .test_index_groups import DASHBOARD_URL, GROUPED_INDEX, MOST_ENTRIES_PER_GROUP, ON_THE_INDEX
from .test_pages_browser import content_width

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]


def sections_on(page, where):
    """Return ``{caption: [entries]}`` of the rate-limit sections inside ``where``."""
    found = {}
    for module in page.locator(f"{where} .module:has(caption)").all():
        caption = module.locator("caption").inner_text().strip()
        if caption.lower().startswith("rate limits"):
            found[caption] = [row.inner_text().strip()
                              for row in module.locator("th[scope=row]").all()]
    return found


def test_the_index_groups_the_pages_by_task_and_each_entry_opens_under_its_group(
        signed_in_page):
    page = signed_in_page
    page.goto(f"{page.base}/admin/")
    # the stock stylesheet writes captions in capitals: compare the words, not the case
    shown = sections_on(page, "#content-main")
    assert {name.lower(): entries for name, entries in shown.items()} == \
        {name.lower(): entries for name, entries in ON_THE_INDEX.items()}
    # the dashboard first: the first link of the index, above the fold
    first = page.locator("#content-main a").first
    assert (first.inner_text(), first.get_attribute("href")) == ("Dashboard", DASHBOARD_URL)
    assert first.bounding_box()["y"] < 300
    assert max(len(entries) for entries in shown.values()) <= MOST_ENTRIES_PER_GROUP
    page.screenshot(path=str(SCREENSHOTS / "admin-index-by-task.png"), full_page=True)

    billing = page.locator("#content-main .app-ratelimit_billing")
    billing.get_by_role("link", name="Credit accounts").click()
    page.wait_for_url(f"{page.base}/admin/ratelimit_billing/creditaccount/")
    assert breadcrumbs_of(page)["links"][:2] == ["Home", "Rate limits · Billing"]
    sidebar = page.locator("#nav-sidebar .app-ratelimit_billing.current-app")
    assert sidebar.locator("th[scope=row]").all_inner_texts() == \
        GROUPED_INDEX["Rate limits · Billing"]

    page.goto(f"{page.base}/admin/ratelimit_app/webhookendpoint/?q=ops")  # a bookmark
    assert page.url == f"{page.base}/admin/ratelimit_alerts/webhookendpoint/?q=ops"
    assert page.locator("#changelist-search input[name=q]").input_value() == "ops"
    assert page.problems == []


@pytest.mark.parametrize("width", [1280, 390])
def test_the_protection_group_opens_its_pages_and_the_index_fits_the_screen(
        signed_in_page, width):
    page = signed_in_page
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{page.base}/admin/")
    shown = {name.lower(): entries for name, entries in sections_on(page, "#content-main").items()}
    assert shown["rate limits · protection"] == GROUPED_INDEX["Rate limits · Protection"]
    # nothing sideways: not the page, nor a box scrolling its content out of sight
    found, where = content_width(page)
    assert found <= width, f"{found} px wide at {width} px ({where})"

    protection = page.locator("#content-main .app-ratelimit_protection")
    protection.get_by_role("link", name="Ban rules").click()
    page.wait_for_url(f"{page.base}/admin/ratelimit_protection/banrule/")
    assert breadcrumbs_of(page)["links"][:2] == ["Home", "Rate limits · Protection"]
    page.goto(f"{page.base}/admin/ratelimit_app/accesslistentry/?q=abuse")  # a bookmark
    assert page.url == f"{page.base}/admin/ratelimit_protection/accesslistentry/?q=abuse"
    assert page.locator("#changelist-search input[name=q]").input_value() == "abuse"
    assert page.problems == []
