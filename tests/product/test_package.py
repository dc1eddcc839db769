"""The package as a user gets it: the sdist and wheel built from the repository, the wheel
installed into a fresh virtualenv beside a fresh ``django-admin startproject`` wired exactly as
docs/tutorial/quickstart.md says, and real requests limited through it.

The quick start's code is not restated here: the fenced blocks the page marks with
``<!-- quickstart-test: ... -->`` are appended to the project's files and run as written, so the
page and this test cannot drift apart. This test follows the page "with your own Redis" (the
suite's server), the path production takes; the embedded server's path has tests of its own. The fresh virtualenv gets exactly the versions of Django,
DRF, django-redis, redis-py and hiredis this test runs under (every matrix cell proves its own
versions), installed without resolving (``--no-deps``, from pip's cache), then ``pip check``
proves the wheel's declared requirements accept them.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import venv
import zipfile
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import ratelimit_app

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "tutorial" / "quickstart.md"
# What a project using the app installs, besides the wheel (with the "drf" extra).
RUNTIME = ["Django", "djangorestframework", "django-redis", "redis", "hiredis"]
# Never copied into the build's source tree: environments, caches, build outputs, local data.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", "build", "dist",
                                    "site", "*.sqlite3", "staticfiles", "screenshots", "results")
MARKER_BLOCK = re.compile(r"<!-- quickstart-test: (?P<marker>[^>]+?) -->\n```\w*\n(?P<code>.*?)```",
                          re.DOTALL)
STEP_TIMEOUT_S = 180


def quickstart_blocks():
    """Return the quick start's marked fenced blocks as ``{marker: code}``."""
    blocks = {m["marker"]: m["code"] for m in MARKER_BLOCK.finditer(QUICKSTART.read_text())}
    assert {"append to mysite/settings.py", "with your own Redis, append to mysite/settings.py",
            "append to mysite/urls.py", "manage.py shell, without DEFAULT_THROTTLE_RATES",
            "response headers"} <= set(blocks), f"quick start markers missing: {sorted(blocks)}"
    return blocks


def run(argv, **kwargs):
    """Run ``argv``; return the CompletedProcess, failing with its output if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, **kwargs)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def build_distributions(tmp_path):
    """Build the sdist and, from it, the wheel (what ``python -m build`` does) out of a copy of
    the repository, so no build output lands in the checkout; return ``(sdist, wheel)``."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    python = sys.executable
    if find_spec("build") is None:  # a matrix cell without the `build` tool: a throwaway one
        # with its own pip, which build then uses for its isolated environments (one ensurepip,
        # not one per environment)
        venv.create(tmp_path / "build-tool", with_pip=True)
        python = str(tmp_path / "build-tool" / "bin" / "python")
        run([python, "-m", "pip", "install", "--quiet", "build"])
    dist = tmp_path / "dist"
    run([python, "-m", "build", "--outdir", str(dist), str(source)])
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return source, sdist, wheel


def assert_wheel_holds_the_package_only(wheel, source):
    names = set(zipfile.ZipFile(wheel).namelist())
    dist_info = f"django_ratelimit_app-{ratelimit_app.__version__}.dist-info/"
    package = {str(p.relative_to(source)) for p in (source / "ratelimit_app").rglob("*")
               if p.is_file()}
    assert {n for n in names if not n.startswith(dist_info)} == package
    for needed in ("ratelimit_app/stores/lua/take.lua", "ratelimit_app/migrations/0001_initial.py",
                   "ratelimit_app/templates/ratelimit_app/dashboard.html",
                   "ratelimit_app/static/ratelimit_app/dashboard.js", dist_info + "licenses/LICENSE"):
        assert needed in names
    fields = zipfile.ZipFile(wheel).read(dist_info + "METADATA").decode()
    assert f"\nVersion: {ratelimit_app.__version__}\n" in fields
    assert "\nLicense-Expression: BSD-3-Clause\n" in fields
    assert "\nRequires-Dist: hiredis>=3.2\n" in fields


def assert_sdist_has_no_test_suite(sdist):
    names = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
    assert {"pyproject.toml", "LICENSE", "CHANGELOG.md", "README.md",
            "ratelimit_app/stores/lua/take.lua"} <= names
    assert not [n for n in names if n.split("/")[0] in ("tests", "project", "bench", "docs")]


def running_versions(names=RUNTIME):
    """Return ``name==version`` pins of ``names`` and everything they require here, as this
    interpreter has them installed (markers evaluated, extras not followed)."""
    pins, pending = {}, list(names)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in pins:
            continue
        dist = metadata.distribution(name)
        pins[name] = f"{name}=={dist.version}"
        for line in dist.requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return sorted(pins.values())


