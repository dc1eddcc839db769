"""Optional URLs of the app: ``path("ratelimit/", include("ratelimit_app.urls"))``.

The dashboard itself lives in the admin and needs no URL here.
"""

from django.urls import path

from .prometheus import metrics_view

app_name = "ratelimit_app"

urlpatterns = [
    path("metrics/", metrics_view, name="prometheus"),
]
