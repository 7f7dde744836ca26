# The two quick-start commands: `make demo` and `make test`. Both set up .venv first
# (only when pyproject.toml changed since), so both work on a fresh clone and re-run fast.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARCHIVE := $(VENV)/.class-archive
READER := $(VENV)/.log-reader
# Independent steps run side by side: the linters beside the class-data archive (each
# about a core for most of a minute), the browser's install beside the packages'.
MAKEFLAGS += --jobs=2

.PHONY: demo test lint bench browser

# uv installs the same versions pip resolves in half pip's time (it fetches and
# byte-compiles in parallel). Compiled here, not at first import: where
# PYTHONDONTWRITEBYTECODE is set (this machine sets it) every process compiles all it imports.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]'
	touch $(STAMP)

# The log's reader inside Spark's JVM (backlog_dagster/log/jvm_reader.py): Debian's SQLite
# JDBC driver, then javac against PySpark's jars (a few seconds).
$(READER): $(STAMP) backlog_dagster/log/jvm/LogRangeSource.java
	@test -f /usr/share/java/sqlite-jdbc.jar || \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q libxerial-sqlite-jdbc-java || \
	   (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libxerial-sqlite-jdbc-java))
	$(BIN)/backlog-dagster spark log-reader
	touch $(READER)

# The class-data archive local Spark drivers start from (about a third less CPU a start).
$(ARCHIVE): $(READER)
	$(BIN)/backlog-dagster spark class-archive
	touch $(ARCHIVE)

# `make demo ARGS=--postgres`: results and Dagster's storage in the local PostgreSQL.
demo: $(ARCHIVE)
	$(BIN)/backlog-dagster demo $(ARGS)

test: lint browser $(ARCHIVE)
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

bench: $(ARCHIVE)
	$(BIN)/python bench/run.py
