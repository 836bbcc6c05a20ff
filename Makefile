# Two commands do everything on a fresh machine with Python 3.11+:
#   make demo   — create .venv, install, run the whole flow on built-in stand-ins
#   make test   — create .venv with test extras, then lint, type-check and test
#   make e2e    — build a real control plane from Go modules (.e2e/bin), run tests/e2e against it
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint typecheck pytest e2e e2e-build bench soak mutation venv clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m proxy demo

test: venv lint typecheck pytest

lint: venv
	$(VENV)/bin/ruff format --check proxy standins tests bench tools
	$(VENV)/bin/ruff check proxy standins tests bench tools
	$(VENV)/bin/lint-imports
	@if [ -f Dockerfile ]; then $(VENV)/bin/hadolint Dockerfile; fi

typecheck: venv
	$(VENV)/bin/mypy

pytest: venv
	$(PY) -m pytest

# The real control plane (Go toolchain needed; binaries reused from .e2e/bin or $$KUBEBUILDER_ASSETS).
e2e-build:
	bash e2e/build.sh

e2e: venv e2e-build
	$(PY) -m pytest tests/e2e

bench: venv
	$(PY) bench/passthrough.py
	$(PY) bench/submit.py
	$(PY) bench/polling.py
	$(PY) bench/history.py

soak: venv
	$(PY) bench/soak.py

# Mutation testing (mutmut) of errors, headers, render, the log view and the upstream client.
# Slow: EVERY=10 checks every 10th mutant of the big modules (errors and headers whole).
EVERY ?= 1
mutation: venv
	$(PY) -m pip install --quiet 'mutmut==3.8.1'
	$(PY) tools/mutation.py --every $(EVERY)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
