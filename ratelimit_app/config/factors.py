"""An identity override's factor: "× 2" of a rule's own numbers, whatever they become.

An override with a factor stores no numbers of its own: the rule's numbers in force are scaled
each time a caller's buckets are built from a snapshot (``decision/engine.py``), so an edit of
the rule moves the override with it. The admin's sentence ("bob: 1,200 requests per minute,
bursts up to 400") scales a rule row with the same function, so the words and the engine
never disagree.

The arithmetic is decimal (a factor of 0.29 on 100 is 29, never 28.999… rounded down), rounded
half up to a whole number, never below 1 (a halved limit of 1 stays 1) and never above what a
bucket can hold (``most``).
"""

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from .choices import MAX_BUCKET_UNITS, MAX_CONCURRENCY

__all__ = ["MIN_FACTOR", "MAX_FACTOR", "FACTOR_DECIMALS", "scaled", "scaled_limits",
           "factor_words", "parse_factor"]

# The factors an override may have: from a hundredth to a thousand times the rule's numbers.
MIN_FACTOR = Decimal("0.01")
MAX_FACTOR = Decimal("1000")
FACTOR_DECIMALS = 2
# The largest rate a rule row holds (its column's): a scaled rate stays a rate a rule could have.
MAX_RATE = 2**31 - 1


def scaled(number, factor, most):
    """Return ``number`` × ``factor`` (a Decimal) as a whole number, rounded half up, at least
    1 and at most ``most``."""
    product = (Decimal(number) * factor).to_integral_value(rounding=ROUND_HALF_UP)
    return int(min(max(product, 1), most))


def scaled_limits(factor, *, rate, period_s, burst, calendar=False, concurrency=False):
    """Return ``(rate, burst)``, a rule's numbers × ``factor``: a token bucket's rate and burst
    (its period kept; burst × period within what a bucket holds), a calendar quota's units per
    period, a concurrency limit's requests in flight (their burst is their rate)."""
    if calendar:
        limit = scaled(rate, factor, MAX_BUCKET_UNITS)
        return limit, limit
    if concurrency:
        limit = scaled(rate, factor, MAX_CONCURRENCY)
        return limit, limit
    return (scaled(rate, factor, MAX_RATE),
            scaled(burst, factor, MAX_BUCKET_UNITS // (period_s * 1000)))


def factor_words(factor):
    """Return a factor as an operator reads it: "× 2", "× 0.5", "× 1.25"."""
    return f"× {factor.normalize():f}"


def parse_factor(text):
    """Return the Decimal a factor typed as ``text`` ("2", "0.5", "1,5", "×2") is, or None
    when it is not a number."""
    text = (text or "").strip().lstrip("×x* ").replace(",", ".")
    if not text or len(text) > 16:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None
