"""The identity override's form: "× 2 for 7 days", exempt, or numbers of its own, read as a
sentence while it is typed ("bob: 1,200 requests per minute, bursts up to 400, until 14
December 10:00").

- ``OverrideForm``: the ModelForm. What the caller gets is one choice (``treatment``); a
  duration (a number and a unit) sets the end, from the start or from now (the clock seam:
  ``decision.clock.process_clock``); the dates stay for an override that starts later.
- ``override_from_input(data)``: an unsaved override of what the form holds so far, for the
  sentence (the preview endpoint and the page's first render use the same).
- ``override_words(override)``: that sentence and the numbers of the rules it changes now.
"""

import datetime

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS
from django.db.models import Q
from django.http import HttpRequest

from ..config.choices import Counts, Kind
from ..config.factors import MAX_FACTOR, MIN_FACTOR
from ..config.models import MISSING_TREATMENT, IdentityOverride, Rule
from ..config.override_words import PENDING, override_sentence, rule_now_words
from ..decision.clock import process_clock
from ..decision.identity import identify
from ..decision.scopes import Scope
from ..runtime.limiter import default_limiter
from .rule_forms import PeriodField

__all__ = ["OverrideForm", "DurationField", "TREATMENTS", "override_fieldsets",
           "override_from_input", "override_words", "rules_changed", "now"]

TREATMENTS = [("factor", "× a factor of the rule's limits"),
              ("exempt", "Exempt: no limit at all"),
              ("numbers", "Numbers of its own")]
# The units a duration is typed in; a day unless told.
DURATION_UNITS = (("hour", 3600), ("day", 86400), ("week", 7 * 86400))
_DURATION_SECONDS = dict(DURATION_UNITS)
# The longest duration: as long as a rule's longest period.
MAX_DURATION_S = 366 * 86400
# The most rules the sentence spells out (a caller's plan has a few).
MAX_RULES_SHOWN = 8
# The factor an override starts from on the add page: twice the rule's limits.
DEFAULT_FACTOR = 2


def now():
    """Return "now" as the form reads it for a duration's start: the process's clock (a
    test's, when one is installed), to the second."""
    return datetime.datetime.fromtimestamp(process_clock.now_ms() // 1000,
                                           tz=datetime.timezone.utc)


