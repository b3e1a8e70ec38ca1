# specmarket: `make demo` sets everything up and runs the demo; `make test` sets up and runs all tests.
# Both are idempotent: the virtual environment is (re)built only when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# the CPU build of torch first: unpinned, pip would resolve a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/specmarket demo

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python scripts/bench_local.py
	$(BIN)/python scripts/bench_p2p.py

clean:
	rm -rf $(VENV) .pytest_cache demo_out bench_out
