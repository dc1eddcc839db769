"""The quota configuration's rows, edited in the Django admin, and the audit trail of their
changes.

Rows here are never read on the request path: ``config/compiler.py`` compiles them into an
in-process snapshot, and ``runtime/signals.py`` publishes a new config version in Redis on every
committed change so each worker applies it within about a second. ``ratelimit_app.models`` (the
module Django and users import) re-exports every model of the app.
"""

import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..decision.scopes import Scope, hash_api_key
from ..protection.lists import ListValueError, everyone_wide_warning, normalized_value
from .choices import (
    ALERT_MIN_PERIOD_S,
    MAX_BUCKET_UNITS,
    MAX_CONCURRENCY,
    MAX_CONCURRENCY_TIMEOUT_S,
    MAX_PERIOD_S,
    MINIMUM_MESSAGES,
    NOMINAL_PERIOD_S,
    RULE_NAME_RE,
    CalendarPeriod,
    Counts,
    FailureMode,
    Kind,
    ListKind,
    ListTarget,
    Mode,
    parse_alert_thresholds,
)
from .factors import FACTOR_DECIMALS, MAX_FACTOR, MIN_FACTOR, factor_words
from .wording import a_duration, count, duration, either
from .rule_kinds import (
    ConcurrencyLimit,
    burst_below_cost_message,
    cost_above_burst_message,
    form_kind_of,
    kind_of,
)

__all__ = ["Plan", "PlanAssignment", "ApiKey", "Rule", "EndpointCost", "IdentityOverride",
           "AccessListEntry", "ListKind", "ListTarget", "AuditEntry", "AuditSource", "Scope",
           "hash_api_key", "Schedule", "Scheduled",
           "schedule_fields", "schedule_of", "active_at", "Mode", "Counts", "Kind",
           "CalendarPeriod", "FailureMode", "parse_alert_thresholds", "burst_below_cost_message",
           "cost_above_burst_message", "MAX_BUCKET_UNITS", "MAX_PERIOD_S", "RULE_NAME_RE",
           "MINIMUM_MESSAGES", "MAX_CONCURRENCY", "MAX_CONCURRENCY_TIMEOUT_S", "NOMINAL_PERIOD_S",
           "ALERT_MIN_PERIOD_S", "HTTP_METHODS",
           "cost_limit", "tightest_below", "cost_above_limit_message", "BanRule", "BanEvents",
           "Ban", "BanLogKind", "BanLogEntry", "BAN_SCOPES", "parse_statuses"]


class Plan(models.Model):
    """A tier such as free, pro or enterprise."""

    slug = models.SlugField(unique=True, help_text="Short identifier, e.g. 'pro'.")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    default_for_authenticated = models.BooleanField(
        default=False, help_text="Plan of signed-in users and API keys without an assignment."
    )
    default_for_anonymous = models.BooleanField(
        default=False, help_text="Plan of clients that are not signed in."
    )

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.name

    def clean(self):
        for field, label in (
            ("default_for_authenticated", "signed-in users"),
            ("default_for_anonymous", "anonymous clients"),
        ):
            if getattr(self, field):
                other = Plan.objects.filter(**{field: True}).exclude(pk=self.pk).first()
                if other:
                    raise ValidationError(
                        {field: f"“{other}” is already the default plan for {label}; "
                                f"untick it there first."}
                    )


class Schedule(models.TextChoices):
    """Where a row with an optional start and end stands at a moment (see ``Scheduled``)."""

    PERMANENT = "permanent", "Permanent"
    SCHEDULED = "scheduled", "Scheduled"
    ACTIVE = "active", "Active (temporary)"
    EXPIRED = "expired", "Expired"


def schedule_fields(what="the row", reason_length=200):
    """Return new ``(starts_at, ends_at, reason)`` fields for a model body: a row (or ``what``
    of it, as the help texts say) that applies only between its start and end (either may be
    empty), and why (at most ``reason_length`` characters). Declared last in each model, so
    exports list them after the model's own fields."""
    return (
        models.DateTimeField(
            null=True, blank=True, db_index=True,
            help_text=f"Empty: from now on. Otherwise {what} applies from this moment."),
        models.DateTimeField(
            null=True, blank=True, db_index=True,
            help_text=f"Empty: until removed. Otherwise {what} stops applying at this moment "
                      "(it is kept, listed as expired)."),
        models.CharField(
            max_length=reason_length, blank=True,
            help_text="Why, for the next operator: “launch week”, “ticket 4711”."),
    )


def schedule_of(starts_at, ends_at, now):
    """Return the Schedule value, at the datetime ``now``, of a row starting at ``starts_at``
    and ending at ``ends_at`` (None: no start, no end). The policy compile reads rows as
    tuples, not model instances, and asks this directly."""
    if ends_at is not None and ends_at <= now:
        return Schedule.EXPIRED
    if starts_at is not None and starts_at > now:
        return Schedule.SCHEDULED
    if starts_at is None and ends_at is None:
        return Schedule.PERMANENT
    return Schedule.ACTIVE


def active_at(starts_at, ends_at, now):
    """Return True if a row with these dates applies at the datetime ``now``."""
    return schedule_of(starts_at, ends_at, now) in (Schedule.PERMANENT, Schedule.ACTIVE)


class Scheduled:
    """What a model with ``schedule_fields()`` can say about its dates.

    The policy snapshot holds only the rows active when it was compiled and the next moment a
    row starts or ends; every worker recompiles at that moment (``policy.PolicyCache``).
    """

    def schedule_at(self, now):
        """Return the Schedule value of this row at the datetime ``now``."""
        return schedule_of(self.starts_at, self.ends_at, now)

    def is_active_at(self, now):
        """Return True if the row applies at the datetime ``now``."""
        return active_at(self.starts_at, self.ends_at, now)

    def clean_schedule(self):
        """Raise ValidationError if the end is not after the start."""
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": "The end must be after the start: set a later "
                                              "end, or clear one of the two."})

    @classmethod
    def active_q(cls, now):
        """Return the Q of the rows that apply at the datetime ``now``."""
        return (Q(starts_at__isnull=True) | Q(starts_at__lte=now)) & \
            (Q(ends_at__isnull=True) | Q(ends_at__gt=now))


