"""One top-up sent by several processes at once (a billing system's retries landing on several
workers) is credited once: separate processes on one database (an SQLite file, or PostgreSQL in
that cell: the ``database_env`` fixture), each calling ``ledger.top_up`` with the same id for an
account none of them has seen, released together."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ratelimit_app.decision.balances import BalanceState, account_key

ROOT = Path(__file__).resolve().parents[3]
PROCESSES = 4

TOP_UP = """
import django
django.setup()
import os, sys, time
from ratelimit_app.business.credits.ledger import client_of, top_up
from ratelimit_app.runtime.limiter import default_limiter
client = client_of(default_limiter().store)
print("ready", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]):  # released together
    assert time.monotonic() < deadline, "never released"
    time.sleep(0.001)
made, created = top_up("tenant:acme", 250, "inv-race", actor="worker", client=client)
print(created, flush=True)
"""

READ = """
import django
django.setup()
import json
from ratelimit_app.models import CreditAccount, CreditTopUp
print(json.dumps([list(CreditAccount.objects.values_list("ref", "granted")),
                  CreditTopUp.objects.count()]))
"""


def python(env, *args):
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.django_db  # (the rows live in the processes' own database)
def test_processes_sending_one_top_up_at_once_credit_it_once(tmp_path, redis_server,
                                                             redis_client, database_env):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings",
           **database_env(tmp_path), "REDIS_URL": redis_server.url}
    python(env, "manage.py", "migrate", "--verbosity", "0")
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", TOP_UP, str(go)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(PROCESSES)]
    try:
        for racer in racers:
            assert racer.stdout.readline().strip() == "ready", racer.stderr.read()
        go.touch()
        outputs = []
        for racer in racers:
            out, err = racer.communicate(timeout=120)
            assert racer.returncode == 0, err
            outputs.append(out.strip())
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
                racer.wait()
    assert sorted(outputs) == ["False"] * (PROCESSES - 1) + ["True"]
    assert json.loads(python(env, "-c", READ)) == [[["tenant:acme", 250]], 1]
    stored = BalanceState.unpack(redis_client.get(account_key("rl", "tenant:acme")))
    assert stored == BalanceState(250, 0, 0, 0, 0)
