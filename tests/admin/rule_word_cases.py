"""The table of cases the rule's words are checked on, on both sides: the server's sentence
(``rule_from_input(...)`` then its kind's sentence, tests/admin/test_rule_forms.py) and what the
browser shows under the form while the same fields are typed (test_rule_forms_browser.py).

Each case: the form kind, the fields as typed (the period as ``(number, unit)``), the words.
"""

PENDING = "Type the numbers to read the rule in words."

CASES = [
    ("token_bucket", {"rate": "100", "period": ("1", "minute"), "burst": "200"},
     "100 requests per minute per user or API key, bursts up to 200; enforced"),
    ("token_bucket", {"rate": "1", "period": ("1", "second"), "burst": "1", "scope": "ip"},
     "1 request per second per client IP, bursts up to 1; enforced"),
    ("token_bucket", {"rate": "20000", "period": ("10", "minute"), "burst": "3000",
                      "scope": "tenant", "status": "shadow"},
     "20,000 requests per 10 minutes per tenant, bursts up to 3,000; "
     "shadow (counted, never refused)"),
    ("token_bucket", {"rate": "5", "period": ("1", "hour"), "burst": "5",
                      "endpoint": "api:reports", "status": "disabled"},
     "5 requests to api:reports per hour per user or API key, bursts up to 5; disabled"),
    ("token_bucket", {"rate": "500", "period": ("1", "day"), "burst": "50", "scope": "global"},
     "500 requests per day for all callers together, bursts up to 50; enforced"),
    ("token_bucket", {"rate": "100", "period": ("", "minute"), "burst": "200"}, PENDING),
    ("calendar", {"rate": "10000", "calendar_period": "month"},
     "10,000 requests per month per user or API key, reset at midnight on the 1st (UTC); "
     "enforced"),
    ("calendar", {"rate": "500", "calendar_period": "day", "scope": "plan"},
     "500 requests per day for all callers of the plan together, reset at midnight (UTC); "
     "enforced"),
    ("calendar", {"rate": "500", "calendar_period": ""}, PENDING),
    ("concurrency", {"rate": "5", "period": ("30", "second"), "scope": "tenant"},
     "at most 5 requests in flight per tenant, a crashed request's slot freed after 30 "
     "seconds; enforced"),
    ("credits", {"rate": "6", "calendar_period": "day"},
     "6 units included per day per user or API key, then prepaid credits; enforced"),
    ("credits", {"rate": "0", "calendar_period": "", "scope": "tenant"},
     "prepaid credits only per tenant, no allowance; enforced"),
    ("failed_auth", {"rate": "10", "period": ("1", "minute"), "burst": "10"},
     "10 failed authentications per minute per client IP, up to 10 in a row; enforced"),
    ("responses", {"rate": "20", "period": ("1", "minute"), "burst": "20", "scope": "ip",
                   "counted_statuses": "404"},
     "at most 20 responses 404 per minute per client IP, up to 20 in a row; enforced"),
    ("responses", {"rate": "5", "period": ("10", "minute"), "burst": "5", "scope": "ip",
                   "counted_statuses": "401,403", "counted_path_prefix": "/login",
                   "status": "shadow"},
     "at most 5 responses 401 or 403 under /login per 10 minutes per client IP, up to 5 in a "
     "row; shadow (counted, never refused)"),
    ("responses", {"rate": "20", "period": ("1", "minute"), "burst": "20"}, PENDING),
]


def as_form_data(fields):
    """Return the form's raw fields of a case (the period as its two inputs)."""
    data = {name: value for name, value in fields.items() if name != "period"}
    if "period" in fields:
        data["period_s_0"], data["period_s_1"] = fields["period"]
    return data
