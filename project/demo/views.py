"""A small API to show the limiter: a cheap, a medium and an expensive endpoint, a metered one
(a stream of generated words, charged by the word), one plain view."""

import json

from django.http import JsonResponse, StreamingHttpResponse
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


# The "model" of the fake text generator: words taken in turn, as many as asked.
VOCABULARY = (
    "Quotas keep a shared API fair: every caller draws tokens from its buckets, the buckets "
    "refill with time, and a request that finds one empty waits its turn. A stream like this "
    "one is charged the words it really produced, not the guess it was admitted on."
).split()
DEFAULT_WORDS = 50
MAX_WORDS = 500
# words per server-sent event (the last one may carry fewer)
WORDS_PER_EVENT = 4


def generate(request):
    """Metered: stream ``?words=N`` generated words (1 to 500, default 50) as server-sent
    events, reporting each event's words to the limiter before sending it. The api:generate
    EndpointCost row is metered: the caller is admitted on its estimate and then charged the
    words it was sent (at least the row's minimum)."""
    decision = request.ratelimit
    words = _words_asked(request.GET.get("words"))
    response = StreamingHttpResponse(_events(decision, words), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy such as nginx would hold the events back
    return response


def _words_asked(raw):
    """Return the ``words`` parameter clamped to 1..MAX_WORDS (the default if it is not a whole
    number)."""
    if raw is None or not (raw.isascii() and raw.isdigit()):
        return DEFAULT_WORDS
    return max(1, min(MAX_WORDS, int(raw) if len(raw) <= 4 else MAX_WORDS))


def _events(decision, words):
    """Yield the events of a stream of ``words`` words, charging each one's words first: words
    generated are consumed even when the client leaves before they reach it."""
    sent = 0
    while sent < words:
        chunk = [VOCABULARY[i % len(VOCABULARY)]
                 for i in range(sent, min(words, sent + WORDS_PER_EVENT))]
        decision.charge(len(chunk))
        sent += len(chunk)
        yield _event("words", {"text": " ".join(chunk), "words": len(chunk)})
    yield _event("done", {"words": sent})


def _event(name, data):
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"
