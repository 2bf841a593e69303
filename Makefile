# Camp: two commands do all the set-up (README): `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench schema clean

$(STAMP): requirements.txt requirements-dev.txt
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required ($(PYTHON) not found)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

# The demo: SQLite, a filesystem Celery broker, the simulated cluster. Serves :8000.
demo: $(STAMP)
	mkdir -p var
	$(PY) manage.py rundemo

# The whole suite: lint, types, then every test on real PostgreSQL and Redis.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest

unit: $(STAMP)
	$(PY) -m pytest tests/unit

schema: $(STAMP)
	$(PY) manage.py spectacular --file docs/openapi.yaml --validate --fail-on-warn

clean:
	rm -rf var .pytest_cache .mypy_cache
