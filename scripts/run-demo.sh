#!/usr/bin/env bash
# The demo: a private redis-server (unless REDIS_URL is set), SQLite migrated, demo data loaded,
# the development server on 127.0.0.1:$PORT. Ctrl-C stops the server and the private Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${PORT:-8000}

if [ -z "${REDIS_URL:-}" ]; then
  REDIS_PORT=${REDIS_PORT:-$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
  REDIS_DIR=$(mktemp -d)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$REDIS_DIR" --loglevel warning &
  REDIS_PID=$!
  trap 'kill $REDIS_PID 2>/dev/null; rm -rf "$REDIS_DIR"' EXIT
  export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
  for _ in $(seq 100); do
    $PY -c "import redis,sys; redis.Redis.from_url('$REDIS_URL').ping()" 2>/dev/null && break
    sleep 0.1
  done
  echo "Private redis-server (pid $REDIS_PID) at $REDIS_URL"
else
  echo "Using REDIS_URL=$REDIS_URL"
fi

$PY manage.py migrate --noinput -v0
$PY manage.py load_demo | sed "s/PORT/$PORT/"
cat <<MSG

Try it (about 40 quick anonymous requests reach 429):
  for i in \$(seq 50); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:$PORT/api/items/; done; echo
  curl -si http://127.0.0.1:$PORT/api/items/
  curl -si -H 'X-Api-Key: rk_demo_bob_pro' http://127.0.0.1:$PORT/api/search/

MSG
$PY manage.py runserver "127.0.0.1:$PORT" --noreload
