# Two entry points: `make demo` (the main job on the embedded default) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Type-checked strictly: the whole package.
CORE := src/srtm

.PHONY: demo test lint typecheck browser bench clean
# The console's browser test drives Debian's headless Chromium through its chromedriver.
CHROMIUM := /usr/bin/chromium
CHROMEDRIVER := /usr/bin/chromedriver
# The etcd store's tests start a real etcd member: Debian's etcd-server.
ETCD := /usr/bin/etcd
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.bench-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

demo: $(VENV)/.test-installed
	$(BIN)/srtm demo

lint: $(VENV)/.test-installed
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(VENV)/.test-installed
	$(BIN)/mypy $(CORE)

# Two workers, each taking whole files (fixtures and fixed ports stay within a file).
test: lint typecheck browser $(ETCD)
	$(BIN)/pytest -n 2 --dist loadfile

# Installed only when missing (a file target without prerequisites): quiet, idempotent.
browser: $(CHROMIUM) $(CHROMEDRIVER)

$(CHROMIUM) $(CHROMEDRIVER) &:
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null

$(ETCD):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq etcd-server >/dev/null

bench: $(VENV)/.bench-installed
	$(BIN)/python benchmarks/ratelimit.py
	$(BIN)/python benchmarks/broker.py
	$(BIN)/python benchmarks/workload.py
	$(BIN)/python benchmarks/sim.py
	$(BIN)/python benchmarks/pipeline.py
	$(BIN)/python benchmarks/loop_lag.py
	$(BIN)/python benchmarks/churn.py
	$(BIN)/python benchmarks/stats_doc.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis out
