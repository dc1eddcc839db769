"""The demo's browser tests sign in to the admin as the admin's own browser tests do: their
fixtures (tests/admin/conftest.py), shared rather than written twice."""

from tests.admin.conftest import base_url, orm_beside_playwright, signed_in_page

__all__ = ["base_url", "orm_beside_playwright", "signed_in_page"]