class PlanAssignment(Scheduled, models.Model):
    """Which plan (and tenant) a user is on; with a start or an end, only between them (the
    user is on the default plan for signed-in users outside them)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ratelimit_plan"
    )
    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="assignments")
    tenant = models.CharField(
        max_length=100, blank=True, help_text="Organisation the user belongs to, if any."
    )
    starts_at, ends_at, reason = schedule_fields()

    def __str__(self):
        return f"{self.user} → {self.plan}"

    def clean(self):
        self.clean_schedule()


class ApiKey(Scheduled, models.Model):
    """An API key. Only a digest and a short prefix (for display) are stored.

    Its own plan may have a start and an end (``Scheduled``): outside them the key is on the
    plan of its user, as without a plan of its own. The key itself keeps working.
    """

    PREFIX_LENGTH = 8

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ratelimit_api_keys"
    )
    name = models.CharField(max_length=100, help_text="What the key is used for.")
    prefix = models.CharField(max_length=16, editable=False, db_index=True)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    plan = models.ForeignKey(
        Plan, null=True, blank=True, on_delete=models.SET_NULL,
        help_text="Empty (or outside the dates below): the plan of the key's user.",
    )
    tenant = models.CharField(max_length=100, blank=True)
    active = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)
    starts_at, ends_at, reason = schedule_fields("the key's plan")

    class Meta:
        verbose_name = "API key"

    def __str__(self):
        return f"{self.prefix}… ({self.name})"

    def clean(self):
        self.clean_schedule()
        if not self.plan_id and (self.starts_at or self.ends_at):
            raise ValidationError({"plan": "The start and the end are those of the key's plan: "
                                           "choose a plan, or clear them."})

    @classmethod
    def create_key(cls, user, name, raw_key=None, **fields):
        """Create a key and return ``(api_key, raw_key)``; the raw key is shown once only."""
        api_key = cls(user=user, name=name, **fields)
        raw_key = api_key.set_new_key(raw_key)
        api_key.save()
        return api_key, raw_key

    def set_new_key(self, raw_key=None):
        """Give this key a new secret (not saved yet); return the raw key to show once."""
        raw_key = raw_key or "rk_" + secrets.token_urlsafe(24)
        self.prefix, self.digest = raw_key[: self.PREFIX_LENGTH], hash_api_key(raw_key)
        return raw_key



class Rule(models.Model):
    """One token bucket per scope value: ``rate`` tokens per ``period_s`` up to ``burst``."""

    name = models.CharField(
        max_length=64, unique=True,
        help_text="Shown to clients in the RateLimit headers: letters, digits, '.', '_' or '-'.",
    )
    plan = models.ForeignKey(
        Plan, null=True, blank=True, on_delete=models.CASCADE, related_name="rules",
        help_text="Empty: the rule applies to every plan.",
    )
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.USER)
    endpoint = models.CharField(
        max_length=200, blank=True,
        help_text="Empty: every endpoint, each request charged its endpoint cost. "
                  "Set: only this endpoint, one token per request.",
    )
    kind = models.CharField(
        max_length=12, choices=Kind.choices, default=Kind.TOKEN_BUCKET,
        help_text="Calendar quota: “rate” units per day or month, all usable at once, counted "
                  "from 0 again at midnight (or midnight on the 1st) in the CALENDAR_TIME_ZONE "
                  "setting; period and burst are then not used. Concurrency limit: at most "
                  "“rate” requests of each scope value in flight at once (each holds a slot until "
                  "its response is finished, whatever its cost); “period” is the timeout in "
                  "seconds after which the slot of a request that never finished (a crashed "
                  "worker) is freed; burst is not used.",
    )
    calendar_period = models.CharField(
        max_length=5, choices=CalendarPeriod.choices, blank=True,
        help_text="Calendar quotas: when the count starts again. Prepaid credits: when the "
                  "allowance is whole again (empty: never, it is given once).",
    )
    rate = models.PositiveIntegerField(
        validators=[MinValueValidator(0)],
        help_text="Tokens added per period (a calendar quota: units per day or month; prepaid "
                  "credits: the allowance, units included each day or month, or once, before "
                  "any prepaid unit is spent; 0: none).",
    )
    period_s = models.PositiveIntegerField(
        "period (seconds)", blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_PERIOD_S)],
        help_text="Token buckets only.",
    )
    burst = models.PositiveIntegerField(
        blank=True, validators=[MinValueValidator(1)],
        help_text="Bucket capacity: the most tokens a client can spend at once (token buckets "
                  "only).",
    )
    counts = models.CharField(
        max_length=12, choices=Counts.choices, default=Counts.REQUESTS,
        help_text="Failed authentications: wrong passwords, unknown tokens or API keys cost the "
                  "client IP one token each, and while its bucket is empty every request from "
                  "that IP is refused, whether its credentials are right or not.",
    )
    lease = models.PositiveIntegerField(
        "lease size", default=0,
        help_text="For a busy shared bucket (global, plan or tenant): each worker takes this many "
                  "tokens at a time and spends them locally, so the bucket's Redis node sees one "
                  "call per lease instead of one per request. Never lets more through; a worker "
                  "may hold up to this many tokens for about a second that others cannot use. "
                  "0: off.",
    )
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.ENFORCE)
    on_redis_failure = models.CharField(
        max_length=10, choices=FailureMode.choices, default=FailureMode.DEFAULT
    )
    enabled = models.BooleanField(default=True)
    alert_thresholds = models.CharField(
        max_length=64, blank=True,
        help_text="Percent of the quota used at which to alert, e.g. “80,100”: the signal "
                  "quota_threshold_crossed and the webhooks, once per identity, threshold and "
                  "period. Calendar quotas, and token buckets of a period of at least an hour. "
                  "Prepaid credits: percent of the account's last top-up used (events "
                  "credits.low, and credits.exhausted at 100), once per top-up, noticed by "
                  "the checkpoint of manage.py ratelimit rollup.")
    debt = models.PositiveIntegerField(
        "debt allowed", default=0,
        validators=[MaxValueValidator(MAX_BUCKET_UNITS // 1000)],
        help_text="For metered endpoints (their cost known after the response): how many tokens "
                  "below empty a request that consumed more than the bucket held may take it. "
                  "The caller is then refused until the refill has repaid the debt. What would "
                  "go further is not charged. 0: never below empty. Token buckets and calendar "
                  "quotas counting requests.",
    )
    counted_statuses = models.CharField(
        "count only responses", max_length=200, blank=True,
        help_text="Count only responses with these statuses, e.g. “404” (a scraper walking "
                  "URLs), “401,403” or “4xx”: each such response costs one token once it is "
                  "sent, and a caller with none left is refused. Empty: every request, charged "
                  "on its way in. Token buckets counting requests.")
    counted_path_prefix = models.CharField(
        "count only under", max_length=200, blank=True,
        help_text="Count only responses to requests whose path is under these segments, e.g. "
                  "“/login” (also /login/…, not /loginx). Empty: every path.")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["plan__slug", "scope", "name"]

    def __str__(self):
        return self.name

    def describe(self):
        """Return the rule in words, as the rules list and the plan page show it ("100 requests
        per minute per user or API key, bursts up to 200; enforced"); "—" while a number it
        needs is missing."""
        return form_kind_of(self).sentence(self) or "—"

    def clean(self):
        errors = {}
        kind = kind_of(self)  # what the row's kind checks and derives
        kind.check(self, errors)
        if self.name and not RULE_NAME_RE.match(self.name):
            errors["name"] = ("Use 1–64 letters, digits, '.', '_' or '-', starting with a letter "
                              "or digit: clients read this name in the RateLimit headers.")
        if self.rate is not None and self.rate < kind.minimum_rate:
            errors["rate"] = kind.minimum_rate_message
        if self.period_s is not None and self.period_s < 1:
            errors["period_s"] = MINIMUM_MESSAGES["period_s"]
        if self.lease:
            self._clean_lease(kind, errors)
        self._clean_alert_thresholds(kind, errors)
        if self.debt and kind.debt_refused:
            errors["debt"] = kind.debt_refused
        if self.counted_statuses or self.counted_path_prefix:
            self._clean_counted_responses(errors)
        if self.counts == Counts.FAILED_AUTH:
            self._clean_failed_auth(kind, errors)
        elif not errors:
            self._clean_against_costs(kind, errors)
        if errors:
            raise ValidationError(errors)

    def clean_fields(self, exclude=None):
        # period and burst may be blank (a calendar quota has none), but the kinds that use
        # them need them: checked here, where the fields a form already refused are known
        errors = {}
        exclude = exclude or ()
        try:
            super().clean_fields(exclude)
        except ValidationError as exc:
            errors = exc.update_error_dict(errors)
        kind = form_kind_of(self)  # (a failed-authentication limit words its own fields)
        if isinstance(self.rate, int) and self.rate < kind.minimum_rate and \
                "rate" not in exclude and "rate" not in errors:
            # (the field allows 0 for a credits rule's allowance; every other kind needs 1)
            errors["rate"] = [kind.minimum_rate_message]
        for field, message in kind.required.items():
            if field in ("period_s", "burst") and getattr(self, field) is None and \
                    field not in exclude and field not in errors:
                errors[field] = [message]
        if errors:
            raise ValidationError(errors)

    def _clean_counted_responses(self, errors):
        if self.kind != Kind.TOKEN_BUCKET or self.counts != Counts.REQUESTS:
            errors["counted_statuses"] = ("Only a token bucket counting requests may count "
                                          "responses instead.")
            return
        if self.counted_statuses:
            try:
                parse_statuses(self.counted_statuses)
            except ValueError as exc:
                errors["counted_statuses"] = str(exc)
        if self.counted_path_prefix and not self.counted_path_prefix.startswith("/"):
            errors["counted_path_prefix"] = "A path prefix starts with “/”, e.g. /login."

    def _clean_lease(self, kind, errors):
        if kind.lease_refused:
            errors["lease"] = kind.lease_refused
        elif self.scope not in (Scope.GLOBAL, Scope.PLAN, Scope.TENANT):
            errors["lease"] = ("Leases are for buckets many clients share (global, plan, "
                               "tenant); a client's own bucket is not busy enough to need "
                               "one. Set it to 0.")
        elif self.burst and self.lease > self.burst // 2:
            errors["lease"] = (f"A lease of {self.lease} tokens could hold more than half "
                               f"of the burst ({self.burst}) in one worker; use at most "
                               f"{max(1, self.burst // 2)}.")

    def normalize(self):
        """Write the fields that have one canonical form in it (``alert_thresholds``: "100,80"
        is stored "80,100"), as the admin form and the import both store them; a value that
        does not parse is left for ``clean()`` to refuse."""
        if not self.alert_thresholds.strip():
            self.alert_thresholds = ""
            return
        try:
            self.alert_thresholds = ",".join(map(str, parse_alert_thresholds(
                self.alert_thresholds)))
        except ValueError:
            pass

    def _clean_alert_thresholds(self, kind, errors):
        """Check ``alert_thresholds`` (normalised first: "100,80" -> "80,100")."""
        self.normalize()
        if not self.alert_thresholds:
            return
        try:
            parse_alert_thresholds(self.alert_thresholds)
        except ValueError as exc:
            errors["alert_thresholds"] = str(exc)
            return
        refused = kind.alerts_refused
        if self.counts == Counts.FAILED_AUTH or self.lease:
            refused = ConcurrencyLimit.alerts_refused  # the same words: what alerts are for
        if refused:
            errors["alert_thresholds"] = refused

    def _clean_failed_auth(self, kind, errors):
        if kind.failed_auth_refused:
            errors["kind"] = kind.failed_auth_refused
        if self.scope != Scope.IP:
            errors["scope"] = ("Failed authentications are counted per client IP (the "
                               "caller is unknown when its credentials fail): choose "
                               "“Client IP”.")
        if self.plan_id:
            errors["plan"] = ("A failed authentication has no plan yet (the caller is "
                              "unknown): leave the plan empty.")
        if self.debt:
            errors["debt"] = ConcurrencyLimit.debt_refused

    def _clean_against_costs(self, kind, errors):
        """Refuse a limit below the largest endpoint cost this rule is charged (such requests
        could never pass); endpoint rules count calls, one token each, and a limit on
        responses is charged one token per response it counts (``form_kind_of``)."""
        limit = form_kind_of(self).cost_limit(self)
        largest = self.largest_cost() if limit else None
        if largest and limit < largest[0]:
            field, message = kind.limit_error(self, limit, *largest)
            errors[field] = message

    def credits_clash(self):
        """Return another credits rule that spends the same balances as this one (same scope,
        overlapping plan), or None."""
        clash = Rule.objects.filter(kind=Kind.CREDITS, scope=self.scope).exclude(pk=self.pk)
        if self.plan_id is not None:
            clash = clash.filter(Q(plan__isnull=True) | Q(plan_id=self.plan_id))
        return clash.first()

    def largest_cost(self):
        """Return (cost, description) of the most expensive request this rule is charged for,
        or None."""
        if self.endpoint:
            return None  # endpoint rules count calls: one token each
        costs = EndpointCost.objects.all()
        if self.plan_id:
            costs = costs.filter(Q(plan__isnull=True) | Q(plan_id=self.plan_id))
        top = costs.order_by("-cost").first()
        return (top.cost, top.describe()) if top else None


def cost_limit(rule):
    """Return the largest endpoint cost ``rule`` (a Rule row, saved or typed) lets through, or
    None for a rule an endpoint cost is not checked against: disabled, for one endpoint (one
    token per call), counting failed authentications, counting responses (one token per
    response it counts), or of a kind that takes no cost in tokens (``RuleKind.cost_limit``).
    The one place the endpoint-cost checks ask."""
    if not rule.enabled or rule.endpoint or rule.counts != Counts.REQUESTS:
        return None
    return form_kind_of(rule).cost_limit(rule)


def tightest_below(rules, cost):
    """Return ``(rule, limit)`` for the rule of ``rules`` whose cost_limit is the smallest
    below ``cost`` (requests of that cost could never pass it), or None."""
    short = [(rule, limit) for rule in rules
             if (limit := cost_limit(rule)) is not None and limit < cost]
    return min(short, key=lambda found: found[1]) if short else None


def cost_above_limit_message(rule, limit):
    """The error for an endpoint cost above the ``limit`` (its cost_limit) of ``rule``."""
    return kind_of(rule).cost_above_message(rule, limit)


HTTP_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class EndpointCost(models.Model):
    """How many tokens a request to an endpoint costs (1 when no row matches)."""

    ANY_METHOD = "*"
    METHOD_CHOICES = [(ANY_METHOD, "Any method")] + [(m, m) for m in HTTP_METHODS]

    endpoint = models.CharField(max_length=200, help_text="URL name of the view, e.g. 'api:search'.")
    method = models.CharField(max_length=8, choices=METHOD_CHOICES, default=ANY_METHOD)
    plan = models.ForeignKey(
        Plan, null=True, blank=True, on_delete=models.CASCADE, related_name="costs",
        help_text="Empty: the cost for every plan without its own row.",
    )
    cost = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(10**6)],
        help_text="Tokens charged when the request is admitted. For a metered endpoint, the "
                  "estimate every bucket must hold before the view runs.")
    metered = models.BooleanField(
        default=False,
        help_text="The view reports what the request consumed (request.ratelimit.charge(), or "
                  "the REPORTED_COST_HEADER response header); after the response the buckets "
                  "are charged that instead of the estimate, in one more Redis call when the "
                  "two differ.")
    minimum = models.PositiveIntegerField(
        "minimum charge", default=0, validators=[MaxValueValidator(10**6)],
        help_text="Metered endpoints: the least a request is charged, whatever it reports "
                  "(e.g. 1: a call that consumed nothing still costs a token).")

    class Meta:
        ordering = ["endpoint", "method"]

    def __str__(self):
        return self.describe()

    def describe(self):
        method = "any method" if self.method == self.ANY_METHOD else self.method
        plan = f" on {self.plan}" if self.plan_id else ""
        return f"{self.endpoint} ({method}{plan})"

    def clean(self):
        errors = {}
        duplicate = EndpointCost.objects.filter(
            endpoint=self.endpoint, method=self.method, plan_id=self.plan_id
        ).exclude(pk=self.pk)
        if self.endpoint and duplicate.exists():
            errors["__all__"] = (f"{self.describe()} already has a cost; edit that row instead "
                                 f"of adding a second one.")
        if self.cost:
            # the rules that charge this cost (cost_limit says which kinds take it in tokens)
            rules = Rule.objects.filter(endpoint="", enabled=True)
            if self.plan_id:
                rules = rules.filter(Q(plan__isnull=True) | Q(plan_id=self.plan_id))
            tightest = tightest_below(rules, self.cost)
            if tightest:
                errors["cost"] = cost_above_limit_message(*tightest)
        if self.minimum and not self.metered:
            errors["minimum"] = ("Only a metered endpoint has a minimum charge (others are "
                                 "charged their cost); tick “metered” or set it to 0.")
        elif self.metered and self.cost and self.minimum > self.cost:
            errors["minimum"] = (f"A minimum of {self.minimum} is above the estimate "
                                 f"({self.cost}): every request would cost more than it was "
                                 f"admitted for. Raise the cost to at least {self.minimum}.")
        if errors:
            raise ValidationError(errors)


# An override's factor out of bounds, in words.
FACTOR_RANGE_MESSAGE = (f"The factor must be from {MIN_FACTOR} (a hundredth of the rule's "
                        f"numbers) to {MAX_FACTOR:,} (a thousand times).")
# An override that says neither what its caller gets nor that it is exempt.
MISSING_TREATMENT = ("Give a factor of the rule's numbers (e.g. 2), or tick “exempt”, or give "
                     "rate, period and burst.")
# An override's reason: its own and what its former "note" held, kept whole by migration 0024.
OVERRIDE_REASON_LENGTH = 500


class IdentityOverride(Scheduled, models.Model):
    """Special treatment for one caller: exempt from limits, the rule's own numbers × a factor
    (which follows the rule when it is edited), or its own numbers; with a start or an end,
    only between them (a dated override wins over a permanent one meanwhile)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.CASCADE)
    ip = models.GenericIPAddressField("client IP", null=True, blank=True)
    rule = models.ForeignKey(
        Rule, null=True, blank=True, on_delete=models.CASCADE,
        help_text="Empty: every user/key/IP rule that applies to this caller.",
    )
    exempt = models.BooleanField(default=False, help_text="Never limit this caller at all.")
    factor = models.DecimalField(
        max_digits=7, decimal_places=FACTOR_DECIMALS, null=True, blank=True,
        validators=[MinValueValidator(MIN_FACTOR, message=FACTOR_RANGE_MESSAGE),
                    MaxValueValidator(MAX_FACTOR, message=FACTOR_RANGE_MESSAGE)],
        help_text="The rule's own numbers times this (2: twice its limits; 0.5: half), "
                  "following the rule when it is edited.")
    rate = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    period_s = models.PositiveIntegerField(
        "period (seconds)", null=True, blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_PERIOD_S)],
    )
    burst = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    # (the reason holds what the "note" field held before it: two reasons in one)
    starts_at, ends_at, reason = schedule_fields(reason_length=OVERRIDE_REASON_LENGTH)

    def __str__(self):
        who = self.user or self.api_key or self.ip
        if self.exempt:
            return f"{who}: exempt"
        if self.factor is not None:
            return f"{who}: {factor_words(self.factor)}"
        return f"{who}: {self.rate} per {self.period_s} s, burst {self.burst}"

    @property
    def treatment(self):
        """What the override gives its caller: "exempt", "factor" or "numbers"."""
        if self.exempt:
            return "exempt"
        return "factor" if self.factor is not None else "numbers"

    def clean(self):
        self.clean_schedule()
        chosen = [f for f in ("user", "api_key", "ip") if getattr(self, f if f == "ip" else f + "_id")]
        if len(chosen) != 1:
            raise ValidationError("Choose exactly one of user, API key or client IP.")
        numbers = [self.rate, self.period_s, self.burst]
        given = any(n is not None for n in numbers)
        if self.exempt and (given or self.factor is not None):
            raise ValidationError("An exempt caller has no numbers; clear the factor, rate, "
                                  "period and burst.")
        if self.factor is not None and given:
            raise ValidationError("Give either a factor of the rule's numbers or numbers of "
                                  "its own, not both: clear rate, period and burst, or the "
                                  "factor.")
        if not self.exempt and self.factor is None and None in numbers:
            raise ValidationError(MISSING_TREATMENT)
        if self.burst and self.period_s and self.burst * self.period_s * 1000 > MAX_BUCKET_UNITS:
            raise ValidationError({"burst": "Burst × period is too large."})
        if self.rule_id:
            self._clean_rule()

    def _clean_rule(self):
        rule = self.rule
        if rule.scope not in (Scope.USER, Scope.IP):
            raise ValidationError({"rule": "Only user/API key or IP rules can be overridden per caller."})
        if rule.kind == Kind.CREDITS and not self.exempt:
            raise ValidationError({"rule": "Prepaid credits are a balance, not a limit: neither "
                                           "a factor nor numbers change them. Choose another "
                                           "rule (or tick “exempt”)."})
        if rule.kind in (Kind.CALENDAR, Kind.CONCURRENCY) and self.treatment == "numbers":
            raise ValidationError({"rule": f"A {form_kind_of(rule).label.lower()} has no rate, "
                                           f"period and burst to override; give a factor of "
                                           f"its limit instead (or tick “exempt”)."})


