"""circuits.functions: the FunctionSpec is the one source of everything about a function.  A user
function that declares a sympy form, NaN propagation or value bounds is treated like a built-in by
the symbolic interpreter, the gather rules and the test strategies; the declarations of the
built-ins are honest; no module outside circuits/functions/ reads gen_index names."""

from __future__ import annotations

import ast
import math
import pathlib
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import InvalidArgument

import circuits as C
from circuits import Add, Array, Einsum, GeneralFunction, Rearrange, Scalar, Symbol
from circuits.backend import evaluate
from circuits.backend.symbolic import symbolic_equal, symbolic_evaluate
from circuits.functions import (
    Bounds,
    lookup,
    register_elementwise,
    register_function,
    registered_names,
    unregister_function,
)
from circuits.testing import CLOSED_TYPES, dags
from rewrites.rules.gather import push_gather_through_function
from tests.rewrites.rewrite_helpers import fire, must_not_fire

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def user_functions():
    """Registers the user functions of these tests, and removes them afterwards."""
    import jax.numpy as jnp
    import sympy

    names = []

    def reg(register, name, *args, **kw):
        register(name, *args, **kw)
        names.append(name)

    # elementwise, with a sympy form; NaN in, NaN out
    reg(register_elementwise, "cube_demo", lambda x: x * x * x, sympy=lambda x: x**3, propagates_nan=True,
        bounds=Bounds(lambda x: (x[0] ** 3, x[1] ** 3), arg_max=3.0))
    # elementwise, turns NaN into 0: a checked gather's NaN would not survive it
    reg(register_elementwise, "nan_to_zero_demo", lambda x: jnp.nan_to_num(x, nan=0.0), propagates_nan=False)
    # on the last axis, same shape: x - mean(x), with its row form
    reg(register_function, "center_demo", lambda s: s[0], lambda x: x - jnp.mean(x, axis=-1, keepdims=True),
        core_ndim=1, sympy=lambda row: [v - sympy.Add(*row) / len(row) for v in row], propagates_nan=True,
        bounds=Bounds(lambda x, n: (x[0] - x[1], x[1] - x[0])))
    # a reduction over the last axis, with its row form
    reg(register_function, "sumsq_demo", lambda s: s[0][:-1], lambda x: jnp.sum(x * x, axis=-1), core_ndim=1,
        sympy=lambda row: sympy.Add(*[v**2 for v in row]),
        bounds=Bounds(lambda x, n: (0.0, n * max(x[0] ** 2, x[1] ** 2)), arg_max=5.0))
    # two broadcasting arguments
    reg(register_elementwise, "hypot_demo", lambda x, y: jnp.sqrt(x * x + y * y), num_args=2,
        bounds=Bounds(lambda x, y: (0.0, math.hypot(max(-x[0], x[1]), max(-y[0], y[1]))), arg_max=10.0))
    yield
    for name in names:
        unregister_function(name)


# ---------------------------------------------------------------------------- (a) sympy forms
@pytest.mark.usefixtures("user_functions")
def test_symbolic_interpreter_uses_a_user_functions_sympy_form():
    x = Symbol((2, 3), name="x")
    cube = GeneralFunction("cube_demo", x)
    assert symbolic_equal(cube, Einsum.from_spec("ab,ab,ab->ab", x, x, x))
    assert not symbolic_equal(cube, x)
    # uninterpreted, the same circuits are not provably equal
    assert not symbolic_equal(cube, Einsum.from_spec("ab,ab,ab->ab", x, x, x), interpret=False)
    # a row form: the result keeps the row's shape ...
    neg_mean = Einsum.from_spec("a,->a", GeneralFunction("mean", x), Scalar(-1.0))
    assert symbolic_equal(GeneralFunction("center_demo", x), Add(x, Rearrange(neg_mean, "a -> a 1")))
    # ... or drops the last axis
    assert symbolic_equal(GeneralFunction("sumsq_demo", x), Einsum.from_spec("ab,ab->a", x, x))
    assert str(symbolic_evaluate(GeneralFunction("sumsq_demo", x))[1]) == "x[1,0]**2 + x[1,1]**2 + x[1,2]**2"


