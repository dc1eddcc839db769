"""Load the demo plans, rules, costs, users and API keys, a dated override, a prepaid key's
welcome credit and the webhook endpoint of the demo's own receiver (idempotent)."""

import datetime

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from ratelimit_app.business.credits.ledger import client_of, top_up
from ratelimit_app.models import (
    MAX_PERIOD_S,
    NOMINAL_PERIOD_S,
    ApiKey,
    CalendarPeriod,
    Counts,
    EndpointCost,
    Event,
    IdentityOverride,
    Kind,
    Mode,
    Plan,
    PlanAssignment,
    Rule,
    Scope,
    WebhookEndpoint,
    hash_api_key,
)
from ratelimit_app.runtime.limiter import default_limiter

PLANS = [
    # slug, name, default for signed-in, default for anonymous
    ("free", "Free", True, True),
    ("pro", "Pro", False, False),
    ("enterprise", "Enterprise", False, False),
    ("studio", "AI Studio", False, False),
    ("prepaid", "Pay as you go", False, False),
]

# name, plan, scope, endpoint, rate, period_s, burst, mode
RULES = [
    ("global", None, Scope.GLOBAL, "", 500, 1, 1000, Mode.ENFORCE),
    ("free-plan", "free", Scope.PLAN, "", 3000, 60, 3000, Mode.ENFORCE),
    ("free-ip", "free", Scope.IP, "", 20, 60, 40, Mode.ENFORCE),
    ("free-user", "free", Scope.USER, "", 60, 60, 30, Mode.ENFORCE),
    ("free-reports", "free", Scope.USER, "api:reports", 5, 3600, 5, Mode.ENFORCE),
    ("pro-user", "pro", Scope.USER, "", 600, 60, 200, Mode.ENFORCE),
    ("enterprise-user", "enterprise", Scope.USER, "", 6000, 60, 1000, Mode.ENFORCE),
    ("enterprise-tenant", "enterprise", Scope.TENANT, "", 20000, 60, 3000, Mode.ENFORCE),
    ("search-ip-trial", None, Scope.IP, "api:search", 10, 60, 10, Mode.SHADOW),
    ("studio-minute", "studio", Scope.USER, "", 1200, 60, 600, Mode.ENFORCE),
]

# Daily calendar quotas: name, plan, scope, units per day, alert thresholds (percent used),
# debt (units a metered request may take the quota below empty). AI Studio's 500 words a day
# are spent by three streams of 200 (ratelimit_traffic): alerts at 50, 80 and 100 %, and the
# third stream ends 100 below empty.
DAILY_QUOTAS = [
    ("studio-daily", "studio", Scope.USER, 500, "50,80,100", 200),
]

# Prepaid credits: name, plan, scope, allowance (units included before prepaid ones are spent),
# when the allowance is whole again ("": given once, never refilled). Pay as you go includes 20
# units once (a trial: one report); then each request spends its cost from the caller's prepaid
# balance, and is refused 402 once that cannot pay it, until an operator tops the account up in
# the admin.
CREDIT_RULES = [
    ("prepaid-credits", "prepaid", Scope.USER, 20, ""),
]

# Failed authentications (wrong passwords, unknown tokens or API keys) per client IP:
# name, rate, period_s, burst. Ten tries, then one more a minute.
FAILED_AUTH_RULES = [
    ("auth-failures", 1, 60, 10),
]

# endpoint, method, cost, metered, minimum. A metered cost is the estimate a request must find
# in its buckets to start; it is then charged what it reports (the words api:generate streams).
# The estimate stays within free-user's burst (30), or free callers could never start a stream.
COSTS = [
    ("api:search", "GET", 5, False, 0),
    ("api:reports", "POST", 20, False, 0),
    ("api:generate", "GET", 20, True, 1),
]

# username, plan, tenant, API key. The keys' first ApiKey.PREFIX_LENGTH (8) characters differ,
# so the inspector finds each demo key by the prefix the dashboard shows.
USERS = [
    ("alice", "free", "", "rk_alice_free"),
    ("bob", "pro", "", "rk_bob_pro"),
    ("carol", "enterprise", "acme", "rk_carol_enterprise"),
    ("dana", "studio", "", "rk_dana_studio"),
    ("erin", "prepaid", "", "rk_erin_prepaid"),
]
DEMO_PASSWORD = "demo-pass"
ADMIN = ("admin", "admin")

# A dated override, renewed by every load: user, rule, reason, days, factor (twice the words
# per minute while AI Studio launches: 2400 per 60 s, burst 1200).
LAUNCH_WEEK = ("dana", "studio-minute", "launch week", 7, 2)
WEBHOOK_ENDPOINT = "demo receiver"
# The welcome credit of a prepaid demo key: user, units, top-up id (its idempotency key, made
# per account: loaded again, it credits nothing again), note. Five reports (cost 20 each), after
# the trial allowance's one.
WELCOME_CREDIT = ("erin", 100, "demo-welcome", "welcome credit of the demo")


