# The README's commands: `make run` (demo) and `make test` (whole suite); `make bench`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: run test bench system-packages clean

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	touch $@

# Debian's redis-server when it is missing (and no REDIS_URL, REDIS_CLUSTER_NODES or
# REDIS_SENTINELS points elsewhere).
system-packages:
	@if [ -z "$$REDIS_URL$$REDIS_CLUSTER_NODES$$REDIS_SENTINELS" ] && \
		! command -v redis-server >/dev/null; then scripts/apt-install.sh redis-server; fi

run: $(VENV)/.installed system-packages
	PORT=$(PORT) PY=$(PY) scripts/run-demo.sh

# The suite starts its own redis-server (single node, Cluster, Sentinel) and drives Debian's
# Chromium: install whichever of them this machine lacks.
test: $(VENV)/.installed
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then scripts/apt-install.sh $$missing; fi
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v wrk >/dev/null || missing="$$missing wrk"; \
	command -v hey >/dev/null || missing="$$missing hey"; \
	if [ -n "$$missing" ]; then scripts/apt-install.sh $$missing; fi
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) db.sqlite3 staticfiles
