"""Fixtures of the admin's tests in Debian's Chromium (the modules marked ``browser`` ask for
``orm_beside_playwright`` through their ``pytestmark``)."""

import pytest

from tests.helpers import load_demo_data


@pytest.fixture(scope="session")
def base_url():
    """Replaces pytest-playwright's fallback ``base_url`` fixture, a plugin-object method that
    pytest 9 warns about (warnings are errors here). Pages are opened by full URL."""
    return


@pytest.fixture(scope="module")
def orm_beside_playwright(django_db_setup):
    """Playwright's sync API runs an event loop in this thread, which Django takes for an async
    context; the database calls of these tests (and their fixtures) are plain sync code.
    Depending on django_db_setup creates the test database before Playwright starts, so it is
    also torn down after Playwright stops."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def signed_in_page(page, live_server, settings):
    """A browser page signed in to the admin of the demo data, collecting console errors."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    load_demo_data()
    page.problems = []  # console errors and failed responses (the browser's own favicon aside)
    page.on("console", lambda m: m.type == "error" and "Failed to load resource" not in m.text
            and page.problems.append(m.text))
    page.on("response", lambda r: r.status >= 400 and not r.url.endswith("/favicon.ico")
            and page.problems.append(f"{r.status} {r.url}"))
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")  # only signed-in pages have it
    page.base = live_server.url
    return page
