"""The demo's own receiver of the quota alerts' webhooks (docs/howto/receive-webhooks.md).

It does what a receiver in another service does: it verifies the Standard Webhooks headers
(``webhook-id``, ``webhook-timestamp``, ``webhook-signature``) against the raw body with the
``standardwebhooks`` package, answers 2xx only to a delivery it could verify, and stores a
delivery id once (the sender delivers at least once). Unlike a real receiver it also keeps what
it refused, so that the admin's *Received webhooks* page can show both kinds. It is exempt from
the quotas: a refused delivery is only retried later, and the sender shares the demo's client
address (127.0.0.1) with the traffic.
"""

import json
from urllib.parse import urlsplit

from django.db.models import F
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from ratelimit_app.decorators import ratelimit_exempt
from ratelimit_app.models import WebhookEndpoint

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


def verified(secret, body, headers):
    """Return True if the delivery verifies with ``secret``. The package raises ValueError, not
    only WebhookVerificationError, for a malformed header (one outside ASCII, without a comma,
    not base64): all of them are "does not verify"."""
    try:
        Webhook(secret).verify(body, headers, json_parse=False)
    except (WebhookVerificationError, ValueError):
        return False
    return True


def _event(body):
    """The body's ``type``, if the body is a JSON object that has one (for the page)."""
    try:
        event = json.loads(body).get("type", "")
    except (ValueError, AttributeError):
        return ""
    return event[:50] if isinstance(event, str) else ""


@ratelimit_exempt
@csrf_exempt
@require_POST
def receive_webhook(request):
    """Store one delivery. Returns 200 when its signature verifies (also for a delivery
    received before), 400 without the signature headers, 401 when the signature does not
    verify."""
    body = request.body
    signature = request.headers.get("webhook-signature", "")
    signed = bool(signature and request.headers.get("webhook-id")
                  and request.headers.get("webhook-timestamp"))
    valid = signed and any(verified(secret, body, request.headers)
                           for secret in _secrets_for(request.path))
    delivery_id = request.headers.get("webhook-id", "")[:40]
    if valid and ReceivedWebhook.objects.filter(
            delivery_id=delivery_id, signature_valid=True).update(
            times_received=F("times_received") + 1):
        return JsonResponse({"received": delivery_id, "duplicate": True})
    ReceivedWebhook.objects.create(
        delivery_id=delivery_id, event=_event(body), signature=signature[:200],
        signature_valid=valid, body=body[:MAX_STORED_BODY].decode("utf-8", "replace"))
    _forget_oldest()
    if valid:
        return JsonResponse({"received": delivery_id})
    if not signed:
        return JsonResponse({"error": "no webhook-id, webhook-timestamp and webhook-signature "
                                      "headers"}, status=400)
    return JsonResponse({"error": "the signature does not verify"}, status=401)


def _forget_oldest():
    newest_first = ReceivedWebhook.objects.order_by("-id").values_list("id", flat=True)
    beyond = newest_first[KEEP_ROWS:KEEP_ROWS + 1]
    if beyond:
        ReceivedWebhook.objects.filter(id__lte=beyond[0]).delete()
