"""The demo's prepaid key in Debian's Chromium: erin's reports spend her trial and welcome credit
until the live server refuses them 402; an operator signed in to the admin opens her key's credit
account and tops it up with its form; her next reports are served."""

import urllib.error
import urllib.request

import pytest

from ratelimit_app.models import ApiKey, CreditTopUp

from ..helpers import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]

ERIN = {"X-Api-Key": "rk_erin_prepaid"}
# straight to the live server, whatever proxy the environment names
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def report(base):
    """POST a report as erin (cost 20) to the live server; return the status."""
    request = urllib.request.Request(f"{base}/api/reports/", method="POST", data=b"",
                                     headers=ERIN)
    try:
        with OPENER.open(request, timeout=10) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        exc.read()
        exc.close()
        return exc.code


def test_an_operator_tops_up_the_prepaid_key_that_was_refused_and_it_is_served_again(
        signed_in_page):
    page = signed_in_page  # load_demo has run: erin's key has its trial (20 units, one report)
    ref = f"key:{ApiKey.objects.get(prefix='rk_erin_').pk}"  # and a welcome credit of 100
    assert [report(page.base) for _ in range(7)] == [202] * 6 + [402]

    page.goto(f"{page.base}/admin/")
    page.click("text=Credit accounts")
    row = page.locator("#result_list tbody tr", has_text=ref)
    assert "key rk_erin_… (demo)" in row.inner_text()
    row.get_by_role("link", name=ref).click()
    page.wait_for_selector("#credit-top-up-form")
    assert page.locator("#credit-balance strong").inner_text() == "0"  # spent, live from Redis
    page.fill("#id_units", "40")
    page.fill("#id_note", "invoice demo-1")
    with page.expect_navigation():
        page.click("#credit-top-up-form input[type=submit]")
    assert f"Credited 40 units to {ref}" in page.locator(".messagelist").inner_text()
    assert page.locator("#credit-balance strong").inner_text() == "40"
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "demo-prepaid-top-up.png"), full_page=True)

    assert [report(page.base) for _ in range(3)] == [202, 202, 402]  # 40 units: two reports
    assert CreditTopUp.objects.filter(account__ref=ref, units=40, actor="admin").count() == 1
    assert page.problems == []
