"""The admin index by task (ratelimit_app/groups/, admin/registration.py, admin/placement.py):
six sections in the stock index, each page under its group with the app model's permissions,
the old addresses redirected (308), the app's own links going straight to the new ones, and,
in a project without the group apps, one section and no warning (the grouping is optional)."""

import datetime
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ratelimit_app.admin.placement import admin_url_name, placed_model
from ratelimit_app.admin.registration import ADMIN_CLASSES
from ratelimit_app.models import (
    AccessListEntry,
    ApiKey,
    AuditEntry,
    Ban,
    BanRule,
    CreditAccount,
    CreditTopUp,
    IdentityOverride,
    Plan,
    PlanAssignment,
    Rule,
)

from ..helpers import limiter

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: saves announce versions

ROOT = Path(__file__).resolve().parents[2]

GROUPED_INDEX = {
    "Rate limits": ["Endpoint costs", "Plans", "Rules"],
    "Rate limits · Alerts": ["Quota alerts", "Webhook deliveries", "Webhook endpoints"],
    "Rate limits · Billing": ["Credit accounts", "Credit top-ups", "Usage records"],
    "Rate limits · Callers": ["API keys", "Identity overrides", "Plan assignments"],
    "Rate limits · Monitoring": ["Audit entries", "Dashboard", "Simulator"],
    "Rate limits · Protection": ["Allow and deny lists", "Ban log", "Ban rules", "Bans"],
}
MOST_ENTRIES_PER_GROUP = 8
# On the index the dashboard leads, on a line of its own above the sections (not as a row).
ON_THE_INDEX = {name: [entry for entry in entries if entry != "Dashboard"]
                for name, entries in GROUPED_INDEX.items()}
DASHBOARD_URL = "/admin/ratelimit_monitoring/dashboard/"


class IndexSections(HTMLParser):
    """The sections of an admin index page: ``{caption: [(entry, href or None)]}``, in order."""

    def __init__(self, html):
        super().__init__()
        self.sections, self._section, self._cell, self._href, self._text = {}, None, None, None, ""
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "caption":
            self._cell, self._text = "caption", ""
        elif tag == "th" and attrs.get("scope") == "row":
            self._cell, self._text, self._href = "entry", "", None
        elif tag == "a" and self._cell == "entry":
            self._href = attrs.get("href")

    def handle_data(self, data):
        if self._cell:
            self._text += data

    def handle_endtag(self, tag):
        if tag == "caption" and self._cell == "caption":
            self._section = self._text.strip()
            self.sections[self._section] = []
        elif tag == "th" and self._cell == "entry":
            self.sections[self._section].append((self._text.strip(), self._href))
        if tag in ("caption", "th"):
            self._cell = None


def first_entry(html):
    """Return ``(text, href)`` of the first link of an index page's content."""
    found = re.search(r'<div id="content-main">.*?<a href="([^"]+)"[^>]*>([^<]*)</a>', html,
                      re.S)
    return found.group(2).strip(), found.group(1)


def rate_limit_sections(html):
    """Return ``{caption: [entry names]}`` of the index's rate-limit sections."""
    return {name: [entry for entry, _ in entries]
            for name, entries in IndexSections(html).sections.items()
            if name.startswith("Rate limits")}


