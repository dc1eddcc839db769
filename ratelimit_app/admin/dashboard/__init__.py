"""The staff dashboard, hosted inside the Django admin.

``admin.py`` registers a ModelAdmin for the table-less ``Dashboard`` model whose changelist is the
dashboard (so the admin index links to it and its permissions gate it); ``data.py`` assembles
what the page and its JSON endpoint show; ``rates.py`` the 429 rate over the last hour and day
per plan and per rule; ``charts.py`` draws the SVG charts; ``inspector.py`` finds a client's
buckets and resets them (for the caller pages of ``admin/callers/`` and ``manage.py ratelimit
inspect``).
"""
