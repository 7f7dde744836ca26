# The two quick-start commands: `make demo` and `make test`. Both set up .venv first
# (only when pyproject.toml changed since), so both work on a fresh clone and re-run fast.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench browser

# The class-data archive local Spark drivers start from (about a third less CPU a start).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(BIN)/backlog-dagster spark class-archive
	touch $(STAMP)

# `make demo ARGS=--postgres`: results and Dagster's storage in the local PostgreSQL.
demo: $(STAMP)
	$(BIN)/backlog-dagster demo $(ARGS)

test: lint browser
	$(BIN)/pytest -n 2

# The UI test's headless browser: Debian's chromium and its driver (never a download).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver || \
	   (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/run.py
