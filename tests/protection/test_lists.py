"""protection/lists.py: what an entry's value may be, and which entry matches a caller (IPv4 and
IPv6 networks and their edges, API keys, users, tenants, User-Agent parts), deny before allow,
an entry's end."""

import math
from types import SimpleNamespace

import pytest

from ratelimit_app.config.choices import ListTarget
from ratelimit_app.decision.identity import Identity
from ratelimit_app.protection.lists import (
    MAX_ADDRESSES_MEMOISED,
    TARGETS,
    AccessLists,
    ListValueError,
    normalized_value,
)

_ids = iter(range(1, 10**6))


def entry(target, value="", *, kind="deny", user_id=None, api_key_id=None, exempt=False,
          reason="because", ends_at=None):
    """A row as the compiler reads it."""
    return SimpleNamespace(id=next(_ids), kind=kind, target=target, value=value, user_id=user_id,
                           api_key_id=api_key_id, exempt=exempt, reason=reason, ends_at=ends_at)


def caller(ip="192.0.2.1", **fields):
    return Identity("anonymous", ip, ip, None)._replace(**fields)


def lists(*rows, ipv6_prefix=64):
    return AccessLists.from_rows(rows, ipv6_prefix)


def matched(access_lists, identity, user_agent=None, now_s=0.0):
    meta = {} if user_agent is None else {"HTTP_USER_AGENT": user_agent}
    found = access_lists.match(identity, meta, lambda: now_s)
    return None if found is None else found.reason


def test_the_model_offers_exactly_the_targets_the_matcher_knows():
    assert tuple(ListTarget.values) == TARGETS


def test_no_rows_no_lists():
    assert AccessLists.from_rows([], 64) is None


@pytest.mark.parametrize("value, stored", [
    ("203.0.113.7", "203.0.113.7"), (" 203.0.113.7/32 ", "203.0.113.7"),
    ("198.51.100.0/24", "198.51.100.0/24"), ("0.0.0.0/0", "0.0.0.0/0"),
    ("2001:DB8::/48", "2001:db8::/48"), ("2001:db8:0:1::/64", "2001:db8:0:1::/64"),
    ("::ffff:203.0.113.7", "203.0.113.7"), ("::ffff:198.51.100.0/120", "198.51.100.0/24"),
])
def test_addresses_and_networks_are_stored_in_their_canonical_form(value, stored):
    assert normalized_value("ip", value, 64) == stored


@pytest.mark.parametrize("value, words", [
    ("203.0.113.300", "is not an IP address or network"),
    ("example.com", "is not an IP address or network"),
    ("10.0.0.5/8", "The network is 10.0.0.0/8"),
    ("2001:db8::1", "write 2001:db8::/64"),
    ("2001:db8::/96", "write 2001:db8::/64"),
    ("", "Give the value to match."),
])
def test_a_value_that_cannot_be_matched_says_what_to_write(value, words):
    with pytest.raises(ListValueError) as refused:
        normalized_value("ip", value, 64)
    assert words in str(refused.value)


def test_the_ipv6_granularity_follows_the_setting():
    assert normalized_value("ip", "2001:db8::/56", 56) == "2001:db8::/56"
    with pytest.raises(ListValueError, match="/48"):
        normalized_value("ip", "2001:db8::/56", 48)


def test_other_values():
    assert normalized_value("tenant", "  acme ", 64) == "acme"
    assert normalized_value("user_agent", "curl", 64) == "curl"
    with pytest.raises(ListValueError, match="at least 3"):
        normalized_value("user_agent", "Go", 64)
    with pytest.raises(ListValueError, match="at most 100"):
        normalized_value("tenant", "t" * 101, 64)
    with pytest.raises(ListValueError, match="leave the value empty"):
        normalized_value("user", "alice", 64)
    assert normalized_value("api_key", "", 64) == ""


def test_ipv4_networks_match_from_their_first_to_their_last_address():
    access = lists(entry("ip", "198.51.100.0/24", reason="net"),
                   entry("ip", "203.0.113.7", reason="one"),
                   entry("ip", "10.0.0.0/8", reason="ten"))
    assert matched(access, caller("198.51.100.0")) == "net"
    assert matched(access, caller("198.51.100.255")) == "net"
    assert matched(access, caller("198.51.99.255")) is None
    assert matched(access, caller("198.51.101.0")) is None
    assert matched(access, caller("203.0.113.7")) == "one"
    assert matched(access, caller("203.0.113.8")) is None
    assert matched(access, caller("10.255.255.255")) == "ten"
    assert matched(access, caller("11.0.0.0")) is None
    assert matched(access, caller("unknown")) is None


def test_everything_matches_a_zero_length_prefix():
    access = lists(entry("ip", "0.0.0.0/0", reason="all v4"))
    assert matched(access, caller("192.0.2.1")) == "all v4"
    assert matched(access, caller("2001:db8::/64")) is None  # not an IPv4 caller


def test_ipv6_networks_match_the_callers_networks_they_hold():
    # an IPv6 caller is its /64 (Identity.ip), as identify() names it
    access = lists(entry("ip", "2001:db8::/48", reason="v6 range"),
                   entry("ip", "2001:db8:ffff:1::/64", reason="one /64"))
    assert matched(access, caller("2001:db8::/64")) == "v6 range"
    assert matched(access, caller("2001:db8:0:ffff::/64")) == "v6 range"
    assert matched(access, caller("2001:db8:1::/64")) is None
    assert matched(access, caller("2001:db7:ffff:ffff::/64")) is None
    assert matched(access, caller("2001:db8:ffff:1::/64")) == "one /64"
    assert matched(access, caller("2001:db8:ffff:2::/64")) is None
    # an address of the same bits in the other family is another address
    assert matched(access, caller("32.1.13.184")) is None


