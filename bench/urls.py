"""The benchmark's views: one trivial DRF view under two names (the flood has its own rule)."""

from django.urls import include, path
from rest_framework.response import Response
from rest_framework.views import APIView


class Item(APIView):
    def get(self, request):
        return Response({"ok": True})


bench_patterns = ([
    path("item/", Item.as_view(), name="item"),
    path("flood/", Item.as_view(), name="flood"),
], "bench")

urlpatterns = [path("", include(bench_patterns))]
