"""What a client can make the penalty box write (issue 56): a flood of addresses, each banned,
makes one ban-log entry per rule and interval, at most BAN_ROWS_PER_INTERVAL Ban rows, one
``caller.banned`` delivery per endpoint and no audit entry, written off the request path, while
Redis refuses every banned address at once. A ban extended by its retries moves the end staff
see, with one row write per round of the ban log's thread, not one per retry."""

import io
import ipaddress
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ratelimit_app.config.audit import Actor
from ratelimit_app.config.ban_records import current_bans
from ratelimit_app.models import (AuditEntry, Ban, BanLogEntry, BanRule, WebhookDelivery,
                                  WebhookEndpoint)

from ..helpers import limiter, load_demo_data, use_fake_clock

pytestmark = pytest.mark.django_db

FLOOD = 300
ROWS_PER_INTERVAL = 20  # BAN_ROWS_PER_INTERVAL's default


def address(i):
    return f"2001:db8:{i:x}::1"  # a /64 each: an IPv6 caller is its /64


def network(i):
    return str(ipaddress.ip_network(f"2001:db8:{i:x}::/64"))  # what staff see of address(i)


def write_ban_log():
    """What the ban log's thread does (off in unit tests): write the bans noted so far."""
    return limiter().protection.ban_log.drain()


@pytest.fixture
def behind_proxy(settings):
    load_demo_data()
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "TRUSTED_PROXIES": ["127.0.0.1"]}
    WebhookEndpoint.objects.create(name="soc", url="https://example.com/hook")


def subscribed_endpoints():
    return sum("caller.banned" in endpoint.event_list()
               for endpoint in WebhookEndpoint.objects.filter(enabled=True))


def flood_rule(mode="enforce"):
    BanRule.objects.create(name="walkers", scope="ip", events="statuses", statuses="404",
                           threshold=3, window_s=60, ban_s=60, mode=mode)
    clock = use_fake_clock()
    limiter().policies.reset()
    return clock


def walk(client, ip, count=3):
    for i in range(count):
        assert client.get(f"/no-such-page-{i}/", HTTP_X_FORWARDED_FOR=ip).status_code == 404


def test_a_flood_of_banned_addresses_writes_a_bounded_record(behind_proxy):
    flood_rule()
    audited = AuditEntry.objects.count()
    client = Client()
    for i in range(FLOOD):
        walk(client, address(i))
        # refused at once by Redis: the row is not written yet
        answer = client.get("/hello/", HTTP_X_FORWARDED_FOR=address(i))
        assert answer.status_code == 429 and json.loads(answer.content)["banned-by"] == ["walkers"]
    assert not Ban.objects.exists() and not BanLogEntry.objects.exists()

    write_ban_log()
    assert Ban.objects.count() == ROWS_PER_INTERVAL
    assert sorted(Ban.objects.values_list("who", flat=True)) == sorted(
        network(i) for i in range(ROWS_PER_INTERVAL))  # the first ones
    [entry] = BanLogEntry.objects.all()
    assert (entry.kind, entry.bans, len(entry.callers)) == ("banned", FLOOD, ROWS_PER_INTERVAL)
    assert AuditEntry.objects.count() == audited
    assert WebhookDelivery.objects.count() == subscribed_endpoints()  # one each
    [delivery] = WebhookDelivery.objects.filter(endpoint__name="soc")
    data = json.loads(delivery.body)["data"]
    assert (delivery.event, data["bans"], len(data["callers"])) == (
        "caller.banned", FLOOD, ROWS_PER_INTERVAL)
    assert (data["identity"], data["rule"]) == (network(0), "walkers")  # one ban's fields, kept
    # every address is still refused, listed or not
    assert {client.get("/hello/", HTTP_X_FORWARDED_FOR=address(i)).status_code
            for i in (0, FLOOD - 1)} == {429}


def test_the_next_interval_gets_its_own_bounded_record(behind_proxy):
    clock = flood_rule()
    client = Client()
    for i in range(ROWS_PER_INTERVAL + 5):
        walk(client, address(i))
    write_ban_log()
    clock.advance(60_000)
    for i in range(100, 105):
        walk(client, address(i))
    write_ban_log()
    assert BanLogEntry.objects.count() == 2
    assert sorted(BanLogEntry.objects.values_list("bans", flat=True)) == [5, ROWS_PER_INTERVAL + 5]
    assert Ban.objects.count() == ROWS_PER_INTERVAL + 5
    assert WebhookDelivery.objects.count() == 2 * subscribed_endpoints()