def test_an_ipv6_entry_narrower_than_a_caller_applies_to_the_callers_network():
    # a row written before IPV6_PREFIX_LENGTH was lowered: it applies to its caller's network
    access = lists(entry("ip", "2001:db8:0:1::/64", reason="narrow"), ipv6_prefix=48)
    assert matched(access, caller("2001:db8::/48")) == "narrow"
    assert access.networks[6][0][0] == 48


def test_keys_users_tenants():
    access = lists(entry("api_key", api_key_id=7, reason="key"),
                   entry("user", user_id=42, reason="user"),
                   entry("tenant", "globex", reason="tenant"))
    assert matched(access, caller(api_key_id=7, kind="key")) == "key"
    assert matched(access, caller(api_key_id=8, kind="key")) is None
    # a user entry covers the user's keys: their caller carries the user's id
    assert matched(access, caller(api_key_id=8, user_id="42", kind="key")) == "user"
    assert matched(access, caller(user_id="4")) is None
    assert matched(access, caller(tenant="globex")) == "tenant"
    assert matched(access, caller(tenant="Globex")) is None  # tenants are names: exact


def test_user_agent_parts_match_in_any_case():
    access = lists(entry("user_agent", "SQLmap", reason="scanner"),
                   entry("user_agent", "Ünïcode", reason="unicode"))
    assert matched(access, caller(), "sqlmap/1.7.2#stable (https://sqlmap.org)") == "scanner"
    assert matched(access, caller(), "Mozilla/5.0 SQLMAP") == "scanner"
    assert matched(access, caller(), "Mozilla/5.0 (X11; Linux x86_64)") is None
    assert matched(access, caller(), "sql map") is None
    assert matched(access, caller(), "") is None
    assert matched(access, caller()) is None  # no User-Agent at all
    assert matched(access, caller(), "a ÜNÏCODE client") == "unicode"


def test_a_deny_entry_wins_over_an_allow_entry_whatever_matched_first():
    access = lists(entry("ip", "198.51.100.0/24", kind="allow", reason="office"),
                   entry("user_agent", "sqlmap", reason="scanner"))
    assert matched(access, caller("198.51.100.7")) == "office"
    assert matched(access, caller("198.51.100.7"), "sqlmap") == "scanner"
    narrow_and_wide = lists(entry("ip", "198.51.100.0/24", reason="deny the net"),
                            entry("ip", "198.51.100.7", kind="allow", reason="but trust one"))
    assert matched(narrow_and_wide, caller("198.51.100.7")) == "deny the net"


def test_an_ended_entry_no_longer_matches_even_in_a_snapshot_that_still_holds_it():
    ends = SimpleNamespace(timestamp=lambda: 1000.0)
    access = lists(entry("ip", "203.0.113.7", ends_at=ends, reason="until 1000"),
                   entry("ip", "203.0.113.0/24", kind="allow", reason="trusted"))
    assert access.match(caller("203.0.113.7"), {}, lambda: 999.9).reason == "until 1000"
    assert access.match(caller("203.0.113.7"), {}, lambda: 1000.0).reason == "trusted"


def test_the_clock_is_read_only_when_an_entry_matches():
    access = lists(entry("ip", "203.0.113.7"))

    def no_clock():
        raise AssertionError("read the clock for a caller no entry matches")

    assert access.match(caller("192.0.2.1"), {"HTTP_USER_AGENT": "x"}, no_clock) is None


def test_a_row_that_cannot_be_matched_is_left_out_and_logged(caplog):
    access = lists(entry("ip", "not an address", reason="bad"), entry("ip", "203.0.113.7"))
    assert matched(access, caller("203.0.113.7")) == "because"
    assert "access list entry" in caplog.text and "ignored" in caplog.text


def test_an_allow_entry_only_exempts():
    access = lists(entry("ip", "203.0.113.7", exempt=True), entry("tenant", "t", kind="allow",
                                                                   exempt=True))
    assert not access.match(caller("203.0.113.7"), {}, lambda: 0).exempt  # a deny never exempts
    assert access.match(caller(tenant="t"), {}, lambda: 0).exempt
    assert access.match(caller(tenant="t"), {}, lambda: 0).ends_at_s == math.inf


def test_the_memo_of_addresses_stays_bounded():
    access = lists(entry("ip", "10.0.0.0/8", reason="ten"))
    for n in range(MAX_ADDRESSES_MEMOISED + 10):
        assert matched(access, caller(f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}")) == \
            "ten"
    assert len(access._addresses) <= MAX_ADDRESSES_MEMOISED
    assert matched(access, caller("11.0.0.1")) is None


def test_many_prefix_lengths_cost_one_lookup_each():
    rows = [entry("ip", f"10.{n}.0.0/16", reason=f"net {n}") for n in range(200)]
    rows += [entry("ip", f"172.16.{n}.0/24") for n in range(200)]
    access = lists(*rows)
    assert [length for length, _ in access.networks[4]] == [16, 24]
    assert matched(access, caller("10.150.3.4")) == "net 150"
