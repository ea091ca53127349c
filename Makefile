# `make demo` and `make test` work on a fresh machine with only Python 3.11 and pip.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CORE   := $(VENV)/.core
JOBS   ?= 2

.PHONY: demo test test-slow test-tiers test-all bench clean venv system-deps lint docs notebooks

# The core dependencies alone (what `make demo` needs: jax, numpy, ...); the test extras on top.
$(CORE): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(CORE)

$(STAMP): $(CORE)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Headless Chromium for the notebook view's browser test: installed with apt where we are root, so
# that a fresh machine (and CI) runs that test instead of skipping it.
system-deps:
	@if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium with apt-get (for the notebook view's browser test)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "chromium is missing and cannot be installed here (not root): the browser test will skip"; \
	  fi; \
	fi

demo: $(CORE)
	$(PY) examples/demo.py

test: $(STAMP) system-deps
	$(VENV)/bin/ruff check circuits rewrites tests benchmarks examples docs notebooks/execute.py
	$(PY) -m pytest -n $(JOBS) -rs -m "not slow" --doctest-modules circuits rewrites tests

lint: $(STAMP)
	$(VENV)/bin/ruff check circuits rewrites tests benchmarks examples docs notebooks/execute.py

test-slow: $(STAMP) system-deps
	$(PY) -m pytest -n $(JOBS) -rs -m slow tests

# Every interpretability test in each tier (op by op, whole programs).
test-tiers: $(STAMP)
	CIRCUITS_ALL_TIERS=1 $(PY) -m pytest -n $(JOBS) -rs -m "not slow" tests/interp

test-all: $(STAMP) system-deps
	$(PY) -m pytest -n $(JOBS) -rs --doctest-modules circuits rewrites tests

# Run every notebook headless and keep its outputs (tests/test_notebooks.py compares against them).
notebooks: $(STAMP)
	$(PY) notebooks/execute.py

# The documentation site, into site/ (strict: a broken link fails; the build fetches nothing).
docs: $(CORE)
	$(PY) -m pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build site *.egg-info