class BanEvents(models.TextChoices):
    REFUSALS = "refusals", "Refusals by the quotas"
    STATUSES = "statuses", "Responses with a status in the set"
    FAILED_AUTH = "failed_auth", "Failed authentications"


# a ban rule's modes, in its own words (a rule's speak of denials)
BAN_MODES = [(Mode.ENFORCE.value, "Enforce"),
             (Mode.SHADOW.value, "Shadow (count would-be bans, ban no one)")]
# the scopes a caller can be banned at (a ban of everyone, or of a plan, would be an outage)
BAN_SCOPES = (Scope.IP, Scope.USER, Scope.TENANT)
# who a ban rule bans, in its sentence ("Ban a client IP for 10 minutes …")
BAN_SCOPE_WORDS = {Scope.IP: "a client IP", Scope.USER: "a user or API key",
                   Scope.TENANT: "a tenant"}
# the longest ban, and the longest memory of earlier bans
MAX_BAN_S = 366 * 24 * 3600


def parse_statuses(text):
    """Return the response statuses of ``text`` ("401,403", "404", "4xx") as a sorted tuple of
    ints from 100 to 599 ("4xx" stands for 400 to 499); raise ValueError with an operator's
    message."""
    found = set()
    for part in text.replace(" ", "").lower().split(","):
        if len(part) == 3 and part[0] in "12345" and part[1:] == "xx":
            found.update(range(int(part[0]) * 100, int(part[0]) * 100 + 100))
        elif part.isascii() and part.isdigit() and len(part) == 3 and 100 <= int(part) <= 599:
            found.add(int(part))
        else:
            raise ValueError(f"“{part[:20]}” is not a response status; write statuses such as "
                             f"401,403 or a class such as 4xx, separated by commas.")
    return tuple(sorted(found))