def test_a_later_round_of_one_interval_adds_to_its_entry_and_its_pending_delivery(behind_proxy):
    flood_rule()
    client = Client()
    walk(client, address(1))
    write_ban_log()
    for i in range(2, 40):
        walk(client, address(i))
    write_ban_log()
    [entry] = BanLogEntry.objects.all()
    assert (entry.bans, len(entry.callers)) == (39, ROWS_PER_INTERVAL)
    assert Ban.objects.count() == ROWS_PER_INTERVAL
    [delivery] = WebhookDelivery.objects.filter(endpoint__name="soc")
    assert json.loads(delivery.body)["data"]["bans"] == 39  # rewritten while not sent


def test_a_shadow_rule_writes_a_bounded_record_and_refuses_no_one(behind_proxy):
    flood_rule(mode="shadow")
    client = Client()
    for i in range(FLOOD // 3):
        walk(client, address(i))
        assert client.get("/hello/", HTTP_X_FORWARDED_FOR=address(i)).status_code == 200
    write_ban_log()
    assert Ban.objects.filter(shadow=True).count() == ROWS_PER_INTERVAL
    assert not Ban.objects.filter(shadow=False).exists()
    [entry] = BanLogEntry.objects.all()
    assert (entry.shadow, entry.bans) == (True, FLOOD // 3)
    assert not WebhookDelivery.objects.exists()  # would-be bans are not announced


@pytest.fixture
def extender(db):
    load_demo_data()
    BanRule.objects.create(name="extender", scope="ip", events="statuses", statuses="404",
                           threshold=3, window_s=60, ban_s=2, extend_on_retry=True)
    clock = use_fake_clock()
    limiter().policies.reset()
    return clock


def test_retries_that_extend_a_ban_move_the_end_staff_see(extender):
    clock = extender
    client = Client()
    walk(client, "127.0.0.1")
    write_ban_log()
    [ban] = Ban.objects.all()
    first_until = ban.until
    assert (first_until - ban.since).total_seconds() == 2
    for _ in range(20):  # a retry every 0.15 s: refused throughout, each retry extends it
        clock.advance(150)
        assert client.get("/hello/").status_code == 429
    with CaptureQueriesContext(connection) as queries:
        write_ban_log()
    assert len([q for q in queries if q["sql"].startswith("UPDATE")]) == 1  # not one per retry
    ban.refresh_from_db()
    assert (ban.until - first_until).total_seconds() == 3.0  # 20 × 0.15 s later
    assert list(current_bans(ban.until - (ban.until - ban.since) / 2)) == [ban]


def test_an_extended_ban_is_listed_while_it_refuses_and_a_lift_frees_it(extender, settings):
    # on the real clock: ``bans list`` and the admin read the wall clock
    install_real_clock()
    client = Client()
    walk(client, "127.0.0.1")
    write_ban_log()
    [ban] = Ban.objects.all()
    Ban.objects.filter(pk=ban.pk).update(until=ban.since)  # as if its 2 s were over
    assert client.get("/hello/").status_code == 429  # a retry: Redis extends the ban
    write_ban_log()
    out = io.StringIO()
    call_command("ratelimit", "bans", "list", stdout=out)
    assert f"#{ban.pk}" in out.getvalue() and "extender" in out.getvalue()

    assert limiter().protection.lift_ban(ban, Actor("staff", "admin")) is True
    assert client.get("/hello/").status_code == 200
    write_ban_log()
    out = io.StringIO()
    call_command("ratelimit", "bans", "list", stdout=out)
    assert "No ban in force." in out.getvalue()
    assert BanLogEntry.objects.filter(kind="lifted", who="127.0.0.1", actor="staff").exists()


def install_real_clock():
    from ratelimit_app.runtime.limiter import install_limiter

    install_limiter(metrics_autostart=False)
    limiter().policies.reset()


def test_the_bans_of_a_rule_deleted_before_they_are_written_do_not_hold_up_the_others(
        behind_proxy):
    flood_rule()
    other = BanRule.objects.create(name="others", scope="ip", events="statuses",
                                   statuses="404", path_prefix="/other", threshold=3,
                                   window_s=60, ban_s=60)
    limiter().policies.reset()
    client = Client()
    walk(client, address(1))  # walkers
    for i in range(3):
        client.get(f"/other/{i}/", HTTP_X_FORWARDED_FOR=address(2))
    BanRule.objects.filter(name="walkers").delete()
    write_ban_log()
    assert [(ban.rule_name, ban.who) for ban in Ban.objects.all()] == [("others", network(2))]
    assert limiter().protection.ban_log.pending() == 0
    assert other.pk == Ban.objects.get().rule_id