def staff_with(*codenames):
    """A staff user (a client signed in as them) with ``ratelimit_app``'s ``codenames`` only."""
    user = get_user_model().objects.create_user("operator", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="ratelimit_app",
                                                        codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def ban_rule_and_ban():
    """A ban rule and a ban it imposed (rows only: no Redis key behind the ban)."""
    rule = BanRule.objects.create(name="scrapers", scope="ip", events="statuses", statuses="404",
                                  threshold=3, window_s=60, ban_s=600)
    now = timezone.now()
    ban = Ban.objects.create(rule=rule, rule_name=rule.name, scope="ip", who="203.0.113.77",
                             key="rl:{ban:ip:203.0.113.77}", since=now,
                             until=now + datetime.timedelta(seconds=600))
    return rule, ban


def deny_entry():
    return AccessListEntry.objects.create(kind="deny", target="ip", value="192.0.2.0/24",
                                          reason="abuse from this network")


def test_the_index_shows_six_groups_of_at_most_eight_entries(admin_client):
    response = admin_client.get(reverse("admin:index"))
    sections = IndexSections(response.content.decode()).sections
    grouped = {name: entries for name, entries in sections.items()
               if name.startswith("Rate limits")}
    assert {name: [entry for entry, _ in entries] for name, entries in grouped.items()} \
        == ON_THE_INDEX
    # the dashboard first, before any section
    assert first_entry(response.content.decode()) == ("Dashboard", DASHBOARD_URL)
    # the stock index sorts sections by name: the six stay together, the quotas first
    names = list(sections)
    first = names.index("Rate limits")
    assert names[first:first + len(GROUPED_INDEX)] == list(GROUPED_INDEX)
    assert max(len(entries) for entries in grouped.values()) <= MOST_ENTRIES_PER_GROUP
    hrefs = dict(entry for entries in grouped.values() for entry in entries)
    assert hrefs["Credit accounts"] == "/admin/ratelimit_billing/creditaccount/"
    assert hrefs["Simulator"] == "/admin/ratelimit_monitoring/simulator/"
    assert hrefs["Rules"] == "/admin/ratelimit_app/rule/"
    assert hrefs["Ban rules"] == "/admin/ratelimit_protection/banrule/"
    assert hrefs["Bans"] == "/admin/ratelimit_protection/ban/"
    assert hrefs["Allow and deny lists"] == "/admin/ratelimit_protection/accesslistentry/"
    for href in hrefs.values():  # every entry opens
        assert admin_client.get(href).status_code == 200, href


def test_a_groups_own_page_lists_its_entries_and_its_name_leads_the_breadcrumbs(admin_client):
    page = admin_client.get("/admin/ratelimit_billing/").content.decode()
    assert rate_limit_sections(page) == {
        "Rate limits · Billing": GROUPED_INDEX["Rate limits · Billing"]}
    account = CreditAccount.objects.create(ref="tenant:acme", display="tenant acme")
    change = admin_client.get(f"/admin/ratelimit_billing/creditaccount/{account.pk}/change/")
    assert '<a href="/admin/ratelimit_billing/">Rate limits · Billing</a>' in \
        change.content.decode()


def test_staff_with_only_the_app_models_view_permission_see_and_open_credit_accounts():
    account = CreditAccount.objects.create(ref="tenant:acme", display="tenant acme", granted=5)
    client = staff_with("view_creditaccount")
    index = client.get(reverse("admin:index")).content.decode()
    assert rate_limit_sections(index) == {"Rate limits · Billing": ["Credit accounts"]}
    listed = client.get("/admin/ratelimit_billing/creditaccount/")
    assert listed.status_code == 200 and "tenant acme" in listed.content.decode()
    # the sidebar, on every admin page, names the group and the entry too
    sidebar = IndexSections(listed.content.decode()).sections
    assert [entry for entry, _ in sidebar["Rate limits · Billing"]] == ["Credit accounts"]
    page = client.get(f"/admin/ratelimit_billing/creditaccount/{account.pk}/change/")
    assert page.status_code == 200 and "Top up" not in page.content.decode()  # no add_credittopup
    assert client.get("/admin/ratelimit_billing/credittopup/").status_code == 403


def test_protection_holds_the_penalty_box_and_the_lists_and_leads_their_breadcrumbs(
        admin_client):
    page = admin_client.get("/admin/ratelimit_protection/").content.decode()
    assert rate_limit_sections(page) == {
        "Rate limits · Protection": ["Allow and deny lists", "Ban log", "Ban rules", "Bans"]}
    assert "ratelimit_app/admin.css" in page  # the app's accessibility styles, as on each group's
    rule, ban = ban_rule_and_ban()
    entry = deny_entry()
    for path in (f"/admin/ratelimit_protection/banrule/{rule.pk}/change/",
                 f"/admin/ratelimit_protection/ban/{ban.pk}/change/",
                 f"/admin/ratelimit_protection/accesslistentry/{entry.pk}/change/"):
        html = admin_client.get(path).content.decode()
        assert '<a href="/admin/ratelimit_protection/">Rate limits · Protection</a>' in html, path


def test_staff_with_only_the_app_models_permissions_see_and_use_the_protection_pages():
    rule, ban = ban_rule_and_ban()
    deny_entry()
    client = staff_with("view_banrule", "view_ban", "view_accesslistentry")
    index = client.get(reverse("admin:index")).content.decode()
    assert rate_limit_sections(index) == {
        "Rate limits · Protection": ["Allow and deny lists", "Ban rules", "Bans"]}
    for path, shown in (("/admin/ratelimit_protection/banrule/", "scrapers"),
                        ("/admin/ratelimit_protection/ban/", "203.0.113.77"),
                        ("/admin/ratelimit_protection/accesslistentry/",
                         "abuse from this network")):
        listed = client.get(path)
        assert listed.status_code == 200 and shown in listed.content.decode(), path
    assert client.get(f"/admin/ratelimit_protection/ban/{ban.pk}/change/").status_code == 200
    assert client.get("/admin/ratelimit_protection/banrule/add/").status_code == 403
    assert client.get("/admin/ratelimit_protection/accesslistentry/add/").status_code == 403
    bans = client.get("/admin/ratelimit_protection/ban/").content.decode()
    assert "Lift the selected bans" not in bans  # the action asks ratelimit_app.lift_ban
    get_user_model().objects.get(username="operator").user_permissions.add(
        Permission.objects.get(content_type__app_label="ratelimit_app", codename="lift_ban"))
    bans = client.get("/admin/ratelimit_protection/ban/").content.decode()
    assert "Lift the selected bans" in bans


def test_every_placed_admin_answers_permissions_as_on_the_app_model(admin_user):
    """Same answers as the admin class registered on the app's model, for a staff user with
    every permission of that model and for one with none (the proxies have none of their own)."""
    request_of = lambda user: type("Request", (), {"user": user})()  # noqa: E731
    every = get_user_model().objects.create_user("every", is_staff=True)
    every.user_permissions.set(Permission.objects.filter(content_type__app_label="ratelimit_app"))
    every = get_user_model().objects.get(pk=every.pk)  # no permission cache
    nobody = get_user_model().objects.create_user("nobody", is_staff=True)
    for model, admin_class in ADMIN_CLASSES.items():
        proxy = placed_model(model)
        if proxy is model:
            continue
        placed = admin.site.get_model_admin(proxy)
        on_the_app_model = admin_class(model, admin.site)
        for user in (every, nobody):
            request = request_of(user)
            assert placed.get_model_perms(request) == on_the_app_model.get_model_perms(request)
            assert placed.has_module_permission(request) == \
                on_the_app_model.has_module_permission(request)
        assert True in placed.get_model_perms(request_of(every)).values(), model
        assert not Permission.objects.filter(content_type__app_label=proxy._meta.app_label) \
            .exists()


def test_an_old_address_answers_308_to_the_same_path_and_query_under_the_group(admin_client):
    account = CreditAccount.objects.create(ref="tenant:acme", display="tenant acme")
    response = admin_client.get("/admin/ratelimit_app/creditaccount/?q=acme&o=1")
    assert response.status_code == 308
    assert response["Location"] == "/admin/ratelimit_billing/creditaccount/?q=acme&o=1"
    old = reverse("admin:ratelimit_app_creditaccount_change", args=[account.pk])  # reversible
    assert old == f"/admin/ratelimit_app/creditaccount/{account.pk}/change/"
    assert admin_client.get(old)["Location"] == \
        f"/admin/ratelimit_billing/creditaccount/{account.pk}/change/"
    assert reverse("admin:ratelimit_app_dashboard_inspect") == \
        "/admin/ratelimit_app/dashboard/inspect/"
    assert admin_client.get("/admin/ratelimit_app/dashboard/inspect/?q=ip%3A10.0.0.1") \
        ["Location"] == "/admin/ratelimit_monitoring/dashboard/inspect/?q=ip%3A10.0.0.1"
    followed = admin_client.get("/admin/ratelimit_app/creditaccount/?q=acme", follow=True)
    assert followed.redirect_chain == [("/admin/ratelimit_billing/creditaccount/?q=acme", 308)]
    assert "tenant acme" in followed.content.decode()


def test_the_protection_pages_old_addresses_answer_308_under_protection(admin_client):
    rule, ban = ban_rule_and_ban()
    entry = deny_entry()
    moved = {
        "/admin/ratelimit_app/banrule/?q=scrapers":
            "/admin/ratelimit_protection/banrule/?q=scrapers",
        f"/admin/ratelimit_app/banrule/{rule.pk}/change/":
            f"/admin/ratelimit_protection/banrule/{rule.pk}/change/",
        "/admin/ratelimit_app/ban/?shadow__exact=0":
            "/admin/ratelimit_protection/ban/?shadow__exact=0",
        f"/admin/ratelimit_app/ban/{ban.pk}/change/":
            f"/admin/ratelimit_protection/ban/{ban.pk}/change/",
        f"/admin/ratelimit_app/accesslistentry/{entry.pk}/change/":
            f"/admin/ratelimit_protection/accesslistentry/{entry.pk}/change/",
    }
    for old, new in moved.items():
        response = admin_client.get(old)
        assert (response.status_code, response["Location"]) == (308, new)
        assert admin_client.get(new).status_code == 200, new
    # the old URL names still reverse (to the old address); the app's links ask placement
    assert reverse("admin:ratelimit_app_ban_change", args=[ban.pk]) == \
        f"/admin/ratelimit_app/ban/{ban.pk}/change/"
    assert reverse(admin_url_name(BanRule, "changelist")) == \
        "/admin/ratelimit_protection/banrule/"
    assert reverse(admin_url_name(AccessListEntry, "change"), args=[entry.pk]) == \
        f"/admin/ratelimit_protection/accesslistentry/{entry.pk}/change/"


def test_a_post_to_an_old_address_is_sent_again_with_its_body(admin_client, admin_user):
    free = Plan.objects.create(slug="free", name="Free")
    old_add = "/admin/ratelimit_app/planassignment/add/"
    data = {"user": str(admin_user.pk), "plan": str(free.pk), "tenant": "acme",
            "starts_at_0": "", "starts_at_1": "", "ends_at_0": "", "ends_at_1": "", "reason": ""}
    response = admin_client.post(old_add, data)
    assert response.status_code == 308
    assert response["Location"] == "/admin/ratelimit_callers/planassignment/add/"
    followed = admin_client.post(old_add, data, follow=True)
    assert followed.redirect_chain[0] == ("/admin/ratelimit_callers/planassignment/add/", 308)
    assert PlanAssignment.objects.get().tenant == "acme"  # the body reached the new page


def test_an_edit_through_a_groups_page_is_announced_and_audited(admin_client, admin_user):
    """The group's pages save proxies, and a proxy's save is sent as the proxy: the version
    bump and the audit trail must hear it as they hear the app model's."""
    free = Plan.objects.create(slug="free", name="Free")
    Rule.objects.create(name="free-user", plan=free, scope="user", rate=60, period_s=60,
                        burst=30)
    key = ApiKey(user=admin_user, name="ci")
    key.set_new_key()
    key.save()
    before_version, before_entries = limiter().read_version(), AuditEntry.objects.count()
    response = admin_client.post(
        f"/admin/ratelimit_callers/apikey/{key.pk}/change/",
        {"user": str(admin_user.pk), "name": "ci", "plan": str(free.pk), "starts_at_0": "",
         "starts_at_1": "", "ends_at_0": "", "ends_at_1": "", "reason": "", "tenant": "",
         "active": "on"})
    assert response.status_code == 302
    assert ApiKey.objects.get().plan == free
    assert limiter().read_version() != before_version
    assert AuditEntry.objects.count() == before_entries + 1
    entry = AuditEntry.objects.order_by("-id").first()
    assert entry.user == admin_user and "plan" in entry.summary


def test_the_apps_own_links_go_to_the_groups_pages(admin_client, admin_user):
    account = CreditAccount.objects.create(ref="tenant:acme", display="tenant acme")
    CreditTopUp.objects.create(account=account, top_up_id="t-1", units=5)
    assert reverse(admin_url_name(CreditAccount, "top_up"), args=[account.pk]) == \
        f"/admin/ratelimit_billing/creditaccount/{account.pk}/top-up/"
    assert admin_url_name(Rule, "changelist") == "admin:ratelimit_app_rule_changelist"
    page = admin_client.get(f"/admin/ratelimit_billing/creditaccount/{account.pk}/change/")
    html = page.content.decode()
    assert f'href="/admin/ratelimit_billing/credittopup/?account__id__exact={account.pk}"' in html
    assert f'action="/admin/ratelimit_billing/creditaccount/{account.pk}/top-up/"' in html
    dashboard = admin_client.get("/admin/ratelimit_monitoring/dashboard/").content.decode()
    assert 'data-url="/admin/ratelimit_monitoring/dashboard/data.json"' in dashboard
    assert 'action="/admin/ratelimit_monitoring/dashboard/callers/"' in dashboard
    override = IdentityOverride.objects.create(ip="10.0.0.1", exempt=True)
    change = admin_client.get(f"/admin/ratelimit_callers/identityoverride/{override.pk}/change/")
    assert 'href="/admin/ratelimit_monitoring/auditentry/?touched=' in change.content.decode()
    rules = admin_client.get("/admin/ratelimit_app/rule/").content.decode()
    assert 'href="/admin/ratelimit_monitoring/simulator/"' in rules
    rule, ban = ban_rule_and_ban()
    ban_page = admin_client.get(f"/admin/ratelimit_protection/ban/{ban.pk}/change/")
    ban_html = ban_page.content.decode()
    assert f'<a href="/admin/ratelimit_protection/banrule/{rule.pk}/change/">scrapers</a>' \
        in ban_html
    # (Django's own raw-id lookup beside a foreign key links the old address, which redirects)
    stock_lookup = re.compile(r'<a href="[^"]*" class="related-lookup"')
    for html in (html, dashboard, stock_lookup.sub("", change.content.decode()), rules,
                 ban_html):
        for model in ("creditaccount", "credittopup", "dashboard", "auditentry", "apikey",
                      "identityoverride", "banrule", "ban", "accesslistentry"):
            assert f"/admin/ratelimit_app/{model}/" not in html


def test_the_simulator_has_its_own_entry_and_keeps_its_old_page(admin_client):
    entry = admin_client.get("/admin/ratelimit_monitoring/simulator/?endpoint=api%3Aitems"
                             "&method=GET&ip=10.0.0.1")
    html = entry.content.decode()
    assert entry.status_code == 200 and "What would this request do?" in html
    assert '<a href="/admin/ratelimit_monitoring/simulator/">Simulator</a>' in html  # breadcrumbs
    assert admin_client.get("/admin/ratelimit_app/rule/simulate/").status_code == 200
    assert staff_with("view_plan").get("/admin/ratelimit_monitoring/simulator/").status_code \
        == 403


def test_the_migrations_match_the_models():
    """``makemigrations --check``: the group apps' proxies are in their initial migrations."""
    done = subprocess.run([sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No changes detected" in done.stdout


INDEX_WITHOUT_GROUPS = """
import json
from django.contrib import admin
from django.core.checks import run_checks
from django.test import RequestFactory
from django.urls import reverse

class Everyone:  # a user holding every permission; the index needs no database
    is_active = is_staff = is_superuser = True
    def has_perm(self, perm, obj=None): return True
    def has_module_perms(self, label): return True

request = RequestFactory().get("/admin/")
request.user = Everyone()
print(json.dumps({
    "sections": {str(app["name"]): [str(m["name"]) for m in app["models"]]
                 for app in admin.site.get_app_list(request)},
    "account": reverse("admin:ratelimit_app_creditaccount_changelist"),
    "checks": [m.id for m in run_checks(tags=["ratelimit_app"], include_deployment_checks=False)
               if m.id != "ratelimit_app.W004"],  # the store is the test's business elsewhere
}))
"""


def test_without_the_group_apps_everything_is_in_one_section_and_no_check_complains():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.admin.settings_without_groups"}
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", INDEX_WITHOUT_GROUPS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    rate_limits = {name: entries for name, entries in found["sections"].items()
                   if name.startswith("Rate limits")}
    assert list(rate_limits) == ["Rate limits"]
    assert sorted(rate_limits["Rate limits"]) == sorted(
        entry for name, entries in GROUPED_INDEX.items() for entry in entries
        if entry != "Simulator")  # the simulator stays a page beside the rules
    assert found["account"] == "/admin/ratelimit_app/creditaccount/"
    assert found["checks"] == []


def test_the_apps_index_page_by_task_holds_what_the_group_apps_hold(admin_client):
    # admin/index_tasks.py names the group apps' sections and their models a second time, for
    # a project without them: the two say the same
    from django.apps import apps

    from ratelimit_app.admin.index_tasks import TASKS

    grouped = {app.verbose_name: sorted(model._meta.model_name for model in app.get_models())
               for app in apps.get_app_configs() if app.name.startswith("ratelimit_app.groups.")}
    tasks = {name: sorted(models) for name, models in TASKS[1:]}
    grouped["Rate limits · Monitoring"].remove("simulator")  # the rules' page without the group
    assert tasks == grouped
    # with the groups installed, the app's own page holds the quotas alone, as the index does
    page = admin_client.get("/admin/ratelimit_app/").content.decode()
    assert rate_limit_sections(page) == {"Rate limits": GROUPED_INDEX["Rate limits"]}


APP_INDEX_WITHOUT_GROUPS = """
import json
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import setup_test_environment
from tests.admin.test_index_groups import first_entry, rate_limit_sections

setup_test_environment()
connection.creation.create_test_db(verbosity=0)  # an in-memory SQLite test database
client = Client()
client.force_login(get_user_model().objects.create_superuser("admin"))
app_index = client.get("/admin/ratelimit_app/").content.decode()
index = client.get("/admin/").content.decode()
print(json.dumps({"app_index": rate_limit_sections(app_index), "first": [
    first_entry(app_index), first_entry(index)]}))
"""


def test_without_the_group_apps_the_apps_own_page_shows_a_table_per_task():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.admin.settings_without_groups",
           "SQLITE_PATH": ":memory:"}
    env.pop("POSTGRES_DB", None)  # SQLite: its test database may not clash with the suite's
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", APP_INDEX_WITHOUT_GROUPS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    expected = {name: entries for name, entries in ON_THE_INDEX.items()}
    expected["Rate limits · Monitoring"] = ["Audit entries"]  # no simulator entry
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["app_index"] == expected
    # the dashboard first on the app's page and on the admin's index
    dashboard = ["Dashboard", "/admin/ratelimit_app/dashboard/"]
    assert found["first"] == [dashboard, dashboard]


PAGES_WITHOUT_GROUPS = """
import json
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
connection.creation.create_test_db(verbosity=0)  # an in-memory SQLite test database
client = Client()
client.force_login(get_user_model().objects.create_superuser("admin"))
paths = ["/admin/ratelimit_app/banrule/", "/admin/ratelimit_app/banrule/add/",
         "/admin/ratelimit_app/ban/", "/admin/ratelimit_app/accesslistentry/",
         "/admin/ratelimit_app/accesslistentry/add/", "/admin/ratelimit_protection/ban/"]
print(json.dumps({path: client.get(path).status_code for path in paths}))
"""


def test_without_the_group_apps_the_protection_pages_work_under_ratelimit_app():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.admin.settings_without_groups",
           "SQLITE_PATH": ":memory:"}
    env.pop("POSTGRES_DB", None)  # SQLite: its test database may not clash with the suite's
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", PAGES_WITHOUT_GROUPS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "/admin/ratelimit_app/banrule/": 200, "/admin/ratelimit_app/banrule/add/": 200,
        "/admin/ratelimit_app/ban/": 200, "/admin/ratelimit_app/accesslistentry/": 200,
        "/admin/ratelimit_app/accesslistentry/add/": 200,
        "/admin/ratelimit_protection/ban/": 404}  # no such section without the group


