"""The staff JSON API of prepaid credits (views/credits.py): ``GET credits/<account>/`` and
``POST credits/<account>/top-ups/``: who may call them, a retried top-up credited once,
problems for bad input and conflicts, CSRF kept for signed-in sessions."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from ratelimit_app.decision.balances import BalanceState, account_key
from ratelimit_app.models import CreditAccount, CreditTopUp

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: top-ups reach Redis

BALANCE = "/ratelimit/credits/tenant:acme/"
TOP_UPS = "/ratelimit/credits/tenant:acme/top-ups/"


def staff(*codenames):
    """A signed-in client of an active staff user with the ``codenames`` permissions."""
    user = get_user_model().objects.create_user(f"staff-{'-'.join(codenames) or 'none'}",
                                                is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def post(client, body, path=TOP_UPS, **extra):
    return client.post(path, json.dumps(body) if not isinstance(body, str) else body,
                       content_type="application/json", **extra)


def test_only_staff_with_the_permissions_read_and_top_up(admin_user):
    CreditAccount.objects.create(ref="tenant:acme", granted=5)
    body = {"units": 10, "top_up_id": "inv-1"}
    for client in (Client(), staff()):
        for answer in (client.get(BALANCE), post(client, body)):
            assert answer.status_code == 403
            assert answer["Content-Type"] == "application/problem+json"
    viewer = staff("view_creditaccount")
    assert viewer.get(BALANCE).status_code == 200
    refused = post(viewer, body)
    assert refused.status_code == 403 and "ratelimit_app.add_credittopup" in \
        refused.json()["detail"]
    assert post(staff("add_credittopup"), body).status_code == 201
    admin = Client()
    admin.force_login(admin_user)
    assert admin.get(BALANCE).json()["granted"] == 15
    assert Client().post(TOP_UPS).status_code == 403
    assert admin.get(TOP_UPS).status_code == 405  # a top-up is a POST


def test_a_top_up_is_created_once_and_retries_get_the_same_answer(redis_client):
    clerk = staff("add_credittopup", "view_creditaccount")
    body = {"units": 500, "top_up_id": "inv-2026-0042", "note": "March"}
    created = post(clerk, body)
    assert created.status_code == 201 and created["Cache-Control"] == "no-store"
    answer = created.json()
    assert answer["created"] is True and answer["granted"] == 500
    assert answer["top_up"] | {"created": None} == {
        "top_up_id": "inv-2026-0042", "account": "tenant:acme", "units": 500, "created": None,
        "actor": "staff API: staff-add_credittopup-view_creditaccount", "note": "March"}
    assert BalanceState.unpack(redis_client.get(account_key("rl", "tenant:acme"))).granted == 500

    retried = post(clerk, body)
    assert retried.status_code == 200
    assert retried.json() == answer | {"created": False}
    assert CreditTopUp.objects.count() == 1

    balance = clerk.get(BALANCE)
    assert balance.status_code == 200 and balance["Cache-Control"] == "no-store"
    # no credits rule charges tenants: the allowance (and so the units left) is not known
    assert balance.json() | {"checkpointed_at": None, "last_top_up": None} == {
        "account": "tenant:acme", "display": "tenant acme", "allowance": None,
        "allowance_period": None, "allowance_rule": None,
        "allowance_unknown": "no credits rule for tenants is in force",
        "allowance_used": None, "allowance_left": None, "allowance_period_start": None,
        "used_in_period": 0, "prepaid_left": 500, "units_left": None,
        "granted": 500, "spent": 0, "pending_top_up_units": 0, "source": "redis",
        "checkpointed_at": None, "last_top_up": None}
    assert balance.json()["last_top_up"]["top_up_id"] == "inv-2026-0042"


def test_bad_top_ups_are_400_and_a_reused_id_is_409():
    clerk = staff("add_credittopup", "view_creditaccount")
    assert post(clerk, {"units": 5, "top_up_id": "inv-1"}).status_code == 201
    cases = [
        ({"units": 0, "top_up_id": "inv-2"}, "units must be a whole number from 1 to 10^12"),
        ({"units": "lots", "top_up_id": "inv-2"}, "units must be a whole number"),
        # text is refused, digits or not, as the quotas-as-code import refuses "3"
        ({"units": "7", "top_up_id": "inv-2"},
         "units must be a whole number from 1 to 10^12, sent as a number, not as text"),
        ({"units": 5}, "The top-up id must be 1 to 100 printable characters"),
        ({"units": 5, "top_up_id": "inv-2", "note": 7}, "The note must be text"),
        ({"units": 5, "top_up_id": "inv-2", "amount": 5}, "Unknown field(s): amount"),
        ([5, "inv-2"], "Send a JSON object"),
        ("{units: 5", "The body is not valid JSON."),
        ("x" * 5000, "longer than 4096 bytes"),
    ]
    for body, message in cases:
        answer = post(clerk, body)
        assert answer.status_code == 400, body
        assert answer["Content-Type"] == "application/problem+json"
        assert message in answer.json()["detail"], (body, answer.json())
    as_form = clerk.post(TOP_UPS, {"units": 5, "top_up_id": "inv-2"})
    assert as_form.status_code == 400 and "Content-Type: application/json" in \
        as_form.json()["detail"]
    bad_account = post(clerk, {"units": 5, "top_up_id": "inv-2"},
                       path="/ratelimit/credits/acme/top-ups/")
    assert bad_account.status_code == 400 and "names no account" in bad_account.json()["detail"]

    reused = post(clerk, {"units": 6, "top_up_id": "inv-1"})
    assert reused.status_code == 409 and reused.json()["title"] == "Top-up id used before"
    elsewhere = post(clerk, {"units": 5, "top_up_id": "inv-1"},
                     path="/ratelimit/credits/tenant:globex/top-ups/")
    assert elsewhere.status_code == 409
    assert list(CreditAccount.objects.values_list("ref", "granted")) == [("tenant:acme", 5)]


def test_reading_an_unknown_account_or_with_redis_down(redis_server):
    clerk = staff("view_creditaccount", "add_credittopup")
    assert clerk.get("/ratelimit/credits/tenant:nobody/").status_code == 404
    assert clerk.get("/ratelimit/credits/nobody/").status_code == 400
    CreditAccount.objects.create(ref="tenant:acme", granted=5)
    redis_server.kill()
    try:
        down = clerk.get(BALANCE)
        assert down.status_code == 503 and down["Content-Type"] == "application/problem+json"
        # the ledger takes the top-up; Redis is given it by the next checkpoint
        assert post(clerk, {"units": 5, "top_up_id": "inv-down"}).status_code == 201
    finally:
        redis_server.start()
    assert CreditAccount.objects.get().granted == 10


def test_a_signed_in_session_needs_the_csrf_token_to_top_up(admin_user):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    assert post(browser, {"units": 5, "top_up_id": "inv-1"}).status_code == 403
    assert not CreditTopUp.objects.exists()
