"""The usage records page of the admin in Debian's Chromium: a date range, the table, and the
CSV and JSON downloads holding exactly the records of that range."""

import json

import pytest

from ..helpers import SCREENSHOTS, create_usage_records

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]


def table_rows(page):
    return [[cell.strip() for cell in row.locator("td").all_inner_texts()]
            for row in page.locator("#usage-records tbody tr").all()]


def submit(page):
    """Submit the date-range form and wait for the page it loads."""
    with page.expect_navigation():
        page.click("#usage-form input[type=submit]")


def download(page, selector):
    """Click the download link ``selector``; return the file's name and text."""
    with page.expect_download() as info:
        page.click(selector)
    got = info.value
    return got.suggested_filename, got.path().read_text(encoding="utf-8")


def test_a_date_range_shows_its_records_and_downloads_them(signed_in_page):
    page = signed_in_page
    create_usage_records(display="caller {identity}")
    page.goto(f"{page.base}/admin/")
    page.click("text=Usage records")
    page.wait_for_selector("#usage-form")
    page.fill("#id_date_from", "2026-03-01")
    page.fill("#id_date_to", "2026-03-31")
    page.fill("#id_tenant", "acme")
    submit(page)
    assert table_rows(page) == [
        ["2026-03-01", "caller key:1", "acme", "daily-units", "7", "3", "1"],
        ["2026-03-02", "caller key:1", "acme", "daily-units", "10", "4", "2"]]
    assert page.locator("#usage-records tfoot").inner_text().split() == \
        ["Total", "17", "7", "3"]
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "usage-records.png"), full_page=True)

    name, text = download(page, "#download-csv")
    assert name == "usage-2026-03-01-2026-03-31.csv"
    assert text.splitlines() == [
        "period,identity,display,tenant,rule,units,allowed,refused",
        "2026-03-01,key:1,caller key:1,acme,daily-units,7,3,1",
        "2026-03-02,key:1,caller key:1,acme,daily-units,10,4,2"]
    name, text = download(page, "#download-json")
    document = json.loads(text)
    assert name.endswith(".json") and document["from"] == "2026-03-01"
    assert [r["units"] for r in document["records"]] == [7, 10]

    page.select_option("#id_period", "month")
    page.fill("#id_tenant", "")
    submit(page)
    assert table_rows(page) == [
        ["2026-03", "caller key:1", "acme", "daily-units", "17", "7", "3"],
        ["2026-03", "caller user:9", "globex", "daily-units", "1", "1", "0"]]
    _, text = download(page, "#download-csv")
    assert text.splitlines()[1:] == ["2026-03,key:1,caller key:1,acme,daily-units,17,7,3",
                                     "2026-03,user:9,caller user:9,globex,daily-units,1,1,0"]
    assert page.problems == []


def test_a_range_that_ends_before_it_starts_says_so(signed_in_page):
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_billing/usagerecord/")
    page.fill("#id_date_from", "2026-03-31")
    page.fill("#id_date_to", "2026-03-01")
    submit(page)
    assert "The range ends before it starts" in page.locator(".errornote").inner_text()
    assert page.locator("#usage-downloads").count() == 0
