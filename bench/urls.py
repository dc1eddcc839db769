"""The benchmark's views: one trivial DRF view under two names (the flood has its own rule), and
the same answer from an ``async def`` Django view (what async users run under ASGI)."""

from django.http import JsonResponse
from django.urls import include, path
from rest_framework.response import Response
from rest_framework.views import APIView


class Item(APIView):
    def get(self, request):
        return Response({"ok": True})


async def async_item(request):
    return JsonResponse({"ok": True})


bench_patterns = ([
    path("item/", Item.as_view(), name="item"),
    path("aitem/", async_item, name="aitem"),
    path("flood/", Item.as_view(), name="flood"),
], "bench")

urlpatterns = [path("", include(bench_patterns))]
