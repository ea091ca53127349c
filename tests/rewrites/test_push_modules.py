"""push_down_modules (rust_circuit's ModulePusher): the cases of rust's python tests
(``test_module.py``: naming edge cases, the complex nested-module case, nested update of an
argument), and generated circuits evaluated before and after (float64)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import circuits as C
from circuits import Add, Module, Symbol, parse, parse_many
from circuits.check import check
from circuits.testing import circuits_with_inputs
from rewrites.push_modules import PushDownModuleError, default_namer, push_down_modules
from tests.deep import build_deep_chain

from .rewrite_helpers import RULE_SETTINGS, assert_same


def distinct(circuit, kind):
    return list({n.hash: n for n in circuit.toposort() if type(n) is kind}.values())


# ---------------------------------------------------------------------------- rust's naming cases
SYM = "'random_sym' [] Symbol ded02d73-6102-4f7f-a8cf-15b1065e226e\n"


@pytest.mark.parametrize("text, expect", [
    (SYM + "'b' Module\n  'random_sym'", 0),
    (SYM + "'a' Module\n  'b' Module\n    'random_sym'", 0),
    (SYM + "'add' Add\n  'random_sym'\n  'random_sym'\n'b' Module\n  'add'", 1),
    (SYM + "'add' Add\n  'random_sym'\n  'random_sym'\n'a' Module\n  'b' Module\n    'add'", 1),
    (SYM + "'add' Add\n  'random_sym'\n  'random_sym'\n'a' Module\n  'b' Module\n    'c' Module\n"
     "      'add'\n      'garbage' [] Scalar 3 ! 'unused0' [] Symbol 26f1c039-5491-458e-a908-1a90e258c806\n"
     "    'garbage' ! 'unused0'\n  'garbage' ! 'unused0'", 1),
    (SYM + "'my_arg' [] Scalar 3874\n'b' Module\n  'random_sym'\n  'my_arg' ! 'random_sym'", 1),
    (SYM + "'my_arg' [] Scalar 3874\n'a' Module\n  'b' Module\n    'random_sym'\n    'my_arg' ! 'random_sym'", 1),
])
def test_rust_naming_edge_cases(text, expect):
    # rust: ModulePusher().push_down_modules(c, traversal=new_traversal()) == <the expected root>
    roots = parse_many(text)
    assert push_down_modules(roots[-1]) == roots[expect]


def test_rust_naming_pushed_node_is_named_after_the_module():
    # rust's last naming case: the module's result takes its name, nodes inside get ' bind:b'
    # (rust's text defines 'my_arg' inside the expected Add twice; ours defines it once first)
    _, _, new_add, c = parse_many(SYM + """
'my_arg' [] Scalar 3874
0 'b' Add
  'add bind:b' Add
    'my_arg'
    'my_arg'
1 'b' Module
  'outer' Add
    'add' Add
      'random_sym'
      'random_sym'
  'my_arg' ! 'random_sym'
""")
    assert push_down_modules(c) == new_add
    assert push_down_modules(c, namer=default_namer("with")).children[0].name == "add with:b"


def test_rust_term_early_at_keeps_the_module_it_stops_at():
    # rust: push_down_modules(c, traversal=new_traversal(term_early_at="c")) == c_mod
    _, _, c_mod, c = parse_many(SYM + """
'add' Add
  'random_sym'
  'random_sym'
'c' Module
  'add'
  'garbage' [] Scalar 3 ! 'unused0' [] Symbol 26f1c039-5491-458e-a908-1a90e258c806

'a' Module
  'b' Module
    'c'
    'garbage' ! 'unused0'
  'garbage' ! 'unused0'
