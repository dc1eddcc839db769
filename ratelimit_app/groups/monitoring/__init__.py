"""Monitoring: the dashboard, the simulator ("What would this request do?") and the audit trail."""
