"""Alerts: the quota alerts, the webhook endpoints they are sent to, and the deliveries."""
