"""Admin forms: endpoint pickers fed by the URLconf, operator-worded validation, the simulator form.

The models' ``clean()`` methods hold the rules of a valid configuration; the forms here make sure
those messages reach the operator (on the main form and on every inline row), add the checks
that only make sense across the rows of one plan page, and offer real endpoints, not free text.
"""

import re

from django import forms
from django.contrib.auth import get_user_model
from django.core.validators import MinValueValidator, ProhibitNullCharactersValidator
from django.forms.models import BaseInlineFormSet
from django.utils.html import format_html

from ..config.endpoints import endpoint_names, find_endpoint, limited_endpoints
from ..config.models import (
    HTTP_METHODS,
    MAX_PERIOD_S,
    MINIMUM_MESSAGES,
    ApiKey,
    EndpointCost,
    Kind,
    Rule,
)
from ..decision.scopes import hash_api_key

__all__ = [
    "EndpointCostForm",
    "EndpointCostInlineFormSet",
    "EndpointField",
    "RuleForm",
    "SimulatorForm",
    "is_missing_endpoint",
]

MISSING_ENDPOINT = "not in the URLconf any more"
EXEMPT_ENDPOINT = "exempt from limits (EXEMPT_PATHS or @ratelimit_exempt)"

# MINIMUM_MESSAGES (from models) are shown instead of Django's "Ensure this value is greater
# than or equal to 1."
# Replace the model validators' "Ensure this value is less than or equal to …".
MAXIMUM_MESSAGES = {
    "period_s": f"The period can be at most 366 days ({MAX_PERIOD_S} seconds).",
    "cost": "A request can cost at most 1000000 tokens.",
}


def _django_blank_label():
    """Return the label Django's own selects give their empty choice on this version.

    "---------" up to Django 6.0, "- Select an option -" (translated) from 6.1, or whatever the
    project set instead: asked of a ModelChoiceField, the same source the admin's selects use,
    so our pickers never look foreign beside them.
    """
    return forms.ModelChoiceField(queryset=None, required=False).empty_label


def is_missing_endpoint(name):
    """Return True if ``name`` is set but no longer an endpoint of the URLconf."""
    return bool(name) and name not in endpoint_names()


class EndpointField(forms.ChoiceField):
    """A choice of the project's endpoints that requests are charged on (exempt ones are not
    offered). A stored value that left the URLconf or became exempt stays on offer (flagged),
    so editing other fields of an old row never loses or changes its endpoint."""

    default_error_messages = {
        "invalid_choice": ("“%(value)s” is not an endpoint of this project: pick one from the "
                           "list (the URL names of the URLconf)."),
    }

    def __init__(self, *, current="", blank_label=None, **kwargs):
        super().__init__(**kwargs)
        if blank_label is None:
            blank_label = _django_blank_label()
        choices = [("", blank_label)] + [(e.name, e.label) for e in limited_endpoints()]
        if is_missing_endpoint(current):
            choices.append((current, f"{current} — ⚠ {MISSING_ENDPOINT}"))
            self.help_text = format_html(
                "⚠ “{}” is {}: no request matches it. Pick a current endpoint. {}",
                current, MISSING_ENDPOINT, self.help_text)
        elif current and getattr(find_endpoint(current), "exempt", False):
            choices.append((current, f"{current} — ⚠ {EXEMPT_ENDPOINT}"))
            self.help_text = format_html(
                "⚠ “{}” is {}: no request to it is charged. Pick another endpoint. {}",
                current, EXEMPT_ENDPOINT, self.help_text)
        self.choices = choices


def _use_endpoint_picker(form, blank_label):
    """Replace the model's free-text endpoint field of ``form`` by an EndpointField."""
    text_field = form.fields.get("endpoint")
    if text_field is None:  # read-only or left out of this form
        return
    form.fields["endpoint"] = EndpointField(
        current=form.initial.get("endpoint") or "", blank_label=blank_label,
        required=text_field.required, label=text_field.label, help_text=text_field.help_text)


def _word_number_limits(form):
    """Give the number fields' bounds one clear message each (not Django's generic ones)."""
    for name, message in MINIMUM_MESSAGES.items():
        field = form.fields.get(name)
        if field is None:
            continue
        field.validators = [v for v in field.validators if not isinstance(v, MinValueValidator)]
        field.validators.append(MinValueValidator(1, message=message))
        field.min_value = 1
        field.widget.attrs["min"] = 1
    for name, message in MAXIMUM_MESSAGES.items():
        if name in form.fields:  # checked by the model field's validator, reworded here
            form.fields[name].error_messages["max_value"] = message


