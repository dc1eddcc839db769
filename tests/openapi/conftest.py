"""Fixtures of the Swagger UI browser test."""

import pytest


@pytest.fixture(scope="session")
def base_url():
    """Replaces pytest-playwright's fallback ``base_url`` fixture, a plugin-object method that
    pytest 9 warns about (warnings are errors here). Pages are opened by full URL."""
    return
