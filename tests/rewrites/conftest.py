"""Fixtures for the rewrite tests (their strategies and helpers are in ``rewrite_helpers``)."""

import pytest


@pytest.fixture
def symbols():
    from circuits import Symbol

    return {n: Symbol((2,), name=n) for n in "abcuvx"}
