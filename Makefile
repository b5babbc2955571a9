# `make train` and `make test` set everything up on first use (a .venv beside this file).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: train test test-fast lint clean

train: $(VENV)/.installed
	$(PY) train.py $(ARGS)

# Two pytest-xdist workers, a test module each at a time: a module's shared runs (and test_slurm's one
# Slurm) stay in one worker, and the other fills the core that one run's start-up and waits leave idle.
# The modules go longest first (tests/conftest.py), not by their number of tests.
test: lint
	$(PY) -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder $(ARGS)

# The inner loop: config, schema, bad input that fails before TensorFlow, clusters' mapping, data,
# summaries and plots; no training (tests marked slow).
test-fast: lint
	$(PY) -m pytest -q -n 2 -m "not slow" $(ARGS)

# ruff, with the settings in pyproject.toml: every Python file of the checkout.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $@

clean:
	rm -rf $(VENV) outputs multirun
