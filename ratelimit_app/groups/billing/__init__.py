"""Billing: the prepaid credit accounts, their top-ups and the usage records."""
