# The README's two commands: `make demo` and `make test`. Both create the virtual environment
# and install everything they need, so they work from a fresh clone on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install agents demo demo-lora test test-fast lint typecheck format clean

$(STAMP): pyproject.toml Makefile
	# Chromium for the viewer's browser tests comes from the distribution (never a browser
	# download): installed here when it is missing and we are root, as CI is on a fresh clone.
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -q && apt-get install -y -q chromium; }
	@command -v chromium >/dev/null || echo "warning: no chromium; as root: apt-get install chromium (viewer browser tests)"
	# bubblewrap confines the harness's local sandboxes (docs/harness.md); without it they run unconfined.
	@command -v bwrap >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -q && apt-get install -y -q bubblewrap; }
	@command -v bwrap >/dev/null || echo "warning: no bwrap; as root: apt-get install bubblewrap (harness sandboxes)"
	# docker.io's daemon runs the harness's docker sandboxes (and their tests, which start their own).
	@command -v dockerd >/dev/null || [ "$$(id -u)" != 0 ] || { apt-get update -q && apt-get install -y -q docker.io; }
	@command -v dockerd >/dev/null || echo "warning: no dockerd; as root: apt-get install docker.io (docker sandboxes)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so nothing below pulls the CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# SGLang's wheel only for its /generate schema (sglang/api/v1/api_types.py, needs msgspec).
	$(PY) -m pip install -q --no-deps sglang==0.5.23
	# GEM's environments (docs/environments.md) the same way: gem-llm pins msgspec 0.19.0 and
	# reasoning-gym 0.1.23 against ours, yet runs with ours; what else it imports (nltk,
	# math-verify, reasoning-gym) comes with slimeish and its [textarena] / [reasoning-gym] extras.
	$(PY) -m pip install -q --no-deps gem-llm==0.1.0
	touch $(STAMP)

install: $(STAMP)

# The agent programs tests/programs runs (Codex CLI, Claude Code, Gemini CLI, opencode), pinned by
# tests/programs/package-lock.json and installed into a git-ignored cache, never globally. Each ships
# its native binary as an optional per-platform package; install scripts are not run, except Claude
# Code's and opencode's, which only link that binary into place (they download nothing).
# `npm install` over the committed lock, not `npm ci`: the lock holds only the platform packages the
# registry served when it was made, and `npm ci` refuses a lock without every platform's entry.
AGENTS := .cache/agents
$(AGENTS)/.installed: tests/programs/package.json tests/programs/package-lock.json
	mkdir -p $(AGENTS)
	cp tests/programs/package.json tests/programs/package-lock.json $(AGENTS)/
	cd $(AGENTS) && npm install --ignore-scripts --no-audit --no-fund --loglevel=error
	cd $(AGENTS) && node node_modules/@anthropic-ai/claude-code/install.cjs
	cd $(AGENTS)/node_modules/opencode-ai && node postinstall.mjs
	touch $@

agents: $(AGENTS)/.installed

demo: $(STAMP)
	$(PY) -m examples.demo.run

# The same demo with LoRA (examples/demo/README.md, "With LoRA"): rank 16 of the tiny model's
# width 64 on all four projections, alpha 32, and ~7x full fine-tuning's learning rate, as
# LoRA usually needs (B starts at zero, so the first steps are gentle).
demo-lora: $(STAMP)
	$(PY) -m examples.demo.run --run-dir runs/demo-lora --lora-rank 16 --lora-alpha 32 --lr 1e-2 --min-lr 1e-3

# The slowest tests are listed at the end: the suite's wall time is what CI is limited by.
test: lint typecheck agents
	$(PY) -m pytest -q --durations=25

# The tier without end-to-end runs and GPU tests: a minute or two.
test-fast: lint typecheck
	$(PY) -m pytest -q -m "not slow and not gpu"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy names modules after their paths, so it sees the installed names through a tree of links
# that mirrors pyproject's package-dir mapping (router/ is slimeish.router, ...).
MAPPED := router buffer rollout_functions
# Packages held to `mypy --strict` as well (the rest stays on pyproject's mode); the modules they
# import are read, but only these packages' own errors count.
STRICT := slimeish.router slimeish.buffer
TYPES := build/typecheck
typecheck: $(STAMP)
	rm -rf $(TYPES) && mkdir -p $(TYPES)/slimeish
	@ln -s $(foreach f,$(wildcard slimeish/*),$(CURDIR)/$(f)) $(TYPES)/slimeish/
	@$(foreach d,$(MAPPED),ln -s $(CURDIR)/$(d) $(TYPES)/slimeish/$(d) &&) true
	cd $(TYPES) && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/.mypy_cache -p slimeish
	cd $(TYPES) && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/.mypy_cache/strict \
		--strict --follow-imports=silent $(foreach p,$(STRICT),-p $(p))

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) runs build .pytest_cache .ruff_cache .mypy_cache
