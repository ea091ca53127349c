"""Identity rules: an Index selecting everything, a Concat of one child."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from circuits import Array, Concat, Index
from circuits.testing import shapes
from rewrites.rules import concat_single, index_select_all

from .rewrite_helpers import RULE_SETTINGS, fire, must_not_fire, operands


@st.composite
def full_selections(draw, shape):
    """Index entries that each select a whole axis in order."""
    entries = []
    for n in shape[: draw(st.integers(0, len(shape)))]:
        entries.append(draw(st.sampled_from([
            slice(None), slice(0, n), slice(None, n + 5), slice(-n, None), slice(0, None, 1),
            np.arange(n), np.arange(n) - n,
        ])))
    return tuple(entries)


@RULE_SETTINGS
@given(shapes(min_rank=1, max_rank=3, max_side=3).flatmap(lambda s: st.tuples(operands(s), full_selections(s))))
def test_index_select_all_fires_and_keeps_value(case):
    x, index = case
    out = fire(index_select_all, Index(x, index))
    assert out == x


def test_index_select_all_must_not_fire():
    x = Array(np.ones((3, 2), np.float32))
    for index in [(0,), (slice(1, None),), (slice(None, None, -1),), (np.array([0, 1, 1]),),
                  (np.array([2, 1, 0]),), (slice(None), np.array([0]))]:
        must_not_fire(index_select_all, Index(x, index))


@RULE_SETTINGS
@given(shapes(min_rank=1, max_rank=3, max_side=3).flatmap(operands), st.integers(0, 2))
def test_concat_single_fires_and_keeps_value(x, axis):
    out = fire(concat_single, Concat(x, axis=axis % x.ndim))
    assert out == x


def test_concat_single_must_not_fire():
    x = Array(np.ones((3, 2), np.float32))
    must_not_fire(concat_single, Concat(x, x, axis=0))
