"""The interpretability tests in each tier (issue 20), under the settings a user gets: the
modules in ``CROSS_TIER`` run twice in the default suite, once with every ``mode='auto'`` call
pinned op by op and once pinned to whole programs (``circuits.backend.tiers.pinned``);
``CIRCUITS_ALL_TIERS=1`` (``make test-tiers``) runs every module of this folder so (but tests
marked ``unpinned``: tests of what ``'auto'`` chooses).  Every other test runs in ``'auto'`` with
the tier settings a user gets (``tiers.Settings()``: cold start and fused groups on; the rest of
the suite switches them off, ``tests/conftest.py``)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from circuits.backend import tiers

CROSS_TIER = {"test_interventions", "test_attribution"}


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if metafunc.definition.get_closest_marker("unpinned") is not None:
        return  # a test of what 'auto' chooses
    if module in CROSS_TIER or os.environ.get("CIRCUITS_ALL_TIERS"):
        metafunc.parametrize("pinned_tier", ["ops", "jit"], indirect=True)


@pytest.fixture(autouse=True)
def pinned_tier(request):
    mode = getattr(request, "param", None)
    if mode is None:
        with tiers.configure(**USER_SETTINGS):
            yield None
        return
    with tiers.pinned(mode):
        yield mode


USER_SETTINGS = {f.name: getattr(tiers.Settings(), f.name) for f in dataclasses.fields(tiers.Settings)}
