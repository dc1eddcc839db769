"""Every page of the app's admin in Debian's Chromium at 1280 × 800, in light and dark mode: no
page wider than the viewport, no axe-core violation of impact serious or critical (axe's
``label`` rule on: every input, select and textarea labelled), the dashboard and the simulator
usable with the keyboard alone, and the compact lists' rows at most 60 px high on average.

The pages come from the admin's registry (each of the app's model admins: its list, its add
page if it has one, the change page of one row) plus the custom views of ``custom_pages``, so
a new model admin is checked without being named here. axe-core comes from PyPI's
``axe-playwright-python``, which bundles it (no browser or script is downloaded).
"""

import io
from dataclasses import dataclass

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import RequestFactory
from django.urls import NoReverseMatch, reverse

from ratelimit_app.config.rule_kinds import FORM_KINDS
from ratelimit_app.admin.placement import admin_url_name
from ratelimit_app.models import ApiKey, AuditEntry, CreditAccount, IdentityOverride, QuotaAlert

from ..helpers import create_usage_records, limiter, poll_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]

VIEWPORT = {"width": 1280, "height": 800}
SERIOUS = {"serious", "critical"}
# axe's options: violations only, and the rule that every form control has a label kept on
# whatever axe's defaults become.
AXE_OPTIONS = {"resultTypes": ["violations"], "rules": {"label": {"enabled": True}}}
# The lists issue 49 asks to read at a glance: their rows average at most this high with the
# demo's data.
MAX_AVERAGE_ROW_PX = 60
COMPACT_LISTS = ["rule", "plan", "endpointcost", "identityoverride", "apikey", "planassignment",
                 "creditaccount", "credittopup", "quotaalert", "webhookendpoint",
                 "webhookdelivery"]
# The usage page's range that holds create_usage_records' rows.
USAGE_RANGE = "?date_from=2026-02-01&date_to=2026-03-31"


@dataclass(frozen=True)
class AdminPage:
    name: str  # "apikey list", "dashboard", …
    path: str
    click: str = ""  # a button to press once the page is open (a POST's confirmation page)


def _app_admins():
    """Return ``(model, model_admin)`` of every model admin the app registers, whatever the
    app label its models are under."""
    return [(model, model_admin) for model, model_admin in admin.site._registry.items()
            if type(model_admin).__module__.startswith("ratelimit_app.")]


def _url(name, *args):
    """Return the admin URL ``name`` reversed with ``args``, or None if the admin has none."""
    try:
        return reverse(f"admin:{name}", args=args)
    except NoReverseMatch:
        return None


def registry_pages(superuser):
    """Return the AdminPage of each model admin's list, add page (if it may add) and one row's
    change page (if it has rows and a change page)."""
    request = RequestFactory().get("/admin/")
    request.user = superuser
    pages = []
    for model, model_admin in _app_admins():
        opts = model._meta
        prefix, label = f"{opts.app_label}_{opts.model_name}", opts.model_name
        pages.append(AdminPage(f"{label} list", _url(f"{prefix}_changelist")))
        if model_admin.has_add_permission(request) and _url(f"{prefix}_add"):
            pages.append(AdminPage(f"{label} add", _url(f"{prefix}_add")))
        row = model._default_manager.order_by("pk").first() \
            if opts.concrete_model._meta.managed else None
        if row is not None and _url(f"{prefix}_change", row.pk):
            pages.append(AdminPage(f"{label} change", _url(f"{prefix}_change", row.pk)))
    return pages


def custom_pages():
    """Return the app's pages that are not a model admin's list, add or change page."""
    callers = reverse("admin:ratelimit_app_dashboard_caller")
    erin_key = ApiKey.objects.get(user__username="erin")  # prepaid credits
    dana = get_user_model().objects.get(username="dana")  # an override, a daily quota
    simulator = reverse("admin:ratelimit_app_rule_simulate")
    account = CreditAccount.objects.order_by("pk").first()
    entry = AuditEntry.objects.order_by("pk").first()
    bob = get_user_model().objects.get(username="bob")
    app_labels = sorted({model._meta.app_label for model, _ in _app_admins()})
    return [
        AdminPage("admin index", reverse("admin:index")),
        *(AdminPage(f"{label} app index", reverse("admin:app_list", args=[label]))
          for label in app_labels),
        *(AdminPage(f"rule add: {key}", reverse("admin:ratelimit_app_rule_add") + f"?kind={key}")
          for key in FORM_KINDS),
        # the caller's page links here, prefilled: the autocomplete and the sentence filled in
        AdminPage("override add for a caller", reverse(admin_url_name(IdentityOverride, "add"))
                  + f"?user={bob.pk}"),
        AdminPage("caller search", callers),
        AdminPage("caller search with choices", f"{callers}?q=rk_"),
        AdminPage("caller page of a key", f"{callers}?q=key%3A{erin_key.pk}"),
        AdminPage("caller page of a user", f"{callers}?q=user%3A{dana.pk}"),
        AdminPage("caller page of an address", f"{callers}?q=ip%3A127.0.0.1"),
        AdminPage("reset confirmation", f"{callers}?q=user%3A{dana.pk}",
                  click="input[value^='Reset this caller']"),
        AdminPage("simulator", simulator),
        AdminPage("simulator with a result",
                  f"{simulator}?user=alice&ip=203.0.113.7&endpoint=api%3Asearch&method=GET"),
        AdminPage("usage records of a range",
                  reverse("admin:ratelimit_app_usagerecord_changelist") + USAGE_RANGE),
        AdminPage("credit top-up", reverse("admin:ratelimit_app_creditaccount_top_up",
                                           args=[account.pk])),
        AdminPage("audit restore", reverse("admin:ratelimit_app_auditentry_restore",
                                           args=[entry.pk])),
    ]


