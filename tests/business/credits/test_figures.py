"""A credit balance's figures (business/credits/figures.py) on every read path: the staff API,
the usage endpoint, ``manage.py ratelimit credits show``, the admin's account page and list,
and the dashboard, each naming the allowance used, the period's consumption and the units left
for what they are, and all agreeing with one another. Requests go through the real request
path (QuotaMiddleware) on the suite's redis-server, at a test clock's time. Also: which rule's
allowance applies to an account (business/credits/rules.py), and what is said when none can
be named."""

import datetime
import io
import re

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.http import HttpResponse
from django.test import Client, TestCase
from django.urls import include, path
from django.utils.html import escape

import ratelimit_app.admin.dashboard.admin  # noqa: F401  (registers the dashboard with the admin)
from ratelimit_app.admin.dashboard.data import credit_rows
from ratelimit_app.business.credits.ledger import client_of, top_up
from ratelimit_app.business.credits.rules import AccountRules
from ratelimit_app.decision import periods
from ratelimit_app.decision.balances import BalanceState, account_key
from ratelimit_app.models import ApiKey, CreditAccount, EndpointCost, Plan, PlanAssignment, Rule

from ...helpers import limiter, use_fake_clock

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.business.credits.test_figures")]

DAY_MS = 24 * 3600 * 1000


def ok(request):
    return HttpResponse("ok")


urlpatterns = [
    path("ok/", ok, name="ok"),
    path("admin/", admin.site.urls),
    path("ratelimit/", include("ratelimit_app.urls")),
]

# where the admin shows them (under Billing and Monitoring when the group apps are installed)
ACCOUNTS = "/admin/ratelimit_billing/creditaccount/"
DASHBOARD = "/admin/ratelimit_monitoring/dashboard/"
# the figures every path must show, by the staff API's names
NAMES = ("allowance", "allowance_used", "allowance_left", "used_in_period", "prepaid_left",
         "units_left")


@pytest.fixture
def clock():
    return use_fake_clock()


def credits_rule(plan, *, allowance, refill="", name="credits", scope="user"):
    rule = Rule(name=name, plan=plan, scope=scope, kind="credits", rate=allowance,
                calendar_period=refill)
    rule.full_clean()
    rule.save()
    return rule


def rules_in_force():
    """The AccountRules of the rules as they are now (the test's edits never commit, so the
    policy is told of them as a commit would tell it)."""
    limiter().policies.invalidate()
    return AccountRules(limiter().snapshot())


