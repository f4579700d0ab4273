# Two entry points for a newcomer: `make demo` and `make test` (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Tests always run against the real services of the machine (never SQLite / fakes).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/outlier_admin
TEST_REDIS_URL    ?= redis://127.0.0.1:6379/0

.PHONY: install services system-packages test lint demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	bash scripts/ensure-services.sh

system-packages:
	bash scripts/ensure-system-packages.sh

test: install services system-packages
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/ruff check .
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest

lint: install
	$(BIN)/ruff check .

demo: install
	$(BIN)/python -m outlier_admin.demo

bench: install
	$(BIN)/python -m detector.bench --out reports/bench-detector.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis reports