""")
    assert push_down_modules(c, traversal="c") == c_mod


# ---------------------------------------------------------------------------- rust's complex case
def complex_case(batch_inner_0=(), batch_inner_1=(), batch_outer_0=(), batch_outer_1=(), separate_mod=False,
                 symbolic=True):
    """rust's get_complex_module_test: an inner module whose body uses a Symbol the outer module
    binds.  With ``symbolic=False`` its symbolic sizes are made concrete (0s=7, 4s=5, 3s=9, 5s=12)."""
    b = "".join(chr(ord("f") + i) for i in range(len(batch_inner_0)))

    def j(t):
        return ",".join(map(str, t))

    s0, s3, s4, s5 = ("0s", "3s", "4s", "5s") if symbolic else (7, 9, 5, 12)
    text = f"""
    'inner' Einsum az,bz,cl->bac
      'inner.sym_arg0' [{s0}, {s4}] Symbol a409cdc3-d962-4df1-8d1b-c5c8d8b50639
      'inner.concat' Concat 0
        'inner.sym_arg1' [3, {s4}] Symbol 02927290-fc4f-45b7-9822-267918e897d6
        'outer.sym_arg0' [7, {s4}] Symbol 6dcfaf1e-5e35-418a-ad88-3d79ae32096c
      'outer.sym_arg1' [{s3}, {s5}] Symbol ecf273f5-82c5-4fbf-8097-d9b1a250e035

    'inner.call' Module
      'inner'
      'inner.apply_inner' Einsum cd,{b}a->{b}ca ! 'inner.sym_arg0'
        'outer.sym_arg0'
        'inner.rand0' [{j(batch_inner_0 + (5,))}] Array rand
      'inner.rand1' [{j(batch_inner_1 + (3, 5))}] Array rand ! 'inner.sym_arg1'

    'add_inner' Add
      'inner.call'
      'inner.call'

    'outer' Module
      '{"add_inner" if separate_mod else "inner.call"}'
      'outer.rand0' [{j(batch_outer_0 + (7, 5))}] Array rand ! 'outer.sym_arg0'
      'outer.rand1' [{j(batch_outer_1 + (9, 12))}] Array rand ! 'outer.sym_arg1'
    """
    inner, inner_call, _, outer = parse_many(text)
    inner_batch = np.broadcast_shapes(batch_inner_0, batch_inner_1)
    outer_batch = np.broadcast_shapes(batch_outer_0, batch_outer_1)
    if symbolic:  # rust's asserts on the parsed shapes
        assert inner.shape == (10, C.symbolic_size(0), C.symbolic_size(3))
        assert inner_call.shape == inner_batch + (10, 7, C.symbolic_size(3))
    assert outer.shape == outer_batch + inner_batch + (10, 7, 9)
    outer = C.fill_random(outer, seed=3)
    return inner_call, outer


def value(c):
    return C.evaluate(c, dtype="float64")


# rust's test_complex_push_down: every batching of the inner and the outer module's arguments
RUST_BATCHES = [
    {}, {"batch_inner_0": (3,)}, {"batch_inner_0": (3, 7)}, {"batch_inner_1": (3,)}, {"batch_inner_1": (3, 7)},
    {"batch_inner_0": (3,), "batch_inner_1": (3,)}, {"batch_inner_0": (7,), "batch_inner_1": (7,)},
    {"batch_inner_0": (3,), "batch_inner_1": (7, 3)}, {"batch_inner_0": (7, 3), "batch_inner_1": (7, 3)},
    {"batch_inner_0": (7, 3), "batch_inner_1": (3,)}, {"batch_inner_0": (1, 7, 3), "batch_inner_1": (3,)},
    {"batch_outer_0": (3,)}, {"batch_outer_0": (3, 7)}, {"batch_outer_1": (3,)}, {"batch_outer_1": (3, 7)},
    {"batch_outer_0": (3,), "batch_outer_1": (3,)}, {"batch_outer_0": (7,), "batch_outer_1": (7,)},
    {"batch_outer_0": (3,), "batch_outer_1": (7, 3)}, {"batch_outer_0": (7, 3), "batch_outer_1": (7, 3)},
    {"batch_outer_0": (7, 3), "batch_outer_1": (3,)}, {"batch_outer_0": (1, 7, 3), "batch_outer_1": (3,)},
    {"batch_inner_0": (3,), "batch_outer_0": (3,)}, {"batch_inner_0": (3,), "batch_outer_0": (4,)},
    {"batch_inner_0": (3, 1), "batch_outer_0": (4,), "batch_outer_1": (6, 4)},
    {"batch_inner_0": (3, 2), "batch_inner_1": (2,), "batch_outer_0": (4,), "batch_outer_1": (6, 4)},
    {"batch_inner_1": (7,), "batch_outer_0": (4,), "batch_outer_1": (6, 4)},
    {"batch_inner_1": (3,), "batch_outer_0": (4,)}, {"batch_inner_1": (3,), "batch_outer_1": (4,)},
    {"batch_inner_0": (3,), "batch_outer_1": (4,)}, {"batch_inner_0": (3,), "batch_outer_1": (6, 4)},
]


@pytest.mark.parametrize("separate_mod", [False, True])
@pytest.mark.parametrize("batches", RUST_BATCHES, ids=lambda b: "-".join(
    f"{k[6:]}{''.join(map(str, v))}" for k, v in b.items()) or "none")
def test_rust_complex_push_down(batches, separate_mod):
    inner_call, outer = complex_case(**batches, separate_mod=separate_mod)
    want = value(outer)
    # the same circuit with its symbolic sizes written out has the same value (the same leaves)
    np.testing.assert_allclose(value(complex_case(**batches, separate_mod=separate_mod, symbolic=False)[1]),
                               want, rtol=1e-12)
    np.testing.assert_allclose(value(C.substitute_all_modules(outer)), want, rtol=1e-9)
    push = push_down_modules(outer)
    np.testing.assert_allclose(value(push), want, rtol=1e-9)
    check(push)
    # rust: push.get(Symbol) == set() (pushed all the way = substituted)
    assert distinct(push, Symbol) == [] and distinct(push, Module) == []
    assert push == push_down_modules(outer, flatten_modules=False)

    # rust: term_early_at="inner.concat": 2 Symbols, one flat Module (2 arguments), or two nested
    for flatten, n_modules in [(True, 1), (False, 2)]:
        push = push_down_modules(outer, traversal="inner.concat", flatten_modules=flatten)
        np.testing.assert_allclose(value(push), want, rtol=1e-9)
        mods = distinct(push, Module)
        assert len(distinct(push, Symbol)) == 2 and len(mods) == n_modules
        assert sum(len(m.spec.arg_specs) for m in mods) == 2

    # rust: none of remove_unused_inputs / elim_no_input_modules changes pushing all the way;
    # the noop callback (both False) keeps every argument: 4 between the two nested modules
    for remove, elim in [(False, False), (False, True), (True, False)]:
        for flatten in (True, False):
            assert push_down_modules(outer, flatten_modules=flatten, remove_unused_inputs=remove,
                                     elim_no_input_modules=elim) == push_down_modules(outer)
    push = push_down_modules(outer, traversal="inner.concat", flatten_modules=False, remove_unused_inputs=False,
                             elim_no_input_modules=False)
    mods = distinct(push, Module)
    assert len(mods) == 2 and sum(len(m.spec.arg_specs) for m in mods) == 4
    np.testing.assert_allclose(value(push), want, rtol=1e-9)

    # rust: skipping every module changes nothing; skipping 'outer' leaves it with its arguments
    assert push_down_modules(outer, skip_module={"outer", "inner.call"}) is outer
    push = push_down_modules(outer, skip_module="outer")
    assert type(push) is Module and push.spec.arg_specs == outer.spec.arg_specs
    assert len(distinct(push, Symbol)) == 2 and len(distinct(push, Module)) == 1
    np.testing.assert_allclose(value(push), want, rtol=1e-9)

    push = push_down_modules(outer, skip_module="inner.call")
    np.testing.assert_allclose(value(push), want, rtol=1e-9)
    # rust: one Module left, binding the inner module's Symbols
    (mod,) = distinct(push, Module)
    assert {a.symbol.name for a in mod.spec.arg_specs} == {a.symbol.name for a in inner_call.spec.arg_specs}
    assert len(distinct(push, Symbol)) == 2

    for end_depth in range(8):  # rust's demo: every depth keeps the value
        for flatten in (True, False):
            np.testing.assert_allclose(value(push_down_modules(outer, traversal=end_depth,
                                                               flatten_modules=flatten)), want, rtol=1e-9)


def test_rust_nested_update_arg():
    circ = parse("""
    'a' Module
      'b' Module
        'c' Module
          'add' Add
            'sym_a' [] Symbol 05c93da1-ac33-47eb-b215-d1a8e8438a02
            'sym_b' [] Symbol 5ae54c16-b570-4abd-ad37-f527c25494c1
            'sym_c' [] Symbol cb22836a-b5cb-4e65-969e-563958249e81
          'arg_c' [] Scalar 3 ! 'sym_c'
        'arg_b' Einsum ij,j->i ! 'sym_b'
          'within_arg' Module
            'add_within' Add
              'sym_d' [] Symbol fbb99b36-0809-4eae-ae10-7d38a90d1386
              'w' [3] Scalar 4
            'k' [7] Scalar 7 ! 'sym_d'
          'x' [3] Scalar 8
      'arg_a' [] Scalar 82.83 ! 'sym_a'
    """)
    want = value(circ)
    for kwargs in [{}, {"flatten_modules": False},
                   {"flatten_modules": False, "traversal": {"sym_a", "sym_d"}}]:
        np.testing.assert_allclose(value(push_down_modules(circ, **kwargs)), want)
    for flatten in (False, True):
        pushed = push_down_modules(circ, traversal={"sym_a", "sym_d", "add"}, skip_module={"a", "c"},
                                   flatten_modules=flatten)
        assert isinstance(pushed.get_unique("within_arg"), Add)
        np.testing.assert_allclose(value(pushed), want)


def test_pushing_past_a_skipped_module_that_rebinds_is_refused():
    # rust's demo: PushDownModulePushingPastModuleWhichOverridesSymError
    circ = parse("""
    'a' Module
      'add' Add
        'b' Module
          'sym' [] Symbol c9517c8e-0b5a-4ebf-94c8-6da413c9f5d1
          'b.arg' [] Scalar 1.2 ! 'sym'
        'sym'
      'a.arg' [3] Scalar 1.3 ! 'sym'
    """)
    with pytest.raises(PushDownModuleError, match="binds"):
        push_down_modules(circ, skip_module="b")
    np.testing.assert_allclose(value(push_down_modules(circ)), value(circ))


def test_pushed_all_the_way_is_substitution_up_to_names():
    _, outer = complex_case()
    assert C.strip_names(push_down_modules(outer)) == C.strip_names(C.substitute_all_modules(outer))


def test_deep_chain_inside_a_module():
    x = Symbol((2,), name="x")
    node = x
    for _ in range(3000):
        node = C.GeneralFunction("tanh", node)
    spec = C.ModuleSpec(node, [C.ModuleArgSpec(x)])
    m = Module(spec, C.Scalar(0.5, (2,), name="half"), name="deep")
    out = push_down_modules(m)
    assert distinct(out, Module) == [] and distinct(out, Symbol) == []
    np.testing.assert_allclose(value(out), value(m))


def keep_names(node, modules):
    return node.name


@pytest.mark.usefixtures("low_recursion_limit")
@pytest.mark.parametrize("depth, traversal", [
    (10_000, None),
    pytest.param(50_000, None, marks=pytest.mark.slow),
    pytest.param(50_000, 30_001, marks=pytest.mark.slow),  # stops at the Add of level 19,999
])
def test_tens_of_thousands_of_levels_push_down_without_recursion(depth, traversal):
    # the shared deep chain (tests/deep.py) as the body of a module binding its leaf, pushed with
    # 250 frames of Python stack to spare.  The oracle: the chain built again on the argument
    # (pushed all the way), or, stopped at a depth, a module around the part below it, which
    # substitutes to the same.
    x = Symbol((2,), name="x")
    arg = C.Array(np.array([0.5, -0.25], np.float32), name="arg")
    m = Module(C.ModuleSpec(build_deep_chain(depth, tag="deep.", leaf=x), [C.ModuleArgSpec(x)]), arg, name="deep")
    out = push_down_modules(m, traversal=traversal, namer=keep_names)
    by_hand = build_deep_chain(depth, tag="deep.", leaf=arg)
    if traversal is None:
        assert out.name == "deep" and out.children == by_hand.children
    else:
        (inner,) = distinct(out, Module)
        level = depth - traversal  # the Module is at depth 0, the chain's top (level depth - 1) at 1
        assert inner.body.name == f"deep.n{level}" and inner.args == (arg,)
        assert C.substitute_all_modules(out).children == by_hand.children


@RULE_SETTINGS
@given(data=st.data())
def test_push_down_keeps_the_value_of_generated_modules(data):
    circuit, inputs = data.draw(circuits_with_inputs(root_types=[Module], max_nodes=8, max_depth=4))
    order = circuit.toposort()
    names = sorted({n.name for n in order if n.name})
    stop = data.draw(st.none() | st.integers(0, 5) | st.sampled_from(names or [None]))
    flatten, remove, elim = data.draw(st.booleans()), data.draw(st.booleans()), data.draw(st.booleans())
    out = push_down_modules(circuit, traversal=stop, flatten_modules=flatten, remove_unused_inputs=remove,
                            elim_no_input_modules=elim)
    check(out)
    free = {n.hash for n in out.toposort() if type(n) is Symbol}
    assert_same(circuit, out, {s: v for s, v in inputs.items() if s.hash in free} or None)
    if stop is None:
        assert distinct(out, Module) == []


def test_three_levels_of_batched_modules_push_down_and_keep_their_layout():
    # each module batches its argument, and each inner argument uses the enclosing Symbols: the
    # value is [5 (m1), 4 (m2), 6 (m3), 2], outer batch axes outermost
    circ = C.fill_random(parse("""