class BanRule(models.Model):
    """The penalty box: a caller that triggers ``threshold`` events within ``window_s`` is
    banned for ``ban_s`` (each ban within ``memory_s`` of the last one ``factor`` times longer,
    up to ``max_ban_s``). A model of its own rather than a kind of Rule: it is not a bucket a
    request spends (no rate, burst, cost or plan), and its own numbers (events, escalation)
    would be empty columns on every other rule."""

    name = models.CharField(
        max_length=64, unique=True,
        help_text="Shown to a banned client in the RateLimit headers and the problem body: "
                  "letters, digits, '.', '_' or '-'.",
    )
    scope = models.CharField(max_length=10, choices=[(s.value, s.label) for s in BAN_SCOPES],
                             default=Scope.IP,
                             help_text="Who is banned: the client IP (an IPv6 client's /64), "
                                       "the user or API key, or the tenant.")
    events = models.CharField(max_length=12, choices=BanEvents.choices,
                              default=BanEvents.STATUSES)
    statuses = models.CharField(
        max_length=200, blank=True,
        help_text="For responses with a status in the set: e.g. “404” (a scraper walking URLs), "
                  "“401,403”, or “4xx”.",
    )
    path_prefix = models.CharField(
        max_length=200, blank=True,
        help_text="Count only requests whose path starts with these segments, e.g. “/login”. "
                  "Empty: every path.",
    )
    threshold = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(1_000_000)],
        help_text="Events within the window that ban the caller (fail2ban's maxretry).")
    window_s = models.PositiveIntegerField(
        "window (seconds)", validators=[MinValueValidator(1), MaxValueValidator(MAX_BAN_S)],
        help_text="fail2ban's findtime.")
    ban_s = models.PositiveIntegerField(
        "ban (seconds)", validators=[MinValueValidator(1), MaxValueValidator(MAX_BAN_S)],
        help_text="How long the first ban lasts (fail2ban's bantime).")
    factor = models.PositiveIntegerField(
        "escalation factor", default=1, validators=[MinValueValidator(1),
                                                    MaxValueValidator(1000)],
        help_text="Each ban within the memory of the previous one lasts this many times longer "
                  "(fail2ban's bantime.factor); 1: every ban as long.")
    max_ban_s = models.PositiveIntegerField(
        "longest ban (seconds)", null=True, blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_BAN_S)],
        help_text="Escalation stops here (fail2ban's bantime.maxtime). Empty: the first ban's "
                  "length times the factor, without limit up to a year.")
    memory_s = models.PositiveIntegerField(
        "memory (seconds)", default=24 * 3600,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_BAN_S)],
        help_text="A ban within this long of the last one escalates; later, it starts over.")
    extend_on_retry = models.BooleanField(
        "retries extend the ban", default=False,
        help_text="Off (the default): requests during a ban do not make it longer.")
    mode = models.CharField(max_length=10, choices=BAN_MODES, default=Mode.ENFORCE,
                            help_text="Shadow: count the would-be bans, ban no one.")
    enabled = models.BooleanField(default=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "ban rule"

    def __str__(self):
        return self.name

    def clean(self):
        errors = {}
        if self.name and not RULE_NAME_RE.match(self.name):
            errors["name"] = ("Use letters, digits, '.', '_' or '-' (at most 64), starting "
                              "with a letter or digit.")
        if self.events == BanEvents.STATUSES:
            if not self.statuses:
                errors["statuses"] = "Name the response statuses that count, e.g. 404 or 4xx."
            else:
                try:
                    parse_statuses(self.statuses)
                except ValueError as error:
                    errors["statuses"] = str(error)
        elif self.statuses:
            errors["statuses"] = "Statuses are counted only by a rule counting responses."
        if self.path_prefix and not self.path_prefix.startswith("/"):
            errors["path_prefix"] = "A path prefix starts with “/”, e.g. /login."
        if self.max_ban_s is not None and self.ban_s and self.max_ban_s < self.ban_s:
            errors["max_ban_s"] = "The longest ban cannot be shorter than the first one."
        if errors:
            raise ValidationError(errors)

    def describe(self):
        """Return the rule as a sentence ("Ban a client IP for 10 minutes after 20 responses 404
        within a minute, doubling each time up to a day"), or "" while its numbers are not all
        given (a form being typed). The one source of the words: the ban rules list, the form's
        live sentence and its preview endpoint all call it."""
        if not (self.threshold and self.window_s and self.ban_s):
            return ""
        shadow = self.mode == Mode.SHADOW
        who = BAN_SCOPE_WORDS.get(self.scope, self.scope)
        one = self.threshold == 1
        if self.events == BanEvents.STATUSES:
            statuses = [part.strip() for part in self.statuses.split(",") if part.strip()]
            what = ("response" if one else "responses") + \
                (f" {either(statuses)}" if statuses else "")
        elif self.events == BanEvents.FAILED_AUTH:
            what = "failed authentication" if one else "failed authentications"
        else:
            what = ("refusal" if one else "refusals") + " by its own quotas"
        if self.path_prefix:
            what += f" under {self.path_prefix}"
        words = (f"{'Would ban' if shadow else 'Ban'} {who} for {duration(self.ban_s)} after "
                 f"{count(self.threshold)} {what} within {a_duration(self.window_s)}")
        factor = self.factor or 1
        if factor > 1:
            growth = {2: "doubling", 3: "tripling"}.get(factor, f"{count(factor)} times longer")
            words += f", {growth} each time up to {a_duration(self.max_ban_s or MAX_BAN_S)}"
            if self.memory_s:
                words += (f"; a ban more than {a_duration(self.memory_s)} after the last one "
                          f"is {duration(self.ban_s)} again")
        if self.extend_on_retry:
            words += "; requests during a ban make it longer"
        if shadow:
            words += " (shadow: records only)"
        if not self.enabled:
            words += " (disabled)"
        return words


class Ban(models.Model):
    """One ban (or, by a shadow rule, a would-be ban), as the penalty box reported it: the
    dashboard's list of current bans, and what lifting one acts on. The ban itself lives in
    Redis (protection/bans.py); this row is its record."""

    rule = models.ForeignKey(BanRule, null=True, on_delete=models.SET_NULL, related_name="+")
    rule_name = models.CharField(max_length=64)
    scope = models.CharField(max_length=10)
    who = models.CharField(max_length=200, help_text="The caller as staff may see it: a user "
                                                      "name, a key's prefix, an address.")
    key = models.CharField(max_length=120, editable=False)  # the Redis key holding the ban
    since = models.DateTimeField()
    until = models.DateTimeField()
    times = models.PositiveIntegerField(default=1, help_text="Bans within the rule's memory, "
                                                             "this one included.")
    shadow = models.BooleanField(default=False, help_text="A would-be ban of a shadow rule.")
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-since"]
        verbose_name = "ban"
        default_permissions = ("view", "change")
        permissions = [("lift_ban", "Can lift a ban")]

    def __str__(self):
        return f"{self.who} banned by {self.rule_name}"

    @property
    def in_force(self):
        return not self.shadow and self.lifted_at is None and self.until > timezone.now()


class BanLogKind(models.TextChoices):
    BANNED = "banned", "banned"
    LIFTED = "lifted", "lifted"


class BanLogEntry(models.Model):
    """The ban log: what the penalty box did and what staff undid, apart from the audit trail
    (which records configuration changes). A ``banned`` entry counts one ban rule's bans (or
    would-be bans, for a shadow rule) in one interval (BAN_LOG_INTERVAL_S), listing the first
    few callers: one entry per rule, mode and interval, however many addresses a client
    rotates through. A ``lifted`` entry is one lift by staff."""

    kind = models.CharField(max_length=6, choices=BanLogKind.choices)
    at = models.DateTimeField(help_text="A lift's moment; a ban entry's latest ban.")
    rule = models.ForeignKey(BanRule, null=True, on_delete=models.SET_NULL, related_name="+")
    rule_name = models.CharField(max_length=64)
    scope = models.CharField(max_length=10)
    shadow = models.BooleanField(default=False, help_text="Would-be bans of a shadow rule.")
    interval_start = models.DateTimeField(null=True, blank=True)
    bans = models.PositiveIntegerField(default=0, help_text="Bans in the interval (a lift: 1).")
    callers = models.JSONField(default=list, blank=True,
                               help_text="The first callers banned in the interval (who, since, "
                                         "until, times), at most BAN_ROWS_PER_INTERVAL.")
    who = models.CharField(max_length=200, blank=True, help_text="A lift: the caller freed.")
    actor = models.CharField(max_length=150, blank=True, help_text="A lift: who lifted it.")

    class Meta:
        ordering = ["-at"]
        verbose_name = "ban log entry"
        verbose_name_plural = "ban log"
        default_permissions = ("view",)
        constraints = [models.UniqueConstraint(
            fields=["rule", "shadow", "interval_start"], condition=Q(kind="banned"),
            name="ratelimit_ban_log_once_per_interval")]

    def __str__(self):
        if self.kind == BanLogKind.LIFTED:
            return f"{self.actor} lifted the ban of {self.who} by {self.rule_name}"
        verb = "would have banned" if self.shadow else "banned"
        return f"{self.rule_name} {verb} {self.bans} caller{'' if self.bans == 1 else 's'}"


class AccessListEntry(Scheduled, models.Model):
    """An allow- or deny-list entry: callers matched by their client IP or network, API key,
    user, tenant or User-Agent, refused outright (deny) or trusted (allow: never banned, and
    with ``exempt`` never limited); with a start or an end, only between them. Compiled into
    the snapshot (protection/lists.py): matching costs no query and no Redis call."""

    kind = models.CharField(max_length=5, choices=ListKind.choices, default=ListKind.DENY)
    target = models.CharField("matches", max_length=10, choices=ListTarget.choices,
                              default=ListTarget.IP)
    value = models.CharField(
        max_length=200, blank=True,
        help_text="Client IP or network: an address or a CIDR range, IPv4 or IPv6 "
                  "(203.0.113.7, 198.51.100.0/24, 2001:db8::/48). Tenant: its name. User-Agent: "
                  "a part of it, in any case (“sqlmap”). Empty for an API key or a user: choose "
                  "it below.")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="+", verbose_name="API key")
    exempt = models.BooleanField(
        "exempt from quotas", default=False,
        help_text="Allow entries: these callers are not limited at all (no Redis call). "
                  "Unticked, they are limited as anyone, but never banned.")
    reason = models.CharField(
        max_length=200,
        help_text="Deny entries: told to the refused caller (never what the entry matched), "
                  "e.g. “abuse from this network, write to abuse@example.com”. Allow entries: "
                  "for the next operator.")
    starts_at, ends_at = schedule_fields("the entry")[:2]

    class Meta:
        verbose_name = "allow or deny list entry"
        verbose_name_plural = "allow and deny lists"
        ordering = ["kind", "target", "value"]

    def __str__(self):
        return f"{self.get_kind_display().split(' ')[0].lower()} {self.matched_words()}"

    def matched_words(self):
        """What the entry matches, in words: 'client IP 203.0.113.0/24', 'API key rk_ab12…'."""
        if self.target == ListTarget.API_KEY:
            return f"API key {self.api_key}" if self.api_key_id else "an API key"
        if self.target == ListTarget.USER:
            return f"user {self.user}" if self.user_id else "a user"
        if self.target == ListTarget.USER_AGENT:
            return f"User-Agent containing “{self.value}”"
        if self.target == ListTarget.TENANT:
            return f"tenant “{self.value}”"
        return f"client IP {self.value}"

    def normalize(self):
        """Write ``value`` as the entry stores it (an address or network in its canonical
        form, ``::ffff:0:0/96`` as ``0.0.0.0/0``; words stripped), as the admin form and the
        import both store it; raise ValidationError on ``value`` if it cannot be matched."""
        from ..conf import get_config

        try:
            self.value = normalized_value(self.target, self.value,
                                          get_config()["IPV6_PREFIX_LENGTH"])
        except ListValueError as exc:
            raise ValidationError({"value": str(exc)}) from None

    def everyone_warning(self):
        """Return the warning for an entry that refuses, or exempts from quotas, every caller
        of an address family (a deny of ``0.0.0.0/0`` or ``::/0``, or an exempt allow), or
        None."""
        return everyone_wide_warning(self.kind == ListKind.DENY, self.exempt, self.target,
                                     self.value)

    def clean(self):
        self.clean_schedule()
        errors = {}
        try:
            self.normalize()
        except ValidationError as exc:
            errors.update(exc.message_dict)
        for field, target in (("user", ListTarget.USER), ("api_key", ListTarget.API_KEY)):
            chosen = getattr(self, f"{field}_id") is not None
            if self.target == target and not chosen:
                errors[field] = f"Choose the {self._meta.get_field(field).verbose_name}."
            elif self.target != target and chosen:
                errors[field] = (f"Only an entry matching a {self._meta.get_field(field).verbose_name}"
                                 f" names one: clear it, or choose “{target.label}” above.")
        if self.exempt and self.kind == ListKind.DENY:
            errors["exempt"] = "Only an allow entry exempts its callers from quotas: untick it."
        if not errors and self.duplicate().exists():
            errors["__all__"] = (f"The {self.get_kind_display().split(' ')[0].lower()} list "
                                 f"already holds {self.matched_words()}: edit that entry.")
        if errors:
            raise ValidationError(errors)

    def duplicate(self):
        """The other entries of the same list matching the same callers from the same start."""
        return AccessListEntry.objects.filter(
            kind=self.kind, target=self.target, value=self.value, user_id=self.user_id,
            api_key_id=self.api_key_id, starts_at=self.starts_at).exclude(pk=self.pk)


