"""The kinds of limit a ``Rule`` row can be, each in one class: the fields it uses, the words it
is typed and read in, the checks that belong to it, and the numbers it derives.

One table holds every kind (``Rule``, with its migrations); what differs between the kinds lives
here, so ``Rule.clean()`` asks the rule's kind instead of branching on it, and the admin builds
one form per kind from the same classes (``admin/rule_forms.py``). A failed-authentication limit
is a token bucket that counts failed authentications: stored as a token bucket, typed in a
form of its own, so that each form stays short; so is a limit on responses (a token bucket that
counts only the responses of some statuses, or under a path prefix).

Nothing here queries the database itself: the checks that compare a rule with other rows call
the rule's own methods for it (``Rule.largest_cost``, ``Rule.credits_clash``).
"""

from ..conf import get_config
from .choices import (
    ALERT_MIN_PERIOD_S,
    MAX_BUCKET_UNITS,
    MAX_CONCURRENCY,
    MAX_CONCURRENCY_TIMEOUT_S,
    MAX_PERIOD_S,
    NOMINAL_PERIOD_S,
    CalendarPeriod,
    Counts,
    Kind,
)
from .wording import SCOPE_PHRASES, count, duration, per_period, status_words

__all__ = ["RuleKind", "TokenBucket", "FailedAuthLimit", "CalendarQuota", "ConcurrencyLimit",
           "PrepaidCredits", "ResponseLimit", "FORM_KINDS", "kind_of", "form_kind_of",
           "burst_below_cost_message", "cost_above_burst_message", "statuses_words"]

# The fields every kind's form shows around its own numbers.
_NAME_FIELDS = ("name", "plan", "scope", "endpoint")
_STATUS_FIELDS = ("status", "on_redis_failure")


def burst_below_cost_message(burst, cost, what):
    """The error for a rule whose burst cannot hold the ``cost`` of requests to ``what``."""
    return (f"Burst {burst} is below the cost of {what} ({cost} tokens): such requests could "
            f"never pass. Raise the burst to at least {cost}.")


def cost_above_burst_message(rule_name, burst):
    """The error for an endpoint cost above the burst of a rule that charges it."""
    return (f"Rule “{rule_name}” has burst {burst}, below this cost: such requests could never "
            f"pass. Lower the cost or raise that rule's burst.")


class RuleKind:
    """What one kind of limit is. Subclasses set the class attributes and override the hooks."""

    key = ""             # the form's name for the kind: Kind's value, or "failed_auth"
    kind = None          # the Kind stored in the row
    label = ""           # "Token bucket"
    chooser_text = ""    # one line on the add page that asks for the kind
    form_fields = ()     # the model fields (and "status") its form shows, in order
    number_rows = ()     # form fields shown on one line, read as one phrase
    advanced_fields = ()  # shown in a collapsed "More" section
    labels = {}          # field -> label in this kind's words
    help_texts = {}      # field -> a short help under the field
    # field -> the message when the field is left empty
    required = {}
    # the smallest rate (0: "none", as a credits allowance may be) and its message
    minimum_rate = 1
    minimum_rate_message = "The rate must be at least 1 token per period."
    # what the kind refuses, with the message naming it in the kind's words (None: allowed)
    lease_refused = None
    debt_refused = None
    alerts_refused = None
    failed_auth_refused = None

    def check(self, rule, errors):
        """Add to ``errors`` (field -> message) what is wrong with ``rule`` for this kind, and
        set the numbers the kind derives (burst, period). Called by ``Rule.clean()``."""

    def cost_limit(self, rule):
        """Return the largest endpoint cost a request may have to pass ``rule`` (a token
        bucket's burst, a calendar quota's units per period), or None for a kind an endpoint
        cost is not charged to in tokens: a concurrency limit holds one slot per request in
        flight whatever its cost, a credit balance has no burst (any cost its units cover
        passes)."""
        return None

    def limit_error(self, rule, limit, cost, what):
        """Return ``(field, message)``: the error for ``rule`` whose cost limit ``limit``
        cannot hold the ``cost`` of requests to ``what``."""
        raise NotImplementedError

    def cost_above_message(self, rule, limit):
        """Return the error for an endpoint cost above the cost limit ``limit`` of ``rule``."""
        raise NotImplementedError

    def limit_words(self, rule):
        """Return the limit in words without scope or status ("100 requests per minute,
        bursts up to 200"), or None while a number it needs is missing."""
        raise NotImplementedError

    def sentence(self, rule):
        """Return the whole rule in words: its limit, whom it counts, how it acts ("100
        requests per minute per user or API key, bursts up to 200; enforced"), or None while
        a number it needs is missing."""
        limit = self.limit_words(rule)
        if limit is None:
            return None
        head, _, tail = limit.partition(", ")
        who = SCOPE_PHRASES.get(rule.scope, "")
        words = f"{head} {who}" + (f", {tail}" if tail else "")
        return f"{words}; {status_words(rule.enabled, rule.mode == 'shadow')}"

    @staticmethod
    def _requests(rule, number, noun="request"):
        """Return "1 request", "100 requests to api:search"."""
        words = f"{count(number)} {noun}" + ("" if number == 1 else "s")
        return f"{words} to {rule.endpoint}" if rule.endpoint else words