class _QuotaRowForm(forms.ModelForm):
    """A rule or cost row: the endpoint picked from the URLconf, the numbers' bounds in words."""

    endpoint_blank_label = None  # Django's own blank label

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _use_endpoint_picker(self, blank_label=self.endpoint_blank_label)
        _word_number_limits(self)
        # a form (or script) written before metered costs means none: 0
        for name in METERED_NUMBERS:
            if name in self.fields:
                self.fields[name].required = False

    def clean_debt(self):
        return self.cleaned_data.get("debt") or 0

    def clean_minimum(self):
        return self.cleaned_data.get("minimum") or 0


# The numbers of metered costs (a rule's debt allowed, a cost row's minimum charge): 0 when left
# out of a form's data.
METERED_NUMBERS = ("debt", "minimum")


# What rate and period mean for each kind of rule (shown under the fields).
RULE_FIELD_HELP = {
    "rate": "Token bucket: tokens added per period. Calendar quota: units per day or month. "
            "Concurrency limit: the most requests in flight at once. Prepaid credits: the "
            "allowance, units included each day or month (or once) before prepaid units are "
            "spent; 0: none.",
    "period_s": "Token bucket: the period in seconds. Concurrency limit: the timeout in seconds "
                "after which the slot of a request that never finished is freed. Calendar "
                "quota, prepaid credits: not used (leave empty).",
}


def _allow_no_allowance(rate):
    """Let the rate field take 0, a credits rule's "no allowance" (RuleForm.clean_rate still
    wants at least 1 of every other kind)."""
    if rate is None:
        return
    rate.validators = [v for v in rate.validators if not isinstance(v, MinValueValidator)]
    rate.validators.append(MinValueValidator(0, message=MINIMUM_MESSAGES["rate"]))
    rate.min_value = 0
    rate.widget.attrs["min"] = 0


class RuleForm(_QuotaRowForm):
    endpoint_blank_label = "Every endpoint"

    class Meta:
        model = Rule
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "kind" in self.fields:
            # a form (or script) written before calendar quotas means a token bucket
            self.fields["kind"].required = False
        # the model's help texts predate concurrency limits ("period: token buckets only"), and
        # a concurrency limit's N and timeout are typed in these very fields: say so here
        for name, text in RULE_FIELD_HELP.items():
            if name in self.fields:
                self.fields[name].help_text = text
        _allow_no_allowance(self.fields.get("rate"))

    def clean_kind(self):
        return self.cleaned_data.get("kind") or Kind.TOKEN_BUCKET

    def clean_rate(self):
        # a credits rule's allowance may be 0 (none: prepaid units only), every other kind's
        # rate is at least 1 (the field's own minimum is 0 for this: see _allow_no_allowance)
        rate = self.cleaned_data.get("rate")
        if rate is not None and rate < 1 and self.cleaned_data.get("kind") != Kind.CREDITS:
            raise forms.ValidationError(MINIMUM_MESSAGES["rate"])
        return rate


class EndpointCostForm(_QuotaRowForm):
    class Meta:
        model = EndpointCost
        fields = "__all__"


class EndpointCostInlineFormSet(BaseInlineFormSet):
    """The plan page's endpoint costs: each row is checked against the database by the model's
    ``clean()`` (the plan's rules among them); two rows of one endpoint and method typed in the
    same save are only visible to each other here."""

    def clean(self):
        super().clean()
        seen = set()
        for form in self.forms:
            if not form.is_valid() or form.cleaned_data.get("DELETE"):
                continue
            if form.instance.pk is None and not form.has_changed():
                continue  # an empty extra row
            cost = form.instance
            if (cost.endpoint, cost.method) in seen:
                form.add_error(None, f"{cost.describe()} is listed twice on this page; "
                                     f"keep one row.")
            seen.add((cost.endpoint, cost.method))


def user_named(text):
    """Return the User whose user name is ``text``, or raise ValidationError saying so."""
    User = get_user_model()
    try:
        return User._default_manager.get(**{User.USERNAME_FIELD: text})
    except User.DoesNotExist:
        raise forms.ValidationError(f"No user named “{text}”.") from None


