"""Module, ModuleSpec, symbolic sizes and SetSymbolicShape: the shapes rust_circuit's tests assert
for its texts, values against numpy and against the substituted forms, the text format."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as C
from circuits import (
    Add,
    Array,
    Einsum,
    GeneralFunction,
    Module,
    ModuleArgSpec,
    ModuleSpec,
    Scalar,
    SetSymbolicShape,
    Symbol,
    parse,
    parse_many,
    print_many,
)
from circuits.expand import substitute_all_modules
from circuits.shapes import is_symbolic, read_size, size_text, symbolic_size
from circuits.testing import circuits_with_inputs, store_of

S0, S1 = symbolic_size(0), symbolic_size(1)

NESTED = """
'rep_fst' [7, 9, 3s] Symbol 0bac3288-00e7-41bf-bd59-ac04de67ba47
'rep_snd' [8, 5s] Symbol d5f29a2c-5927-4237-a7ea-7fe7ec2c3be6
'a' Module
  'add' Add
    'arg0' [0s] Symbol 7d2c48d4-6110-4759-be98-de15bfb20af2
    'arg1' [0s] Symbol 86b517ef-b83c-4ea0-9568-f89bb2106db9
  'fst' [7s] Symbol c41b44e7-4f04-4124-bf02-34e0133c7c19 ! 'arg0'
  'snd' [12s, 7s] Symbol 823c2e81-99a2-46b3-bec1-329109e06e20 ! 'arg1'
'b' Module
  'a'
  'rep_fst' ! 'fst'
  'rep_snd' ! 'snd'
"""


def test_symbolic_sizes_print_and_parse_as_rust_writes_them():
    assert size_text(symbolic_size(0)) == "0s" and size_text(symbolic_size(1, 2)) == "2*1s"
    assert read_size("2*1s") == symbolic_size(1, 2) and read_size("12") == 12
    assert is_symbolic(S0) and not is_symbolic(300)
    s = parse("'x' [0s, 2*1s, 3] Symbol")
    assert s.shape == (S0, symbolic_size(1, 2), 3)
    assert s.to_text() == "'x' [0s,2*1s,3] Symbol"
    with pytest.raises(C.ParseError, match="cannot read the shape"):
        parse("'x' [999s] Symbol")


def test_nested_modules_from_rusts_test_take_rusts_shapes():
    rep_fst, rep_snd, a, b = parse_many(NESTED)
    assert a.shape == (symbolic_size(12), symbolic_size(7))
    # rust asserts: b.shape[:3] == (7, 9, 8) and b.shape[3] is one of the two symbolic sizes
    assert b.shape[:3] == (7, 9, 8) and b.shape[3] in (rep_fst.shape[-1], rep_snd.shape[-1])
    sub = b.substitute()
    assert sub.shape == b.shape and sub.name == "b"
    assert parse_many(print_many([rep_fst, rep_snd, a, b])) == [rep_fst, rep_snd, a, b]


@pytest.mark.parametrize("sym_on_top", [False, True])
def test_modules_batched_over_modules_take_rusts_shapes(sym_on_top):
    text = f"""
    'rep_fst' [12, {"7s" if sym_on_top else 8}, 9, 7] Symbol 0bac3288-00e7-41bf-bd59-ac04de67ba47
    'rep_snd' [13, 12, 9, 10, {8 if sym_on_top else "7s"}, 7] Symbol d5f29a2c-5927-4237-a7ea-7fe7ec2c3be6
    'a' Module
      'add' Add
        'arg0' [1s, 0s] Symbol 7d2c48d4-6110-4759-be98-de15bfb20af2
        'arg1' [0s] Symbol 86b517ef-b83c-4ea0-9568-f89bb2106db9
      'fst' [21s, 24s, 20s] Symbol c41b44e7-4f04-4124-bf02-34e0133c7c19 ! 'arg0'
      'snd' [23s, 22s, 21s, 20s] Symbol 823c2e81-99a2-46b3-bec1-329109e06e20 ! 'arg1'
    'b' Module
      'a'
      'rep_fst' ! 'fst'
      'rep_snd' ! 'snd'
    """
    text = "\n".join(line[4:] for line in text.splitlines())
    *_, out = parse_many(text)
    assert out.shape == (13, 12, 9, 10, 8, 9, 7)
    assert out.substitute().shape == (13, 12, 9, 10, 8, 9, 7)
    assert substitute_all_modules(out).shape == (13, 12, 9, 10, 8, 9, 7)


def test_module_shape_with_unused_arguments_as_rust_asserts():
    spec = ModuleSpec(Scalar(0.0), [ModuleArgSpec(Symbol((S0,), name="a")), ModuleArgSpec(Symbol((S1,), name="b"))],
                      check_all_inputs_used=False)
    for a, b in [((4, 5, 6, 7), (6, 4)), ((4, 5, 6, 7), (4,)), ((7,), (4, 5, 6, 4))]:
        c = Module(spec, a=Symbol(a, name="x"), b=Symbol(b, name="y"))
        assert c.shape == (4, 5, 6) and c.substitute().shape == (4, 5, 6)
    spec7 = ModuleSpec(Scalar(0.0, (7,)), spec.arg_specs, check_all_inputs_used=False)
    c = Module(spec7, a=Symbol((7,), name="x"), b=Symbol((4, 5, 6, 4), name="y"))
    assert c.shape == (4, 5, 6, 7) and c.substitute().shape == (4, 5, 6, 7)
    np.testing.assert_array_equal(C.evaluate(c, {"x": np.ones(7), "y": np.ones((4, 5, 6, 4))}), np.zeros((4, 5, 6, 7)))


def layer_norm_module():
    """A layer norm written once over a symbolic width, as rust's module library writes it."""
    x, w = Symbol((S0,), name="ln.input"), Symbol((S0,), name="ln.w")
    inv_n = GeneralFunction("reciprocal", GeneralFunction("last_dim_size", x))
    mean = Einsum.from_spec("a,->", x, inv_n, name="ln.mean")
    centered = Add(x, Einsum.from_spec(",->", mean, Scalar(-1.0)), name="ln.centered")
    var = Einsum.from_spec("a,a,->", centered, centered, inv_n, name="ln.var")
    scale = GeneralFunction("rsqrt", Add(var, Scalar(1e-5)), name="ln.scale")
    body = Einsum.from_spec("a,,a->a", centered, scale, w, name="ln.out")
    return ModuleSpec(body, [ModuleArgSpec(x), ModuleArgSpec(w, batchable=False)])


