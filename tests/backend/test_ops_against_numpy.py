"""Each node type's JAX lowering against the plain-numpy oracle: float32 through jit, float64 op
by op to 1e-12."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits.functions as functions
from circuits import Add, Array, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag, evaluate

from .numpy_oracle import NUMPY_FUNCTIONS, numpy_evaluate

rng = np.random.default_rng(0)
A = Array(rng.standard_normal((3, 4)).astype(np.float32), name="A")
B = Array(rng.standard_normal((4, 5)).astype(np.float32), name="B")
SQ = Array(rng.standard_normal((3, 3)).astype(np.float32), name="SQ")
CUBE = Array(rng.standard_normal((3, 3, 4)).astype(np.float32), name="CUBE")
ROW = Array(rng.standard_normal((4,)).astype(np.float32), name="row")
COL = Array(rng.standard_normal((3, 1)).astype(np.float32), name="col")
POS = Array(rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32), name="pos")
T4 = Array(rng.standard_normal((2, 3, 4)).astype(np.float32), name="T4")
INTS = Array(np.arange(12, dtype=np.int64).reshape(3, 4), name="ints")
X53 = Array(rng.standard_normal((5, 3)).astype(np.float32), name="x53")
X45 = Array(rng.standard_normal((4, 5)).astype(np.float32), name="x45")
X235 = Array(rng.standard_normal((2, 3, 5)).astype(np.float32), name="x235")


def ids(values, name="idx"):
    return Array(np.asarray(values, dtype=np.int64), name=name)


CASES = {
    # leaves
    "scalar_shaped": Scalar(2.5, (2, 3)),
    "scalar_0d_added": Add(Scalar(1.5), A),
    "array_int": INTS,
    # einsum
    "einsum_matmul": Einsum.from_spec("ab,bc->ac", A, B),
    "einsum_diagonal": Einsum.from_spec("aa->a", SQ),
    "einsum_trace": Einsum.from_spec("aa->", SQ),
    "einsum_diagonal_3d": Einsum.from_spec("aab->ba", CUBE),
    "einsum_zero_operands": Einsum.from_spec("->"),
    "einsum_scalar_operand": Einsum.from_spec("ab,->ab", A, Scalar(3.0)),
    "einsum_outer": Einsum.from_spec("a,b->ab", ROW, Array(np.arange(3, dtype=np.float32))),
    "einsum_three_operands": Einsum.from_spec("qc,kc,qk->qk", A, A, SQ),
    "einsum_permute": Einsum.from_spec("abc->cab", T4),
    "einsum_int_and_float": Einsum.from_spec("ab,ab->a", INTS, A),
    "einsum_large_axis_ids": Einsum(A, B, in_axes=((70, 40), (40, 99)), out_axes=(99, 70)),
    # add
    "add_broadcast": Add(A, ROW, COL, Scalar(0.25)),
    "add_zero_children": Add(),
    "add_one_child": Add(A),
    "add_same_child_twice": Add(A, A),
    "add_broadcast_up": Add(ROW, Scalar(1.0, (2, 1, 4))),
    "add_int_and_float": Add(INTS, A),
    # index
    "index_int": Index(T4, (1,)),
    "index_negative_int": Index(T4, (-1, -2)),
    "index_slice_step": Index(T4, (slice(None), slice(None, None, 2))),
    "index_negative_step": Index(T4, (slice(None, None, -1), slice(2, 0, -1))),
    "index_slice_as_written": Index(A, (slice(1, -1),)),
    "index_array": Index(T4, (slice(None), np.array([2, 0, 0]))),
    "index_negative_array": Index(T4, (np.array([-1, 0]), slice(None), np.array([-4, 3]))),
    "index_two_arrays_outer": Index(A, (np.array([2, 0]), np.array([1, 3, 3]))),
    "index_array_and_int": Index(T4, (np.array([1, 0, 1]), 2)),
    "index_empty_array": Index(A, (np.array([], dtype=np.int64),)),
    "index_int_array_on_ints": Index(INTS, (np.array([2, 1]), -1)),
    "index_all_ints": Index(T4, (1, 2, 3)),
    # rearrange
    "rearrange_split": Rearrange(Array(np.arange(30, dtype=np.float32).reshape(6, 5)), "(h d) s -> h s d", h=2),
    "rearrange_merge": Rearrange(T4, "a b c -> (a b) c"),
    "rearrange_permute": Rearrange(T4, "a b c -> c a b"),
    "rearrange_repeat": Rearrange(A, "a b -> a r b", r=3),
    "rearrange_repeat_merged": Rearrange(ROW, "a -> (r a)", r=2),
    "rearrange_unit_in": Rearrange(Array(np.ones((2, 1, 3), np.float32) * np.arange(3)), "a 1 b -> b a"),
    "rearrange_unit_out": Rearrange(A, "a b -> a 1 b 1"),
    "rearrange_drop_named_unit": Rearrange(Array(np.arange(6, dtype=np.float32).reshape(2, 1, 3)), "a o b -> b a"),
    "rearrange_split_permute_merge": Rearrange(T4, "a b (c d) -> (d a) c b", c=2),
    "rearrange_identity": Rearrange(A, "a b -> a b"),
    # concat and tag
    "concat_axis0": Concat(A, Array(np.ones((2, 4), np.float32)), axis=0),
    "concat_last_axis": Concat(A, SQ, A, axis=-1),
    "concat_int_and_float": Concat(INTS, A, axis=0),
    "tag": Tag(Add(A, A), uuid="00000000-0000-0000-0000-000000000001"),
    # gen_index family (float x), in rust_circuit's layouts; out-of-range index Arrays are refused
    # when built (tests/test_trust_values.py), Symbols when bound: NaN is only the last resort.
    "gen_index_at_0_c": GeneralFunction("gen_index_at_0_c", X53, ids([4, 0, 2, 3, 1, 0])),
    "gen_index_at_0": GeneralFunction("gen_index_at_0", X53, ids([4, -1, -5, 0])),
    "gen_index_at_0_2d_index": GeneralFunction("gen_index_at_0_c", X53, ids([[1, 2], [3, 4]])),
    "gen_index_at_1_c": GeneralFunction("gen_index_at_1_c", X53, ids([2, 0, 1])),
    "gen_index_at_1_2d_index_first": GeneralFunction("gen_index_at_1", T4, ids([[2, 0], [-1, 1], [2, 2]])),
    "gen_index_at_1_no_batch_index": GeneralFunction("gen_index_at_1_no_batch_index", T4, ids([[2, 0], [-1, 1]])),
    "gen_index_at_-1": GeneralFunction("gen_index_at_-1", T4, ids([3, -4, 0])),
    "gen_index_at_-2_2d_index": GeneralFunction("gen_index_at_-2_c", T4, ids([[2, 0], [1, 1]])),
    "gen_index_at_-1_batch_x_no_batch_index": GeneralFunction("gen_index_at_-1_batch_x_no_batch_index", T4,
                                                              ids([[3, 0], [1, 2]])),
    "gen_index_at_0_batch_x_c": GeneralFunction("gen_index_at_0_batch_x_c", X45, ids([4, 0, 4, 1])),
    "gen_index_at_0_batch_x": GeneralFunction("gen_index_at_0_batch_x", X45, ids([4, -5, 2, -1])),
    "gen_index_at_0_batch_x_c_two_batch_axes": GeneralFunction(
        "gen_index_at_0_batch_x_c", X235, ids([[0, 4, 2], [1, 1, 3]])
    ),
    "gen_index_at_-1_batch_x_c": GeneralFunction("gen_index_at_-1_batch_x_c", T4, ids([0, 3])),
}

CASES["fn_softmax_of_ints"] = GeneralFunction("softmax", INTS)
CASES["fn_softmax_masked_with_inf"] = GeneralFunction(
    "softmax", Array(np.where(np.triu(np.ones((3, 3)), 1) > 0, -np.inf, 1.0).astype(np.float32))
)
CASES["fn_log_softmax_of_large_values"] = GeneralFunction("log_softmax", Array(np.array([[1e4, 0.0, -1e4]], np.float32)))

# Every function circuits.functions registers, on inputs inside its domain.
for _name in sorted(NUMPY_FUNCTIONS):
    if _name == "pow":
        CASES["fn_pow"] = GeneralFunction("pow", POS, Array(np.array([0.5, 2.0, -1.0, 3.0], np.float32)))
    elif _name in ("log", "sqrt", "rsqrt", "reciprocal"):
        CASES[f"fn_{_name}"] = GeneralFunction(_name, POS)
    elif _name == "logit":  # (its domain is (0, 1))
        CASES["fn_logit"] = GeneralFunction("logit", Array(np.array([0.05, 0.3, 0.5, 0.9], np.float32)))
    else:
        CASES[f"fn_{_name}"] = GeneralFunction(_name, T4)


def _check(circuit, got, expected, fdt):
    assert got.shape == circuit.shape
    if circuit.dtype.startswith("float"):
        assert got.dtype == np.dtype(fdt)
        tol = 1e-12 if fdt == "float64" else 2e-5
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)
    else:
        assert got.dtype.kind == "i"
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_node_lowering_float32_jit_matches_numpy(case):
    c = CASES[case]
    _check(c, evaluate(c, mode="jit"), numpy_evaluate(c), "float32")


@pytest.mark.parametrize("case", sorted(CASES))
def test_node_lowering_float64_op_by_op_matches_numpy_to_1e12(case):
    c = CASES[case]
    _check(c, evaluate(c, dtype="float64", mode="ops"), numpy_evaluate(c), "float64")


def test_float64_jit_on_a_composite_circuit():
    h = Einsum.from_spec("ab,bc->ac", GeneralFunction("tanh", A), B)
    c = Add(GeneralFunction("log_softmax", h), Index(h, (slice(None), np.array([0, 0, 4, 1, 2]))), Scalar(1e-3))
    got = evaluate(c, dtype="float64", mode="jit")
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, numpy_evaluate(c), rtol=1e-12, atol=1e-12)
    # float32 differs from float64 by float32 rounding, far more than 1e-12
    low = evaluate(c, mode="jit")
    assert low.dtype == np.float32 and 1e-12 < np.abs(low - got).max() < 1e-4


def test_every_builtin_function_is_covered():
    builtin = {
        name for name in functions.registered_names()
        if functions.lookup(name).jax.__module__ == "circuits.functions.builtins"
    }
    assert {"exp", "softmax", "pow", "last_dim_size"} <= builtin  # the filter finds the built-ins
    assert builtin <= set(NUMPY_FUNCTIONS)
    assert {f"fn_{n}" for n in builtin} <= set(CASES)


def test_gen_index_out_of_range_gives_nan_not_wrapped():
    # Indices computed inside the circuit are known to no check: the gather itself gives NaN.
    computed = Add(ids([4, 0, 2, 5, -1, 0]), ids([0, 0, 0, 0, 0, 0], name="zeros"))
    got = evaluate(GeneralFunction("gen_index_at_0_c", X53, computed))
    assert np.isnan(got[3]).all() and np.isnan(got[4]).all() and not np.isnan(got[:3]).any()


def test_float16_and_float64_arrays_compute_in_the_requested_precision():
    x16 = Array(np.array([1.0, 2.0], np.float16))
    x64 = Array(np.array([1.0 + 1e-10, 2.0]))
    c = Add(x16, x64)
    assert evaluate(c).dtype == np.float32
    np.testing.assert_allclose(evaluate(c, dtype="float64"), [2.0 + 1e-10, 4.0], rtol=0, atol=1e-15)


@st.composite
def index_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    entries = []
    for n in shape[: draw(st.integers(0, len(shape)))]:
        kind = draw(st.sampled_from(["int", "slice", "array"]))
        if kind == "int":
            entries.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            bound = st.none() | st.integers(-n - 1, n + 1)
            entries.append(slice(draw(bound), draw(bound), draw(st.none() | st.sampled_from([-2, -1, 1, 2]))))
        else:
            entries.append(np.array(draw(st.lists(st.integers(-n, n - 1), max_size=3)), dtype=np.int64))
    return shape, tuple(entries)


@settings(max_examples=40, deadline=None)
@given(index_cases())
def test_index_matches_outer_indexing(case):
    shape, entries = case
    x = Array(np.arange(np.prod(shape), dtype=np.float64).reshape(shape))
    c = Index(x, entries)
    got = evaluate(c, dtype="float64", mode="ops")
    np.testing.assert_array_equal(got, numpy_evaluate(c))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=4),
    st.randoms(use_true_random=False),
)
def test_einsum_with_repeated_and_summed_axes_matches_numpy(sizes, random):
    # operands draw axis ids (with repeats) from a small pool; output keeps a random subset
    pool = list(range(len(sizes)))
    operands, in_axes = [], []
    for _ in range(random.randint(0, 4)):
        axes = tuple(random.choice(pool) for _ in range(random.randint(0, 3)))
        in_axes.append(axes)
        operands.append(Array(np.asarray(np.random.default_rng(len(in_axes)).standard_normal(
            [sizes[a] for a in axes])), name=None))
    used = sorted({a for t in in_axes for a in t})
    out = tuple(a for a in used if random.random() < 0.5)
    c = Einsum(*operands, in_axes=in_axes, out_axes=out)
    np.testing.assert_allclose(evaluate(c, dtype="float64", mode="ops"), numpy_evaluate(c), rtol=1e-12, atol=1e-12)


def test_symbol_inputs_of_every_kind():
    f = Symbol((2, 3), name="f")
    i = Symbol((2,), name="i", dtype="int64")
    flag = Symbol((2,), name="flag", dtype="bool")
    c = GeneralFunction("gen_index_at_0_batch_x_c", f, i)
    values = {"f": np.arange(6.0).reshape(2, 3), "i": np.array([2, 0])}
    np.testing.assert_array_equal(evaluate(c, values), [2.0, 3.0])
    np.testing.assert_array_equal(evaluate(Index(flag, (np.array([1, 0]),)), {"flag": np.array([True, False])}),
                                  [False, True])