class DurationWidget(forms.MultiWidget):
    """A number and a unit: "7 days", "12 hours"."""

    def __init__(self, attrs=None):
        number = forms.NumberInput(attrs={"min": 1, "class": "vIntegerField", "size": 5,
                                          "aria-label": "For how long: how many"})
        unit = forms.Select(choices=[(unit, f"{unit}(s)") for unit, _ in DURATION_UNITS],
                            attrs={"aria-label": "For how long: unit"})
        super().__init__([number, unit], attrs)

    def decompress(self, value):
        return [None, "day"] if not value else [value // 86400, "day"]


class DurationField(forms.MultiValueField):
    """A duration typed as a number and a unit; cleaned to a timedelta (None: no duration)."""

    widget = DurationWidget

    def __init__(self, **kwargs):
        fields = (forms.IntegerField(min_value=1, required=False),
                  forms.ChoiceField(choices=[(unit, unit) for unit, _ in DURATION_UNITS],
                                    required=False))
        kwargs["required"] = False
        super().__init__(fields, require_all_fields=False, **kwargs)

    def compress(self, data_list):
        if not data_list or data_list[0] in (None, ""):
            return None
        seconds = data_list[0] * _DURATION_SECONDS.get(data_list[1] or "day", 86400)
        if seconds > MAX_DURATION_S:
            raise forms.ValidationError("An override can last at most 366 days; for longer, "
                                        "leave the duration empty (until removed).")
        return datetime.timedelta(seconds=seconds)

    def clean(self, value):
        try:
            return super().clean(value)
        except forms.ValidationError as error:
            if any(e.code == "min_value" for e in error.error_list):
                raise forms.ValidationError("The duration must be at least 1 hour.") from None
            raise


# The fields of what the caller gets: a factor, or numbers of its own.
_TREATMENT_FIELDS = ("factor", "rate", "period_s", "burst")
# The numbers' labels, read as a phrase: "Requests [120] per [1] [minute] bursts up to [60]".
NUMBER_LABELS = {"rate": "Requests", "period_s": "per", "burst": "bursts up to"}
NUMBER_MISSING = {"rate": "Give the requests per period.",
                  "period_s": "Give the period, as a number and a unit.",
                  "burst": "Give the burst: the most the caller can spend at once."}


class OverrideForm(forms.ModelForm):
    """An override: who (one of user, API key, IP), which rule (or every one that applies),
    what the caller gets, for how long, and why."""

    treatment = forms.ChoiceField(
        label="The caller gets", choices=TREATMENTS, initial="factor", widget=forms.RadioSelect,
        required=False)
    duration = DurationField(
        label="For",
        help_text="From now, or from the start under “Dates”. Empty: until removed (or the "
                  "end under “Dates”).")

    class Meta:
        model = IdentityOverride
        fields = ["user", "api_key", "ip", "rule", "factor", "rate", "period_s", "burst",
                  "starts_at", "ends_at", "reason"]
        help_texts = {
            "user": "One of user, API key or client IP.",
            "rule": "Empty: every user, key or IP rule that applies to the caller.",
            "reason": "Why, for the next operator: “launch week”, “ticket 4711”.",
            "starts_at": "Empty: from now.",
            "ends_at": "Empty: until removed (or the duration above).",
        }
        labels = {"factor": "Factor (×)", "ip": "Client IP", "api_key": "API key"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        fields = self.fields
        fields["rule"].queryset = Rule.objects.filter(scope__in=(Scope.USER, Scope.IP)) \
            .exclude(kind=Kind.CREDITS).order_by("name")
        fields["rule"].empty_label = "Every user, key or IP rule that applies"
        if "factor" in fields:
            factor = fields["factor"]
            factor.help_text = (f"2: twice the rule's limits; 0.5: half. From {MIN_FACTOR} to "
                                f"{MAX_FACTOR:,}; follows the rule when it is edited.")
            factor.widget.attrs.update({"min": str(MIN_FACTOR), "size": 6})
            factor.label_suffix = ""
            if not self.instance.pk:
                factor.initial = DEFAULT_FACTOR
            elif self.instance.factor is not None:  # "2", not the column's "2.00"
                self.initial["factor"] = f"{self.instance.factor:f}".rstrip("0").rstrip(".")
        if "period_s" in fields:
            period = fields["period_s"] = PeriodField(label="per", required=False)
            number, unit = period.widget.widgets
            number.attrs["aria-label"] = "Requests per: how many"
            unit.attrs["aria-label"] = "Requests per: unit"
        for name, label in NUMBER_LABELS.items():
            if name in fields:
                fields[name].label, fields[name].label_suffix = label, ""
        if self.instance.pk:
            fields["treatment"].initial = self.instance.treatment

    def clean(self):
        cleaned = super().clean()
        treatment = cleaned.get("treatment") or self._treatment_without_one()
        self.instance.exempt = treatment == "exempt"
        numbers = _TREATMENT_FIELDS[1:]
        unused = (() if treatment == "factor" else ("factor",)) + \
            (() if treatment == "numbers" else numbers)
        for name in unused:  # (what was typed there is not kept, nor its error)
            cleaned[name] = None
            self._errors.pop(name, None)
        if treatment == "factor" and cleaned.get("factor") is None and "factor" not in self.errors:
            self.add_error("factor", "Type the factor: 2 for twice the rule's limits, 0.5 for "
                                     "half.")
        if treatment == "numbers":
            for name in numbers:
                if cleaned.get(name) is None and name not in self.errors:
                    self.add_error(name, NUMBER_MISSING[name])
        self._clean_duration(cleaned)
        return cleaned

    def _update_errors(self, errors):
        # the model's "give a factor or numbers" repeats what the fields' errors already say
        if hasattr(errors, "error_dict") and set(self.errors) & set(_TREATMENT_FIELDS):
            kept = [e for e in errors.error_dict.get(NON_FIELD_ERRORS, ())
                    if e.message != MISSING_TREATMENT]
            errors.error_dict[NON_FIELD_ERRORS] = kept
            if not kept:
                del errors.error_dict[NON_FIELD_ERRORS]
            if not errors.error_dict:
                return
        super()._update_errors(errors)

    def _clean_duration(self, cleaned):
        """A duration sets the end: from the start when it lies ahead, else from now (an
        override being extended keeps its start). Its start is now unless told."""
        length = cleaned.get("duration")
        if length is None:
            return
        if cleaned.get("ends_at") and "ends_at" in self.changed_data:
            self.add_error("duration", "Give a duration or an end under “Dates”, not both.")
            return
        moment = now()
        start = cleaned.get("starts_at") or moment
        cleaned["starts_at"], cleaned["ends_at"] = start, max(start, moment) + length

    def _treatment_without_one(self):
        """What a form sent without a treatment means (a script's post of the fields the form
        had before): exempt when ticked, a factor when given, else numbers."""
        if self.data.get("exempt") in ("on", "true", "1", "True"):
            return "exempt"
        if self.data.get("rate"):
            return "numbers"
        if self.data.get("factor") or not self.instance.pk:
            return "factor"
        return self.instance.treatment


def override_fieldsets(obj=None):
    """Return the admin fieldsets of the form: who, what the caller gets, for how long and why,
    and the dates (folded away unless the override has some the duration did not make)."""
    dated = obj is not None and (obj.starts_at or obj.ends_at)
    return [
        ("Who", {"fields": ["user", "api_key", "ip"]}),
        ("What the caller gets", {"fields": ["rule", "treatment", "factor",
                                             ("rate", "period_s", "burst")]}),
        ("For how long, and why", {"fields": ["duration", "reason"]}),
        ("Dates", {"fields": ["starts_at", "ends_at"],
                   "classes": [] if dated else ["collapse"]}),
    ]


def override_from_input(data, base=None):
    """Return an unsaved IdentityOverride of what ``data`` (the form's raw fields) says so far,
    as a save would store it: fields that do not clean are left empty, never guessed. ``base``
    (a saved override) gives what the form does not send."""
    form = OverrideForm(data, instance=IdentityOverride(
        **{f.attname: getattr(base, f.attname) for f in IdentityOverride._meta.concrete_fields})
        if base is not None else None)
    form.is_valid()  # (the form's errors are the page's to show; the instance holds the rest)
    return form.instance


def _request():
    request = HttpRequest()
    request.META = {"REMOTE_ADDR": "0.0.0.0"}
    request.method = "GET"
    return request


def caller_plan(override):
    """Return the plan slug the override's user or API key is on now, as requests see it (the
    process's snapshot), or None."""
    snapshot = default_limiter().snapshot()
    if override.api_key_id:
        entry = snapshot.api_keys.get(override.api_key.digest)
        if entry is not None and entry.plan:
            return entry.plan
        user = override.api_key.user
    else:
        user = override.user
    return identify(_request(), user, snapshot).plan


def rules_changed(override):
    """Return the enabled rule rows the override changes: the one it names, or every user, key
    or IP rule that applies to its caller (a user's or key's plan, or every plan for a client
    IP), as the engine picks them (``engine.with_override_numbers``)."""
    if override.rule_id:
        return [override.rule]
    if not (override.user_id or override.api_key_id or override.ip) or override.exempt:
        return []
    rules = Rule.objects.filter(enabled=True).exclude(kind=Kind.CREDITS) \
        .exclude(counts=Counts.FAILED_AUTH)
    if override.ip:
        rules = rules.filter(scope=Scope.IP)
    else:
        rules = rules.filter(Q(scope=Scope.USER) | Q(scope=Scope.IP)).filter(
            Q(plan__isnull=True) | Q(plan__slug=caller_plan(override)))
    if override.treatment == "numbers":  # own numbers describe a token bucket
        rules = rules.filter(kind=Kind.TOKEN_BUCKET)
    return list(rules.order_by("name")[:MAX_RULES_SHOWN])


def override_words(override):
    """Return ``(sentence, numbers now)``: what the override gives its caller and until when,
    and the numbers of the rules it changes as they are now ("" when it changes none)."""
    if override is None:
        return PENDING, ""
    rules = rules_changed(override)
    return override_sentence(override, now(), rules), rule_now_words(rules)