class TokenBucket(RuleKind):
    key = Kind.TOKEN_BUCKET.value
    kind = Kind.TOKEN_BUCKET
    label = "Token bucket"
    chooser_text = ("A steady rate with room for bursts: “100 requests per minute, bursts up "
                    "to 200”.")
    form_fields = (*_NAME_FIELDS, "rate", "period_s", "burst", *_STATUS_FIELDS,
                   "lease", "debt", "alert_thresholds")
    number_rows = (("rate", "period_s", "burst"),)
    advanced_fields = ("lease", "debt", "alert_thresholds")
    labels = {"rate": "Requests", "period_s": "per", "burst": "bursts up to",
              "lease": "Lease size", "debt": "Debt allowed", "alert_thresholds": "Alert at (%)"}
    help_texts = {
        "burst": "The most a caller can spend at once.",
        "lease": "Shared buckets only: tokens a worker takes at a time. 0: off.",
        "debt": "Metered endpoints: how far below empty a request may go. 0: never.",
        "alert_thresholds": "Percents of the quota, e.g. 80,100 (periods of an hour or more).",
    }
    required = {"period_s": "A token bucket needs its period: how often the requests refill.",
                "burst": "A token bucket needs its burst: the most a caller can spend at once."}
    def check(self, rule, errors):
        rule.calendar_period = ""
        if rule.burst is not None and rule.period_s and \
                rule.burst * rule.period_s * 1000 > MAX_BUCKET_UNITS:
            errors["burst"] = "Burst × period is too large; lower the burst or the period."
        if rule.debt and rule.period_s and rule.debt * rule.period_s * 1000 > MAX_BUCKET_UNITS:
            errors["debt"] = "Debt × period is too large; lower the debt or the period."
        if rule.alert_thresholds.strip() and rule.period_s and rule.period_s < ALERT_MIN_PERIOD_S:
            errors["alert_thresholds"] = (
                f"A token bucket of a {rule.period_s} s period refills too fast for an alert to "
                f"mean much; alerts need a period of at least {ALERT_MIN_PERIOD_S} s (or a "
                f"calendar quota). Clear this field.")

    def cost_limit(self, rule):
        return rule.burst

    def limit_error(self, rule, limit, cost, what):
        return "burst", burst_below_cost_message(limit, cost, what)

    def cost_above_message(self, rule, limit):
        return cost_above_burst_message(rule.name, limit)

    def limit_words(self, rule):
        if not (rule.rate and rule.period_s and rule.burst):
            return None
        return (f"{self._requests(rule, rule.rate)} {per_period(rule.period_s)}, "
                f"bursts up to {count(rule.burst)}")


