"""The prepaid credits of the admin in Debian's Chromium: an account found in the list, topped up
with its page's form sent twice at once (credited once), then again from the page shown anew
(a new top-up); the balance live from Redis."""

import pytest
from playwright.sync_api import expect

from ratelimit_app.models import CreditAccount, CreditTopUp

from ..helpers import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]


# the form sent twice, as a double click sends it: the same fields, the same top-up id (the
# redirects not followed: the page they lead to would take the messages)
SEND_TWICE = """async form => {
    const send = () => fetch(form.action, {method: 'POST', body: new FormData(form),
                                           redirect: 'manual'});
    const first = await send(), second = await send();
    return [first.type, second.type];
}"""


def submit_top_up(page):
    with page.expect_navigation():
        page.click("#credit-top-up-form input[type=submit]")


def test_a_top_up_from_the_account_page_is_credited_once(signed_in_page):
    page = signed_in_page
    CreditAccount.objects.create(ref="tenant:acme", display="tenant acme")
    page.goto(f"{page.base}/admin/")
    page.click("text=Credit accounts")
    page.click("text=tenant:acme")
    page.wait_for_selector("#credit-top-up-form")
    page.fill("#id_units", "1500")
    page.fill("#id_note", "invoice 1042")
    assert page.locator("#credit-top-up-form").evaluate(SEND_TWICE) == ["opaqueredirect"] * 2
    page.reload()
    messages = page.locator(".messagelist").inner_text()
    assert "Credited 1500 units to tenant:acme" in messages
    assert "was credited before; nothing was credited again" in messages
    assert page.locator("#credit-balance [data-figure=prepaid_left]").inner_text() == "1500"
    assert "Live from Redis." in page.locator("#credit-balance").inner_text()
    assert CreditTopUp.objects.filter(account__ref="tenant:acme").count() == 1

    page.fill("#id_units", "500")  # the page shown again: a new form, a new top-up
    submit_top_up(page)
    assert "Credited 500 units" in page.locator(".messagelist").inner_text()
    assert page.locator("#credit-balance [data-figure=prepaid_left]").inner_text() == "2000"
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "credit-account.png"), full_page=True)
    assert CreditTopUp.objects.filter(account__ref="tenant:acme").count() == 2
    assert page.problems == []


NO_HORIZONTAL_OVERFLOW = "() => document.documentElement.scrollWidth <= window.innerWidth"


def test_the_account_page_leads_with_top_up_and_folds_the_stored_counters(signed_in_page):
    page = signed_in_page
    page.set_viewport_size({"width": 1280, "height": 800})
    account = CreditAccount.objects.create(ref="tenant:globex", display="tenant globex")
    page.goto(f"{page.base}/admin/ratelimit_app/creditaccount/{account.pk}/change/")

    button = page.locator("#credit-top-up-form input[type=submit]").bounding_box()
    assert button["y"] + button["height"] <= 800  # above the fold, no scrolling
    sequence = page.get_by_text("Sequence:", exact=True)
    assert not sequence.is_visible()
    assert not page.get_by_text("Allowance period start (ms):", exact=True).is_visible()
    assert page.evaluate(NO_HORIZONTAL_OVERFLOW)
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "credit-account-top.png"))

    page.fill("#id_units", "300")
    submit_top_up(page)
    assert "Credited 300 units" in page.locator(".messagelist").inner_text()
    assert page.locator("#credit-balance [data-figure=prepaid_left]").inner_text() == "300"

    page.click("text=Stored counters")
    expect(sequence).to_be_visible()  # (the click unfolds it: wait for it)
    assert page.problems == []