def test_a_layer_norm_module_batches_and_matches_numpy():
    spec = layer_norm_module()
    rng = np.random.default_rng(1)
    xv, wv = rng.standard_normal((5, 7, 16)), rng.standard_normal(16)
    m = Module(spec, Array(xv, name="resid"), Array(wv, name="w"), name="ln")
    assert m.shape == (5, 7, 16)
    mu = xv.mean(-1, keepdims=True)
    want = (xv - mu) / np.sqrt(((xv - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * wv
    np.testing.assert_allclose(C.evaluate(m, dtype="float64"), want, rtol=1e-9)
    np.testing.assert_allclose(C.evaluate(m.substitute(), dtype="float64"), want, rtol=1e-9)
    # its text round-trips, with the flags of the non-batchable argument
    text = m.to_text()
    assert "'w' [16] Array" in text and "! 'ln.w' ftt" in text
    again = parse(text, store=store_of(m))
    assert again == m and again.to_text() == text
    with pytest.raises(C.ShapeError, match="not batchable"):
        Module(spec, Array(xv), Array(np.ones((2, 16))))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_generated_modules_evaluate_as_their_substituted_forms(data):
    circuit, inputs = data.draw(circuits_with_inputs(root_types=[Module], max_nodes=8, max_depth=4))
    want = C.evaluate(substitute_all_modules(circuit), inputs, dtype="float64")
    np.testing.assert_allclose(C.evaluate(circuit, inputs, dtype="float64"), want, rtol=1e-12, atol=1e-12)
    text = circuit.to_text()
    assert C.parse(text).to_text() == text


def test_child_info_errors_name_the_line():
    with pytest.raises(C.ParseError, match="only follows an argument line of a Module"):
        parse("'a' Add\n  'x' [2] Symbol ! 'y'")
    with pytest.raises(C.ParseError, match="argument lines but 0"):
        parse("'m' Module\n  'b' Add\n    'x' [2] Symbol\n  'y' [2] Symbol")
    with pytest.raises(C.ParseError, match="binds a Symbol"):
        parse("'m' Module\n  'b' Add\n    'x' [2] Symbol\n  'y' [2] Symbol ! 'b'")
    with pytest.raises(C.CircuitError, match="does not occur in the body"):
        ModuleSpec(Scalar(1.0, (2,)), [ModuleArgSpec(Symbol((2,), name="x"))])


def test_a_symbol_the_body_does_not_show_prints_in_full_after_the_bang():
    spec = ModuleSpec(Scalar(1.0, (2,), name="one"), [ModuleArgSpec(Symbol((2,), name="unused"))],
                      check_all_inputs_used=False)
    m = Module(spec, Symbol((3, 2), name="y"), name="m")
    assert m.to_text() == "'m' Module\n  'one' [2] Scalar 1\n  'y' [3,2] Symbol ! 'unused' [2] Symbol"


def test_module_errors_name_the_argument():
    x = Symbol((3,), name="x")
    spec = ModuleSpec(Add(x, x), [ModuleArgSpec(x)])
    with pytest.raises(C.ShapeError, match="size 4 where its Symbol 'x' has 3"):
        Module(spec, Symbol((4,), name="z"))
    with pytest.raises(C.ShapeError, match="rank 1"):
        Module(spec, Scalar(1.0))
    with pytest.raises(C.CircuitError, match="no argument Symbol named 'q'"):
        Module(spec, q=Scalar(1.0, (3,)))


def test_set_symbolic_shape_states_symbolic_sizes():
    x = Symbol((3, 4), name="x")
    s = SetSymbolicShape(x, (S0, 4))
    assert s.to_text() == "0 [0s,4] SetSymbolicShape\n  'x' [3,4] Symbol"
    assert parse(s.to_text()) == s
    np.testing.assert_array_equal(C.evaluate(SetSymbolicShape(x, (3, 4)), {x: np.ones((3, 4))}), np.ones((3, 4)))
    with pytest.raises(C.ShapeError, match="neither is symbolic"):
        SetSymbolicShape(x, (5, 4))


def test_a_deep_module_body_substitutes_and_evaluates_without_recursion(low_recursion_limit):
    from tests.deep import build_deep_chain, deep_chain_value

    x = Symbol((2,), name="x")
    body = build_deep_chain(leaf=x)
    m = Module(ModuleSpec(body, [ModuleArgSpec(x)]), Array(np.array([[0.5, -0.25], [0.5, -0.25]], np.float32)))
    assert m.shape == (2, 2)
    text = m.to_text()
    assert parse(text, store=store_of(m)) == m
    out = C.evaluate(m, dtype="float64")
    np.testing.assert_allclose(out[1], deep_chain_value(), rtol=1e-5)


def test_strip_names_keeps_a_module_bound_to_its_symbols():
    m = parse("'m' Module\n  'b' Add\n    'x' [2] Symbol\n    'x'\n  'y' [3,2] Symbol ! 'x'")
    s = C.strip_names(m)
    assert s.spec.arg_specs[0].symbol.name is None
    y = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(C.evaluate(s, {s.children[1]: y}), 2 * y)


BILINEAR_MLP = """
'outer_b.bilinear_mlp' Module
  'bilinear_mlp' Einsum h,h,oh->o
    'bilinear_mlp.pre0' Index [0,:]
      'bilinear_mlp.fold_pre' Rearrange (a:2 b) -> a:2 b
        'bilinear_mlp.pre' Einsum i,hi->h
          'bilinear_mlp.input' [0s] Symbol 873a937e-2bb9-4f7f-b55e-a100db3dde52
          'bilinear_mlp.w.proj_in' [2*1s,0s] Symbol c171d519-8793-4a8b-ac5e-d550347f30a6
    'bilinear_mlp.pre1' Index [1,:]
      'bilinear_mlp.fold_pre'
    'bilinear_mlp.w.proj_out' [2s,1s] Symbol e61637eb-9f17-4325-b2c2-5eb2518026cf
  0 [64,17] Array rand ! 'bilinear_mlp.input'
  'b.proj_in' [22,17] Array rand ! 'bilinear_mlp.w.proj_in' ftt
  'b.proj_out' [13,11] Array rand ! 'bilinear_mlp.w.proj_out' ftt
"""


def test_a_symbolic_product_takes_its_size_from_the_argument_as_rust_solves_it():
    # rust_circuit's test_batching_top: 2*1s given 22 makes 1s 11, which proj_out's [13,11] agrees with
    m = parse(BILINEAR_MLP)
    assert m.shape == (64, 13)
    x, w_in, w_out = (np.asarray(a.value, np.float64) for a in m.args)
    pre = np.einsum("ni,hi->nh", x, w_in).reshape(64, 2, 11)
    want = np.einsum("nh,nh,oh->no", pre[:, 0], pre[:, 1], w_out)
    np.testing.assert_allclose(C.evaluate(m, dtype="float64"), want, rtol=1e-9)
    np.testing.assert_allclose(C.evaluate(m.substitute(), dtype="float64"), want, rtol=1e-9)
    # a size the factor does not divide is refused, naming the argument
    with pytest.raises(C.errors.ParseError, match="argument 1 has size 21"):
        parse(BILINEAR_MLP.replace("[22,17] Array rand", "[21,17] Array rand"))


def test_a_symbol_bound_twice_is_bound_by_the_later_argument():
    # rust_circuit's modules_and_symbols demo: "later children are considered 'more inner'"
    b_arg, m = parse_many("""
'b.arg' [] Scalar 1.2
'a' Module
  'sym' [] Symbol c9517c8e-0b5a-4ebf-94c8-6da413c9f5d1
  'a.arg' [] Scalar 1.3 ! 'sym'
  'b.arg' ! 'sym'
""")
    assert m.spec.are_args_used() == [False, True]
    assert substitute_all_modules(m) == b_arg.rename("a")
    assert float(C.evaluate(m)) == pytest.approx(1.2)
    with pytest.raises(C.errors.CircuitError, match="does not occur in the body"):
        ModuleSpec(m.body, m.spec.arg_specs)  # rust's parser refuses it unless told not to check
    assert parse_many(print_many([b_arg, m])) == [b_arg, m]


def test_symbolic_sizes_in_rust_rearrange_specs_and_their_expansion():
    # rust_circuit's test_symbolic_rearrange_expand: the spec's sizes conform to the new shapes
    from circuits.expand import expand

    scl0, scl1, scl2, sym, root = parse_many("""
    'scl0' [3*1s] Scalar 1.3
    'scl1' [24] Scalar 1.3
    'scl2' [17] Scalar 1.3
    'sym' [3*0s] Symbol rand
    2 Add
      3 Rearrange (a:1s b:3) -> b a
        'scl0'
      4 Rearrange (b:3 a:8) -> a b 1
        'scl1'
      8 Einsum i->
        7 Add
          5 Rearrange a:17 -> a
            'scl2'
          6 Rearrange a -> a
            'scl2'
    """)
    assert root.shape == (8, 3, S1)  # [3,1s] + [8,3,1] + []
    first = root.children[0]
    assert first.payload_text() == "(a b) -> b a a=1s b=3"  # a symbolic size prints as one
    assert parse(first.to_text()) == first
    expanded = expand(root, {scl0: sym, scl1: sym, scl2: sym})
    assert expanded.shape == (S0, 3, S0)
    # a concrete expansion conforms the same way: (b:3 a:8) over 30 makes a 10
    r = parse("'r' Rearrange (b:3 a:8) -> a b\n  'x' [24] Scalar 1")
    assert expand(r, {r.children[0]: Scalar(1.0, (30,))}).shape == (10, 3)
    with pytest.raises(C.errors.CircuitError, match="cannot follow"):  # 3 does not divide 31
        expand(r, {r.children[0]: Scalar(1.0, (31,))})
