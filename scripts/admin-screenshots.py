"""Make the admin screenshots of docs/howto/admin.md again, from the demo's data:

    .venv/bin/python scripts/admin-screenshots.py

It starts what it needs and stops it by PID: a private redis-server on a free port in a temp
dir, a temporary SQLite database migrated and given the demo data and a little traffic, and
Django's server on a free 127.0.0.1 port; then Debian's Chromium (Playwright, /usr/bin/chromium)
takes each page of PAGES at 1280 px wide (light mode, and dark for DARK_TOO), into
docs/howto/img/admin/.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "howto" / "img" / "admin"
VIEWPORT = {"width": 1280, "height": 800}
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

# name -> (path, what to do on the page before the picture: a function of the page, or None)
PAGES = {
    "index": ("/admin/", None),
    "choose-kind": ("/admin/ratelimit_app/rule/add/", None),
    "token-bucket": ("/admin/ratelimit_app/rule/add/?kind=token_bucket",
                     lambda page: _type_token_bucket(page)),
    "calendar-quota": ("/admin/ratelimit_app/rule/add/?kind=calendar",
                       lambda page: _type_calendar_quota(page)),
    "rules": ("/admin/ratelimit_app/rule/", None),
    "plan": ("/admin/ratelimit_app/plan/?q=pro", lambda page: _open_first_row(page)),
    "dashboard": ("/admin/ratelimit_monitoring/dashboard/", None),
    # dana's key after the traffic: her daily quota's run-out, her user's launch-week override
    "caller": ("/admin/ratelimit_monitoring/dashboard/callers/?q=rk_dana_", None),
    # bob's page, Override…, 7 days: the form's sentence before saving
    "override": ("/admin/ratelimit_monitoring/dashboard/callers/?q=bob",
                 lambda page: _override_for_a_week(page)),
    "ban-rule": ("/admin/ratelimit_protection/banrule/add/?kind=statuses",
                 lambda page: _type_ban_rule(page)),
}
# Every page in light mode, these in dark mode too (the docs show one of each kind of page).
DARK_TOO = ("token-bucket", "dashboard", "caller")


def shots():
    """Return ``(name, scheme)`` of every screenshot the script takes."""
    return [(name, scheme) for scheme in ("light", "dark") for name in PAGES
            if scheme == "light" or name in DARK_TOO]


def image_names():
    """Return the file names the script writes (docs/howto/admin.md shows these)."""
    return [f"{name}-{scheme}.png" for name, scheme in shots()]


def _open_first_row(page):
    page.click("#result_list tbody tr:first-child th a")
    page.wait_for_selector("#plan-hub")


def _type_token_bucket(page):
    page.fill("#id_name", "pro-user-minute")
    page.fill("#id_rate", "100")
    page.fill("#id_period_s_0", "1")
    page.select_option("#id_period_s_1", "minute")
    page.fill("#id_burst", "200")
    page.wait_for_function(
        "document.querySelector('#rule-in-words').textContent.startsWith('100 requests')")


def _type_calendar_quota(page):
    page.fill("#id_name", "pro-user-month")
    page.fill("#id_rate", "10000")
    page.select_option("#id_calendar_period", "month")
    page.wait_for_function(
        "document.querySelector('#rule-in-words').textContent.startsWith('10,000')")


def _override_for_a_week(page):
    page.click("a[data-action=override]")
    page.fill("#id_duration_0", "7")
    page.wait_for_function(
        "document.querySelector('#rule-in-words').textContent.includes('until')")


def _type_ban_rule(page):
    page.fill("#id_name", "vault-scanner")
    page.fill("#id_statuses", "404")
    page.fill("#id_threshold", "20")
    page.fill("#id_window_s_0", "1")
    page.select_option("#id_window_s_1", "minute")
    page.fill("#id_ban_s_0", "10")
    page.select_option("#id_ban_s_1", "minute")
    page.wait_for_function(
        "document.querySelector('#rule-in-words').textContent.startsWith('Ban a client IP')")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url, process, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited ({process.returncode}) before answering")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout_s} s")


def _manage(env, *args):
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def take_screenshots(base_url):
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{base_url}/admin/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "admin")
        page.click("input[type=submit]")
        page.wait_for_selector("#user-tools")
        for name, scheme in shots():
            path, prepare = PAGES[name]
            page.emulate_media(color_scheme=scheme)
            page.goto(base_url + path)
            if prepare is not None:
                prepare(page)
            # the whole page: a form's words sit below its fields
            page.screenshot(path=OUT / f"{name}-{scheme}.png", full_page=True)
        browser.close()


def main():
    work = Path(tempfile.mkdtemp(prefix="ratelimit-screenshots."))
    redis_port, web_port = _free_port(), _free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", str(work)],
                             stdout=subprocess.DEVNULL)
    server = None
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
           "SQLITE_PATH": str(work / "db.sqlite3")}
    try:
        _manage(env, "migrate", "--noinput", "-v0")
        base_url = f"http://127.0.0.1:{web_port}"
        _manage(env, "load_demo", "--server-url", base_url)
        server = subprocess.Popen([sys.executable, "manage.py", "runserver", "--noreload",
                                   f"127.0.0.1:{web_port}"], cwd=ROOT, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(f"{base_url}/hello/", server)
        _manage(env, "ratelimit_traffic", "--url", base_url, "--requests", "80", "--rps", "0")
        take_screenshots(base_url)
    finally:
        for process in (server, redis):
            if process is not None:
                process.terminate()
                process.wait(timeout=10)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(f"{len(image_names())} screenshots in {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
