"""Fixtures of the business features' tests: the alerts' signal as it is sent, and a real
webhook receiver."""

import pytest

from ratelimit_app.business.alerts.crossings import quota_threshold_crossed

from .webhook_receiver import Receiver


@pytest.fixture
def received():
    """The quota_threshold_crossed signals sent during the test (their alerts)."""
    alerts = []

    def receiver(sender, alert, **kwargs):
        alerts.append(alert)

    quota_threshold_crossed.connect(receiver)
    yield alerts
    quota_threshold_crossed.disconnect(receiver)


@pytest.fixture
def receiver():
    """A real webhook receiver (tests/business/webhook_receiver.py) on a free port, stopped
    after."""
    receiver = Receiver().start()
    yield receiver
    receiver.stop()
