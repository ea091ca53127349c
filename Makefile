# `make demo` and `make test` work on a fresh machine with only Python 3.11 and pip.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CORE   := $(VENV)/.core
JOBS   ?= 2

.PHONY: demo test test-slow test-tiers test-all bench clean venv system-deps lint docs notebooks device-wheels

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

# The wheels a GPU machine lent through the device tool lacks (its image has jax, torch,
# transformers, numpy, ...; it has no network), for its Python 3.12 on x86-64, into .whl/ (ignored):
# carry .whl and start the command with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# then `python3 -m benchmarks.device_check` (which names, in one line, anything still missing).
DEVICE_WHEELS ?= blake3 platformdirs
device-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(DEVICE_WHEELS)
	ls .whl
