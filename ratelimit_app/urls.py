"""Optional URLs of the app: ``path("ratelimit/", include("ratelimit_app.urls"))``.

``usage/`` is the caller's own quota usage (see views/usage.py), ``metrics/`` the Prometheus
endpoint (off unless enabled), ``usage-records/`` the staff JSON API of the usage records for
billing (views/usage_records.py), ``credits/<account>/`` and ``credits/<account>/top-ups/`` the
staff JSON API of prepaid credits (views/credits.py). The dashboard itself lives in the admin
and needs no URL here.
"""

from django.urls import path

from .views.credits import credit_balance_view, credit_top_up_view
from .views.prometheus import metrics_view
from .views.usage import usage_view
from .views.usage_records import usage_records_view

app_name = "ratelimit_app"

urlpatterns = [
    path("metrics/", metrics_view, name="prometheus"),
    path("usage/", usage_view, name="usage"),
    path("usage-records/", usage_records_view, name="usage-records"),
    path("credits/<str:ref>/", credit_balance_view, name="credit-balance"),
    path("credits/<str:ref>/top-ups/", credit_top_up_view, name="credit-top-ups"),
]
