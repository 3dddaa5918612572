# polymq: `make run` starts everything in one process; `make test` runs every test.
SHELL  := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
SUM    := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# installed: what running polymq needs (make run); everything the tests, benchmarks and
# checks need too
RUN_STAMP := $(VENV)/.run-$(SUM)
STAMP  := $(VENV)/.installed-$(SUM)

SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
WEB    := services/stomp/web
STOMPJS := $(WEB)/node_modules/@stomp/stompjs/bundles/stomp.umd.min.js
# uPlot, the charts of the core's console (services/core/polymq_core/admin/console.py)
CONSOLEWEB := services/core/web
UPLOT := $(CONSOLEWEB)/node_modules/uplot/dist/uPlot.iife.min.js
AMQPNODE := tests/integration/amqp/node
AMQPLIB := $(AMQPNODE)/node_modules/amqplib/package.json
COMPILED := $(VENV)/.compiled

.PHONY: run test lint typecheck bench install clean chromium rabbitmq compiled

# @stomp/stompjs for the STOMP frontend's browser page: from npm, served locally (no CDN)
$(STOMPJS): $(WEB)/package.json $(WEB)/package-lock.json
	cd $(WEB) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# uPlot for the core's console: from npm, served locally by the admin port (no CDN)
$(UPLOT): $(CONSOLEWEB)/package.json $(CONSOLEWEB)/package-lock.json
	cd $(CONSOLEWEB) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# amqplib for the AMQP frontend's Node test (tests/integration/amqp/test_amqplib.py)
$(AMQPLIB): $(AMQPNODE)/package.json $(AMQPNODE)/package-lock.json
	cd $(AMQPNODE) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# Debian's chromium for the browser tests (Playwright drives it; it never downloads one)
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

# make run installs polymq and its runtime dependencies only (no PySpark, Playwright, Helm
# SDK...); make test / bench / lint add every extra
$(RUN_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[fast,compile]'
	@rm -f $(VENV)/.run-*
	@touch $@

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,dev,fast,compile,cluster,spark]'
	@rm -f $(VENV)/.installed-* $(VENV)/.run-*
	@touch $@ $(RUN_STAMP)

install: $(STAMP) $(STOMPJS) $(UPLOT) $(AMQPLIB) $(COMPILED)

# The STOMP codec compiled with mypyc (polymq_stomp/compiled.py): built again whenever its
# sources change, used only while it matches them; without mypyc or a C compiler polymq runs
# the pure-Python codec (the build says so and make goes on).
compiled: $(COMPILED)
$(COMPILED): $(RUN_STAMP) $(addprefix services/stomp/polymq_stomp/,codec.py frames.py compiled.py)
	@command -v cc >/dev/null || command -v gcc >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq gcc libc6-dev >/dev/null; } || true
	-$(PY) -m polymq_stomp.compiled
	@touch $@

## make run: install what is missing, then start polymq (core + frontends) on its embedded store
# One process, whatever the machine (polymq run's own default, --workers auto, uses every
# CPU allowed on more than two): POLYMQ_WORKERS=N make run serves STOMP and AMQP in N (docs/workers.md)
run: $(RUN_STAMP) $(STOMPJS) $(UPLOT) $(COMPILED)
	$(VENV)/bin/polymq run --workers $${POLYMQ_WORKERS:-1} --data-dir $${POLYMQ_DATA_DIR:-./polymq-data}

## make test: install what the tests need, then run them all (lint and types first).
# Two pytest processes side by side: the cluster tests and the bench's smoke runs (real nodes,
# mostly waiting on elections, timeouts and starts) beside all the others; each with its own
# temporary directory, the second one's report printed after the first's. Fails if either does.
PYTEST := $(PY) -m pytest -q -rs --durations=25
BESIDE := tests/cluster tests/bench
test: $(STAMP) $(STOMPJS) $(UPLOT) $(AMQPLIB) $(COMPILED) chromium lint typecheck
	@tmp=$$(mktemp -d); \
	$(PYTEST) --basetemp=$$tmp/beside $(BESIDE) > $$tmp/beside.log 2>&1 & beside=$$!; \
	$(PYTEST) --basetemp=$$tmp/rest $(addprefix --ignore=,$(BESIDE)); rest=$$?; \
	wait $$beside; status=$$?; \
	echo "==== $(BESIDE), run beside the above ===="; cat $$tmp/beside.log; rm -rf $$tmp; \
	test $$rest -eq 0 && test $$status -eq 0

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## make bench: the benchmark scenarios; results in bench-results.json
# RabbitMQ is the yardstick for the STOMP scenarios: installed when none is listening (the
# bench enables its STOMP plugins itself, and records the RabbitMQ side as skipped if it can't).
rabbitmq:
	@(exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null || command -v rabbitmq-server >/dev/null || \
		{ $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		  $(SUDO) apt-get install -y -qq rabbitmq-server >/dev/null; } || \
		echo "bench: could not install rabbitmq-server; its side will be skipped"

bench: $(STAMP) $(STOMPJS) $(COMPILED) rabbitmq
	$(PY) -m bench --settle 15 --out bench-results.json

clean:
	rm -rf $(VENV) $(WEB)/node_modules $(CONSOLEWEB)/node_modules $(AMQPNODE)/node_modules polymq-data bench-results.json .pytest_cache .mypy_cache .ruff_cache \
		services/stomp/polymq_stomp/_codec_compiled*.so