def test_a_lists_history_keeps_the_changes_logged_while_it_was_under_callers(
        admin_client, admin_user):
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    entry = deny_entry()
    # the Callers group's proxy, before the lists moved to Protection (its content type stays)
    under_callers, _ = ContentType.objects.get_or_create(app_label="ratelimit_callers",
                                                         model="accesslistentry")
    LogEntry.objects.create(
        user=admin_user, content_type=under_callers, object_id=str(entry.pk),
        object_repr=str(entry), action_flag=CHANGE,
        change_message="Changed the reason under Callers.")
    history = admin_client.get(
        f"/admin/ratelimit_protection/accesslistentry/{entry.pk}/history/").content.decode()
    assert "Changed the reason under Callers." in history


def test_an_objects_history_keeps_the_changes_logged_before_its_group_was_installed(
        admin_client, admin_user):
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    override = IdentityOverride.objects.create(ip="10.0.0.1", exempt=True, reason="launch")
    LogEntry.objects.create(  # as the admin logged it on the app's model, before
        user=admin_user, content_type=ContentType.objects.get_for_model(IdentityOverride),
        object_id=str(override.pk), object_repr=str(override), action_flag=CHANGE,
        change_message="Changed the reason before the move.")
    page = f"/admin/ratelimit_callers/identityoverride/{override.pk}/"
    data = {"ip": "10.0.0.1", "treatment": "exempt", "reason": "launch week",
            "starts_at_0": "", "starts_at_1": "", "ends_at_0": "", "ends_at_1": "",
            "user": "", "api_key": "", "rule": ""}
    assert admin_client.post(f"{page}change/", data).status_code == 302
    history = admin_client.get(f"{page}history/").content.decode()
    assert "Changed the reason before the move." in history
    assert "Changed Reason." in history  # the change just made, logged as the proxy's
