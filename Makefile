# polymq: `make run` starts everything in one process; `make test` runs every test.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test lint typecheck bench install clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,dev,fast]'
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

## make run: install what is missing, then start polymq (core + frontends) on its embedded store
run: $(STAMP)
	$(VENV)/bin/polymq run --data-dir $${POLYMQ_DATA_DIR:-./polymq-data}

## make test: install what the tests need, then run them all (lint and types first)
test: $(STAMP) lint typecheck
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## make bench: the benchmark scenarios; results in bench-results.json
bench: $(STAMP)
	$(PY) -m bench --out bench-results.json

clean:
	rm -rf $(VENV) polymq-data bench-results.json .pytest_cache .mypy_cache .ruff_cache
