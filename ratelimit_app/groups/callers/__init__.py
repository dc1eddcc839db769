"""Callers: the API keys, plan assignments and identity overrides, in a section of their own."""
