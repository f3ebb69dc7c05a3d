# The README's two commands: `make demo` and `make test`. Both create the virtual environment
# and install everything they need, so they work from a fresh clone on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint format clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first, so nothing below pulls the CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# SGLang's wheel only for its /generate schema (sglang/api/v1/api_types.py, needs msgspec).
	$(PY) -m pip install -q --no-deps sglang==0.5.23
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo.run

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
