"""The demo's own receiver of the quota alerts' webhooks (docs/howto/alerts.md).

It does what a receiver in another service does: it checks ``X-Ratelimit-Signature`` against
the raw body with ``ratelimit_app.webhooks.verify_signature``, answers 2xx only to a delivery it
could verify, and stores a delivery id once (the sender delivers at least once). Unlike a real
receiver it also keeps what it refused, so that the admin's *Received webhooks* page can show
both kinds. It is exempt from the quotas: a refused delivery is only retried later, and the
sender shares the demo's client address (127.0.0.1) with the traffic.
"""

from urllib.parse import urlsplit

from django.db.models import F
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from ratelimit_app.decorators import ratelimit_exempt
from ratelimit_app.models import WebhookEndpoint
from ratelimit_app.webhooks import SIGNATURE_HEADER, verify_signature

from .models import ReceivedWebhook

# rows kept (the oldest go first): anyone can POST here, verified or not
KEEP_ROWS = 1000
# characters of a body kept for the page (the signature is checked on all of it)
MAX_STORED_BODY = 20_000


def _secrets_for(path):
    """Return the secrets of the webhook endpoints whose URL points at ``path``. A receiver
    elsewhere would keep its endpoint's secret in its own settings; this one lives in the same
    project, so a secret replaced in the admin takes effect here at once."""
    return [secret for url, secret in WebhookEndpoint.objects.values_list("url", "secret")
            if urlsplit(url).path == path]


@ratelimit_exempt
@csrf_exempt
@require_POST
def receive_webhook(request):
    """Store one delivery. Returns 200 when its signature verifies (also for a delivery
    received before), 400 without a signature header, 401 when the signature does not verify."""
    body = request.body
    header = request.headers.get(SIGNATURE_HEADER, "")
    valid = bool(header) and any(verify_signature(secret, header, body)
                                 for secret in _secrets_for(request.path))
    delivery_id = request.headers.get("X-Ratelimit-Delivery", "")[:40]
    if valid and delivery_id and ReceivedWebhook.objects.filter(
            delivery_id=delivery_id, signature_valid=True).update(
            times_received=F("times_received") + 1):
        return JsonResponse({"received": delivery_id, "duplicate": True})
    ReceivedWebhook.objects.create(
        delivery_id=delivery_id, event=request.headers.get("X-Ratelimit-Event", "")[:50],
        signature=header[:200], signature_valid=valid,
        body=body[:MAX_STORED_BODY].decode("utf-8", "replace"))
    _forget_oldest()
    if valid:
        return JsonResponse({"received": delivery_id})
    if not header:
        return JsonResponse({"error": f"no {SIGNATURE_HEADER} header"}, status=400)
    return JsonResponse({"error": "the signature does not verify"}, status=401)


def _forget_oldest():
    newest_first = ReceivedWebhook.objects.order_by("-id").values_list("id", flat=True)
    beyond = newest_first[KEEP_ROWS:KEEP_ROWS + 1]
    if beyond:
        ReceivedWebhook.objects.filter(id__lte=beyond[0]).delete()
