"""The demo's prepaid key: ``load_demo`` gives erin's key (plan *Pay as you go*, a credits rule
whose allowance of 20 units is given once) a welcome credit once however often it runs, her
reports spend them, and ``ratelimit_traffic`` runs them out: 402s, told apart from the 429s of
rate limits."""

import io
import re

import pytest
from django.core.management import call_command
from django.test import Client, override_settings

from ratelimit_app.models import ApiKey, CreditAccount, CreditTopUp, Rule

ERIN = {"X-Api-Key": "rk_erin_prepaid"}
WELCOME = 100  # units: five reports
TRIAL = 20  # the rule's allowance, given once: one report
REPORT_COST = 20


@override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
def load(**options):
    out = io.StringIO()
    call_command("load_demo", stdout=out, **options)
    return out.getvalue()


def erin_ref():
    return f"key:{ApiKey.objects.get(prefix='rk_erin_').pk}"


@pytest.mark.django_db
def test_load_demo_credits_erins_key_its_welcome_once():
    out = load()
    ref = erin_ref()
    account = CreditAccount.objects.get()
    assert (account.ref, account.granted, account.display) == (ref, WELCOME,
                                                                "key rk_erin_… (demo)")
    top_up = CreditTopUp.objects.get()
    assert (top_up.top_up_id, top_up.units, top_up.actor) == (f"demo-welcome-{ref}", WELCOME,
                                                              "load_demo")
    rule = Rule.objects.get(name="prepaid-credits")
    assert (rule.kind, rule.scope, rule.plan.slug, rule.rate, rule.calendar_period) == (
        "credits", "user", "prepaid", TRIAL, "")
    assert "X-Api-Key: rk_erin_prepaid" in out
    assert f"Credit accounts → {ref} → Top up" in out

    load()
    assert list(CreditAccount.objects.values_list("ref", "granted")) == [(ref, WELCOME)]
    assert CreditTopUp.objects.get() == top_up


@pytest.mark.django_db
def test_erins_reports_spend_the_trial_and_the_welcome_credit_then_are_refused_402():
    load()
    client = Client()
    statuses = [client.post("/api/reports/", headers=ERIN).status_code
                for _ in range((TRIAL + WELCOME) // REPORT_COST + 1)]
    assert statuses == [202] * 6 + [402]
    refused = client.post("/api/reports/", headers=ERIN)
    assert refused.json()["credits-exhausted"] == ["prepaid-credits"]
    assert "Retry-After" not in refused  # the trial never comes back: a top-up helps
    assert client.get("/api/items/", headers=ERIN).status_code == 402  # nothing left at all


@pytest.mark.django_db(transaction=True)
def test_the_traffic_runs_erins_credits_out_and_reports_its_402s_apart(live_server, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    load(server_url=live_server.url)
    out = io.StringIO()
    # erin's reports are every 27th request from the 8th: the seventh finds nothing left
    call_command("ratelimit_traffic", url=live_server.url, requests=180, rps=0, stdout=out)
    report = out.getvalue()
    assert re.search(r"erin \(prepaid key\) +202: 6, 402: 1\n", report), report
    assert re.search(r"scraper \(anonymous, abusive\) +200: \d+, 429: \d+", report), report
    refused = re.search(r"Refused: (\d+) by rate limits and quotas \(429\), 1 for prepaid "
                        r"credits spent \(402\); top the account up in the admin: Credit "
                        r"accounts → the account → Top up\.", report)
    assert refused and int(refused[1]) > 0, report
    assert CreditAccount.objects.get(ref=erin_ref()).granted == WELCOME
