"""Shared test configuration: hypothesis settings profiles.

- ``default``: modest ``max_examples`` for the everyday suite on a small machine, no deadline
  (JAX compiles on first use, which makes per-example timings meaningless).
- ``ci``: the same examples every run (derandomized), so CI is reproducible; chosen
  automatically when the ``CI`` environment variable is set.
- ``thorough``: many examples, for a long local run.

Pick one with ``HYPOTHESIS_PROFILE=ci pytest ...``.
"""

import os

from hypothesis import HealthCheck, settings

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile("default", max_examples=40, deadline=None, suppress_health_check=_QUIET)
settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=_QUIET,
)
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))
