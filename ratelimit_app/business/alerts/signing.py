"""The signatures of webhook deliveries: Standard Webhooks, and the former X-Ratelimit-Signature.

Standard Webhooks (https://www.standardwebhooks.com/), what receivers check with the
``standardwebhooks`` or ``svix`` packages:

    webhook-id:        the delivery's id, the same on every attempt (receivers dedupe on it)
    webhook-timestamp: unix seconds of the attempt
    webhook-signature: "v1," + base64(HMAC-SHA256(key, "<id>.<timestamp>.<raw body>"))

where ``key`` is the endpoint secret's bytes: the base64 after its ``whsec_`` prefix. The id and
the timestamp are signed, so a body replayed under another id, or later, does not verify.

The former scheme, still sent beside the standard headers to endpoints whose signature scheme
is "both" (the endpoints added before 0.2.0, until their receivers move over):

    X-Ratelimit-Signature: t=<timestamp>,v1=<hex HMAC-SHA256(key, "<t>.<raw body>")>

keyed with the same bytes: migration 0019 wrapped each former secret ``s`` as
``"whsec_" + base64(s)``, so the key is ``s`` itself, as before, and a receiver that still
holds ``s`` verifies as it did.

Every comparison here is of bytes: a header a client sent, with characters outside ASCII, is
"does not verify", never an exception.
"""

import base64
import binascii
import hashlib
import hmac
import time

__all__ = ["SECRET_PREFIX", "SIGNATURE_HEADER", "secret_key", "new_secret", "standard_headers",
           "legacy_signature_header", "verify_standard", "verify_legacy", "verify_signature",
           "wrap_former_secret"]

SECRET_PREFIX = "whsec_"
# the former scheme's header
SIGNATURE_HEADER = "X-Ratelimit-Signature"
# how far a signed timestamp may be from the receiver's clock (the standard's 5 minutes)
TOLERANCE_S = 300


def secret_key(secret):
    """Return the HMAC key of a ``whsec_<base64>`` secret: its decoded bytes. Raises ValueError
    if the secret is not one."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error as exc:
        raise ValueError("the webhook secret is not whsec_ and base64") from exc
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def new_secret(size=32):
    """Return a new secret: ``whsec_`` and ``size`` random bytes in base64."""
    import secrets

    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(size)).decode()


def wrap_former_secret(former):
    """Return the Standard Webhooks form of a secret made before 0.2.0: its text, base64-encoded
    behind ``whsec_``, so that its key (``secret_key``) is the text the former scheme keyed with.
    A receiver holding the former secret computes the same to verify the standard headers."""
    return SECRET_PREFIX + base64.b64encode(former.encode()).decode()


def _standard_signature(key, message_id, timestamp, body):
    message = f"{message_id}.{int(timestamp)}.".encode() + body
    return base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode()


def standard_headers(secret, message_id, timestamp, body):
    """Return the three Standard Webhooks headers of ``body`` (bytes) sent as ``message_id`` at
    ``timestamp`` (unix seconds)."""
    signature = _standard_signature(secret_key(secret), message_id, timestamp, body)
    return {"webhook-id": str(message_id), "webhook-timestamp": str(int(timestamp)),
            "webhook-signature": f"v1,{signature}"}


def _legacy_hex(key, timestamp, body):
    return hmac.new(key, str(int(timestamp)).encode() + b"." + body, hashlib.sha256).hexdigest()


def legacy_signature_header(secret, timestamp, body):
    """Return the former ``X-Ratelimit-Signature`` value of ``body`` at ``timestamp``."""
    return f"t={int(timestamp)},v1={_legacy_hex(secret_key(secret), timestamp, body)}"


def _recent(timestamp, now, tolerance_s):
    now = time.time() if now is None else now
    return abs(now - timestamp) <= tolerance_s


def _ascii(text):
    """``text`` as bytes, or None if it has characters outside ASCII (so it matches nothing)."""
    try:
        return text.encode("ascii")
    except UnicodeEncodeError:
        return None


def verify_standard(secret, headers, body, now=None, tolerance_s=TOLERANCE_S):
    """Return True if ``headers`` (a mapping; names in any case) carry a Standard Webhooks
    signature of ``body`` (bytes) by ``secret`` (``whsec_…``) made within ``tolerance_s`` of
    ``now``. Anything malformed is False."""
    lowered = {str(name).lower(): value for name, value in headers.items()}
    message_id = lowered.get("webhook-id", "")
    signatures = lowered.get("webhook-signature", "")
    try:
        timestamp = int(lowered.get("webhook-timestamp", ""))
        key = secret_key(secret)
    except ValueError:
        return False
    if not message_id or not _recent(timestamp, now, tolerance_s):
        return False
    expected = f"v1,{_standard_signature(key, message_id, timestamp, body)}".encode()
    # several signatures, separated by spaces, may be sent (e.g. during a key rotation)
    return any(candidate is not None and hmac.compare_digest(candidate, expected)
               for candidate in map(_ascii, signatures.split(" ")))


def verify_legacy(secret, header, body, now=None, tolerance_s=TOLERANCE_S):
    """Return True if ``header`` (an X-Ratelimit-Signature value) signs ``body`` with the former
    secret ``secret`` (the text a receiver was given before 0.2.0) within ``tolerance_s``."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
    except (ValueError, KeyError):
        return False
    given = _ascii(fields.get("v1", ""))
    if given is None or not _recent(timestamp, now, tolerance_s):
        return False
    return hmac.compare_digest(_legacy_hex(secret.encode(), timestamp, body).encode(), given)


def verify_signature(secret, headers, body, now=None, tolerance_s=TOLERANCE_S):
    """Return True if the delivery verifies: ``headers`` a mapping of the request's headers
    (Standard Webhooks, ``secret`` the endpoint's ``whsec_…``), or, as before 0.2.0, the
    ``X-Ratelimit-Signature`` value as a string (``secret`` the former one, see
    ``verify_legacy``)."""
    if isinstance(headers, str):
        return verify_legacy(secret, headers, body, now, tolerance_s)
    return verify_standard(secret, headers, body, now, tolerance_s)