class Command(BaseCommand):
    help = ("Load the demo plans, rules, endpoint costs, users and API keys, a dated override, "
            "a prepaid key's welcome credit and the webhook endpoint of the demo's receiver.")

    def add_arguments(self, parser):
        parser.add_argument("--server-url", default="http://127.0.0.1:8000",
                            help="Where the demo server will listen: its webhook receiver is "
                                 "there, and the URLs printed. Default: %(default)s")

    @transaction.atomic
    def handle(self, *args, server_url, **options):
        server_url = server_url.rstrip("/")
        plans = {}
        for slug, name, default_auth, default_anon in PLANS:
            plans[slug], _ = Plan.objects.update_or_create(
                slug=slug, defaults={"name": name, "default_for_authenticated": default_auth,
                                     "default_for_anonymous": default_anon})
        for endpoint, method, cost, metered, minimum in COSTS:
            EndpointCost.objects.update_or_create(
                endpoint=endpoint, method=method, plan=None,
                defaults={"cost": cost, "metered": metered, "minimum": minimum})
        for name, plan, scope, endpoint, rate, period_s, burst, mode in RULES:
            Rule.objects.update_or_create(name=name, defaults={
                "plan": plans[plan] if plan else None, "scope": scope, "endpoint": endpoint,
                "rate": rate, "period_s": period_s, "burst": burst, "mode": mode, "enabled": True})
        for name, rate, period_s, burst in FAILED_AUTH_RULES:
            Rule.objects.update_or_create(name=name, defaults={
                "plan": None, "scope": Scope.IP, "endpoint": "", "counts": Counts.FAILED_AUTH,
                "rate": rate, "period_s": period_s, "burst": burst, "mode": Mode.ENFORCE,
                "enabled": True})
        for name, plan, scope, units, thresholds, debt in DAILY_QUOTAS:
            # burst and period as Rule.clean() stores them for a calendar quota
            Rule.objects.update_or_create(name=name, defaults={
                "plan": plans[plan], "scope": scope, "endpoint": "", "kind": Kind.CALENDAR,
                "calendar_period": CalendarPeriod.DAY, "rate": units, "burst": units,
                "period_s": NOMINAL_PERIOD_S[CalendarPeriod.DAY], "alert_thresholds": thresholds,
                "debt": debt, "mode": Mode.ENFORCE, "enabled": True})
        for name, plan, scope, allowance, refill in CREDIT_RULES:
            # burst and period as Rule.clean() stores them for a credits rule
            Rule.objects.update_or_create(name=name, defaults={
                "plan": plans[plan], "scope": scope, "endpoint": "", "kind": Kind.CREDITS,
                "calendar_period": refill, "rate": allowance, "burst": allowance,
                "period_s": NOMINAL_PERIOD_S.get(refill, MAX_PERIOD_S), "alert_thresholds": "",
                "debt": 0, "mode": Mode.ENFORCE, "enabled": True})
        User = get_user_model()
        for username, plan, tenant, raw_key in USERS:
            user, _ = User.objects.get_or_create(username=username)
            user.set_password(DEMO_PASSWORD)
            user.save()
            PlanAssignment.objects.update_or_create(
                user=user, defaults={"plan": plans[plan], "tenant": tenant})
            demo_key = ApiKey.objects.filter(user=user, name="demo").first()
            if demo_key is None:
                ApiKey.create_key(user, "demo", raw_key=raw_key, tenant=tenant)
            elif demo_key.digest != hash_api_key(raw_key):
                # a database loaded by an older demo holds other keys: print what works
                demo_key.set_new_key(raw_key)
                demo_key.save()
        admin, _ = User.objects.get_or_create(username=ADMIN[0], defaults={"is_staff": True})
        admin.is_staff = admin.is_superuser = True
        admin.set_password(ADMIN[1])
        admin.save()
        self._launch_week(User)
        welcome_ref, welcome_units = self._welcome_credit(User)
        # the demo server's URLconf, whichever one this process runs with (a test's own)
        receiver_url = server_url + reverse("demo:webhook-receiver", urlconf="project.urls")
        WebhookEndpoint.objects.update_or_create(name=WEBHOOK_ENDPOINT, defaults={
            "url": receiver_url, "events": ",".join(Event.values), "enabled": True})

        self.stdout.write(self.style.SUCCESS("Demo data loaded."))
        self.stdout.write(f"  Admin:      {server_url}/admin/  user {ADMIN[0]} / {ADMIN[1]}")
        for username, plan, _tenant, raw_key in USERS:
            self.stdout.write(f"  {username:<6} ({plan:<10}) password {DEMO_PASSWORD}  "
                              f"X-Api-Key: {raw_key}")
        self.stdout.write(f"  Credits:    {WELCOME_CREDIT[0]}'s key ({welcome_ref}) has a welcome "
                          f"credit of {welcome_units} prepaid units; top it up in the admin: "
                          f"Credit accounts → {welcome_ref} → Top up")
        self.stdout.write(f"  Webhooks:   quota alerts are POSTed to {receiver_url}; what it "
                          f"received: {server_url}/admin/demo/receivedwebhook/")

    @staticmethod
    def _welcome_credit(User):
        """Credit the prepaid demo key its welcome units, once per key (the top-up id names the
        account: a key made anew, its old one deleted, is welcomed too). Returns the account's
        ref and the units."""
        username, units, top_up_id, note = WELCOME_CREDIT
        key = ApiKey.objects.get(user=User.objects.get(username=username), name="demo")
        ref = f"key:{key.pk}"
        # Redis is told after the commit; a Redis not running yet is told by the balance's
        # first use (it is rebuilt from the ledger)
        top_up(ref, units, f"{top_up_id}-{ref}", actor="load_demo", note=note,
               client=client_of(default_limiter().store))
        return ref, units

    @staticmethod
    def _launch_week(User):
        """(Re)start the launch week override: from now, for its days."""
        username, rule, reason, days, factor = LAUNCH_WEEK
        now = timezone.now()
        IdentityOverride.objects.update_or_create(
            user=User.objects.get(username=username), rule=Rule.objects.get(name=rule),
            reason=reason, defaults={
                "starts_at": now, "ends_at": now + datetime.timedelta(days=days),
                "factor": factor, "rate": None, "period_s": None, "burst": None,
                "exempt": False})
