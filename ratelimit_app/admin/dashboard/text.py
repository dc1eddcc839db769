"""The dashboard's tables as plain text, for ``manage.py ratelimit top`` and ``inspect``.

The numbers come from ``dashboard_data`` and ``inspector.bucket_rows`` unchanged: a terminal and
the admin page show the same figures.
"""

__all__ = ["counted", "table", "top_lines", "bucket_lines"]


def counted(count, noun, plural=None):
    """Return ``"1 key"`` or ``"2 keys"``: ``count`` with ``noun`` in the number it takes
    (``plural`` for a noun that does not just add an s)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def table(headers, rows):
    """Return ``rows`` (sequences of values) under ``headers`` as aligned lines of text."""
    cells = [[str(h) for h in headers]] + [["—" if v is None else str(v) for v in row]
                                           for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in cells]


def _section(title, headers, rows, empty):
    return ["", title] + (["  " + line for line in table(headers, rows)] if rows
                          else [f"  {empty}"])


def top_lines(data):
    """Return the hot keys and 429 rates of ``dashboard_data(...)`` as lines of text."""
    summary, window = data["summary"], data["window"]
    lines = [f"Last {window}: {counted(summary['requests'], 'request')}, "
             f"{summary['denied']} denied ({summary['rate_429']} % 429), "
             f"{counted(summary['shadow'], 'shadow would-be denial')}, "
             f"{summary['degraded']} decided without Redis."]
    hot_headers = ("identity", "plan", "requests", "denied", "429 %", "tokens")
    for metric, title in (("denials", "Hot keys by denials"),
                          ("tokens", "Hot keys by tokens used")):
        rows = [(row["label"], row["plan"] or None, row["requests"], row["denials"], row["rate"],
                 row["tokens"]) for row in data["hot_keys"][metric]]
        lines += _section(f"{title} ({window})", hot_headers, rows, "no traffic")
    for dimension in ("plan", "rule", "endpoint"):
        rows = [(row["name"] or None, row["requests"], row["denied"], row["rate"])
                for row in data["rates"][dimension]]
        lines += _section(f"429 rate by {dimension} ({window})",
                          (dimension, "requests", "denied", "429 %"), rows, "no traffic")
    return lines


def bucket_lines(rows):
    """Return the inspector's bucket rows as a table (shared buckets marked)."""
    return table(
        ("rule", "scope", "endpoint", "mode", "tokens", "capacity", "cost", "full in", "rate"),
        [(row["rule"], row["scope"] if row["own"] else f"{row['scope']} (shared)",
          row["endpoint"], row["mode"], row["tokens"], row["capacity"], row["cost"],
          f"{row['full_in_s']} s", row["rate"]) for row in rows])