@pytest.fixture
def app_pages(signed_in_page, live_server):
    """The signed-in page at 1280 × 800 after the demo's traffic (the dashboard's numbers and
    chart, quota alerts and their webhook deliveries) and a few usage records; returns
    ``(page, every AdminPage of the app)``."""
    page = signed_in_page
    page.set_viewport_size(VIEWPORT)
    call_command("ratelimit_traffic", url=live_server.url, requests=60, rps=0, duration=60,
                 stdout=io.StringIO())
    limiter().flusher.flush_now()
    # dana's streams cross AI Studio's alert thresholds: alerts, and deliveries of them (this
    # test runs no alert thread)
    poll_until(lambda: limiter().alerts.drain() is not None and QuotaAlert.objects.exists(),
               what="the alerts of dana's streams")
    create_usage_records()
    superuser = get_user_model().objects.get(username="admin")
    pages = registry_pages(superuser) + custom_pages()
    assert len({p.name for p in pages}) == len(pages), "two pages under one name"
    return page, pages


def open_page(page, admin_page):
    """Open ``admin_page`` (and press its button); fail unless it answers 200."""
    response = page.goto(page.base + admin_page.path)
    assert response.status == 200, f"{admin_page.name}: {response.status} at {admin_page.path}"
    if admin_page.click:
        with page.expect_navigation():
            page.click(admin_page.click)


# The page's width, and the boxes that scroll sideways because their content is wider than
# they are (a list's table in the admin's ``.results``, a dashboard card): a 1280 px screen
# shows such a box, but not all of what it holds. Form controls scroll their own text.
WIDTHS_JS = """() => {
    const boxes = [];
    for (const box of document.querySelectorAll('body *:not(input, textarea, select)')) {
        const scrolls = ['auto', 'scroll'].includes(getComputedStyle(box).overflowX);
        if (scrolls && box.scrollWidth > box.clientWidth + 1) {
            const name = box.id ? '#' + box.id : box.tagName.toLowerCase()
                + [...box.classList].map(c => '.' + c).join('');
            boxes.push([name, Math.round(box.getBoundingClientRect().left + box.scrollWidth)]);
        }
    }
    return [document.documentElement.scrollWidth, boxes];
}"""


def content_width(page):
    """Return ``(width, where)``: how wide the page's content is in px (the page's own
    scrollWidth, or a sideways-scrolling box's content from the page's left edge), and which
    box that is ("page" for the page itself)."""
    width, boxes = page.evaluate(WIDTHS_JS)
    return max([(width, "page"), *((right, name) for name, right in boxes)])


def serious_violations(page):
    """Return ``[(rule id, impact, [targets])]`` of axe's serious and critical violations."""
    # colours read mid-transition (a scheme switched on an open page) are neither theme's
    page.wait_for_function(
        "document.getAnimations().every(animation => animation.playState !== 'running')")
    results = Axe().run(page, options=AXE_OPTIONS).response
    return [(v["id"], v["impact"], [" ".join(map(str, n["target"])) for n in v["nodes"]])
            for v in results["violations"] if v["impact"] in SERIOUS]


def report(failures):
    """Return ``{page name: what it failed}`` as one line per page, for an assertion."""
    return "\n".join(f"{name}: {found}" for name, found in failures.items())


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_page_is_wider_than_1280_px_or_has_a_serious_axe_violation(app_pages, scheme):
    page, pages = app_pages
    # "auto", the admin's default theme, follows the browser's preference
    page.emulate_media(color_scheme=scheme)
    too_wide, violations = {}, {}
    for admin_page in pages:
        open_page(page, admin_page)
        assert page.evaluate("matchMedia('(prefers-color-scheme: dark)').matches") == \
            (scheme == "dark")
        width, where = content_width(page)
        if width > VIEWPORT["width"]:
            too_wide[admin_page.name] = f"{width} px ({where})"
        found = serious_violations(page)
        if found:
            violations[admin_page.name] = found
    assert len(pages) >= 30  # the registry was read (issue 49 counted the app's 34 pages)
    assert not (too_wide or violations), (
        f"wider than {VIEWPORT['width']} px:\n{report(too_wide)}\n"
        f"serious or critical axe violations (rule, impact, targets):\n{report(violations)}")


