"""Load the demo plans, rules, costs, users and API keys (idempotent)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from ratelimit_app.models import (
    ApiKey,
    Counts,
    EndpointCost,
    Mode,
    Plan,
    PlanAssignment,
    Rule,
    Scope,
    hash_api_key,
)

PLANS = [
    # slug, name, default for signed-in, default for anonymous
    ("free", "Free", True, True),
    ("pro", "Pro", False, False),
    ("enterprise", "Enterprise", False, False),
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
]

# Failed authentications (wrong passwords, unknown tokens or API keys) per client IP:
# name, rate, period_s, burst. Ten tries, then one more a minute.
FAILED_AUTH_RULES = [
    ("auth-failures", 1, 60, 10),
]

# endpoint, method, cost
COSTS = [
    ("api:search", "GET", 5),
    ("api:reports", "POST", 20),
]

# username, plan, tenant, API key. The keys' first ApiKey.PREFIX_LENGTH (8) characters differ,
# so the inspector finds each demo key by the prefix the dashboard shows.
USERS = [
    ("alice", "free", "", "rk_alice_free"),
    ("bob", "pro", "", "rk_bob_pro"),
    ("carol", "enterprise", "acme", "rk_carol_enterprise"),
]
DEMO_PASSWORD = "demo-pass"
ADMIN = ("admin", "admin")


class Command(BaseCommand):
    help = "Load the demo plans, rules, endpoint costs, users and API keys."

    @transaction.atomic
    def handle(self, *args, **options):
        plans = {}
        for slug, name, default_auth, default_anon in PLANS:
            plans[slug], _ = Plan.objects.update_or_create(
                slug=slug, defaults={"name": name, "default_for_authenticated": default_auth,
                                     "default_for_anonymous": default_anon})
        for endpoint, method, cost in COSTS:
            EndpointCost.objects.update_or_create(
                endpoint=endpoint, method=method, plan=None, defaults={"cost": cost})
        for name, plan, scope, endpoint, rate, period_s, burst, mode in RULES:
            Rule.objects.update_or_create(name=name, defaults={
                "plan": plans[plan] if plan else None, "scope": scope, "endpoint": endpoint,
                "rate": rate, "period_s": period_s, "burst": burst, "mode": mode, "enabled": True})
        for name, rate, period_s, burst in FAILED_AUTH_RULES:
            Rule.objects.update_or_create(name=name, defaults={
                "plan": None, "scope": Scope.IP, "endpoint": "", "counts": Counts.FAILED_AUTH,
                "rate": rate, "period_s": period_s, "burst": burst, "mode": Mode.ENFORCE,
                "enabled": True})
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

        self.stdout.write(self.style.SUCCESS("Demo data loaded."))
        self.stdout.write(f"  Admin:      http://127.0.0.1:PORT/admin/  user {ADMIN[0]} / {ADMIN[1]}")
        for username, plan, _tenant, raw_key in USERS:
            self.stdout.write(f"  {username:<6} ({plan:<10}) password {DEMO_PASSWORD}  "
                              f"X-Api-Key: {raw_key}")