class FailedAuthLimit(TokenBucket):
    """A token bucket of failed authentications per client IP (stored as a token bucket)."""

    key = "failed_auth"
    label = "Failed-authentication limit"
    chooser_text = ("Stop password and key guessing: “10 failed sign-ins per minute per "
                    "address”, then that address is refused.")
    form_fields = ("name", "endpoint", "rate", "period_s", "burst", *_STATUS_FIELDS)
    advanced_fields = ()
    labels = {"rate": "Failed authentications", "period_s": "per",
              "burst": "up to, in a row"}
    required = {"period_s": "Give the period the failed authentications are counted over.",
                "burst": "Give how many failed authentications in a row an address may have."}
    help_texts = {"burst": "While none are left, every request from the address is refused."}

    def limit_words(self, rule):
        if not (rule.rate and rule.period_s and rule.burst):
            return None
        failures = f"{count(rule.rate)} failed authentication" + ("" if rule.rate == 1 else "s")
        where = f" at {rule.endpoint}" if rule.endpoint else ""
        return (f"{failures}{where} {per_period(rule.period_s)}, "
                f"up to {count(rule.burst)} in a row")


def statuses_words(text):
    """Return a typed status set as read in a sentence: "404", "401 or 403", "4xx"."""
    return " or ".join(part for part in text.replace(" ", "").lower().split(",") if part)


class ResponseLimit(TokenBucket):
    """A token bucket that counts only some responses (their status in a set, or their path
    under a prefix): checked on the way in, charged one token after a matching response.
    Stored as a token bucket counting requests with ``counted_statuses`` or
    ``counted_path_prefix`` set; a form of its own keeps the token bucket's short."""

    key = "responses"
    label = "Limit on responses"
    chooser_text = ("Stop a scraper or a guesser by what it gets back: “at most 20 responses "
                    "404 per minute per client IP”, then that caller is refused.")
    form_fields = (*_NAME_FIELDS, "rate", "period_s", "burst", "counted_statuses",
                   "counted_path_prefix", *_STATUS_FIELDS)
    number_rows = (("rate", "period_s", "burst"),)
    advanced_fields = ()
    labels = {"rate": "Responses", "period_s": "per", "burst": "up to, in a row",
              "counted_statuses": "Counting statuses", "counted_path_prefix": "Under path"}
    help_texts = {
        "burst": "While none are left, the caller's requests are refused.",
        "counted_statuses": "e.g. 404, 401,403 or 4xx. Empty: every status (give a path).",
        "counted_path_prefix": "e.g. /login (also /login/…, not /loginx). Empty: every path.",
    }
    required = {"period_s": "Give the period the responses are counted over.",
                "burst": "Give how many such responses in a row a caller may get."}
    nothing_counted_message = ("Give the statuses to count (e.g. 404, 401,403 or 4xx), a path "
                               "prefix (e.g. /login), or both.")

    def cost_limit(self, rule):
        # one token per response it counts, whatever the request's endpoint cost: a burst
        # of 5 lets a cost-20 request through, and no endpoint cost is checked against it
        return None

    def limit_words(self, rule):
        if not (rule.rate and rule.period_s and rule.burst) or \
                not (rule.counted_statuses or rule.counted_path_prefix):
            return None
        words = f"at most {count(rule.rate)} response" + ("" if rule.rate == 1 else "s")
        if rule.counted_statuses:
            words += f" {statuses_words(rule.counted_statuses)}"
        if rule.counted_path_prefix:
            words += f" under {rule.counted_path_prefix}"
        if rule.endpoint:
            words += f" to {rule.endpoint}"
        return f"{words} {per_period(rule.period_s)}, up to {count(rule.burst)} in a row"