def test_a_sympy_form_of_the_wrong_size_is_a_clear_error():
    register_function("bad_rows_demo", lambda s: s[0], lambda x: x, core_ndim=1, sympy=lambda row: [row[0]])
    try:
        with pytest.raises(C.EvaluationError, match="sympy form of bad_rows_demo gave 1 entries .* shape \\[3\\]"):
            symbolic_evaluate(GeneralFunction("bad_rows_demo", Symbol((2, 3), name="x")))
    finally:
        unregister_function("bad_rows_demo")


# ---------------------------------------------------------------------------- (b) NaN propagation
@pytest.mark.usefixtures("user_functions")
def test_gather_moves_through_a_user_function_only_when_it_propagates_nan():
    z = Array(np.arange(12.0).reshape(4, 3), name="z")

    def computed(values):  # indices no check sees before the gather runs
        return Add(Array(np.array(values), name="t"), Array(np.zeros(3, np.int64), name="zeros"))

    idx = computed([1, 7, 0])  # 7 is out of range: the checked gather gives a NaN row
    through = GeneralFunction("gen_index_at_0_c", GeneralFunction("cube_demo", z), idx)
    out = fire(push_gather_through_function, through)
    assert out.function.name == "cube_demo" and np.isnan(evaluate(out)[1]).all()
    stopped = GeneralFunction("gen_index_at_0_c", GeneralFunction("nan_to_zero_demo", z), idx)
    must_not_fire(push_gather_through_function, stopped)
    # which is right: swapped, the NaN row would become zeros
    swapped = GeneralFunction("nan_to_zero_demo", GeneralFunction("gen_index_at_0_c", z, idx))
    assert np.isnan(evaluate(stopped)[1]).all() and not np.isnan(evaluate(swapped)).any()
    # an unchecked gather wraps negative indices: in range, it gives no NaN to lose
    plain = GeneralFunction("gen_index_at_0", GeneralFunction("nan_to_zero_demo", z), computed([1, -1, 0]))
    fire(push_gather_through_function, plain)


# ---------------------------------------------------------------------------- (c) strategies
@pytest.mark.usefixtures("user_functions")
@pytest.mark.parametrize("name", ["cube_demo", "center_demo", "sumsq_demo", "hypot_demo"])
def test_strategies_draw_user_functions_within_their_bounds(name):
    @given(c=dags(types=CLOSED_TYPES, functions=(name,), max_nodes=5, max_depth=3,
                      root_types=(GeneralFunction,)))
    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    def check(c):
        assert c.function.name == name
        value = evaluate(c, dtype="float64")
        assert np.isfinite(value).all() and np.abs(value).max(initial=0.0) <= 1e4

    check()


def test_strategies_refuse_a_function_they_cannot_draw_and_say_why():
    register_function("opaque_demo", lambda s: s[0], lambda x: x)  # no core_ndim, no bounds
    try:
        @given(c=dags(functions=("opaque_demo",)))
        def check(c):
            pass

        with pytest.raises(InvalidArgument, match="'opaque_demo' cannot be drawn.*FunctionSpec.bounds"):
            check()
    finally:
        unregister_function("opaque_demo")


# ---------------------------------------------------------------------------- the built-ins' declarations
def _builtins():
    return [lookup(n) for n in registered_names() if lookup(n).jax.__module__ == "circuits.functions.builtins"]


def test_builtin_nan_propagation_is_what_they_compute():
    x = np.array([[np.nan, 0.5, 2.0], [1.0, 2.0, 3.0]])
    for spec in _builtins():
        args = [Array(x, name="x")] + [Array(np.zeros_like(x), name="zeros")] * (spec.num_args[0] - 1)
        got = evaluate(GeneralFunction(spec, *args), dtype="float64")
        nan_row = got[0]
        if spec.elementwise:
            nan_row = got[0, :1]
        assert np.isnan(nan_row).all() == spec.propagates_nan, spec.name
    assert {s.name for s in _builtins() if not s.propagates_nan} == {"pow", "last_dim_size", "step"}


