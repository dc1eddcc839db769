"""``caller.banned``: the webhooks of a ban the penalty box imposed (protection/bans.py)."""

import json

from .models import Event, WebhookDelivery, WebhookEndpoint
from .webhooks import _iso, first_attempt_times

__all__ = ["ban_body", "deliver_ban"]


def ban_body(ban):
    """Return the JSON text a Ban row's deliveries send."""
    return json.dumps({
        "type": Event.CALLER_BANNED,
        "id": f"ban_{ban.pk}",
        "created": _iso(ban.since),
        "data": {"rule": ban.rule_name, "scope": ban.scope, "identity": ban.who,
                 "since": _iso(ban.since), "until": _iso(ban.until), "times": ban.times},
    }, separators=(",", ":"))


def deliver_ban(ban):
    """Queue a ``caller.banned`` delivery of ``ban`` to every enabled endpoint that receives
    the event (sent by the alerts' sender, as quota alerts are). Returns the deliveries."""
    body = ban_body(ban)
    next_at, give_up = first_attempt_times()
    return [WebhookDelivery.objects.create(endpoint=endpoint, event=Event.CALLER_BANNED,
                                           body=body, next_attempt_at=next_at,
                                           give_up_at=give_up)
            for endpoint in WebhookEndpoint.objects.filter(enabled=True)
            if Event.CALLER_BANNED in endpoint.event_list()]
