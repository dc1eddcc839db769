"""The suite's database switch (tests/databases.py): SQLite by default, a private PostgreSQL in
the matrix's current cell, and an empty database of its own for each subprocess a test starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests.databases import PostgresServer, SqliteDatabases, databases_from_env, postgres_bin_dir

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ASKED_FOR = os.environ.get("RATELIMIT_TEST_DATABASE", "sqlite")
on_postgresql = pytest.mark.skipif(ASKED_FOR != "postgresql",
                                   reason="PostgreSQL cell only (make test-current)")

# What a subprocess started with database_env's variables is connected to.
REPORT = """
import json
import django
django.setup()
from django.db import connection
print(json.dumps({"vendor": connection.vendor, "tables": connection.introspection.table_names()}))
"""


@pytest.mark.django_db
def test_the_suite_runs_on_the_database_it_was_asked_for():
    assert connection.vendor == ASKED_FOR
    assert connection.introspection.table_names()  # migrated


def subprocess_report(env):
    done = subprocess.run([sys.executable, "-c", REPORT], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_subprocess_gets_an_empty_database_of_its_own(database_env, tmp_path):
    first, second = database_env(tmp_path / "one"), database_env(tmp_path / "two")
    assert first != second
    (tmp_path / "one").mkdir()
    report = subprocess_report(first)
    assert report == {"vendor": ASKED_FOR, "tables": []}


def test_an_unknown_database_kind_is_refused():
    with pytest.raises(ValueError, match="RATELIMIT_TEST_DATABASE='mysql'"):
        databases_from_env({"RATELIMIT_TEST_DATABASE": "mysql"})
    assert isinstance(databases_from_env({}), SqliteDatabases)


def test_the_newest_postgresql_major_is_chosen_numerically(tmp_path):
    for major in ("9", "15", "16-beta"):
        (tmp_path / major / "bin").mkdir(parents=True)
    (tmp_path / "15" / "bin" / "postgres").touch()
    (tmp_path / "9" / "bin" / "postgres").touch()
    assert postgres_bin_dir(str(tmp_path)) == str(tmp_path / "15" / "bin")
    with pytest.raises(RuntimeError, match="install Debian's postgresql package"):
        postgres_bin_dir(str(tmp_path / "none"))


@on_postgresql
def test_a_postgres_server_starts_on_loopback_and_stops_by_pid():
    server = PostgresServer().start()
    try:
        assert server.running
        database = server.create_database("scratch")
        report = subprocess_report({"POSTGRES_DB": database, "POSTGRES_HOST": "127.0.0.1",
                                    "POSTGRES_PORT": str(server.port)})
        assert report == {"vendor": "postgresql", "tables": []}
    finally:
        server.stop()
    assert not server.running and not os.path.exists(server.workdir)
