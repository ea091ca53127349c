"""The einsum plan (``circuits.backend.lower.einsum``): operand order chosen so that a contraction's
result comes out in the output's order, values against ``numpy.einsum`` for any output order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from circuits import Array, Einsum, evaluate
from circuits.backend.lower.einsum import einsum_steps

Q, D, H, C, K = range(5)


def _kinds(steps):
    return [s.kind for s in steps]


def test_head_projection_contracts_weight_first_like_the_hand_written_einsum():
    # 'qd,Hcd->Hqc' (a batched head projection): [q, H, c] in the given order needs the head axis
    # moved to the front (a copy of the whole result); weight first gives [H, c, q], whose last
    # two axes XLA folds into the next contraction.
    steps, _ = einsum_steps(((Q, D), (H, C, D)), (H, Q, C), ((5, 6), (2, 3, 6)))
    dot = steps[0]
    assert dot.kind == "dot" and dot.operands == ((H, C, D), (Q, D)) and dot.result == (H, C, Q)


def test_attention_scores_come_out_in_the_output_order():
    # 'Hqc,Hkc,,qk->Hqk': whichever pair opt_einsum contracts first, no transpose at the end
    steps, _ = einsum_steps(((H, Q, C), (H, K, C), (), (Q, K)), (H, Q, K), ((2, 7, 3), (2, 7, 3), (), (7, 7)))
    assert "transpose" not in _kinds(steps)
    assert [s.result for s in steps if s.kind == "dot"] == [(H, Q, K)]


def test_a_matmul_in_its_own_order_is_left_alone():
    steps, _ = einsum_steps(((0, 1), (1, 2)), (0, 2), ((2, 3), (3, 4)))
    assert _kinds(steps) == ["dot"] and steps[0].operands == ((0, 1), (1, 2))


def test_a_transposed_matmul_swaps_instead_of_transposing():
    steps, _ = einsum_steps(((0, 1), (1, 2)), (2, 0), ((2, 3), (3, 4)))
    assert _kinds(steps) == ["dot"] and steps[0].operands == ((1, 2), (0, 1))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_output_order_matches_numpy(data):
    # 2-4 operands over up to 5 axes, the output a shuffled subset: float32 jit and float64 op by op
    n_axes = data.draw(st.integers(2, 5))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=n_axes, max_size=n_axes))
    n_ops = data.draw(st.integers(2, 4))
    in_axes = [tuple(data.draw(st.lists(st.sampled_from(range(n_axes)), min_size=1, max_size=3, unique=True)))
               for _ in range(n_ops)]
    used = sorted({a for t in in_axes for a in t})
    out = data.draw(st.permutations(used))
    out = tuple(out[:data.draw(st.integers(0, len(out)))])
    rng = np.random.default_rng(len(used))
    values = [rng.standard_normal([sizes[a] for a in t]) for t in in_axes]
    letters = "abcde"
    spec = ",".join("".join(letters[a] for a in t) for t in in_axes) + "->" + "".join(letters[a] for a in out)
    want = np.einsum(spec, *values)
    c = Einsum(*(Array(v) for v in values), in_axes=in_axes, out_axes=out)
    np.testing.assert_allclose(evaluate(c, dtype="float64", mode="ops"), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(evaluate(c, mode="jit"), want, rtol=1e-4, atol=1e-4)
