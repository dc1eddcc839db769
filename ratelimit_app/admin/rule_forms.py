"""One form per kind of limit (token bucket, calendar quota, concurrency limit, prepaid credits,
failed-authentication limit), built from the kinds of ``config/rule_kinds.py``: each shows only
its own fields, labelled in its own words, and reads as a sentence while it is typed.

- ``rule_form_class(kind)``: the ModelForm of a kind (cached per kind: a class, not state).
- ``rule_fieldsets(kind)``: the admin fieldsets of that form.
- ``rule_from_input(kind, data, base)``: an unsaved Rule of what was typed so far, for the words
  shown under the form (the preview endpoint and the page's first render use the same).
"""

import functools

from django import forms
from django.core.validators import MinValueValidator

from ..config.choices import MAX_PERIOD_S, CalendarPeriod, Counts, Mode
from ..config.models import Rule
from ..config.rule_kinds import FORM_KINDS, form_kind_of
from ..decision.scopes import Scope
from .forms import RuleForm

__all__ = ["PeriodField", "StatusField", "rule_form_class", "rule_fieldsets", "rule_from_input",
           "kind_for", "not_a_number"]

# The units a period is typed in, largest last (the select offers them in this order).
PERIOD_UNITS = (("second", 1), ("minute", 60), ("hour", 3600), ("day", 86400))
_UNIT_SECONDS = dict(PERIOD_UNITS)

STATUS_CHOICES = [("enforce", "Enforced"), ("shadow", "Shadow: counted, never refused"),
                  ("disabled", "Disabled")]


