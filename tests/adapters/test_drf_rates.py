"""DRF's rates kept (config/drf_rates.py): a project swaps AnonRateThrottle, UserRateThrottle and
ScopedRateThrottle for QuotaThrottle; ``migrate`` turns its DEFAULT_THROTTLE_RATES into plans and
rules, shown in the admin in words and audited as imported; the same requests are allowed and
refused as DRF's own throttles allow and refuse them."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.cache.backends.locmem import LocMemCache
from django.core.management import call_command
from django.test import Client
from rest_framework.throttling import AnonRateThrottle, ScopedRateThrottle, UserRateThrottle

from ratelimit_app.config.drf_rates import (
    IMPORT_ACTOR,
    DrfRateError,
    drf_rate_rows,
    parse_drf_rate,
)
from ratelimit_app.models import AuditEntry, AuditSource, Plan, Rule
from ratelimit_app.throttling import QuotaThrottle

from ..helpers import use_fake_clock
from .drf_rates_urls import Burst, Things

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: the audit entry

RATES = {"anon": "3/min", "user": "5/min", "burst": "2/sec"}


@pytest.fixture
def drf_project(settings):
    """The project's settings after the swap: QuotaThrottle, DRF's rates kept."""
    settings.ROOT_URLCONF = "tests.adapters.drf_rates_urls"
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_CLASSES": [
                                   "ratelimit_app.throttling.QuotaThrottle"],
                               "DEFAULT_THROTTLE_RATES": RATES}
    return settings


def migrate():
    out = io.StringIO()
    call_command("migrate", verbosity=1, stdout=out)
    return out.getvalue()


def drf_throttle_classes(clock):
    """DRF's three throttles as a project configures them, reading ``clock`` and a locmem
    cache of their own (DRF reads its rates and its cache at import: set on subclasses)."""
    common = {"cache": LocMemCache("drf-rates-test", {}), "THROTTLE_RATES": RATES,
              "timer": lambda self: clock.seconds()}
    return [type(f"Drf{base.__name__}", (base,), common)
            for base in (AnonRateThrottle, UserRateThrottle, ScopedRateThrottle)]


# Each caller's requests: (seconds after the start, path, how many at that moment).
SEQUENCES = {
    "anonymous": [(0, "/drf/things/", 4), (61, "/drf/things/", 4)],
    "anonymous on the scoped view": [(0, "/drf/burst/", 3), (61, "/drf/burst/", 3)],
    "signed-in": [(0, "/drf/things/", 6), (61, "/drf/things/", 6)],
    "signed-in on the scoped view": [(0, "/drf/burst/", 3), (1, "/drf/burst/", 3)],
}
ADDRESSES = {"anonymous": "198.51.100.1", "anonymous on the scoped view": "198.51.100.2",
             "signed-in": "198.51.100.3", "signed-in on the scoped view": "198.51.100.4"}


def clients():
    users = {}
    for caller, address in ADDRESSES.items():
        client = Client(REMOTE_ADDR=address)
        if caller.startswith("signed-in"):
            user = users[caller] = get_user_model().objects.get_or_create(
                username=caller.replace(" ", "-"))[0]
            client.force_login(user)
        yield caller, client


def run_sequences(clock):
    """Return ``{caller: [True (allowed) / False (429), ...]}`` for SEQUENCES, in time order
    across callers (the clock only moves forward)."""
    start = clock.now_ms
    steps = sorted((at, caller, path, times) for caller, sequence in SEQUENCES.items()
                   for at, path, times in sequence)
    by_caller = dict(clients())
    outcomes = {caller: [] for caller in SEQUENCES}
    for at, caller, path, times in steps:
        clock.now_ms = start + at * 1000
        for _ in range(times):
            status = by_caller[caller].get(path).status_code
            assert status in (200, 429), status
            outcomes[caller].append(status == 200)
    return outcomes


def test_drfs_rates_become_plans_and_rules_shown_in_words_and_audited(drf_project, admin_client):
    output = migrate()
    assert "DRF's DEFAULT_THROTTLE_RATES imported as 4 rules" in output
    anonymous, signed_in = Plan.objects.get(slug="anonymous"), Plan.objects.get(slug="signed-in")
    assert anonymous.default_for_anonymous and not anonymous.default_for_authenticated
    assert signed_in.default_for_authenticated and not signed_in.default_for_anonymous
    rows = {(r.name, r.plan.slug, r.scope, r.endpoint, r.rate, r.period_s, r.burst)
            for r in Rule.objects.select_related("plan")}
    assert rows == {
        ("anon", "anonymous", "ip", "", 3, 60, 3),
        ("user", "signed-in", "user", "", 5, 60, 5),
        ("burst-ip", "anonymous", "ip", "drf-burst", 2, 1, 2),
        ("burst-user", "signed-in", "user", "drf-burst", 2, 1, 2),
    }
    words = {"anon": "3 requests per minute per client IP, bursts up to 3",
             "user": "5 requests per minute per user or API key, bursts up to 5",
             "burst-ip": "2 requests to drf-burst per second per client IP, bursts up to 2",
             "burst-user": "2 requests to drf-burst per second per user or API key, bursts up "
                           "to 2"}
    for rule in Rule.objects.all():  # each rule's page, where the operator edits it
        page = admin_client.get(f"/admin/ratelimit_app/rule/{rule.pk}/change/")
        assert page.status_code == 200
        assert words[rule.name] in page.content.decode(), rule.name
    [entry] = AuditEntry.objects.filter(actor=IMPORT_ACTOR)
    assert entry.source == AuditSource.IMPORT


def test_migrate_again_keeps_the_operators_edits_and_deletions(drf_project):
    migrate()
    rule = Rule.objects.get(name="anon")
    rule.rate = rule.burst = 30
    rule.save()
    Rule.objects.filter(name="burst-ip").delete()
    assert "imported" not in migrate()
    assert Rule.objects.get(name="anon").rate == 30
    assert not Rule.objects.filter(name="burst-ip").exists()
    # an operator who deleted every row is not given them back either
    Plan.objects.all().delete()
    migrate()
    assert not Plan.objects.exists() and not Rule.objects.exists()


def test_a_project_with_plans_of_its_own_gets_nothing_imported(drf_project):
    Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    assert "imported" not in migrate()
    assert list(Plan.objects.values_list("slug", flat=True)) == ["free"]
    assert not AuditEntry.objects.filter(actor=IMPORT_ACTOR).exists()


def test_the_same_requests_are_allowed_and_refused_as_by_drfs_throttles(drf_project,
                                                                          monkeypatch):
    clock = use_fake_clock(monkeypatch)
    for view in (Things, Burst):
        monkeypatch.setattr(view, "throttle_classes", drf_throttle_classes(clock))
    drfs = run_sequences(clock)
    assert drfs == {
        "anonymous": [True] * 3 + [False] + [True] * 3 + [False],
        "anonymous on the scoped view": [True, True, False] * 2,
        "signed-in": [True] * 5 + [False] + [True] * 5 + [False],
        "signed-in on the scoped view": [True, True, False] * 2,
    }
    migrate()  # the swap: DRF's rates become rules; QuotaThrottle decides on Redis
    for view in (Things, Burst):
        monkeypatch.setattr(view, "throttle_classes", [QuotaThrottle])
    clock.advance(3_600_000)  # the same sequences, an hour later
    assert run_sequences(clock) == drfs


def test_a_request_refused_by_one_limit_spends_nothing_of_the_others(drf_project, monkeypatch):
    # Where the two differ, by design: DRF records a request in every throttle that let it
    # through, even when another refused it; here a refused request debits no bucket.
    clock = use_fake_clock(monkeypatch)
    migrate()
    client = Client(REMOTE_ADDR="198.51.100.9")
    assert [client.get("/drf/burst/").status_code for _ in range(3)] == [200, 200, 429]
    clock.advance(1500)
    # the "anon" bucket (3 a minute) spent 2, not 3: one more request passes; DRF would refuse
    assert client.get("/drf/things/").status_code == 200


def test_drf_rates_are_read_as_drf_reads_them():
    assert parse_drf_rate("3/min") == (3, 60)
    assert parse_drf_rate("2/sec") == (2, 1)
    assert parse_drf_rate("100/day") == (100, 86400)
    assert parse_drf_rate("1000/h") == (1000, 3600)
    for bad in ("3", "3/fortnight", "x/min", "0/min", 3, ""):
        with pytest.raises(DrfRateError):
            parse_drf_rate(bad)


def test_unreadable_rates_and_unset_ones_are_skipped_with_a_line_each(drf_project):
    rules, problems = drf_rate_rows({"anon": None, "user": "5/min", "burst": "lots"})
    # no "anon": the anonymous plan gets the user rate per address, as UserRateThrottle does
    assert [(r.name, r.plan, r.scope) for r in rules] == [
        ("user-ip", "anonymous", "ip"), ("user", "signed-in", "user")]
    assert problems == ["DEFAULT_THROTTLE_RATES['burst']: 'lots' is not a DRF rate such as "
                        "'100/day' or '3/min' (at least 1 request per s, m, h or d); not "
                        "imported."]
