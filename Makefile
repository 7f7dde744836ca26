# The two quick-start commands: `make demo` and `make test`. Both set up .venv first
# (only when pyproject.toml changed since), so both work on a fresh clone and re-run fast.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The oldest and the newest Python the package supports (tests/pythons.py): the unit
# tests run on each in a virtualenv of its own, the full suite on .venv's.
OLDEST := 3.10
NEWEST := 3.13
# Independent steps run side by side: the linters beside the unit tests on the other
# Pythons, the browser's install beside the packages'.
MAKEFLAGS += --jobs=2

.PHONY: demo test lint bench browser unit-oldest unit-newest

# uv installs the same versions pip resolves in half pip's time (it fetches and
# byte-compiles in parallel). Compiled here, not at first import: where
# PYTHONDONTWRITEBYTECODE is set (this machine sets it) every process compiles all it imports.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]'
	touch $(STAMP)

# A virtualenv per other Python, for its unit tests: .venv-3.10, .venv-3.13.
.venv-%/.installed: pyproject.toml $(STAMP)
	$(BIN)/uv venv --quiet --python "$$($(BIN)/python tests/pythons.py $*)" .venv-$*
	$(BIN)/uv pip install --quiet --compile-bytecode --python .venv-$*/bin/python -e '.[dev]'
	touch $@

# `make demo ARGS=--postgres`: results and Dagster's storage in the local PostgreSQL.
demo: $(STAMP)
	$(BIN)/backlog-dagster demo $(ARGS)

# The unit tests have run on the oldest and the newest Python by then: the suite on
# .venv's Python, which lies between them, leaves them out.
test: lint browser unit-oldest unit-newest
	$(BIN)/pytest -n 2 -m "not unit"

# One process each: make runs the two side by side.
unit-oldest: .venv-$(OLDEST)/.installed
	.venv-$(OLDEST)/bin/pytest -q -m unit -p no:cacheprovider

unit-newest: .venv-$(NEWEST)/.installed
	.venv-$(NEWEST)/bin/pytest -q -m unit -p no:cacheprovider

# The UI test's headless browser: Debian's chromium and its driver (never a download).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver || \
	   (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/run.py