class PeriodWidget(forms.MultiWidget):
    """A number and a unit: "1 minute", "30 seconds"."""

    def __init__(self, attrs=None):
        number = forms.NumberInput(attrs={"min": 1, "class": "vIntegerField", "size": 6})
        unit = forms.Select(choices=[(unit, f"{unit}(s)") for unit, _ in PERIOD_UNITS])
        super().__init__([number, unit], attrs)

    def value_from_datadict(self, data, files, name):
        if f"{name}_0" not in data and name in data:  # seconds, as scripts posted them before
            return [data.get(name), "second"]
        return super().value_from_datadict(data, files, name)

    def decompress(self, value):
        if not value:
            # a number typed alone is seconds, the unit of ``period_s`` in code, in exports and
            # in a form posted without a unit: the same "60" means the same period everywhere
            return [None, "second"]
        for unit, length in reversed(PERIOD_UNITS):
            if value % length == 0:
                return [value // length, unit]
        return [value, "second"]


class PeriodField(forms.MultiValueField):
    """A period typed as a number and a unit; cleaned to whole seconds. ``noun`` names it in
    the errors ("The ban must be at least 1 second.")."""

    widget = PeriodWidget

    def __init__(self, *, required=True, noun="period", **kwargs):
        self.noun = noun
        # (each part optional: an empty period is the kind's to word, "a token bucket needs
        # its period")
        fields = (forms.IntegerField(min_value=1, required=False),
                  forms.ChoiceField(choices=[(unit, unit) for unit, _ in PERIOD_UNITS],
                                    required=False))
        super().__init__(fields, required=required, require_all_fields=False, **kwargs)

    def compress(self, data_list):
        if not data_list or data_list[0] in (None, ""):
            return None
        seconds = data_list[0] * _UNIT_SECONDS.get(data_list[1] or "second", 1)
        if seconds > MAX_PERIOD_S:
            raise forms.ValidationError(
                f"The {self.noun} can be at most 366 days ({MAX_PERIOD_S} seconds).")
        return seconds

    def clean(self, value):
        try:
            seconds = super().clean(value)
        except forms.ValidationError as error:
            if any(e.code == "min_value" for e in error.error_list):
                raise forms.ValidationError(
                    f"The {self.noun} must be at least 1 second.") from None
            raise
        if seconds is None and self.required:  # a unit chosen, no number typed
            raise forms.ValidationError(f"Type the {self.noun} as a number and a unit.",
                                        code="required")
        return seconds


class StatusField(forms.ChoiceField):
    """How the rule acts: enforced, in shadow mode, or disabled (the row's mode and enabled)."""

    def __init__(self, **kwargs):
        super().__init__(choices=STATUS_CHOICES, **kwargs)


def status_of(rule):
    """Return the StatusField value of ``rule``."""
    if not rule.enabled:
        return "disabled"
    return "shadow" if rule.mode == Mode.SHADOW else "enforce"


def apply_status(rule, status):
    """Set ``rule``'s enabled and mode from a StatusField value (a disabled rule keeps its
    mode, for when it is enabled again)."""
    rule.enabled = status != "disabled"
    if status in ("enforce", "shadow"):
        rule.mode = Mode.ENFORCE if status == "enforce" else Mode.SHADOW


# The help of the fields every kind shows, in a few words each (a kind may say more).
COMMON_HELP = {
    "name": "Clients read it in the RateLimit headers.",
    "plan": "Empty: every plan.",
    "endpoint": "Empty: every endpoint, each request its cost.",
    "on_redis_failure": "What requests get while Redis is unreachable.",
}


class KindRuleForm(RuleForm):
    """The base of each kind's form: the kind, the status, the kind's own words."""

    rule_kind = None  # set per kind by rule_form_class

    status = StatusField(label="Status", initial="enforce", required=False,
                         help_text="Shadow: counts what it would refuse, refuses nothing.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        kind = self.rule_kind
        if self.instance.pk:
            self.fields["status"].initial = status_of(self.instance)
        for name, field in self.fields.items():
            if name in kind.labels:
                field.label = kind.labels[name]
            if not str(field.help_text).startswith("⚠"):  # (a flagged endpoint keeps its warning)
                field.help_text = kind.help_texts.get(name, COMMON_HELP.get(name, ""))
        if "scope" in self.fields and kind.key == "credits":
            self.fields["scope"].choices = [c for c in self.fields["scope"].choices
                                            if c[0] in (Scope.USER, Scope.TENANT)]
        if "period_s" in self.fields:
            label = self.fields["period_s"].label
            period = self.fields["period_s"] = PeriodField(
                label=label, help_text=kind.help_texts.get("period_s", ""), required=False)
            # the label names the pair; each control is named for a screen reader too
            number, unit = period.widget.widgets
            number.attrs["aria-label"] = f"{kind.labels['rate']} {label}: how many"
            unit.attrs["aria-label"] = f"{kind.labels['rate']} {label}: unit"
        if "rate" in self.fields:
            rate = self.fields["rate"]
            rate.validators = [v for v in rate.validators
                               if not isinstance(v, MinValueValidator)]
            rate.validators.append(MinValueValidator(kind.minimum_rate,
                                                     message=kind.minimum_rate_message))
            rate.min_value = rate.widget.attrs["min"] = kind.minimum_rate
        if "calendar_period" in self.fields:
            self._word_calendar_period()
        for row in kind.number_rows:  # one line that reads as a phrase: no colons
            for name in row:
                self.fields[name].label_suffix = ""

    def clean_rate(self):
        # the field's own validator holds this kind's minimum (a credits allowance may be 0)
        return self.cleaned_data.get("rate")

    def _word_calendar_period(self):
        field = self.fields["calendar_period"]
        if self.rule_kind.key == "credits":
            field.choices = [("", "once, never refilled"), (CalendarPeriod.DAY, "every day"),
                             (CalendarPeriod.MONTH, "every month")]
        else:
            field.choices = [("", "—"), (CalendarPeriod.DAY, "day, reset at midnight"),
                             (CalendarPeriod.MONTH, "month, reset on the 1st")]

    def clean(self):
        cleaned = super().clean()
        rule, kind = self.instance, self.rule_kind
        rule.kind = kind.kind
        apply_status(rule, cleaned.get("status") or self._legacy_status())
        if kind.key == "failed_auth":  # counted per address, before the caller is known
            rule.counts, rule.scope, rule.plan = Counts.FAILED_AUTH, Scope.IP, None
        else:
            rule.counts = Counts.REQUESTS
        # a field this kind does not show means nothing to it: the model's default
        for name in ("lease", "debt"):
            if name not in self.fields:
                setattr(rule, name, 0)
        if "alert_thresholds" not in self.fields:
            rule.alert_thresholds = ""
        if "counted_statuses" not in self.fields:
            rule.counted_statuses = rule.counted_path_prefix = ""
        elif not (cleaned.get("counted_statuses") or cleaned.get("counted_path_prefix")) and \
                "counted_statuses" not in self.errors:
            self.add_error("counted_statuses", kind.nothing_counted_message)
        return cleaned

    def _legacy_status(self):
        """The status of a form sent without one: from the "mode" and "enabled" fields of the
        single form the admin had before, or enforced."""
        if "mode" not in self.data:
            return "enforce" if not self.instance.pk else status_of(self.instance)
        if not self.data.get("enabled"):
            return "disabled"
        return "shadow" if self.data.get("mode") == Mode.SHADOW else "enforce"


@functools.cache
def rule_form_class(key):
    """Return the ModelForm class of the form kind ``key`` (a FORM_KINDS key)."""
    kind = FORM_KINDS[key]
    model_fields = [name for name in kind.form_fields if name != "status"]
    meta = type("Meta", (), {"model": Rule, "fields": model_fields})
    return type(f"{kind.label.title().replace(' ', '').replace('-', '')}Form", (KindRuleForm,),
                {"Meta": meta, "rule_kind": kind})


def rule_fieldsets(key):
    """Return the admin fieldsets of the form kind ``key``: who, the limit as one line, how it
    acts, and the rarely needed numbers folded away."""
    kind = FORM_KINDS[key]
    rows = {name for row in kind.number_rows for name in row}
    advanced = set(kind.advanced_fields)
    first = [name for name in kind.form_fields
             if name not in rows and name not in advanced and name not in
             ("status", "on_redis_failure")]
    fieldsets = [(None, {"fields": first}),
                 ("Limit", {"fields": [tuple(row) for row in kind.number_rows]}),
                 ("Behaviour", {"fields": ["status", "on_redis_failure"]})]
    if kind.advanced_fields:
        fieldsets.append(("More", {"fields": list(kind.advanced_fields),
                                   "classes": ["collapse"]}))
    return fieldsets


def kind_for(rule=None, requested=""):
    """Return the FORM_KINDS key of the form for ``rule`` (a saved row), or of the kind
    ``requested`` on an add page ("" when none or unknown: the page asks for it)."""
    if rule is not None and rule.pk:
        return form_kind_of(rule).key
    return requested if requested in FORM_KINDS else ""


# The longest number a preview reads (the largest a rule takes has fewer digits).
MAX_TYPED_DIGITS = 16


def _typed_number(text):
    """Return ``(number, ok)`` of a field's typed ``text``: ``(None, True)`` while empty,
    ``(None, False)`` when it is not a whole number. Digits as the form's IntegerField reads
    them (``str.isdecimal``: what ``int()`` takes; ``str.isdigit`` also holds for "²" and "①",
    which ``int()`` refuses)."""
    text = (text or "").strip()
    if not text:
        return None, True
    if text.isdecimal() and len(text) <= MAX_TYPED_DIGITS:
        return int(text), True
    return None, False


def _number(text):
    return _typed_number(text)[0]


def not_a_number(key, data):
    """Return what the preview says when a number typed in a form of the kind ``key`` is not
    one ("The burst is not a number: type it in digits."), or None."""
    kind = FORM_KINDS[key]
    typed = [(name, data.get(name)) for name in ("rate", "burst") if name in kind.form_fields]
    if "period_s" in kind.form_fields:
        typed.append(("period", PeriodWidget().value_from_datadict(data, {}, "period_s")[0]))
    for name, text in typed:
        if not _typed_number(text)[1]:
            return f"The {name} is not a number: type it in digits, e.g. 60."
    return None


def rule_from_input(key, data, base=None):
    """Return an unsaved Rule of the form kind ``key`` holding what ``data`` (the form's raw
    fields) says so far: numbers that do not parse are left empty, never guessed. ``base`` (a
    saved rule) gives what the form does not show."""
    kind = FORM_KINDS[key]
    rule = Rule(**{f.attname: getattr(base, f.attname) for f in Rule._meta.concrete_fields}) \
        if base is not None else Rule()
    rule.kind = kind.kind
    rule.counts = Counts.FAILED_AUTH if key == "failed_auth" else Counts.REQUESTS
    for name in ("rate", "burst"):
        if name in kind.form_fields:
            setattr(rule, name, _number(data.get(name)))
    if "period_s" in kind.form_fields:
        try:
            rule.period_s = PeriodField(required=False).clean(
                PeriodWidget().value_from_datadict(data, {}, "period_s"))
        except forms.ValidationError:
            rule.period_s = None
    if data.get("scope") in Scope.values:
        rule.scope = data["scope"]
    if key == "failed_auth":
        rule.scope = Scope.IP
    if "endpoint" in kind.form_fields:
        rule.endpoint = (data.get("endpoint") or "")[:200]
    for name in ("counted_statuses", "counted_path_prefix"):
        if name in kind.form_fields:
            setattr(rule, name, (data.get(name) or "").strip()[:200])
    if "calendar_period" in kind.form_fields:
        period = data.get("calendar_period", "")
        rule.calendar_period = period if period in CalendarPeriod.values else ""
    if data.get("status") in dict(STATUS_CHOICES):
        apply_status(rule, data["status"])
    kind.check(rule, {})  # the numbers the kind derives (a quota's burst), as a save would
    return rule
