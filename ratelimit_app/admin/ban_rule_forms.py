"""One form per kind of event a ban rule counts (refusals by the caller's own quotas, responses
with some statuses, failed authentications), in the rule forms' style (``rule_forms.py``): the
kind asked first on the add page, each form showing only its fields, labelled in words, its
durations typed as a number and a unit (stored in seconds, as quotas as code and the engine
read them), and the rule read as a sentence while it is typed (``BanRule.describe``).

- ``ban_rule_form_class(key)``: the ModelForm of an event kind (cached per kind: a class).
- ``ban_rule_fieldsets(key)``: the admin fieldsets of that form.
- ``ban_rule_from_input(key, data, base)``: an unsaved BanRule of what was typed so far, for the
  sentence under the form (the preview endpoint and the page's first render use the same).
"""

import functools
from dataclasses import dataclass

from django import forms

from ..config.models import BAN_SCOPES, BanEvents, BanRule, Mode
from .rule_forms import PeriodField, PeriodWidget, apply_status, status_of

__all__ = ["BAN_FORM_KINDS", "ban_kind_for", "ban_rule_form_class", "ban_rule_fieldsets",
           "ban_rule_from_input"]


@dataclass(frozen=True)
class BanFormKind:
    """An event kind's form: its name on the chooser and the noun of its events."""

    key: str
    label: str
    chooser_text: str
    events_noun: str  # the events, as they follow the threshold: "After [20] responses within"


BAN_FORM_KINDS = {kind.key: kind for kind in (
    BanFormKind(BanEvents.REFUSALS.value, "Refusals",
                "Ban a caller that keeps going after its own quotas refused it (429s of its "
                "own buckets, never of one it shares with others).", "refusals"),
    BanFormKind(BanEvents.STATUSES.value, "Responses with some statuses",
                "Ban a caller that gets too many responses of a kind: 404s of a scraper "
                "walking URLs, 401 or 403 of a guesser.", "responses"),
    BanFormKind(BanEvents.FAILED_AUTH.value, "Failed authentications",
                "Ban a caller whose passwords or API keys keep failing.",
                "failed authentications"),
)}

BAN_STATUS_CHOICES = [("enforce", "Enforced"),
                      ("shadow", "Shadow: records would-be bans, bans no one"),
                      ("disabled", "Disabled")]

# The durations of a ban rule, typed as a number and a unit: (label, noun in errors, help).
DURATIONS = {
    "window_s": ("within", "window", ""),
    "ban_s": ("Ban for", "ban", "How long the first ban lasts."),
    "max_ban_s": ("up to", "longest ban", "Empty: up to 366 days."),
    "memory_s": ("Forget a ban after", "memory",
                 "A ban this long after the last one lasts as long as the first again."),
}

LABELS = {
    "name": ("Name", "Shown to a banned client in the RateLimit headers: letters, digits, "
                     "'.', '_' or '-'."),
    "scope": ("Who is banned", "A client IP (an IPv6 client's /64), a user or API key, or a "
                               "tenant."),
    "statuses": ("Statuses", "e.g. 404, or 401,403, or 4xx."),
    "path_prefix": ("Only under the path", "e.g. /login (covers /login/…, not /loginx). "
                                           "Empty: every path."),
    "threshold": ("After", ""),
    "factor": ("Each ban again ×", "1: every ban as long; 2: each twice the last."),
    "extend_on_retry": ("Requests during a ban make it longer", ""),
}