class CalendarQuota(RuleKind):
    key = Kind.CALENDAR.value
    kind = Kind.CALENDAR
    label = "Calendar quota"
    chooser_text = "A number per day or month, reset at midnight: “10,000 requests a month”."
    form_fields = (*_NAME_FIELDS, "rate", "calendar_period", *_STATUS_FIELDS, "debt",
                   "alert_thresholds")
    number_rows = (("rate", "calendar_period"),)
    advanced_fields = ("debt", "alert_thresholds")
    labels = {"rate": "Requests", "calendar_period": "per", "debt": "Debt allowed",
              "alert_thresholds": "Alert at (%)"}
    help_texts = {"debt": "Metered endpoints: how far below empty a request may go. 0: never.",
                  "alert_thresholds": "Percents of the quota, e.g. 80,100."}
    required = {"calendar_period": "Choose when the quota starts again: every day or every "
                                   "month."}
    minimum_rate_message = "The quota must be at least 1 request."
    lease_refused = ("Leases are for token buckets; a calendar quota is counted in Redis on "
                     "every request. Set it to 0.")
    failed_auth_refused = ("Failed authentications are limited by a token bucket (a guesser "
                           "must not get a whole month's tries at once): choose “Token bucket”.")
    def check(self, rule, errors):
        if not rule.calendar_period:
            errors["calendar_period"] = self.required["calendar_period"]
        if rule.rate and rule.rate > MAX_BUCKET_UNITS:
            errors["rate"] = f"A calendar quota can count at most {MAX_BUCKET_UNITS} units."
        # all of the quota usable at once, over a period the number-based checks can read
        if rule.rate:
            rule.burst = rule.rate
        rule.period_s = NOMINAL_PERIOD_S.get(rule.calendar_period, 24 * 3600)

    def cost_limit(self, rule):
        return rule.rate

    def limit_error(self, rule, limit, cost, what):
        return "rate", (f"A quota of {limit} is below the cost of {what} ({cost} units): such "
                        f"requests could never pass. Raise it to at least {cost}.")

    def cost_above_message(self, rule, limit):
        return (f"Rule “{rule.name}” is a quota of {limit} units a {rule.calendar_period}, "
                f"below this cost: such requests could never pass. Lower the cost or raise "
                f"that quota.")

    def limit_words(self, rule):
        if not (rule.rate and rule.calendar_period in CalendarPeriod.values):
            return None
        zone = get_config()["CALENDAR_TIME_ZONE"]
        resets = "midnight" if rule.calendar_period == CalendarPeriod.DAY else \
            "midnight on the 1st"
        return (f"{self._requests(rule, rule.rate)} per {rule.calendar_period}, reset "
                f"at {resets} ({zone})")


class ConcurrencyLimit(RuleKind):
    key = Kind.CONCURRENCY.value
    kind = Kind.CONCURRENCY
    label = "Concurrency limit"
    chooser_text = "At most N requests in flight at once: “5 report exports per tenant”."
    form_fields = (*_NAME_FIELDS, "rate", "period_s", *_STATUS_FIELDS)
    number_rows = (("rate", "period_s"),)
    labels = {"rate": "At most, in flight", "period_s": "a crashed request's slot freed after"}
    help_texts = {"period_s": "A little more than your slowest response. Needs QuotaMiddleware."}
    required = {"period_s": "A concurrency limit needs its timeout: how long the slot of a "
                            "request that never finishes (a crashed worker) stays taken."}
    minimum_rate_message = "Allow at least 1 request in flight."
    lease_refused = ("Leases are for token buckets; a concurrency slot is taken and released "
                     "in Redis for every request. Set it to 0.")
    debt_refused = ("Only token buckets and calendar quotas counting requests are charged what "
                    "a request consumed; set it to 0.")
    alerts_refused = ("Alerts are for calendar quotas and token buckets counting requests, "
                      "without a lease; clear this field.")
    failed_auth_refused = ("Failed authentications are counted by a token bucket, not in "
                           "flight: choose “Token bucket”.")

    def check(self, rule, errors):
        rule.calendar_period = ""
        if rule.rate and rule.rate > MAX_CONCURRENCY:
            errors["rate"] = (f"A concurrency limit allows at most {MAX_CONCURRENCY} requests "
                              "in flight.")
        if rule.period_s and rule.period_s > MAX_CONCURRENCY_TIMEOUT_S:
            errors["period_s"] = ("The timeout frees the slots of crashed workers: use at most "
                                  f"{MAX_CONCURRENCY_TIMEOUT_S} s (a day), and a little more "
                                  "than your slowest response takes.")
        if rule.rate:
            rule.burst = rule.rate  # only shown: N in flight

    def limit_words(self, rule):
        if not (rule.rate and rule.period_s):
            return None
        return (f"at most {self._requests(rule, rule.rate)} in flight, a crashed "
                f"request's slot freed after {duration(rule.period_s)}")


