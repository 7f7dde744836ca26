# The two quick-start commands: `make demo` and `make test`. Both set up .venv first
# (only when pyproject.toml changed since), so both work on a fresh clone and re-run fast.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# `make demo ARGS=--postgres`: results and Dagster's storage in the local PostgreSQL.
demo: $(STAMP)
	$(BIN)/backlog-dagster demo $(ARGS)

test: lint
	$(BIN)/pytest -n 2

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/run.py
