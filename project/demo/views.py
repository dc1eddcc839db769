"""A small API to show the limiter: a cheap, a medium and an expensive endpoint, one plain view."""

from django.http import JsonResponse
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

ITEMS = [{"id": i, "name": f"item {i}"} for i in range(1, 6)]


class ItemList(APIView):
    """Cheap: anyone may list items (cost 1)."""

    permission_classes = [AllowAny]

    def get(self, request):
        return Response({"items": ITEMS})


class Search(APIView):
    """Medium: a search (cost 5 in the demo data)."""

    permission_classes = [AllowAny]

    def get(self, request):
        query = request.query_params.get("q", "")[:100]
        return Response({"query": query, "results": [i for i in ITEMS if query in i["name"]]})


class Reports(APIView):
    """Expensive: building a report (cost 20 in the demo data)."""

    permission_classes = [AllowAny]

    def post(self, request):
        return Response({"report": "queued"}, status=202)


def hello(request):
    """A plain Django view, limited by QuotaMiddleware."""
    return JsonResponse({"hello": request.user.get_username() or "anonymous"})


def health(request):
    """Exempt from limits (EXEMPT_PATHS)."""
    return JsonResponse({"ok": True})