def credit(ref, units, top_up_id):
    """Top up, running what waits for the commit (the test's transaction never commits)."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        return top_up(ref, units, top_up_id, actor="test", client=client_of(limiter().store))


@pytest.fixture
def six_a_day(clock):
    """The issue's case: an allowance of 6 units a day, 20 prepaid units, five requests of
    cost 3 (15 units: the allowance's 6, then 9 prepaid). Returns ``(raw key, ref)``."""
    plan = Plan.objects.create(slug="metered", name="Metered", default_for_authenticated=True)
    credits_rule(plan, allowance=6, refill="day")
    EndpointCost.objects.create(endpoint="ok", cost=3)
    api_key, raw = ApiKey.create_key(get_user_model().objects.create_user("payer"), "billing",
                                     plan=plan)
    ref = f"key:{api_key.pk}"
    credit(ref, 20, "payment-1")
    assert [Client().get("/ok/", HTTP_X_API_KEY=raw).status_code for _ in range(5)] == [200] * 5
    return raw, ref


# --- reading each path's figures -------------------------------------------------------------

def staff_api(client, ref):
    body = client.get(f"/ratelimit/credits/{ref}/").json()
    return {name: body[name] for name in NAMES}, body


def usage_endpoint(raw):
    [policy] = Client().get("/ratelimit/usage/", HTTP_X_API_KEY=raw).json()["policies"]
    fields = policy["credits"]
    assert policy["remaining"] == fields["units_left"]  # take.lua's reading agrees
    return {name: fields[name] for name in NAMES}, fields


def credits_show(ref):
    out = io.StringIO()
    call_command("ratelimit", "credits", "show", ref, stdout=out)
    lines = out.getvalue().splitlines()
    allowance = re.fullmatch(r"allowance      (\d+) units a day \(rule “credits”\)", lines[1])
    used = re.fullmatch(r"allowance used (\d+) units?, (\d+) left", lines[2])
    consumed = re.match(r"consumed       (\d+) units? in the period from ", lines[3])
    prepaid = re.fullmatch(r"prepaid left   (-?\d+) units?", lines[4])
    left = re.fullmatch(r"units left     (-?\d+) units?", lines[5])
    numbers = [int(n) for match in (allowance, used, consumed, prepaid, left)
               for n in match.groups()]
    return dict(zip(NAMES, numbers)), lines


def account_page(client, ref):
    account = CreditAccount.objects.get(ref=ref)
    html = client.get(f"{ACCOUNTS}{account.pk}/change/").content.decode()
    found = dict(re.findall(r'data-figure="(\w+)">(?:<strong>)?(-?\d+)<', html))
    return {name: int(found[name]) for name in NAMES}, html


def account_list(client, ref):
    html = client.get(ACCOUNTS).content.decode()
    row = next(r for r in re.findall(r"<tr>.*?</tr>", html, re.DOTALL) if ref in r)
    cell = dict(re.findall(r'field-(\w+)">([^<]*)<', row))
    used, allowance = re.fullmatch(r"(\d+) of (\d+) a day", cell["allowance_used_cell"]).groups()
    return {"allowance": int(allowance), "allowance_used": int(used),
            "allowance_left": int(allowance) - int(used),
            "used_in_period": int(cell["used_in_period_cell"]),
            "prepaid_left": int(cell["prepaid_left_cell"]),
            "units_left": int(cell["units_left_cell"])}, row


def dashboard(client):
    [row] = credit_rows()
    html = client.get(DASHBOARD).content.decode()
    table = re.search(r'data-table="credits".*?</table>', html, re.DOTALL).group(0)
    shown = dict(re.findall(r'data-figure="(\w+)">(-?\d+)', table))
    for name in ("units_left", "prepaid_left", "used_in_period"):
        assert int(shown[name]) == row[name]  # the page shows the data it was given
    assert f">{row['allowance_used_text']}<" in table
    return {"allowance": row["allowance"], "allowance_used": row["allowance_used"],
            "allowance_left": row["allowance"] - row["allowance_used"],
            "used_in_period": row["used_in_period"], "prepaid_left": row["prepaid_left"],
            "units_left": row["units_left"]}, row


def every_path(admin_client, raw, ref):
    """Return ``{path: (figures, what it showed)}`` for every read path."""
    return {"staff API": staff_api(admin_client, ref), "usage endpoint": usage_endpoint(raw),
            "credits show": credits_show(ref), "account page": account_page(admin_client, ref),
            "account list": account_list(admin_client, ref), "dashboard": dashboard(admin_client)}


# --- the figures on every path ---------------------------------------------------------------

def test_the_allowance_used_is_at_most_the_allowance_on_every_path_and_they_agree(
        six_a_day, admin_client, redis_client, clock):
    raw, ref = six_a_day
    state = BalanceState.unpack(redis_client.get(account_key("rl", ref)))
    assert (state.granted, state.spent, state.used) == (20, 9, 15)  # what Redis counts

    expected = {"allowance": 6, "allowance_used": 6, "allowance_left": 0, "used_in_period": 15,
                "prepaid_left": 11, "units_left": 11}
    shown = every_path(admin_client, raw, ref)
    for where, (figures, _) in shown.items():
        assert figures == expected, where

    day_start = periods.bounds_at("day", clock.now_ms).start_ms
    _, body = shown["staff API"]
    assert (body["allowance_period"], body["allowance_rule"], body["allowance_unknown"]) == \
        ("day", "credits", None)
    assert body["allowance_period_start"] == datetime.datetime.fromtimestamp(
        day_start / 1000, datetime.timezone.utc).isoformat()
    _, fields = shown["usage endpoint"]
    assert {k: fields[k] for k in ("allowance_period", "allowance_period_start")} == \
        {k: body[k] for k in ("allowance_period", "allowance_period_start")}
    _, lines = shown["credits show"]
    assert lines[3].endswith("00:00:00 UTC (the allowance first, then prepaid units)")
    _, html = shown["account page"]
    assert "6 units a day (rule “credits”)" in html and "20 granted, 9 spent" in html


def test_the_next_day_every_path_shows_the_allowance_whole_again_before_any_request(
        six_a_day, admin_client, clock):
    raw, ref = six_a_day
    clock.advance(DAY_MS)  # no request since: Redis still holds yesterday's 15 units
    expected = {"allowance": 6, "allowance_used": 0, "allowance_left": 6, "used_in_period": 0,
                "prepaid_left": 11, "units_left": 17}
    for where, (figures, _) in every_path(admin_client, raw, ref).items():
        # the usage endpoint's remaining is take.lua's count: the same 17
        assert figures == expected, where
    assert Client().get("/ok/", HTTP_X_API_KEY=raw).status_code == 200
    figures, _ = staff_api(admin_client, ref)
    assert figures == expected | {"allowance_used": 3, "allowance_left": 3,
                                  "used_in_period": 3, "units_left": 14}


def test_an_allowance_given_once_is_not_given_again(clock, admin_client):
    plan = Plan.objects.create(slug="trial", name="Trial", default_for_authenticated=True)
    credits_rule(plan, allowance=4)
    EndpointCost.objects.create(endpoint="ok", cost=3)
    api_key, raw = ApiKey.create_key(get_user_model().objects.create_user("trier"), "trial",
                                     plan=plan)
    ref = f"key:{api_key.pk}"
    credit(ref, 5, "payment-1")
    assert [Client().get("/ok/", HTTP_X_API_KEY=raw).status_code for _ in range(4)] == \
        [200, 200, 200, 402]
    clock.advance(40 * DAY_MS)
    figures, body = staff_api(admin_client, ref)
    assert figures == {"allowance": 4, "allowance_used": 4, "allowance_left": 0,
                       "used_in_period": 9, "prepaid_left": 0, "units_left": 0}
    assert body["allowance_period"] is None and body["allowance_period_start"] is None
    assert usage_endpoint(raw)[0] == figures
    out = io.StringIO()
    call_command("ratelimit", "credits", "show", ref, stdout=out)
    assert "allowance      4 units, given once (rule “credits”)\n" in out.getvalue()
    assert "consumed       9 units so far (the allowance first" in out.getvalue()


# --- which rule's allowance applies ----------------------------------------------------------

def test_an_account_without_a_rule_that_can_be_named_says_why_and_guesses_nothing(
        clock, admin_client):
    free = Plan.objects.create(slug="free", name="Free", default_for_authenticated=True)
    pro = Plan.objects.create(slug="pro", name="Pro")
    credits_rule(pro, allowance=100, refill="month", name="pro-credits")
    free_key, _ = ApiKey.create_key(get_user_model().objects.create_user("f"), "k", plan=free)
    pro_key, _ = ApiKey.create_key(get_user_model().objects.create_user("p"), "k", plan=pro)
    user = get_user_model().objects.create_user("assigned")
    PlanAssignment.objects.create(user=user, plan=pro)
    rules = rules_in_force()

    assert rules.find(f"key:{pro_key.pk}")[0].name == "pro-credits"
    assert rules.find(f"user:{user.pk}")[0].name == "pro-credits"  # its assignment's plan
    assert rules.find(f"key:{free_key.pk}") == \
        (None, "no credits rule applies to its plan “free”")
    assert rules.find("key:999999") == \
        (None, "its API key is revoked or deleted: no rule charges it now")
    assert rules.find("tenant:acme") == (None, "no credits rule for tenants is in force")

    # a tenant's callers may be on several plans: one tenant rule is the one, two are not
    credits_rule(free, allowance=5, name="free-tenant", scope="tenant")
    assert rules_in_force().find("tenant:acme")[0].name == "free-tenant"
    credits_rule(pro, allowance=50, name="pro-tenant", scope="tenant")
    rule, why = rules_in_force().find("tenant:acme")
    assert rule is None and why == ("a tenant's callers may be on several plans, and the "
                                    "credits rules “free-tenant”, “pro-tenant” apply to "
                                    "different plans")

    # every path says so, and shows what it knows: the prepaid units, the period's consumption
    credit("tenant:acme", 30, "payment-1")
    body = admin_client.get("/ratelimit/credits/tenant:acme/").json()
    assert {k: body[k] for k in ("allowance", "allowance_used", "allowance_left", "units_left",
                                 "prepaid_left", "used_in_period")} == \
        {"allowance": None, "allowance_used": None, "allowance_left": None, "units_left": None,
         "prepaid_left": 30, "used_in_period": 0}
    assert body["allowance_unknown"] == why
    out = io.StringIO()
    call_command("ratelimit", "credits", "show", "tenant:acme", stdout=out)
    assert f"allowance      unknown: {why}\n" in out.getvalue()
    assert "units left     unknown, as the allowance is\n" in out.getvalue()
    account = CreditAccount.objects.get(ref="tenant:acme")
    page = admin_client.get(f"{ACCOUNTS}{account.pk}/change/").content.decode()
    assert f"<td>{escape(why[:1].upper() + why[1:])}</td>" in page and '<td data-figure="units_left"><strong>unknown' in page
    row = next(r for r in re.findall(r"<tr>.*?</tr>", admin_client.get(ACCOUNTS).content
                                     .decode(), re.DOTALL) if "tenant:acme" in r)
    assert 'field-allowance_used_cell">unknown<' in row
    [dashboard_row] = credit_rows()
    assert (dashboard_row["units_left"], dashboard_row["allowance_used_text"]) == \
        (None, "unknown")
