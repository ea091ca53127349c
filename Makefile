# `make demo` and `make test` work on a fresh machine with only Python 3.11 and pip.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: demo test test-slow test-all bench clean venv

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) -m "not slow" --doctest-modules circuits rewrites tests

test-slow: $(STAMP)
	$(PY) -m pytest -n $(JOBS) -m slow tests

test-all: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --doctest-modules circuits rewrites tests

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
