"""A DRF project's views as DRF's throttling guide writes them: every view limited by the
default throttle classes, one naming a ``throttle_scope`` (tests/adapters/test_drf_rates.py)."""

from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from project.urls import urlpatterns as project_urlpatterns


class Things(APIView):
    def get(self, request):
        return Response({"things": []})


class Burst(APIView):
    throttle_scope = "burst"

    def get(self, request):
        return Response({"burst": True})


urlpatterns = [
    path("drf/things/", Things.as_view(), name="drf-things"),
    path("drf/burst/", Burst.as_view(), name="drf-burst"),
    *project_urlpatterns,
]