def fresh_virtualenv(path, wheel):
    """Create a virtualenv with the wheel and the running versions; return its bin folder."""
    venv.create(path, with_pip=False)  # this interpreter's pip installs into it (faster)
    python = str(path / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    run([*pip, "install", "--quiet", "--no-deps", str(wheel), *running_versions()])
    run([*pip, "check"])  # the wheel's declared requirements accept the running versions
    return path / "bin"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    """Return ``(status, headers, body)`` of a GET, whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def wait_until_serving(url, process, log_path, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, log_path.read_text()
        try:
            get(url)
            return
        except OSError:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)  # polling a real server with a deadline


def test_the_wheel_in_a_fresh_startproject_follows_the_quickstart(tmp_path, redis_server):
    blocks = quickstart_blocks()
    source, sdist, wheel = build_distributions(tmp_path)
    assert_wheel_holds_the_package_only(wheel, source)
    assert_sdist_has_no_test_suite(sdist)

    bin_dir = fresh_virtualenv(tmp_path / "venv", wheel)
    python = str(bin_dir / "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", REDIS_URL=redis_server.url)
    work = tmp_path / "work"
    work.mkdir()
    installed = run([python, "-c", "import ratelimit_app as r; print(r.__file__, r.__version__)"],
                    cwd=work, env=env).stdout.split()
    assert installed[0].startswith(str(tmp_path / "venv"))  # the wheel's copy, not the checkout
    assert installed[1] == ratelimit_app.__version__

    # the quick start, step by step
    run([str(bin_dir / "django-admin"), "startproject", "mysite"], cwd=work, env=env)
    project = work / "mysite"
    for marker, code in blocks.items():
        if "append to " in marker:
            with open(project / marker.split("append to ", 1)[1], "a") as target:
                target.write("\n" + code)
    migrated = run([python, "manage.py", "migrate"], cwd=project, env=env)
    assert "ratelimit_app: DRF's DEFAULT_THROTTLE_RATES imported as 2 rules (anon, user)" in \
        migrated.stdout
    check = run([python, "-W", "error::DeprecationWarning", "manage.py", "check"],
                cwd=project, env=env)
    assert (check.stdout, check.stderr) == ("System check identified no issues (0 silenced).\n", "")

    def exported():
        export = run([python, "-W", "error::DeprecationWarning", "manage.py", "ratelimit",
                      "export"], cwd=project, env=env)
        assert export.stderr == ""
        quotas = json.loads(export.stdout)
        return [p["slug"] for p in quotas["plans"]], [r["name"] for r in quotas["rules"]]

    assert exported() == (["anonymous", "signed-in"], ["anon", "user"])

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "runserver.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([python, "manage.py", "runserver", "--noreload",
                                   f"127.0.0.1:{port}"], cwd=project, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        wait_until_serving(f"{base}/admin/login/", server, log_path)  # exempt: not charged
        documented_policy = re.search(r"^RateLimit-Policy: (.+)$", blocks["response headers"],
                                      re.MULTILINE)[1]

        status, headers, body = get(f"{base}/api/hello/")  # DRF view: the throttle
        assert (status, json.loads(body)) == (200, {"hello": "api"})
        assert headers["RateLimit-Policy"] == documented_policy
        burst = int(re.search(r";q=(\d+)", documented_policy)[1])
        assert headers["RateLimit"].startswith(f'"anon";r={burst - 1};t=')

        status, headers, _ = get(f"{base}/hello/")  # plain view: the middleware, same bucket
        assert status == 200
        assert headers["RateLimit-Policy"] == documented_policy
        assert headers["RateLimit"].startswith(f'"anon";r={burst - 2};t=')

        statuses = [get(f"{base}/hello/")[0] for _ in range(burst - 2)]
        assert statuses == [200] * (burst - 2)
        status, headers, body = get(f"{base}/hello/")
        assert status == 429
        assert int(headers["Retry-After"]) >= 1
        assert headers["Content-Type"] == "application/problem+json"
        assert json.loads(body)["violated-policies"] == ["anon"]
        status, headers, _ = get(f"{base}/api/hello/")
        assert status == 429 and int(headers["Retry-After"]) >= 1
    finally:
        server.terminate()  # by PID; runserver --noreload is one process
        server.wait(10)
    output = log_path.read_text()
    assert "Traceback" not in output and "unexpected" not in output, output

    # the page's way without DRF's rates: a plan and a rule made in the shell
    run([python, "manage.py", "shell", "-c",
         "from ratelimit_app.models import Plan; Plan.objects.all().delete()"],
        cwd=project, env=env)
    run([python, "manage.py", "shell", "-c",
         blocks["manage.py shell, without DEFAULT_THROTTLE_RATES"]], cwd=project, env=env)
    assert exported() == (["free"], ["free-ip"])
