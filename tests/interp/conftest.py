"""The interpretability tests in each tier (issue 20): the modules in ``CROSS_TIER`` run twice in
the default suite, once with every ``mode='auto'`` call pinned op by op and once pinned to whole
programs (``circuits.backend.tiers.pinned``); ``CIRCUITS_ALL_TIERS=1`` (``make test-tiers``) runs
every module of this folder so (but tests marked ``unpinned``: tests of what ``'auto'``
chooses)."""

from __future__ import annotations

import os

import pytest

from circuits.backend import tiers

CROSS_TIER = {"test_interventions", "test_attribution"}


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if metafunc.definition.get_closest_marker("unpinned") is not None:
        return  # a test of what 'auto' chooses
    if module in CROSS_TIER or os.environ.get("CIRCUITS_ALL_TIERS"):
        metafunc.parametrize("pinned_tier", ["eager", "jit"], indirect=True)


@pytest.fixture(autouse=True)
def pinned_tier(request):
    mode = getattr(request, "param", None)
    if mode is None:
        yield None
        return
    with tiers.pinned(mode):
        yield mode