class KindBanRuleForm(forms.ModelForm):
    """The base of each event kind's form: the kind, the status, durations with units."""

    ban_kind = None  # set per kind by ban_rule_form_class

    status = forms.ChoiceField(choices=BAN_STATUS_CHOICES, label="Status", initial="enforce",
                               required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        kind = self.ban_kind
        for name, (label, help_text) in LABELS.items():
            if name in self.fields:
                self.fields[name].label, self.fields[name].help_text = label, help_text
        for name, (label, noun, help_text) in DURATIONS.items():
            if name == "window_s":
                label = f"{kind.events_noun} within"
            model_field = BanRule._meta.get_field(name)
            # (a saved row's seconds, or on an add page the model's default, split by the
            # widget into a number and a unit)
            field = PeriodField(label=label, noun=noun, help_text=help_text,
                                required=not model_field.null,
                                initial=model_field.get_default())
            number, unit = field.widget.widgets
            number.attrs["aria-label"] = f"{label}: how many"
            unit.attrs["aria-label"] = f"{label}: unit"
            self.fields[name] = field
        self.fields["scope"].choices = [(s.value, s.label) for s in BAN_SCOPES]
        self.fields["threshold"].help_text = ""
        # the numbers read as one phrase: "After [20] responses within [1] [minute]"
        for name in ("threshold", "window_s", "factor", "max_ban_s"):
            self.fields[name].label_suffix = ""
        if self.instance.pk:
            self.fields["status"].initial = status_of(self.instance)

    def clean(self):
        cleaned = super().clean()
        rule = self.instance
        rule.events = self.ban_kind.key
        if "statuses" not in self.fields:
            rule.statuses = ""
        apply_status(rule, cleaned.get("status") or self._status_without_one())
        return cleaned

    def _status_without_one(self):
        """The status of a form sent without one: from the "mode" and "enabled" fields of the
        single form the admin had before (a script's post), else the row's, else enforced."""
        if "mode" in self.data:
            if not self.data.get("enabled"):
                return "disabled"
            return "shadow" if self.data.get("mode") == Mode.SHADOW else "enforce"
        return status_of(self.instance) if self.instance.pk else "enforce"


@functools.cache
def ban_rule_form_class(key):
    """Return the ModelForm class of the event kind ``key`` (a BAN_FORM_KINDS key)."""
    kind = BAN_FORM_KINDS[key]
    fields = ["name", "scope", *(["statuses"] if key == BanEvents.STATUSES else []),
              "path_prefix", "threshold", "window_s", "ban_s", "factor", "max_ban_s",
              "memory_s", "extend_on_retry"]
    meta = type("Meta", (), {"model": BanRule, "fields": fields})
    return type(f"{kind.events_noun.title().replace(' ', '')}BanRuleForm", (KindBanRuleForm,),
                {"Meta": meta, "ban_kind": kind})


def ban_rule_fieldsets(key):
    """Return the admin fieldsets of the event kind ``key``'s form: what counts, the ban as
    a phrase, repeat offenders folded away, and how it acts."""
    what = ["name", "scope", *(["statuses"] if key == BanEvents.STATUSES else []),
            "path_prefix"]
    return [(None, {"fields": what}),
            ("When and how long", {"fields": [("threshold", "window_s"), "ban_s"]}),
            ("Repeat offenders", {"fields": [("factor", "max_ban_s"), "memory_s",
                                             "extend_on_retry"], "classes": ["collapse"]}),
            ("Behaviour", {"fields": ["status"]})]


def ban_kind_for(rule=None, requested=""):
    """Return the BAN_FORM_KINDS key of the form for ``rule`` (a saved row), or of the kind
    ``requested`` on an add page ("" when none or unknown: the page asks for it)."""
    if rule is not None and rule.pk:
        return rule.events if rule.events in BAN_FORM_KINDS else BanEvents.STATUSES.value
    return requested if requested in BAN_FORM_KINDS else ""


def _number(text):
    text = (text or "").strip()
    return int(text) if text.isdigit() and len(text) <= 16 else None


def _seconds(data, name):
    try:
        return PeriodField(required=False).clean(
            PeriodWidget().value_from_datadict(data, {}, name))
    except forms.ValidationError:
        return None


def ban_rule_from_input(key, data, base=None):
    """Return an unsaved BanRule of the event kind ``key`` holding what ``data`` (the form's
    raw fields) says so far: numbers that do not parse are left empty, never guessed. ``base``
    (a saved rule) gives what the form does not send."""
    rule = BanRule(**{f.attname: getattr(base, f.attname)
                      for f in BanRule._meta.concrete_fields}) if base is not None else BanRule()
    rule.events = key
    if data.get("scope") in {scope.value for scope in BAN_SCOPES}:
        rule.scope = data["scope"]
    rule.statuses = (data.get("statuses") or "").strip()[:200] \
        if key == BanEvents.STATUSES else ""
    rule.path_prefix = (data.get("path_prefix") or "").strip()[:200]
    rule.threshold = _number(data.get("threshold"))
    rule.factor = _number(data.get("factor")) or 1
    for name in DURATIONS:
        setattr(rule, name, _seconds(data, name))
    rule.extend_on_retry = data.get("extend_on_retry") in ("on", "true", "1")
    if data.get("status") in dict(BAN_STATUS_CHOICES):
        apply_status(rule, data["status"])
    return rule
