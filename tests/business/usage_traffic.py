"""A worker process of tests/business/test_usage_records.py: sends the requests it is given through
the
whole Django stack (middleware, limiter, recorder) at the given test times, flushes its metrics
to Redis, and prints what it got as JSON: per request its status code, or 0 for an answer made
without Redis (fail-open or fail-closed: no RateLimit header; such an answer charged nothing).

    python -m tests.business.usage_traffic '[[now_ms, raw_key, cost], ...]'
"""

import json
import os
import sys


def main(plan):
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.business.usage_site")
    import django

    django.setup()
    from django.test import Client

    from ratelimit_app.runtime.limiter import default_limiter, install_limiter
    from tests.helpers import FakeClock

    clock = FakeClock(plan[0][0])
    install_limiter(clock=clock, metrics_autostart=False)
    client = Client()
    codes = []
    for now_ms, raw_key, cost in plan:
        clock.now_ms = now_ms
        response = client.get("/hello/", HTTP_X_API_KEY=raw_key, HTTP_X_REQUEST_COST=str(cost))
        codes.append(response.status_code if response.has_header("RateLimit") else 0)
    if default_limiter().flusher.flush_now() == 0:
        sys.exit("the flush wrote nothing")
    print(json.dumps(codes))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