class AuditSource(models.TextChoices):
    ADMIN = "admin", "Admin"
    IMPORT = "import", "Import"
    RESTORE = "restore", "Restore"
    CODE = "code", "Application code"
    OUTSIDE = "outside", "Changed outside the app"
    MIGRATE = "migrate", "Migration"
    PENALTY_BOX = "penalty", "Penalty box"


class AuditEntry(models.Model):
    """One recorded change of the quota configuration (see ``audit.py``): who made it, when, the
    field-by-field ``diff`` against the previous entry and, in a checkpoint, the whole
    configuration after it (``snapshot``, the quotas-as-code document; the others' is rebuilt
    from their checkpoint and the diffs after it, ``audit_documents.py``), so that any entry can
    be restored."""

    created = models.DateTimeField(default=timezone.now, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.SET_NULL, related_name="+")
    actor = models.CharField(max_length=150, help_text="Who: a user name, a command, or "
                                                      "“outside the app”.")
    source = models.CharField(max_length=10, choices=AuditSource.choices)
    summary = models.CharField(max_length=300)
    diff = models.JSONField(default=list)
    snapshot = models.JSONField(null=True, blank=True)
    # one "\n<section>|<key>\n" line per item the change touched: per-object history
    touched = models.TextField(blank=True, editable=False)
    # the entry this one's diff is against; unique, so two processes recording at once cannot
    # both follow the same entry (the second one retries against the first)
    previous = models.OneToOneField("self", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="following", editable=False)
    # the entry recorded into an empty trail; at most one (a constraint), so two processes
    # recording into an empty trail cannot both write a first entry (the second one retries
    # against the first). Not "previous is NULL": deleting an entry sets its follower's
    # previous to NULL (SET_NULL), and that must stay possible.
    opens_trail = models.BooleanField(default=False, editable=False)
    restored_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="+")

    class Meta:
        ordering = ["-id"]
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        default_permissions = ("view",)
        constraints = [models.UniqueConstraint(fields=["opens_trail"],
                                               condition=Q(opens_trail=True),
                                               name="ratelimit_audit_one_first_entry")]
        permissions = [("restore_configuration",
                        "Can restore the quota configuration of an audit entry")]

    def __str__(self):
        return f"#{self.pk} {self.actor}: {self.summary}"