def test_the_theme_toggles_dark_mode_colours_the_dashboard_as_the_dark_preference_does(
        app_pages):
    """Django's theme toggle sets ``data-theme="dark"`` on <html> under a light preference: the
    chart and the cards take the same colours as under ``prefers-color-scheme: dark``."""
    page, _ = app_pages
    dashboard = page.base + reverse("admin:ratelimit_app_dashboard_changelist")
    colours = ("[...document.querySelectorAll('.rl-chart .rl-allowed, .rl-chart text, .rl-card,"
               " .rl-number')].slice(0, 40).map(e => { const s = getComputedStyle(e);"
               " return [s.fill, s.color, s.backgroundColor].join(' '); })")
    page.emulate_media(color_scheme="light")
    page.goto(dashboard)
    light = page.evaluate(colours)
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate(colours)
    page.emulate_media(color_scheme="light")
    page.evaluate("localStorage.setItem('theme', 'dark')")
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    assert page.evaluate(colours) == dark != light
    assert serious_violations(page) == []
    page.evaluate("localStorage.removeItem('theme')")


# Tab from the top of the page at most this many times (the dashboard has fewer controls).
MAX_TABS = 150
# (a select that Django's autocomplete replaced is reached as its box, a [tabindex] element)
FOCUSABLE = ("#content a[href], #content button, #content input:not([type=hidden]), "
             "#content select:not(.select2-hidden-accessible), #content textarea, "
             "#content [tabindex]:not([tabindex='-1'])")
KEYBOARD_PAGES = {
    "dashboard": "/admin/ratelimit_app/dashboard/",
    "simulator with a result": "/admin/ratelimit_app/rule/simulate/?user=alice&ip=203.0.113.7"
                               "&endpoint=api%3Asearch&method=GET",
}


def tab_through(page):
    """Press Tab from the top of the page until focus comes back round; return, for each
    control focused, ``(its description, whether a focus ring shows)``."""
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.evaluate("window.__tabbed = new Set()")
    seen = []
    for _ in range(MAX_TABS):
        page.keyboard.press("Tab")
        focused = page.evaluate("""() => {
            const e = document.activeElement;
            if (!e || e === document.body) return null;
            const s = getComputedStyle(e);
            const ring = (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0)
                         || s.boxShadow !== 'none';
            if (window.__tabbed.has(e)) return 'again';
            window.__tabbed.add(e);
            e.dataset.tabbed = 'yes';
            return [e.outerHTML.slice(0, 120), ring && e.matches(':focus-visible')];
        }""")
        if focused == "again":
            break
        if focused is not None:
            seen.append(tuple(focused))
    return seen


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_tab_reaches_every_control_with_a_visible_focus_ring(signed_in_page, settings, scheme):
    # no live refresh while tabbing: it replaces the dashboard's tables (and their links)
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "DASHBOARD_REFRESH_S": 3600}
    page = signed_in_page
    page.set_viewport_size(VIEWPORT)
    page.emulate_media(color_scheme=scheme)
    for name, path in KEYBOARD_PAGES.items():
        page.goto(page.base + path)
        focused = tab_through(page)
        assert focused, name
        without_ring = [html for html, ring in focused if not ring]
        assert without_ring == [], f"{name}: no visible focus on {without_ring}"
        # (Tab enters a group of radio buttons once, at its checked one; arrows move in it)
        missed = page.eval_on_selector_all(
            FOCUSABLE, "els => els.filter(e => e.offsetParent !== null && !e.disabled"
                       " && e.dataset.tabbed !== 'yes' && !(e.type === 'radio' && document"
                       ".querySelector(`input[type=radio][name='${e.name}'][data-tabbed=yes]`)))"
                       ".map(e => e.outerHTML.slice(0, 120))")
        assert missed == [], f"{name}: Tab never reaches {missed}"


def average_row_height(page, rows_selector):
    """Return ``(rows, average height in px)`` of the rows ``rows_selector`` finds."""
    heights = page.eval_on_selector_all(
        rows_selector, "rows => rows.map(r => r.getBoundingClientRect().height)")
    return len(heights), sum(heights) / max(1, len(heights))


def test_the_compact_lists_rows_average_at_most_60_px(app_pages):
    page, _ = app_pages
    page.emulate_media(color_scheme="light")
    lists = {name: (reverse(f"admin:ratelimit_app_{name}_changelist"), "#result_list tbody tr")
             for name in COMPACT_LISTS}
    lists["usagerecord"] = (reverse("admin:ratelimit_app_usagerecord_changelist")
                            + USAGE_RANGE, "#usage-records tbody tr")
    measured = {}
    for name, (path, rows) in lists.items():
        page.goto(page.base + path)
        measured[name] = average_row_height(page, rows)
    empty = [name for name, (count, _) in measured.items() if count == 0]
    assert empty == [], "lists without rows measure nothing"
    tall = {name: round(height) for name, (_, height) in measured.items()
            if height > MAX_AVERAGE_ROW_PX}
    assert tall == {}, f"rows average more than {MAX_AVERAGE_ROW_PX} px: {tall}"
