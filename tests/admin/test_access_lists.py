"""The allow and deny lists' admin (admin/access_lists.py): under Protection, a form that refuses
what cannot be matched with words to act on, normalises what it keeps, a list in words, each
change audited as the signed-in user."""

import pytest
from django.contrib.auth.models import User

from ratelimit_app.models import AccessListEntry, ApiKey, AuditEntry, AuditSource

from .test_index_groups import rate_limit_sections

pytestmark = pytest.mark.django_db

ADD = "/admin/ratelimit_protection/accesslistentry/add/"
LIST = "/admin/ratelimit_protection/accesslistentry/"


def entry_post(**fields):
    return {"kind": "deny", "target": "ip", "value": "", "user": "", "api_key": "",
            "reason": "abuse", "starts_at_0": "", "starts_at_1": "", "ends_at_0": "",
            "ends_at_1": "", **fields}


def errors_on(response):
    """The form's errors, field by field (``__all__``: those of the whole entry)."""
    form = response.context["adminform"].form
    return {name: list(messages) for name, messages in form.errors.items()}


def test_a_bad_network_gets_a_clear_form_error(admin_client):
    response = admin_client.post(ADD, entry_post(value="10.0.0.9/8"))
    assert response.status_code == 200
    assert errors_on(response) == {"value": [
        "“10.0.0.9/8” is not a network: its address has bits set beyond the first 8. The "
        "network is 10.0.0.0/8: write that, or the address alone."]}
    response = admin_client.post(ADD, entry_post(value="10.0.0.300"))
    assert errors_on(response)["value"][0].startswith("“10.0.0.300” is not an IP address or "
                                                      "network: write an address")
    response = admin_client.post(ADD, entry_post(value="2001:db8::5"))
    assert "write 2001:db8::/64" in errors_on(response)["value"][0]
    assert not AccessListEntry.objects.exists()


def test_the_form_asks_for_what_the_target_needs(admin_client):
    response = admin_client.post(ADD, entry_post(target="api_key"))
    assert errors_on(response) == {"api_key": ["Choose the API key."]}
    response = admin_client.post(ADD, entry_post(target="user_agent", value="ab"))
    assert "at least 3 characters" in errors_on(response)["value"][0]
    response = admin_client.post(ADD, entry_post(value="192.0.2.1", exempt="on"))
    assert errors_on(response) == {"exempt": [
        "Only an allow entry exempts its callers from quotas: untick it."]}
    response = admin_client.post(ADD, entry_post(value="192.0.2.1", reason=""))
    assert errors_on(response) == {"reason": ["This field is required."]}


@pytest.mark.django_db(transaction=True)  # real commits: each save is an audit entry
def test_a_saved_entry_is_normalised_listed_in_words_and_audited(admin_client):
    response = admin_client.post(ADD, entry_post(value=" 2001:DB8::/48 ", reason="v6 abuse"))
    assert response.status_code == 302
    entry = AccessListEntry.objects.get()
    assert entry.value == "2001:db8::/48"
    key, _ = ApiKey.create_key(User.objects.create(username="mallory"), "scraper",
                               raw_key="rk_mallory_1")
    assert admin_client.post(ADD, entry_post(kind="allow", target="api_key", api_key=key.pk,
                                             exempt="on", reason="our own CI")).status_code == 302
    response = admin_client.post(ADD, entry_post(value="2001:db8::/48"))
    assert errors_on(response) == {"__all__": [
        "The deny list already holds client IP 2001:db8::/48: edit that entry."]}
    html = admin_client.get(LIST).content.decode()
    assert "client IP 2001:db8::/48" in html and "v6 abuse" in html
    assert "allow, exempt from quotas" in html and "API key rk_mallo… (scraper)" in html
    assert html.count("Deny entries: told to the refused caller") == 0  # no help text per row
    audited = AuditEntry.objects.filter(source=AuditSource.ADMIN).order_by("id")
    assert [e.summary for e in audited][:1] == [
        "added list entry (kind deny, target ip, value 2001:db8::/48)"]
    assert audited.first().actor == "admin"


def test_the_lists_are_in_the_protection_section_of_the_index(admin_client):
    sections = rate_limit_sections(admin_client.get("/admin/").content.decode())
    assert "Allow and deny lists" in sections["Rate limits · Protection"]
    assert "Allow and deny lists" not in sections["Rate limits · Callers"]
    html = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/ratelimit_protection/accesslistentry/"' in html
    assert "/admin/ratelimit_callers/accesslistentry/" not in html
    moved = admin_client.get("/admin/ratelimit_app/accesslistentry/?q=abuse")
    assert moved.status_code == 308 and moved["Location"] == LIST + "?q=abuse"
    moved = admin_client.post("/admin/ratelimit_app/accesslistentry/add/",
                              entry_post(value="192.0.2.1"), follow=True)
    assert moved.redirect_chain[0] == (ADD, 308)  # sent again with its body: the entry is saved
    assert AccessListEntry.objects.get().value == "192.0.2.1"


@pytest.mark.parametrize("fields, warning", [
    ({"value": "0.0.0.0/0"}, "A deny entry for 0.0.0.0/0 refuses every IPv4 caller"),
    ({"value": "::ffff:0:0/96"}, "A deny entry for 0.0.0.0/0 refuses every IPv4 caller"),
    ({"value": "::/0"}, "A deny entry for ::/0 refuses every IPv6 caller"),
    ({"value": "::/0", "kind": "allow", "exempt": "on"},
     "An allow entry for ::/0 exempt from quotas spares every IPv6 caller every limit"),
])
def test_an_entry_of_every_caller_is_saved_only_once_confirmed(admin_client, fields, warning):
    response = admin_client.post(ADD, entry_post(**fields))
    assert response.status_code == 200
    [error] = errors_on(response)["confirm_everyone"]
    assert error.startswith(warning) and error.endswith("Tick “I mean every caller” to save it.")
    assert not AccessListEntry.objects.exists()
    response = admin_client.post(ADD, entry_post(**fields, confirm_everyone="on"))
    assert response.status_code == 302
    entry = AccessListEntry.objects.get()
    assert entry.value in ("0.0.0.0/0", "::/0")
    # an edit that keeps it as wide asks nothing again
    change = f"{LIST}{entry.pk}/change/"
    response = admin_client.post(change, entry_post(**{**fields, "value": entry.value},
                                                    reason="outage drill"))
    assert response.status_code == 302
    assert AccessListEntry.objects.get().reason == "outage drill"


def test_a_narrower_or_merely_trusted_entry_needs_no_confirmation(admin_client):
    assert admin_client.post(ADD, entry_post(value="0.0.0.0/1")).status_code == 302
    assert admin_client.post(ADD, entry_post(value="::/0", kind="allow")).status_code == 302
    assert AccessListEntry.objects.count() == 2
