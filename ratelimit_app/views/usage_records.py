"""The staff JSON API of the usage records: ``GET usage-records/?from=&to=[&tenant=]
[&identity=][&period=day|month]``, mounted by ``ratelimit_app.urls``.

For billing systems and scripts that sign in as staff (a session; or put it behind your own
authentication). Answers 200 with the rows (see usage_records.as_json), 400 with a problem
saying what to fix, 403 for anyone who is not active staff with
``ratelimit_app.view_usagerecord``. Not limited by the quotas: a staff tool, like the admin.
"""

from django.http import HttpResponse
from django.views.decorators.http import require_safe

from ..business.usage.records import DAY, UsageQueryError, parse_range, render, usage_rows
from ..decision.headers import plain_problem
from ..decorators import ratelimit_exempt
from .staff import refuse_unless_staff_with

__all__ = ["usage_records_view"]

VIEW_PERMISSION = "ratelimit_app.view_usagerecord"


@ratelimit_exempt
@require_safe
def usage_records_view(request):
    """Return the usage records of the query's range as JSON (see the module docstring)."""
    refused = refuse_unless_staff_with(request, VIEW_PERMISSION, "view usage records")
    if refused:
        return refused
    params = request.GET
    try:
        first, last = parse_range(params.get("from"), params.get("to"))
        period = params.get("period") or DAY
        rows = usage_rows(first, last, tenant=params.get("tenant"),
                          identity=params.get("identity"), period=period)
        text, content_type = render(rows, first, last, period, "json")
    except UsageQueryError as exc:
        return plain_problem(400, "Bad usage query", str(exc))
    response = HttpResponse(text, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
