# Developer shortcuts; each target is a thin wrapper over a script or the venv's tools.
VENV      ?= .venv
LISTEN    ?= 127.0.0.1:3000
STATE_DIR ?= /var/lib/warren

.PHONY: setup serve test lint bench

setup:  ## Debian packages, .venv, warren setup (agent bundle + built-in templates); needs root
	scripts/setup.sh

serve:  ## run a node in the foreground; needs root
	$(VENV)/bin/warren serve --listen $(LISTEN) --state-dir $(STATE_DIR)

test:  ## what CI runs: setup, ruff, mypy --strict, lint-imports, pytest
	scripts/test.sh

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict warren
	$(VENV)/bin/lint-imports --no-cache

bench:  ## measure a real node; writes bench/report.json (with the shared node's phase profile)
	$(VENV)/bin/python -m bench --profile --out bench/report.json
