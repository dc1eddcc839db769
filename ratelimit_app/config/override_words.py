"""An identity override in words: what its caller gets, and until when ("bob: 1,200 requests
per minute, bursts up to 400, until 14 December 10:00").

The overrides list, the form's sentence as it is typed (the preview endpoint and the page's
first render) and the dashboard all read these, built from the rule kinds' own words
(``rule_kinds.py``) and the factor's arithmetic (``factors.py``), the engine's: what an
operator reads is what requests get.
"""

import copy

from django.utils import timezone

from .factors import factor_words, scaled_limits
from .rule_kinds import form_kind_of

__all__ = ["caller_words", "moment_words", "dates_words", "treatment_words", "rule_now_words",
           "override_sentence", "PENDING"]

# What the form's sentence says until it has a caller and what the caller gets.
PENDING = ("Choose the caller and what it gets (a factor, exempt, or numbers of its own) to "
           "read the override in words.")

# The rules an override naming no rule changes, in a sentence.
EVERY_RULE = "every user, key or IP rule that applies"


def caller_words(override):
    """Return who the override is for: "bob", "key rk_bob_p…", "203.0.113.9" ("" when it
    names no caller yet)."""
    if override.user_id:
        return override.user.get_username()
    if override.api_key_id:
        return f"key {override.api_key.prefix}…"
    return override.ip or ""


def moment_words(moment, now):
    """Return a moment as a sentence reads it, in the current time zone: "14 December 10:00",
    with the year when it is not ``now``'s ("3 January 2028 10:00")."""
    local, today = timezone.localtime(moment), timezone.localtime(now)
    year = "" if local.year == today.year else f" {local.year}"
    return f"{local.day} {local:%B}{year} {local:%H:%M}"


def dates_words(starts_at, ends_at, now):
    """Return the end of a sentence about a row with these dates: ", until 14 December
    10:00", ", from 10 December 10:00 until 14 December 10:00", ", with no end"."""
    start = f" from {moment_words(starts_at, now)}" if starts_at and starts_at > now else ""
    if ends_at:
        return f",{start} until {moment_words(ends_at, now)}"
    return f",{start} with no end" if start else ", with no end"


def _with_numbers(rule, rate, period_s, burst):
    shown = copy.copy(rule)
    shown.rate, shown.period_s, shown.burst = rate, period_s, burst
    return shown


def _own_words(override, rule):
    """The limit words of the override's own numbers (on ``rule`` when it names one)."""
    if rule is None:
        from .models import Rule

        rule = Rule()
    return _limit_words(_with_numbers(rule, override.rate, override.period_s, override.burst))


def scaled_rule(rule, factor):
    """Return a copy of the rule row ``rule`` with its numbers × ``factor``, as the engine
    scales the compiled rule (None while ``rule`` lacks a number it needs)."""
    kind = form_kind_of(rule)
    if not rule.rate or (kind.key not in ("calendar", "concurrency") and
                         not (rule.period_s and rule.burst)):
        return None
    rate, burst = scaled_limits(factor, rate=rule.rate, period_s=rule.period_s or 1,
                                burst=rule.burst or rule.rate,
                                calendar=kind.key == "calendar",
                                concurrency=kind.key == "concurrency")
    return _with_numbers(rule, rate, rule.period_s, burst)


def _limit_words(rule):
    return form_kind_of(rule).limit_words(rule) or "—"  # (a row missing a number it needs)


def treatment_words(override):
    """Return what the override gives in a few words: "exempt", "× 2", "120 requests per
    minute, bursts up to 60"."""
    if override.exempt:
        return "exempt"
    if override.factor is not None:
        return factor_words(override.factor)
    return _own_words(override, None) or "—"


def rule_now_words(rules):
    """Return the rules' numbers now, as the form shows them beside the result: "Now:
    pro-user, 600 requests per minute, bursts up to 200." ("" for no rule)."""
    if not rules:
        return ""
    return "Now: " + "; ".join(f"{rule.name}, {_limit_words(rule)}" for rule in rules) + "."


def override_sentence(override, now, rules=None):
    """Return what the override gives its caller, and until when, in a sentence: "bob: 1,200
    requests per minute, bursts up to 400, until 14 December 10:00".

    ``rules``: the rule rows it changes (the one it names, or those that apply to its caller),
    each spelled out with its new numbers; None (a list's row) reads the rule it names, or says
    "every user, key or IP rule that applies". PENDING while the override lacks a caller or
    what the caller gets."""
    who = caller_words(override)
    if not who or (not override.exempt and override.factor is None and
                   None in (override.rate, override.period_s, override.burst)):
        return PENDING
    end = dates_words(override.starts_at, override.ends_at, now)
    if override.exempt:
        return f"{who}: no limit at all (exempt from every rule){end}"
    if rules is None:
        rules = [override.rule] if override.rule_id else None
    if override.factor is not None:
        return f"{who}: {_factor_words(override.factor, rules)}{end}"
    if not rules:
        return f"{who}: {_own_words(override, None)} on {EVERY_RULE}{end}"
    return f"{who}: {_named(rules, lambda rule: _own_words(override, rule))}{end}"


def _factor_words(factor, rules):
    if rules is None:
        return f"{factor_words(factor)} on {EVERY_RULE}"
    if not rules:
        return f"{factor_words(factor)} on {EVERY_RULE} (none applies now)"
    return _named(rules, lambda rule: _limit_words(scaled_rule(rule, factor) or rule))


def _named(rules, words):
    """One rule's words alone; several rules' each followed by the rule's name."""
    if len(rules) == 1:
        return words(rules[0])
    return "; ".join(f"{words(rule)} ({rule.name})" for rule in rules)
