"""Widgets of the app's admin forms that the stock admin leaves without an accessible name."""

from django import forms
from django.contrib.admin.widgets import AdminSplitDateTime, AutocompleteSelect
from django.core.exceptions import ValidationError
from django.db import models

__all__ = ["LabelledSplitDateTime", "LABELLED_DATETIMES", "LabelledAutocompleteSelect"]


class LabelledSplitDateTime(AdminSplitDateTime):
    """The admin's date and time inputs, each named by the word printed beside it.

    The stock widget prints "Date:" and "Time:" next to its two inputs without tying them to
    them, and the field's own label is the legend of their group: a screen reader announces
    two unnamed text boxes (axe's ``label`` rule, impact critical).
    """

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        words = (context["date_label"], context["time_label"])
        for subwidget, word in zip(context["widget"]["subwidgets"], words):
            subwidget["attrs"]["aria-label"] = str(word).rstrip(":")
        return context


# a ModelAdmin's ``formfield_overrides``: its date-and-time fields with labelled inputs
LABELLED_DATETIMES = {models.DateTimeField: {"widget": LabelledSplitDateTime}}


class LabelledAutocompleteSelect(AutocompleteSelect):
    """Django's autocomplete select (select2), named while it is empty by its ``placeholder``.

    select2 replaces the select with a combobox named by the text it shows: the chosen row, or
    the placeholder, which the stock widget leaves empty (axe's ``aria-input-field-name``,
    impact serious, for an empty picker).
    """

    def __init__(self, field, admin_site, placeholder, **kwargs):
        super().__init__(field, admin_site, **kwargs)
        self.placeholder = placeholder

    @property
    def media(self):
        # caller_pickers.js names select2's box by the field's label (an empty box has no
        # name of its own): wherever the picker is, the overrides' form or the simulator
        return super().media + forms.Media(js=["ratelimit_app/caller_pickers.js"])

    def build_attrs(self, base_attrs, extra_attrs=None):
        attrs = super().build_attrs(base_attrs, extra_attrs=extra_attrs)
        attrs["data-placeholder"] = self.placeholder  # (the stock one sets it to "")
        return attrs

    def optgroups(self, name, value, attr=None):
        # A value the remote key cannot hold (a prefill such as ``?user=abc``) selects
        # nothing: the stock widget would put it in its query and fail the page with a 500.
        target = self.field.target_field
        return super().optgroups(name, [v for v in value if _holds(target, v)], attr)


def _holds(field, value):
    """True when the model ``field`` can hold ``value`` (empty values included)."""
    try:
        field.to_python(value)
    except ValidationError:
        return False
    return True