'm1' Module
  'm2' Module
    'm3' Module
      'body3' Einsum i,i,i->i
        'a' [2] Symbol
        'b' [2] Symbol
        'c' [2] Symbol
      'c_arg' Add ! 'c'
        'rc' [6,2] Array rand
        'b'
    'b_arg' Add ! 'b'
      'rb' [4,2] Array rand
      'a'
  'ra' [5,2] Array rand ! 'a'
"""), seed=5)
    ra, rb, rc = (np.asarray(circ.get_unique(n).value, np.float64) for n in ("ra", "rb", "rc"))
    a = ra[:, None, None, :]
    b = rb[None, :, None, :] + a
    want = a * b * (rc[None, None, :, :] + b)
    assert circ.shape == (5, 4, 6, 2)
    np.testing.assert_allclose(value(circ), want, rtol=1e-12)
    for flatten in (True, False):
        for traversal in [None, "body3", "c_arg", "b_arg", *range(7)]:
            for skip, remove in [(None, True), ("m2", True), ("m3", True), ({"m2", "m3"}, True), (None, False),
                                 ("m3", False)]:
                push = push_down_modules(circ, traversal=traversal, skip_module=skip, flatten_modules=flatten,
                                         remove_unused_inputs=remove, elim_no_input_modules=remove)
                assert push.shape == circ.shape
                np.testing.assert_allclose(value(push), want, rtol=1e-12,
                                           err_msg=f"traversal={traversal} skip={skip} flatten={flatten}")
    assert distinct(push_down_modules(circ), Module) == []


def test_a_module_whose_body_is_its_symbol_substitutes_to_the_argument_unrenamed():
    # found by the property test above: 'arg bind:x' Module over its own Symbol, bound to a free
    # Symbol; renaming that Symbol after the module made it another, unbound Symbol
    free = Symbol((), name=None)
    arg = Symbol((), name="arg")
    m = Module(C.ModuleSpec(arg, [C.ModuleArgSpec(arg)]), free, name="arg bind:x")
    assert m.substitute() is free
    np.testing.assert_allclose(C.evaluate(Add(m, C.Scalar(1.0)), inputs={free: 2.0}), 3.0)


def test_substituting_keeps_a_bound_symbol_apart_from_a_free_one_alike():
    # found by the three-level test: when 'b' (bound by the outer module) is left only in the inner
    # module's unused argument, substituting the inner module first must not rebind the outer
    # module to the free Symbol 'a', alike in all but name
    m = parse("""
'outer' Module
  'inner' Module
    'a' [2] Symbol
    'c_arg' Add ! 'c' [2] Symbol
      'rc' [6,2] Scalar 1
      'b' [2] Symbol
  'b_arg' Add ! 'b'
    'rb' [4,2] Scalar 2
    'a'
""")
    a = np.array([3.0, 5.0])
    want = np.broadcast_to(a, (4, 6, 2))
    np.testing.assert_allclose(C.evaluate(m, inputs={"a": a}), want)
    np.testing.assert_allclose(C.evaluate(C.substitute_all_modules(m), inputs={"a": a}), want)
