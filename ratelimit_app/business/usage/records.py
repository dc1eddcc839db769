"""Reading usage records for billing: per day or per month, as rows, CSV or JSON. Used by
``manage.py ratelimit usage``, the admin's usage page, the staff JSON API and the usage
endpoint. A month is the sum of its day records (aggregated on read, so it is never out of step
with them).
"""

import csv
import datetime
import io
import json

from django.db.models import Max, Sum
from django.db.models.functions import TruncMonth

from ...metrics.usage import USAGE_METRICS
from .models import UsageRecord

__all__ = ["DAY", "MONTH", "COLUMNS", "FORMATS", "UsageQueryError", "parse_day",
           "parse_range", "usage_rows", "month_to_date", "as_csv", "as_json", "render"]

DAY, MONTH = "day", "month"
COLUMNS = ("period", "identity", "display", "tenant", "rule", *USAGE_METRICS)
FORMATS = {"csv": "text/csv; charset=utf-8", "json": "application/json"}


class UsageQueryError(ValueError):
    """A date range or option that cannot be read; the message says what to send instead."""


def parse_day(text, name):
    """Return the date ``text`` (YYYY-MM-DD) names; UsageQueryError naming ``name`` if not."""
    try:
        return datetime.date.fromisoformat((text or "").strip())
    except ValueError:
        raise UsageQueryError(f"{name} must be a date as YYYY-MM-DD (got {text!r:.40}).") \
            from None


def parse_range(date_from, date_to):
    """Return ``(first day, last day)`` of an inclusive range given as texts."""
    first, last = parse_day(date_from, "from"), parse_day(date_to, "to")
    if last < first:
        raise UsageQueryError(f"The range ends ({last}) before it starts ({first}).")
    return first, last


def usage_rows(first, last, *, tenant=None, identity=None, period=DAY):
    """Return the usage between the days ``first`` and ``last`` (inclusive) as dicts with
    COLUMNS, per day or per month (a month's row sums its days within the range), ordered by
    period, tenant, identity and rule."""
    if period not in (DAY, MONTH):
        raise UsageQueryError(f"period must be {DAY} or {MONTH}.")
    records = UsageRecord.objects.filter(day__gte=first, day__lte=last)
    if tenant is not None:
        records = records.filter(tenant=tenant)
    if identity is not None:
        records = records.filter(identity=identity)
    if period == DAY:
        return [{"period": r.day.isoformat(), "identity": r.identity, "display": r.display,
                 "tenant": r.tenant, "rule": r.rule, "units": r.units, "allowed": r.allowed,
                 "refused": r.refused} for r in records.order_by("day", "tenant", "identity",
                                                                   "rule")]
    months = (records.annotate(month=TruncMonth("day"))
              .values("month", "identity", "tenant", "rule")
              .annotate(display=Max("display"), **{f"sum_{m}": Sum(m) for m in USAGE_METRICS})
              .order_by("month", "tenant", "identity", "rule"))
    return [{"period": _month_text(m["month"]), "identity": m["identity"],
             "display": m["display"], "tenant": m["tenant"], "rule": m["rule"],
             **{metric: m[f"sum_{metric}"] for metric in USAGE_METRICS}} for m in months]


def _month_text(value):
    # TruncMonth of a DateField gives a date (a datetime on some backends)
    return value.strftime("%Y-%m")


def month_to_date(identity, today):
    """Return ``identity``'s usage from the 1st of ``today``'s month to ``today`` per rule:
    ``{"from", "to", "rules": [{"rule", "units", "allowed", "refused"}]}``."""
    first = today.replace(day=1)
    rows = usage_rows(first, today, identity=identity, period=MONTH)
    by_rule = {}
    for row in rows:  # one row per rule and tenant: a caller's tenant may have changed
        numbers = by_rule.setdefault(row["rule"], dict.fromkeys(USAGE_METRICS, 0))
        for metric in USAGE_METRICS:
            numbers[metric] += row[metric]
    return {"from": first.isoformat(), "to": today.isoformat(),
            "rules": [{"rule": rule, **numbers} for rule, numbers in sorted(by_rule.items())]}


def as_csv(rows):
    """Return ``rows`` as CSV text with a header line (cells that a spreadsheet would run as a
    formula are prefixed with a quote)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(row[column]) for column in COLUMNS])
    return out.getvalue()


def _cell(value):
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def as_json(rows, first, last, period):
    """Return ``rows`` as a JSON document (text) saying which range and period they cover."""
    return json.dumps({"from": first.isoformat(), "to": last.isoformat(), "period": period,
                       "records": rows}, indent=1)


def render(rows, first, last, period, output_format):
    """Return ``(text, content type)`` of ``rows`` in ``output_format`` (csv or json)."""
    if output_format not in FORMATS:
        raise UsageQueryError("format must be csv or json.")
    text = as_csv(rows) if output_format == "csv" else as_json(rows, first, last, period)
    return text, FORMATS[output_format]
