"""The first ``manage.py check`` a project runs says nothing: whatever releases pip resolved
(the newest cell of ``make test-matrix`` installs the newest of every dependency, nothing
pinned), no warning unless a release is known not to work (``support.KNOWN_BAD``)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_manage_py_check_is_quiet_with_the_installed_releases(redis_server, database_env,
                                                               tmp_path):
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-W",
         "error::PendingDeprecationWarning", "manage.py", "check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, **database_env(tmp_path), "REDIS_URL": redis_server.url})
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "System check identified no issues (0 silenced).\n", "")