def key_typed(text):
    """Return the ApiKey whose whole key or prefix is ``text``, or raise ValidationError."""
    typed = text.rstrip("…").strip()
    keys = ApiKey.objects.select_related("user")
    whole = keys.filter(digest=hash_api_key(typed)).first()
    if whole is not None:
        return whole
    matching = list(keys.filter(prefix=typed)[:2])
    if not matching:
        raise forms.ValidationError(f"No API key starts with “{typed}”: type the prefix "
                                    f"the API keys list shows, or the whole key.")
    if len(matching) > 1:
        raise forms.ValidationError(f"More than one API key starts with “{typed}”: type "
                                    f"the whole key.")
    return matching[0]


def is_row_id(text):
    """True when ``text`` is a database id: ASCII digits ("²" is no id), few enough for any
    database's integer column."""
    return re.fullmatch(r"[0-9]{1,18}", text) is not None


class CallerField(forms.ModelChoiceField):
    """A user or an API key: picked by search (its id), or named in the query string as the
    simulator's links and bookmarks name it (a user name, a key's prefix or the whole key:
    ``find``)."""

    def __init__(self, queryset, find, **kwargs):
        super().__init__(queryset, required=False, **kwargs)
        self.find_row = find

    def find(self, text):
        """Return the row ``text`` names (``find``), or raise ValidationError; a NUL is
        refused first, as a text field refuses it (PostgreSQL cannot even look it up)."""
        ProhibitNullCharactersValidator()(text)
        return self.find_row(text)

    def to_python(self, value):
        if value in self.empty_values:
            return None
        text = str(value).strip()
        if is_row_id(text):  # as the picker sends it
            return super().to_python(text)
        return self.find(text)


class SimulatorForm(forms.Form):
    """Who calls which endpoint with which method: the input of ``simulator.simulate``.

    ``pickers`` ({"user": widget, "api_key": widget}, from the overrides' admin): the callers
    are picked by search, as on the overrides' form; without them they are typed."""

    user = CallerField(
        get_user_model()._default_manager.all(), user_named, label="User",
        widget=forms.TextInput,
        help_text="A signed-in caller. Empty: an anonymous caller (unless an API key is chosen).")
    api_key = CallerField(
        ApiKey.objects.select_related("user"), key_typed, label="API key",
        widget=forms.TextInput,
        help_text="The request carries this key, as in the API key header (typed: its prefix "
                  "as the API keys list shows it, or the whole key).")
    ip = forms.GenericIPAddressField(
        label="Client IP", initial="203.0.113.10",
        help_text="The address the request comes from (after trusted proxies).")
    endpoint = forms.ChoiceField()  # replaced per form: the URLconf is read when needed
    method = forms.ChoiceField(label="HTTP method", choices=[(m, m) for m in HTTP_METHODS],
                               initial="GET")
    user_agent = forms.CharField(
        label="User-Agent", required=False, max_length=500,
        help_text="The request's User-Agent header, for the lists' User-Agent entries.")

    def __init__(self, *args, pickers=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["endpoint"] = EndpointField(
            help_text="The URL name of the view the request goes to.")
        for name, widget in (pickers or {}).items():
            self.fields[name].widget = widget
            self._name_to_id(name)

    def _name_to_id(self, name):
        """A caller named in the query string (``?user=alice``) is shown chosen in its picker,
        which knows rows by id; a name that finds no row is left for the field's error."""
        source = self.data if self.is_bound else self.initial
        value = str(source.get(name) or "").strip()
        if not value or is_row_id(value):
            return
        try:
            row = self.fields[name].find(value)
        except forms.ValidationError:
            return
        if self.is_bound:
            self.data = self.data.copy()
            self.data[name] = str(row.pk)
        else:
            self.initial = {**self.initial, name: str(row.pk)}

    # the page's two fieldsets, as an admin form lays out its fields
    fieldsets = (("Caller", ("user", "api_key", "ip", "user_agent")),
                 ("Request", ("endpoint", "method")))

    def grouped_fields(self):
        """Return ``[(heading, [bound field, ...]), ...]`` in the order of ``fieldsets``."""
        return [(heading, [self[name] for name in names]) for heading, names in self.fieldsets]

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("user") and cleaned.get("api_key"):
            raise forms.ValidationError("Choose a user or an API key, not both: a request with "
                                        "a key is limited as the key.")
        return cleaned
