"""``UsageRecordAdmin``: the usage records for billing in the admin, as one page with a date
range, a table and a CSV/JSON download (the changelist of UsageRecord; rows are written only
by the rollup, so nothing is added, changed or deleted here).

Who sees it: staff with ``ratelimit_app.view_usagerecord`` (superusers have it); every view goes
through ``admin_site.admin_view`` (others are sent to the admin login) and then checks it.
"""

import zoneinfo

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.http import urlencode

from ..business.usage.models import UsageRecord
from ..business.usage.records import DAY, FORMATS, MONTH, render, usage_rows
from ..conf import get_config
from .placement import admin_url_name
from .readonly import ReadOnlyAdmin

__all__ = ["UsageRecordAdmin", "UsageRangeForm", "today"]

VIEW_PERMISSION = "ratelimit_app.view_usagerecord"
# Rows shown on the page; the download holds them all.
SHOWN_ROWS = 500


def today():
    """Return today's date in CALENDAR_TIME_ZONE (the days the records are kept by)."""
    return timezone.now().astimezone(zoneinfo.ZoneInfo(get_config()["CALENDAR_TIME_ZONE"])).date()


class UsageRangeForm(forms.Form):
    """The page's filter: an inclusive range of days, a tenant, per day or per month."""

    date_from = forms.DateField(label="From", widget=forms.DateInput(attrs={"type": "date"}),
                                input_formats=["%Y-%m-%d"])
    date_to = forms.DateField(label="To (included)",
                              widget=forms.DateInput(attrs={"type": "date"}),
                              input_formats=["%Y-%m-%d"])
    tenant = forms.CharField(required=False, max_length=150,
                             help_text="Empty: every tenant.")
    caller = forms.CharField(required=False, max_length=160,
                             help_text="key:ID, user:ID or anonymous. Empty: every caller.")
    period = forms.ChoiceField(choices=[(DAY, "per day"), (MONTH, "per month")], initial=DAY)

    def clean(self):
        cleaned = super().clean()
        first, last = cleaned.get("date_from"), cleaned.get("date_to")
        if first and last and last < first:
            raise forms.ValidationError("The range ends before it starts: choose a “to” day "
                                        "on or after the “from” day.")
        return cleaned

    def query(self):
        """Return the API's query parameters for the cleaned range (for the download links)."""
        data = self.cleaned_data
        params = {"from": data["date_from"].isoformat(), "to": data["date_to"].isoformat(),
                  "period": data["period"]}
        if data["tenant"]:
            params["tenant"] = data["tenant"]
        if data["caller"]:
            params["caller"] = data["caller"]
        return params


def _form_from(params):
    """Return the bound UsageRangeForm of the query ``params``: the form's own fields, or the
    API's (``from``, ``to``: the download links); this month so far by default."""
    day = today()
    data = {"date_from": params.get("date_from") or params.get("from")
            or day.replace(day=1).isoformat(),
            "date_to": params.get("date_to") or params.get("to") or day.isoformat(),
            "tenant": params.get("tenant", ""), "caller": params.get("caller", ""),
            "period": params.get("period") or DAY}
    return UsageRangeForm(data)


class UsageRecordAdmin(ReadOnlyAdmin):
    """The changelist is the usage page; ``download/`` serves the same rows as CSV or JSON."""

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW_PERMISSION)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="ratelimit_app_usagerecord_changelist"),
            path("download/", wrap(self.download_view),
                 name="ratelimit_app_usagerecord_download"),
        ]

    def _require_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied

    def changelist_view(self, request, extra_context=None):
        """The page: the range form, the rows (at most SHOWN_ROWS) and the download links."""
        self._require_view(request)
        form = _form_from(request.GET)
        rows, downloads = [], {}
        if form.is_valid():
            data = form.cleaned_data
            rows = usage_rows(data["date_from"], data["date_to"],
                              tenant=data["tenant"] or None, identity=data["caller"] or None,
                              period=data["period"])
            url = reverse(admin_url_name(UsageRecord, "download"))
            downloads = {name: f"{url}?{urlencode({**form.query(), 'format': name})}"
                         for name in FORMATS}
        totals = {metric: sum(row[metric] for row in rows)
                  for metric in ("units", "allowed", "refused")}
        context = {**self.admin_site.each_context(request), "title": "Usage records",
                   "opts": self.opts, "has_view_permission": True, "form": form,
                   "rows": rows[:SHOWN_ROWS], "row_count": len(rows), "shown": SHOWN_ROWS,
                   "totals": totals, "downloads": downloads,
                   "time_zone": get_config()["CALENDAR_TIME_ZONE"]}
        return TemplateResponse(request, "admin/ratelimit_app/usagerecord/usage.html", context)

    def download_view(self, request):
        """The rows of the page's range as a file (``format``: csv or json)."""
        self._require_view(request)
        form = _form_from(request.GET)
        output_format = request.GET.get("format", "csv")
        if not form.is_valid() or output_format not in FORMATS:
            return HttpResponse("Give from and to as YYYY-MM-DD (from on or before to), "
                                "period day or month, and format csv or json.\n", status=400,
                                content_type="text/plain; charset=utf-8")
        data = form.cleaned_data
        rows = usage_rows(data["date_from"], data["date_to"], tenant=data["tenant"] or None,
                          identity=data["caller"] or None, period=data["period"])
        text, content_type = render(rows, data["date_from"], data["date_to"], data["period"],
                                    output_format)
        response = HttpResponse(text, content_type=content_type)
        name = f"usage-{data['date_from']}-{data['date_to']}.{output_format}"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        response["Cache-Control"] = "no-store"
        return response
