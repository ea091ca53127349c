"""Shared test configuration: hypothesis settings profiles, and the deep-circuit fixtures.

- ``default``: modest ``max_examples`` for the everyday suite on a small machine, no deadline
  (JAX compiles on first use, which makes per-example timings meaningless).
- ``ci``: the same examples every run (derandomized), so CI is reproducible; chosen
  automatically when the ``CI`` environment variable is set.
- ``thorough``: many examples, for a long local run.

Pick one with ``HYPOTHESIS_PROFILE=ci pytest ...``.

Deep circuits: ``deep_chain`` is the 50,000-deep chain of ``tests/deep.py`` (built once per
session; its recipe and numpy value are there), and ``low_recursion_limit`` runs a test with
Python's recursion limit at ``RECURSION_HEADROOM`` frames above the test's own stack, so that any
walk that recurses once per level of a deep circuit fails loudly instead of passing by luck.
"""

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from circuits.backend import tiers
from circuits.backend.cache.background import wait_for_background
from tests.deep import build_deep_chain

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile("default", max_examples=40, deadline=None, suppress_health_check=_QUIET)
settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=_QUIET,
)
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

# A process's first evaluation is special (cold start): no test should depend on being the first
# in its worker; tests/backend/test_persistent.py tests it in fresh processes.  Fused groups
# compile in the background (circuits.backend.tiers.groups): off, so that no test's counts see another's
# compilation land; tests/backend/test_groups.py turns them on, and the interpretability tests run
# with the settings a user gets (tests/interp/conftest.py).
tiers.configure(cold_start=False, groups=False)


@pytest.fixture(autouse=True)
def _background_compilations_end_with_their_test():
    """A whole-program compilation that 'auto' starts in the background ends within the test that
    started it, so no other test's count of compilations sees it land."""
    yield
    wait_for_background()


# Enough for pytest, JAX tracing, sympy and the library's own (bounded) call depth; a recursion
# over a 50,000-deep chain needs 50,000 frames.
RECURSION_HEADROOM = 250


@pytest.fixture(scope="session")
def deep_chain():
    """``tests.deep.build_deep_chain()``: 50,000 levels of tanh / named Add / identity Einsum."""
    return build_deep_chain()


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


@pytest.fixture
def low_recursion_limit():
    """Python's recursion limit lowered to ``RECURSION_HEADROOM`` frames above the current stack
    for the duration of the test (restored afterwards)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + RECURSION_HEADROOM)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)