def test_builtin_bounds_hold_on_values_inside_their_argument_bounds():
    rng = np.random.default_rng(0)
    for spec in _builtins():
        b = spec.bounds
        assert b is not None, spec.name
        nargs = spec.num_args[0]
        for _ in range(4):
            ivs, arrays = [], []
            for i in range(nargs):
                positive, mag = b.arg(i)
                mag = min(mag or 5.0, 5.0)
                lo = float(rng.uniform(1e-3 if positive else -mag, mag))
                hi = float(rng.uniform(lo, mag))
                ivs.append((lo, hi))
                arrays.append(Array(np.concatenate([[lo, hi], rng.uniform(lo, hi, 4)]).reshape(2, 3)))
            n = {} if spec.elementwise else {"n": 3}
            lo, hi = b.image(*ivs, **n)
            got = evaluate(GeneralFunction(spec, *arrays), dtype="float64")
            assert (got >= lo - 1e-9).all() and (got <= hi + 1e-9).all(), (spec.name, ivs, (lo, hi), got)


# ---------------------------------------------------------------------------- one parser of gen_index names
_PIECES = {"gen_index_at_", "_batch_x", "_no_batch_index", "_c"}


def _grammar_uses(path: pathlib.Path) -> list[str]:
    """Places in ``path`` that read or spell gen_index names by hand: GenIndex.parse or the
    pattern, a regex or format fragment of the name, or its pieces as strings."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        owner = getattr(node, "value", None)
        if (isinstance(node, ast.Attribute) and node.attr == "parse"
                and "GenIndex" in (getattr(owner, "id", None), getattr(owner, "attr", None))):
            found.append(f"{path}:{node.lineno}: GenIndex.parse (read spec.gather)")
        elif isinstance(node, ast.Name) and node.id in ("GEN_INDEX_PATTERN", "GEN_INDEX_GRAMMAR"):
            found.append(f"{path}:{node.lineno}: {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            s = node.value
            if s in _PIECES or re.search(r"gen_index_at_(?![-\d])", s):
                found.append(f"{path}:{node.lineno}: {s!r}")
    return found


def test_no_module_outside_functions_reads_gen_index_names():
    library = [p for d in ("circuits", "rewrites") for p in (ROOT / d).rglob("*.py")
               if (ROOT / "circuits" / "functions") not in p.parents]
    assert len(library) > 30
    found = [hit for p in library for hit in _grammar_uses(p)]
    assert not found, "\n".join(found)


def test_the_scan_finds_hand_written_gen_index_parsing(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import re\n"
        "def axis(name):\n"
        "    '''docstring: gen_index_at_<d> is fine here'''\n"
        "    m = re.fullmatch(r'gen_index_at_(-?\\d+)(_c)?', name)\n"
        "    g = GenIndex.parse(name) or functions.GenIndex.parse(name)\n"
        "    return name.endswith('_c'), f'gen_index_at_{m.group(1)}'\n"
    )
    assert len(_grammar_uses(bad)) == 5
    assert _grammar_uses(ROOT / "circuits" / "functions" / "gather.py")  # where the grammar does live


@pytest.mark.parametrize("n", [100, 5000])
def test_log_softmax_of_long_rows_and_its_gradient(n):
    """log_softmax sums a row of LONG_ROWS or more entries by a product with ones (faster on XLA's
    CPU backend): the value and the gradient match a float64 reference, for short and long rows,
    with a -inf entry and large logits."""
    import jax

    from circuits.functions import builtins

    assert (n >= builtins.LONG_ROWS) == (n == 5000)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, n)) * 30).astype(np.float32)
    x[1, 7] = -np.inf
    fn = lookup("log_softmax").jax
    got = np.asarray(jax.jit(fn)(x))
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(-1, keepdims=True)
    want = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-5)
    weights = rng.standard_normal((3, n)).astype(np.float32)
    grad = np.asarray(jax.grad(lambda v: (fn(v) * weights).sum())(x))
    softmax = np.exp(want)
    want_grad = weights - softmax * weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5)
