"""Callers: the API keys, plan assignments, identity overrides and allow and deny lists, in a
section of their own."""