class PrepaidCredits(RuleKind):
    key = Kind.CREDITS.value
    kind = Kind.CREDITS
    label = "Prepaid credits"
    chooser_text = ("A balance that top-ups raise, each request spending its endpoint cost, "
                    "after an allowance included in the plan.")
    form_fields = ("name", "plan", "scope", "rate", "calendar_period", *_STATUS_FIELDS, "debt",
                   "alert_thresholds")
    number_rows = (("rate", "calendar_period"),)
    advanced_fields = ("debt", "alert_thresholds")
    labels = {"rate": "Allowance (units)", "calendar_period": "refilled",
              "debt": "Debt allowed", "alert_thresholds": "Alert at (% of a top-up)"}
    help_texts = {"rate": "Included before prepaid units are spent. 0: none.",
                  "scope": "Whose balance: a caller's (user or API key) or a tenant's.",
                  "debt": "Metered endpoints: how far below 0 a balance may go.",
                  "alert_thresholds": "Events credits.low and credits.exhausted, e.g. 80,100."}
    minimum_rate = 0
    lease_refused = ("A balance is spent in Redis on every request (it is money): set the lease "
                     "to 0.")
    failed_auth_refused = ("Failed authentications are counted by a token bucket, not paid "
                           "for: choose “Token bucket”.")

    def check(self, rule, errors):
        from ..decision.balances import CREDIT_SCOPES  # (the decision layer, below this one)

        if rule.scope not in CREDIT_SCOPES:
            errors["scope"] = ("Credits belong to a caller (an API key or a signed-in user) or "
                               "to a tenant: choose “User or API key” or “Tenant”.")
        if rule.endpoint:
            errors["endpoint"] = ("Credits are spent on every endpoint, each request its "
                                  "endpoint cost: leave the endpoint empty (endpoint costs set "
                                  "what each endpoint spends).")
        if rule.rate is not None and rule.rate > MAX_BUCKET_UNITS:
            errors["rate"] = f"An allowance can be at most {MAX_BUCKET_UNITS} units."
        if rule.debt and rule.debt > MAX_BUCKET_UNITS // 1000:
            errors["debt"] = "The debt allowed is too large."
        other = rule.credits_clash()
        if other is not None:
            errors["plan"] = (f"Rule “{other}” already spends the same balances (credits of "
                              f"this scope, on an overlapping plan): a request spends one "
                              f"balance per account. Edit that rule instead.")
        # (the field's validator wants at least 1: a row with no allowance must validate
        # again, as an export read back does; a balance reads its allowance from ``rate``)
        rule.burst = max(rule.rate or 0, 1)
        rule.period_s = NOMINAL_PERIOD_S.get(rule.calendar_period, MAX_PERIOD_S)

    def limit_words(self, rule):
        if rule.rate is None:
            return None
        if not rule.rate:
            return "prepaid credits only, no allowance"
        refill = f"per {rule.calendar_period}" if rule.calendar_period else "once"
        units = f"{count(rule.rate)} unit" + ("" if rule.rate == 1 else "s")
        return f"{units} included {refill}, then prepaid credits"


# Every form kind, in the order the add page offers them.
FORM_KINDS = {k.key: k for k in (TokenBucket(), CalendarQuota(), ConcurrencyLimit(),
                                 PrepaidCredits(), FailedAuthLimit(), ResponseLimit())}
_BY_KIND = {k.kind: k for k in FORM_KINDS.values() if k.key == k.kind}


def kind_of(rule):
    """Return the RuleKind whose checks apply to ``rule`` (a token bucket when unknown)."""
    return _BY_KIND.get(rule.kind, FORM_KINDS[Kind.TOKEN_BUCKET.value])


def form_kind_of(rule):
    """Return the RuleKind whose form edits ``rule``: a token bucket counting failed
    authentications, and one counting only some responses, each have a form of their own."""
    if rule.kind == Kind.TOKEN_BUCKET and rule.counts == Counts.FAILED_AUTH:
        return FORM_KINDS["failed_auth"]
    if rule.kind == Kind.TOKEN_BUCKET and (rule.counted_statuses or rule.counted_path_prefix):
        return FORM_KINDS["responses"]
    return kind_of(rule)
