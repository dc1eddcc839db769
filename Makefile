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

# Debian's redis-server when it is missing (and no REDIS_URL points elsewhere).
system-packages:
	@if [ -z "$$REDIS_URL" ] && ! command -v redis-server >/dev/null; then \
		scripts/apt-install.sh redis-server; fi

run: $(VENV)/.installed system-packages
	PORT=$(PORT) PY=$(PY) scripts/run-demo.sh

test: $(VENV)/.installed
	@command -v redis-server >/dev/null || scripts/apt-install.sh redis-server
	$(PY) -m pytest

bench: $(VENV)/.installed
	@command -v redis-server >/dev/null || scripts/apt-install.sh redis-server
	@command -v wrk >/dev/null || scripts/apt-install.sh wrk
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) db.sqlite3 staticfiles
