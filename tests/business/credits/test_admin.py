"""The admin of prepaid credits (admin/credits.py): the accounts' list with the live balance,
an account's page with its "Top up" form (a form sent twice credits once), the read-only
ledger of top-ups, and who may do what."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from ratelimit_app.decision.balances import BalanceState, account_key
from ratelimit_app.models import CreditAccount, CreditTopUp

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: top-ups reach Redis

LIST = "/admin/ratelimit_billing/creditaccount/"


def signed_in(user):
    client = Client()
    client.force_login(user)
    return client


def page_of(account):
    return f"{LIST}{account.pk}/change/"


def form_fields(html):
    """The hidden top-up id and the form's action on an account's page."""
    action = re.search(r'<form method="post" action="([^"]+)" id="credit-top-up-form"', html)
    top_up_id = re.search(r'name="top_up_id" value="([^"]+)"', html)
    return action.group(1), top_up_id.group(1)


def test_the_list_shows_each_account_live_or_at_its_checkpoint(admin_user, redis_client):
    acme = CreditAccount.objects.create(ref="tenant:acme", display="tenant acme", granted=500,
                                        spent=100)
    CreditAccount.objects.create(ref="tenant:globex", display="tenant globex", granted=70)
    CreditTopUp.objects.create(account=acme, top_up_id="inv-1", units=500, actor="admin")
    redis_client.set(account_key("rl", "tenant:acme"), BalanceState(500, 420, 0, 0, 3).pack())
    html = signed_in(admin_user).get(LIST).content.decode()
    rows = re.findall(r"<tr>.*?</tr>", html, re.DOTALL)
    acme_row = next(r for r in rows if "tenant:acme" in r)
    globex_row = next(r for r in rows if "tenant:globex" in r)
    assert re.search(r'field-prepaid_left_cell">80<', acme_row)  # live: 500 − 420
    assert "70 <small>(at the checkpoint)</small>" in globex_row  # Redis holds none
    assert "field-last_top_up_cell" in acme_row and "—" in globex_row


def test_the_top_up_form_credits_once_however_often_it_is_sent(admin_user, redis_client):
    account = CreditAccount.objects.create(ref="tenant:acme", display="tenant acme", granted=0)
    client = signed_in(admin_user)
    page = client.get(page_of(account)).content.decode()
    assert "Redis holds no balance for this account now" in page
    action, top_up_id = form_fields(page)
    assert top_up_id.startswith("admin-")
    assert form_fields(client.get(page_of(account)).content.decode())[1] != top_up_id  # fresh

    form = {"units": "250", "note": "Invoice 7", "top_up_id": top_up_id}
    first = client.post(action, form, follow=True)
    assert first.redirect_chain == [(page_of(account), 302)]
    assert "Credited 250 units to tenant:acme" in first.content.decode()
    assert '<td data-figure="prepaid_left">250</td>' in first.content.decode()
    again = client.post(action, form, follow=True)  # a double click, a reload
    assert "was credited before; nothing was credited again" in again.content.decode()
    made = CreditTopUp.objects.get()
    assert (made.units, made.note, made.actor) == (250, "Invoice 7", "admin")
    assert CreditAccount.objects.get().granted == 250
    assert BalanceState.unpack(redis_client.get(account_key("rl", "tenant:acme"))).granted == 250


def test_bad_input_shows_the_form_again_with_what_to_fix(admin_user):
    account = CreditAccount.objects.create(ref="tenant:acme")
    client = signed_in(admin_user)
    action, top_up_id = form_fields(client.get(page_of(account)).content.decode())
    answer = client.post(action, {"units": "0", "top_up_id": top_up_id})
    html = answer.content.decode()
    assert answer.status_code == 200 and "greater than or equal to 1" in html
    assert form_fields(html) == (action, top_up_id)  # the same top-up, corrected
    CreditTopUp.objects.create(account=account, top_up_id="used", units=5, actor="admin")
    reused = client.post(action, {"units": "6", "top_up_id": "used"}).content.decode()
    assert "“used” was used for 5 units to tenant:acme" in reused
    assert CreditTopUp.objects.count() == 1


def test_staff_without_the_top_up_permission_see_no_form_and_cannot_post(redis_client):
    account = CreditAccount.objects.create(ref="tenant:acme", granted=5)
    viewer = get_user_model().objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(
        codename__in=["view_creditaccount", "view_credittopup"]))
    client = signed_in(viewer)
    page = client.get(page_of(account))
    assert page.status_code == 200 and b'id="credit-top-up-form"' not in page.content
    assert b'<td data-figure="prepaid_left">5</td>' in page.content
    refused = client.post(f"{LIST}{account.pk}/top-up/", {"units": "5", "top_up_id": "x"})
    assert refused.status_code == 403 and not CreditTopUp.objects.exists()
    # rows are made by top-ups only: no add, change or delete here
    assert client.get(f"{LIST}add/").status_code == 403
    assert client.post(f"{LIST}{account.pk}/delete/").status_code == 403
    assert client.get("/admin/ratelimit_billing/credittopup/").status_code == 200
    assert client.get("/admin/ratelimit_billing/credittopup/add/").status_code == 403


def test_the_ledger_of_top_ups_lists_an_accounts_top_ups(admin_user):
    acme = CreditAccount.objects.create(ref="tenant:acme")
    globex = CreditAccount.objects.create(ref="tenant:globex")
    CreditTopUp.objects.create(account=acme, top_up_id="inv-acme", units=5, actor="admin")
    CreditTopUp.objects.create(account=globex, top_up_id="inv-globex", units=7, actor="admin")
    client = signed_in(admin_user)
    page = client.get(page_of(acme)).content.decode()
    link = re.search(r'href="([^"]+)">This account&#x27;s top-ups|href="([^"]+)">This '
                     r"account's top-ups", page)
    listed = client.get((link.group(1) or link.group(2)).replace("&amp;", "&"))
    assert listed.status_code == 200
    assert b"inv-acme" in listed.content and b"inv-globex" not in listed.content
