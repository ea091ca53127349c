"""Fixtures for the rewrite tests (strategies and helpers: ``rewrite_helpers``)."""

import sys
from pathlib import Path

import pytest

# The helpers module sits next to the tests (this directory is not a package, so that it does not
# shadow the ``rewrites`` package).
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def symbols():
    from circuits import Symbol

    return {n: Symbol((2,), name=n) for n in "abcuvx"}
