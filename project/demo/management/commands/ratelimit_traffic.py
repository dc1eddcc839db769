"""Drive demo traffic at a running server so the dashboard has live data.

The demo clients (``load_demo``) call the demo API with their API keys at polite rates, dana
streams generated words (a metered endpoint: charged the words she gets) until AI Studio's
daily quota is spent, crossing its alert thresholds, erin orders reports with a prepaid key
until its credits run out (402, until an operator tops it up in the admin), and one abusive
anonymous scraper hammers the API until it is refused (429). Bounded in requests and seconds,
it stops by itself, and it only talks to loopback addresses.

    python manage.py ratelimit_traffic                    # 60 s or 3000 requests
    python manage.py ratelimit_traffic --duration 20 --url http://127.0.0.1:8001

Without ``--url`` it calls the demo where ``load_demo --server-url`` said it serves (``make
run`` passes its port), read from the demo database; without that, ``http://127.0.0.1:$PORT``
(8000 when PORT is not set). When nothing answers there it says so in one line and sends
nothing.
"""

import http.client
import ipaddress
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from .load_demo import WEBHOOK_ENDPOINT

# name, share of the requests, method, path, headers. The scraper's share makes it the abuser.
CLIENTS = [
    ("alice (free key)", 2, "GET", "/api/items/", {"X-Api-Key": "rk_alice_free"}),
    ("alice (free key)", 1, "GET", "/api/search/?q=item", {"X-Api-Key": "rk_alice_free"}),
    ("bob (pro key)", 3, "GET", "/api/search/?q=1", {"X-Api-Key": "rk_bob_pro"}),
    ("bob (pro key)", 2, "GET", "/api/items/", {"X-Api-Key": "rk_bob_pro"}),
    ("carol (enterprise key)", 2, "GET", "/api/items/", {"X-Api-Key": "rk_carol_enterprise"}),
    ("carol (enterprise key)", 1, "POST", "/api/reports/",
     {"X-Api-Key": "rk_carol_enterprise"}),
    # three streams spend AI Studio's 500 words a day (load_demo's studio-daily)
    ("dana (AI Studio key, streams)", 1, "GET", "/api/generate/?words=200",
     {"X-Api-Key": "rk_dana_studio"}),
    # reports (cost 20) spend erin's prepaid credits (load_demo's: a trial allowance pays one,
    # the welcome credit five)
    ("erin (prepaid key)", 1, "POST", "/api/reports/", {"X-Api-Key": "rk_erin_prepaid"}),
    ("scraper (anonymous, abusive)", 12, "GET", "/api/items/", {}),
    ("scraper (anonymous, abusive)", 2, "GET", "/hello/", {}),
]
MAX_DURATION_S = 600
MAX_REQUESTS = 100_000
# Talk to the server directly, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _schedule():
    """Return the clients in a fixed interleaved order, each repeated by its share."""
    order = []
    largest = max(share for _, share, *_ in CLIENTS)
    for turn in range(largest):
        order.extend(client for client in CLIENTS if client[1] > turn)
    return order


def check_loopback(url):
    """Return ``url`` without a trailing slash if it is http(s) on a loopback host, else raise
    CommandError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CommandError(f"{url!r} is not an http(s) URL.")
    host = parts.hostname
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise CommandError(f"Refusing to send traffic to {host}: only loopback addresses "
                               f"(127.0.0.0/8, ::1, localhost) are allowed.")
    return url.rstrip("/")


def recorded_demo_url():
    """Return the address the demo serves on, as ``load_demo --server-url`` recorded it (the
    origin of the demo receiver's webhook endpoint, which is the demo server itself), or None
    when this database holds no demo."""
    from ratelimit_app.models import WebhookEndpoint

    try:
        endpoint = WebhookEndpoint.objects.filter(name=WEBHOOK_ENDPOINT).first()
    except DatabaseError:  # not migrated: no demo here
        return None
    if endpoint is None:
        return None
    parts = urlsplit(endpoint.url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


def default_url():
    """Return the server to call when no --url is given: the recorded demo, else
    127.0.0.1 on $PORT (8000 when unset)."""
    return recorded_demo_url() or f"http://127.0.0.1:{os.environ.get('PORT') or 8000}"


class Command(BaseCommand):
    help = ("Send realistic demo traffic (one abusive client) to a running server on this "
            "machine, for a bounded number of requests and seconds.")

    def add_arguments(self, parser):
        parser.add_argument("--url", default=None,
                            help="Server to call (loopback only). Default: where load_demo "
                                 "recorded the demo, else http://127.0.0.1:$PORT (8000).")
        parser.add_argument("--duration", type=float, default=60.0,
                            help="Stop after this many seconds (at most 600). Default: 60")
        parser.add_argument("--requests", type=int, default=3000,
                            help="Stop after this many requests (at most 100000). Default: 3000")
        parser.add_argument("--rps", type=float, default=25.0,
                            help="Requests per second; 0 sends as fast as the server answers. "
                                 "Default: 25")

    def handle(self, *args, url, duration, requests, rps, **options):
        if not 0 < duration <= MAX_DURATION_S:
            raise CommandError(f"--duration must be between 0 and {MAX_DURATION_S} seconds.")
        if not 0 < requests <= MAX_REQUESTS:
            raise CommandError(f"--requests must be between 1 and {MAX_REQUESTS}.")
        if rps < 0:
            raise CommandError("--rps cannot be negative.")
        base = check_loopback(url or default_url())
        if self._send(base, "GET", "/health/", {}) == "error":
            raise CommandError(
                f"Nothing answers at {base}: start the demo (make run) or pass the address it "
                f"serves on, e.g. --url http://127.0.0.1:8001.")
        schedule = _schedule()
        results = Counter()
        started = time.monotonic()
        deadline = started + duration
        sent = 0
        self.stdout.write(f"Sending up to {requests} requests for up to {duration:g} s to {base}")
        while sent < requests and time.monotonic() < deadline:
            name, _share, method, path, headers = schedule[sent % len(schedule)]
            results[name, str(self._send(base, method, path, headers))] += 1
            sent += 1
            if rps:
                pause = started + sent / rps - time.monotonic()
                if pause > 0:
                    time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        elapsed = time.monotonic() - started
        self.stdout.write(f"Sent {sent} requests in {elapsed:.1f} s.")
        for name in sorted({name for name, _ in results}):
            statuses = ", ".join(f"{status}: {count}" for (who, status), count
                                 in sorted(results.items()) if who == name)
            self.stdout.write(f"  {name:<30} {statuses}")
        self.stdout.write(self._refusals(results))

    @staticmethod
    def _refusals(results):
        """The summary of the refusals: by a rate limit or quota (429: waiting helps), and for
        prepaid credits spent (402: a top-up helps)."""
        refused = Counter()
        for (_name, status), count in results.items():
            refused[status] += count
        line = (f"Refused: {refused['429']} by rate limits and quotas (429), {refused['402']} "
                f"for prepaid credits spent (402)")
        if refused["402"]:
            line += "; top the account up in the admin: Credit accounts → the account → Top up"
        return line + "."

    @staticmethod
    def _send(base, method, path, headers):
        """Return the HTTP status of one request ("error" if the server could not be reached)."""
        request = urllib.request.Request(base + path, method=method,
                                         headers={"User-Agent": "ratelimit-traffic", **headers},
                                         data=b"" if method == "POST" else None)
        try:
            with _OPENER.open(request, timeout=5) as response:
                response.read()
                return response.status
        except urllib.error.HTTPError as exc:
            exc.read()
            exc.close()
            return exc.code
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            return "error"  # unreachable, or the connection broke mid-answer (a stream)
