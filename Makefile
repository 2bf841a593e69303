# Camp: two commands do all the set-up (README): `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# The demo's install set (requirements.txt: wheels only, no compiler, no apt package) and the
# suite's (requirements-dev.txt: adds the LDAP extra and the test tools).
DEMO_STAMP := $(VENV)/.installed-demo
STAMP      := $(VENV)/.installed

.PHONY: demo test test-deps lint typecheck unit bench schema clean e2e-deps

$(VENV)/bin/python:
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required ($(PYTHON) not found)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(DEMO_STAMP): requirements.txt | $(VENV)/bin/python
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# The suite's venv: the machine's test dependencies first (python-ldap compiles against them).
$(STAMP): requirements.txt requirements-ldap.txt requirements-dev.txt | $(VENV)/bin/python
	PYTHON=$(PYTHON) tools/test-deps.sh
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@ $(DEMO_STAMP)

# The demo: SQLite, a filesystem Celery broker, the simulated cluster. Serves :8000.
demo: $(DEMO_STAMP)
	mkdir -p var
	DEBUG=$${DEBUG:-false} $(PY) manage.py rundemo

# What the suite needs from the machine (installed when run as root; listed otherwise).
test-deps:
	PYTHON=$(PYTHON) tools/test-deps.sh

# Browser-test helpers from the npm registry, pinned by tests/e2e/package-lock.json (axe-core
# for the accessibility scan). Without npm or the registry the scan skips and says why.
AXE := tests/e2e/node_modules/axe-core/axe.min.js
$(AXE): tests/e2e/package.json tests/e2e/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix tests/e2e --no-audit --no-fund --loglevel=error || echo "npm ci failed: the accessibility scan will skip"; else echo "npm not found: the accessibility scan will skip"; fi
e2e-deps: $(AXE)

# The whole suite: lint, types, then every test on real PostgreSQL and Redis.
test: test-deps $(STAMP) e2e-deps
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest

unit: $(STAMP)
	$(PY) -m pytest tests/unit

# With PostgreSQL's column bounds (what production serves; SQLite's integers are wider).
schema: $(STAMP)
	DJANGO_SETTINGS_MODULE=camp.settings.test $(PY) manage.py spectacular --file docs/openapi.yaml --validate --fail-on-warn

clean:
	rm -rf var .pytest_cache .mypy_cache
