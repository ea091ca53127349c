"""The rewrite engine: rules as data, rule sets, strategies, sharing, loops, traces, names."""

import collections
import time

import numpy as np
import pytest
from hypothesis import given, settings

from circuits import (
    Add,
    Array,
    Einsum,
    GeneralFunction,
    RewriteError,
    RewriteLoopError,
    Scalar,
    Symbol,
    count_nodes,
    toposort,
)
from circuits.backend import evaluate
from circuits.backend.symbolic import symbolic_equal
from circuits.testing import circuits_with_inputs
from circuits.text.parser import parse
from rewrites import (
    Rule,
    RuleSet,
    Trace,
    apply,
    at_root,
    bottom_up,
    check,
    dynamic,
    fixpoint,
    normalize,
    once,
    rule,
    seq,
    simp,
    top_down,
    when,
)
from rewrites.optimize import OPTIMIZE_RULES
from rewrites.rules import (
    SIMP_RULES,
    add_single_term,
    all_rules,
    einsum_identity,
    flatten_add,
    nest_add,
    remove_add_zeros,
)
from tests.deep import DEPTH, STEPS

from .rewrite_helpers import assert_same


def sym(name, shape=(2,)):
    return Symbol(shape, name=name)


def counting(rules):
    """The rules wrapped so that every call is logged as (rule name, node hash)."""
    calls = []

    def wrap(r):
        def fn(node):
            calls.append((r.name, node.hash))
            return r.fn(node)
        return Rule(fn, name=r.name, on=r.on, doc=r.doc)

    return RuleSet(*[wrap(r) for r in rules]), calls


# ---------------------------------------------------------------------------- rules as data
def test_rule_decorator_and_rule_sets():
    @rule(on=Add, example=("before", "after"))
    def my_rule(node):
        """Does nothing.

        More text."""
        return None

    assert isinstance(my_rule, Rule) and my_rule.name == "my_rule"
    assert my_rule.summary == "Does nothing." and my_rule.example == ("before", "after")
    assert my_rule(Add(sym("a"))) is None
    assert my_rule.applies_to(Add) and not my_rule.applies_to(Einsum)
    both = my_rule + flatten_add
    assert isinstance(both, RuleSet) and [r.name for r in both] == ["my_rule", "flatten_add"]
    assert [r.name for r in both + RuleSet(flatten_add, nest_add)] == ["my_rule", "flatten_add", "nest_add"]
    assert [r.name for r in [nest_add] + both] == ["nest_add", "my_rule", "flatten_add"]
    assert both["flatten_add"] is flatten_add and "my_rule" in both and nest_add not in both
    assert [r.name for r in both.without("my_rule")] == ["flatten_add"]
    assert both.for_type(Einsum) == () and both.for_type(Add) == (my_rule, flatten_add)
    with pytest.raises(KeyError, match="my_rule, flatten_add"):
        both["nope"]


def test_every_rule_has_a_docstring_and_an_example():
    rules = all_rules()
    assert len(rules) >= 20
    for r in rules:
        assert r.doc, f"rule {r.name} has no docstring"
        assert r.example, f"rule {r.name} has no before/after example"


def test_every_rule_module_exports_a_named_rule_set():
    """Each family of rewrites.rules exports RULES, a RuleSet named after its module (they compose
    with +, print their name and look a rule up by name), not a plain list."""
    import importlib
    import pkgutil

    import rewrites.rules

    families = [info.name for info in pkgutil.iter_modules(rewrites.rules.__path__) if not info.name.startswith("_")]
    assert len(families) >= 12
    for family in families:
        rules = importlib.import_module(f"rewrites.rules.{family}").RULES
        assert isinstance(rules, RuleSet) and rules.name == family, (family, rules)
        assert all(isinstance(r, Rule) for r in rules) and len(rules)


def test_the_optimize_rules_are_in_the_catalogue():
    """optimize's rules live in rewrites.rules, so the example test below covers them."""
    names = {r.name for r in all_rules()}
    assert {r.name for r in OPTIMIZE_RULES} <= names
    assert {"gather_of_log_softmax", "push_gather_through_function", "push_gather_through_einsum",
            "chunk_logsumexp"} <= names


@pytest.mark.parametrize("r", all_rules(), ids=lambda r: r.name)
def test_rule_example(r):
    """Parse ``before``, apply the rule once at the root (with its ``example_options``: a rule
    with parameters), print: that is ``after``.  Every example is then proved exact with sympy
    (int Symbols read as zeros) and, as well, evaluated in float64 on random values."""
    before, after = r.example
    node = parse(before)
    out = apply(at_root(r.with_options(**r.example_options)), node)
    assert out != node, f"{r.name} does not fire on its own example"
    assert out.to_text() == after
    check(out)
    assert out.shape == node.shape and out.dtype == node.dtype
    symbols = [n for n in toposort(node) if type(n) is Symbol]
    ints = {n: np.zeros(n.shape, n.dtype) for n in symbols if "int" in n.dtype}
    assert symbolic_equal(node, out, ints or None), f"{r.name}: before and after differ symbolically"
    rng = np.random.default_rng(0)
    assert_same(node, out, {n: ints.get(n, rng.standard_normal(n.shape)) for n in symbols} or None)


def test_rule_options():
    @rule(on=Scalar, example=("before", "after"), example_options={"by": 2.0})
    def scale(node, *, by=1.0):
        """Scalar v -> Scalar v * by."""
        return Scalar(node.value * by, node.shape)

    doubled = scale.with_options(by=2.0)
    assert doubled.name == "scale" and doubled.example == scale.example and doubled.doc == scale.doc
    assert doubled.example_options == {"by": 2.0}
    assert doubled(Scalar(3.0)).value == 6.0 and scale(Scalar(3.0)).value == 3.0
    trace = Trace()
    assert apply(at_root(doubled), Scalar(3.0), trace=trace).value == 6.0 and trace.rules() == ["scale"]


# ---------------------------------------------------------------------------- strategies
def test_bottom_up_top_down_once_at_root():
    a, b, c = sym("a"), sym("b"), sym("c")
    inner = Add(Add(a, b), c)
    node = Add(inner, a, name="y")
    assert apply(at_root(flatten_add), node).children == (Add(a, b), c, a)
    # bottom-up: the inner Add is flattened first, then the root sees a flat child
    assert apply(bottom_up(flatten_add), node).children == (a, b, c, a)
    # top-down: the root first (one level), then the children of its replacement, which here
    # include the Add(a, b) that came up from below: it has no Add child, so it stays
    assert apply(top_down(flatten_add), node).children == (Add(a, b), c, a)
    # once: only the first node (children first) where a rule applies
    assert apply(once(flatten_add), node).children == (Add(a, b, c), a)
    # a bare rule (or rule set) means normalize
    assert apply(flatten_add, node).children == (a, b, c, a)
    assert apply(seq(at_root(flatten_add), at_root(flatten_add)), node).children == (a, b, c, a)


def test_seq_and_fixpoint():
    a, b, c = sym("a"), sym("b"), sym("c")
    node = Add(Add(Add(a, b), c), a)
    one = at_root(flatten_add)
    assert apply(one >> one, node).children == (a, b, c, a)
    assert apply(fixpoint(one), node).children == (a, b, c, a)
    assert apply(fixpoint(bottom_up(SIMP_RULES)), Add(Add(a, Scalar(0.0)), name="y")) == a


def test_top_down_rewrites_the_replacement_children_not_the_replacement():
    a, b, c, d = sym("a"), sym("b"), sym("c"), sym("d")
    node = Add(a, b, c, d)
    # nest_add at the root gives Add(Add(a, b), c, d); the new child Add(a, b) has two terms
    assert apply(top_down(nest_add), node).children == (Add(a, b), c, d)


def test_each_distinct_node_tried_once_on_a_ladder():
    """x_{i+1} = Add(Einsum(x_i, 2), x_i): 2**40 root-to-leaf paths, 82 distinct nodes."""
    x0 = sym("x0", (3,))
    x = x0
    for _ in range(40):
        x = Add(Einsum.from_spec("a,->a", x, Scalar(2.0)), x)
    assert count_nodes(x) == 2 + 2 * 40  # x0, the shared Scalar 2, an Einsum and an Add per level

    never = Rule(lambda n: None, name="never")
    rules, calls = counting([never])
    apply(bottom_up(rules), x)
    assert len(calls) == count_nodes(x) and len(set(calls)) == len(calls)

    rules, calls = counting(SIMP_RULES)
    trace = Trace()
    start = time.perf_counter()
    out = apply(normalize(rules), x, trace=trace)
    elapsed = time.perf_counter() - start
    repeated = [k for k, v in collections.Counter(calls).items() if v > 1]
    assert not repeated, f"rules called twice on one node: {repeated[:5]}"
    assert elapsed < 30  # generous: an engine that followed paths would never finish
    # the whole ladder is 3**40 * x0
    assert out.spec == "a,->a" and out.children[0] == x0 and out.children[1].value == 3.0**40
    inputs = {x0: np.array([1.0, -2.0, 0.5])}
    np.testing.assert_allclose(evaluate(out, inputs, dtype="float64"), 3.0**40 * inputs[x0], rtol=1e-9)
    assert trace.counts()["dedupe_add_terms"] == 40


def test_shared_node_rewritten_once_everywhere():
    a, b = sym("a"), sym("b")
    shared = Add(Add(a, b))  # rewritten to Add(a, b)... then to itself named nothing
    node = Einsum.from_spec("a,a,a->a", shared, shared, GeneralFunction("exp", shared))
    rules, calls = counting([flatten_add, add_single_term])
    out = apply(normalize(rules), node)
    assert out.children[0] is out.children[1] is out.children[2].children[0] == Add(a, b)
    assert collections.Counter(h for _, h in calls)[shared.hash] == 1


# ---------------------------------------------------------------------------- loops and budgets
def test_normalize_loop_names_both_rules():
    node = Add(sym("a"), sym("b"), sym("c"))
    with pytest.raises(RewriteLoopError, match="nest_add") as e:
        apply(normalize([flatten_add, nest_add]), node)
    assert "flatten_add" in str(e.value)


def test_fixpoint_loop_names_both_rules():
    node = Add(sym("a"), sym("b"), sym("c"))
    with pytest.raises(RewriteLoopError, match="flatten_add") as e:
        apply(fixpoint(bottom_up([flatten_add, nest_add])), node)
    assert "nest_add" in str(e.value)


def test_step_budgets():
    @rule(on=Scalar)
    def count_up(node):
        """Scalar v -> Scalar v + 1 (never ends)."""
        return Scalar(node.value + 1, node.shape)

    with pytest.raises(RewriteLoopError, match="count_up"):
        apply(normalize(count_up, max_steps=500), Scalar(0.0))
    with pytest.raises(RewriteLoopError, match="max_steps=20"):
        apply(fixpoint(bottom_up(count_up), max_steps=20), Add(Scalar(0.0)))


def test_top_down_refuses_a_rule_that_puts_a_node_below_itself():
    @rule(on=Symbol)
    def wrap(node):
        """x -> x + 0 (keeps the node below its replacement)."""
        return Add(node, Scalar(0.0))

    with pytest.raises(RewriteLoopError, match="wrap"):
        apply(top_down(wrap), Add(sym("a"), sym("b")))
    with pytest.raises(RewriteLoopError, match="wrap"):
        apply(normalize(wrap), Add(sym("a"), sym("b")))


# ---------------------------------------------------------------------------- errors, trace, names
def test_rule_changing_shape_or_returning_junk_is_a_rewrite_error():
    @rule(on=Add)
    def shrink(node):
        """Wrong on purpose."""
        return Scalar(1.0)

    @rule(on=Add)
    def junk(node):
        """Wrong on purpose."""
        return 3

    node = Add(sym("a"), sym("b"), name="s")
    with pytest.raises(RewriteError, match=r"shrink[\s\S]*'s' Add[\s\S]*shape \[2\]"):
        apply(bottom_up(shrink), node)
    with pytest.raises(RewriteError, match="junk returned int for 's' Add"):
        apply(normalize(junk), node)

    @rule(on=Add)
    def to_float64(node):
        """Wrong on purpose: same shape, other dtype."""
        return Array(np.zeros(node.shape))

    with pytest.raises(RewriteError, match=r"to_float64[\s\S]*float32[\s\S]*float64"):
        apply(top_down(to_float64), node)


def test_trace_contents():
    a = sym("a")
    node = Add(Add(a, Scalar(0.0)), a, name="y")
    trace = Trace()
    out = apply(normalize(SIMP_RULES), node, trace=trace)
    assert trace.rules() == ["remove_add_zeros", "dedupe_add_terms"]
    first, second = trace
    assert first.before == Add(a, Scalar(0.0)) and first.after == a
    assert second.before == Add(a, a, name="y") and second.after == out
    assert out.name == "y" and out.spec == "a,->a"
    assert str(trace).splitlines() == [
        "remove_add_zeros: Add  ->  'a' [2] Symbol", "dedupe_add_terms: 'y' Add  ->  'y' Einsum a,->a",
    ]


def test_naming_rule():
    a, b = sym("a"), sym("b")
    w = Array(np.ones(2, np.float32), name="w")
    # the replacement of a named node takes its name...
    assert apply(flatten_add, Add(Add(a, b), a, name="n")).name == "n"
    # ...unless it has one (a named child that replaces its parent keeps its own)
    assert apply(add_single_term, Add(Add(a, b, name="inner"), name="outer")).name == "inner"
    # Arrays and Symbols are never renamed
    assert apply(add_single_term, Add(w, name="outer")) is w
    assert apply(remove_add_zeros, Add(a, Scalar(0.0), name="outer")) is a
    # an unnamed node that replaces a named one takes the name
    assert apply(add_single_term, Add(Add(a, b), name="outer")) == Add(a, b, name="outer")


@settings(max_examples=30, deadline=None)
@given(circuits_with_inputs(max_nodes=14))
def test_simp_keeps_value_never_renames_leaves_and_is_idempotent(case):
    circuit, inputs = case
    out = simp(circuit)
    check(out)
    assert out.shape == circuit.shape and out.dtype == circuit.dtype
    leaves = {n for n in toposort(circuit) if type(n) in (Array, Symbol)}
    assert {n for n in toposort(out) if type(n) in (Array, Symbol)} <= leaves
    assert simp(out) == out
    if circuit.dtype.startswith("float"):
        want = evaluate(circuit, inputs, dtype="float64")
        got = evaluate(out, inputs, dtype="float64")
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.usefixtures("low_recursion_limit")
def test_simp_on_a_50000_deep_chain(deep_chain):
    out = simp(deep_chain)  # removes every identity Einsum 'a->a' (and orders Add operands)
    identities = sum(1 for i in range(DEPTH) if STEPS[i % len(STEPS)] == "einsum")
    assert count_nodes(out) == count_nodes(deep_chain) - identities
    assert not any(isinstance(n, Einsum) for n in toposort(out))
    check(out)
    # the other drivers walk it without recursion too (fixpoint runs bottom_up twice)
    no_identities = apply(top_down(einsum_identity), deep_chain)
    assert count_nodes(no_identities) == count_nodes(out)
    assert apply(fixpoint(bottom_up(einsum_identity)), deep_chain) == no_identities
    assert simp(no_identities) == out


def test_check_finds_a_broken_node():
    a = Symbol.new((2,), name="a")
    node = Add(a, a)
    check(node)
    node.shape = (5,)  # tamper with a fresh (unshared) node
    from circuits import CircuitError

    with pytest.raises(CircuitError, match="rebuilding it gives another node"):
        check(node)


def test_rewrite_results_are_checked_values():
    a, b = sym("a", (2, 3)), sym("b", (3,))
    node = Add(Einsum.from_spec("ab,b->a", a, Add(b, Scalar(0.0))), Scalar(0.0), name="y")
    out = simp(node)
    assert out == Einsum.from_spec("ab,b->a", a, b, name="y")
    inputs = {a: np.arange(6.0).reshape(2, 3), b: np.array([1.0, 2.0, -1.0])}
    np.testing.assert_allclose(evaluate(out, inputs, dtype="float64"), inputs[a] @ inputs[b])


def test_simp_on_the_seed_model_keeps_value_and_names():
    models = pytest.importorskip("circuits.models")
    w = models.random_weights(0, vocab=11, d_model=8, n_heads=2, head_size=4, max_positions=16)
    tokens = np.random.default_rng(0).integers(0, 11, 8)
    circuit = models.attn_only(w, tokens)
    trace = Trace()
    out = simp(circuit, trace=trace)
    check(out)
    assert count_nodes(out) < count_nodes(circuit) and len(trace) > 0
    arrays = lambda c: {n.name for n in toposort(c) if type(n) is Array}  # noqa: E731
    assert arrays(out) <= arrays(circuit)
    # named intermediate results survive (flatten keeps named children)
    names = {n.name for n in toposort(out)}
    assert {"t.loss", "log_probs", "b0.a", "a.attn_probs"} <= names
    np.testing.assert_allclose(evaluate(out, dtype="float64"), evaluate(circuit, dtype="float64"), rtol=1e-9)


# ---------------------------------------------------------------------------- one firing protocol
@pytest.mark.parametrize("make", [
    at_root, once, bottom_up, top_down, normalize, fixpoint,
    lambda rules: top_down(fixpoint(at_root(rules))),
    lambda rules: bottom_up(at_root(rules)),
    lambda rules: dynamic(lambda root: bottom_up(when(lambda n: n is not None, rules))),
], ids=["at_root", "once", "bottom_up", "top_down", "normalize", "fixpoint", "top_down_at_node",
        "bottom_up_at_node", "dynamic_when"])
def test_every_driver_fires_rules_the_same_way(make):
    """Each driver checks, names and traces a firing alike (one implementation: Run.fire)."""
    @rule(on=Add)
    def shrink(node):
        """Wrong on purpose."""
        return Scalar(1.0)

    node = Add(sym("a"), sym("b"), name="s")
    with pytest.raises(RewriteError, match=r"rule shrink changed a node's shape or dtype[\s\S]*'s' Add"):
        apply(make(shrink), node)
    trace = Trace()
    out = apply(make(remove_add_zeros), Add(sym("a"), Scalar(0.0), name="s"), trace=trace)
    assert out == sym("a") and trace.rules() == ["remove_add_zeros"]
    trace = Trace()
    out = apply(make(flatten_add), Add(Add(sym("a"), sym("b")), sym("c"), name="s"), trace=trace)
    assert out == Add(sym("a"), sym("b"), sym("c"), name="s") and trace.rules() == ["flatten_add"]


def test_rules_are_fired_only_by_the_engine():
    """No module of rewrites but the engine calls a rule's function, and the engine does not
    import the strategies (no import cycle)."""
    import ast
    import pathlib

    import rewrites

    root = pathlib.Path(rewrites.__file__).parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        calls_fn = [n.lineno for n in ast.walk(tree)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "fn"]
        if path.name != "engine.py" or path.parent != root:
            assert not calls_fn, f"{path} calls a rule's fn at lines {calls_fn}: fire it with Run.fire"
    engine = ast.parse((root / "engine.py").read_text())
    imported = {n.module for n in ast.walk(engine) if isinstance(n, ast.ImportFrom)}
    assert not any(m and "strateg" in m for m in imported)


def test_top_down_with_a_strategy_at_each_node():
    a, b, c, d = sym("a"), sym("b"), sym("c"), sym("d")
    node = Add(Add(Add(a, b), c), Add(Add(c, d), a), name="s")
    # top_down(rules) fires once at the root, then visits the replacement's children
    assert apply(top_down(flatten_add), node).children == (Add(a, b), c, Add(c, d), a)
    # top_down(fixpoint(at_root(rules))) rewrites the root until nothing applies first
    trace = Trace()
    out = apply(top_down(fixpoint(at_root(flatten_add))), node, trace=trace)
    assert out.children == (a, b, c, c, d, a) and trace.rules() == ["flatten_add"] * 2
    assert repr(top_down(fixpoint(at_root(flatten_add)))) == (
        "top_down(fixpoint(at_root(flatten_add), max_steps=100))")

    @rule(on=Scalar)
    def count_up(node):
        """Scalar v -> Scalar v + 1 (never ends)."""
        return Scalar(node.value + 1, node.shape)

    with pytest.raises(RewriteLoopError, match=r"count_up[\s\S]*max_steps=7|max_steps=7[\s\S]*count_up"):
        apply(top_down(fixpoint(at_root(count_up), max_steps=7)), Add(Scalar(0.0)))


def test_when_and_dynamic():
    a, b = sym("a"), sym("b")
    inner = Add(a, b)
    made = []

    def unshared_only(root):  # flatten an Add only into a child that no other node reads
        made.append(root)
        parents = collections.Counter(c.hash for n in toposort(root) for c in set(n.children))
        return bottom_up(when(lambda n: parents[n.children[0].hash] < 2, flatten_add))

    shared = Einsum.from_spec("a,a->a", Add(inner, a), inner)
    assert apply(dynamic(unshared_only), shared) == shared
    alone = Einsum.from_spec("a,a->a", Add(inner, a), b)
    assert apply(dynamic(unshared_only), alone).children[0] == Add(a, b, a)
    # inside fixpoint the strategy is built afresh for every pass
    made.clear()
    apply(fixpoint(dynamic(unshared_only)), alone)
    assert len(made) == 2 and made[1] != made[0]
    with pytest.raises(TypeError, match="dynamic.*built a RuleSet"):
        apply(dynamic(lambda root: RuleSet(flatten_add)), shared)


def test_a_guarded_rule_keeps_its_options():
    from rewrites.rules.chunking import chunk_logsumexp

    x, w = Symbol((3, 4), name="x"), Symbol((6, 4), name="w")
    lse = GeneralFunction("logsumexp", Einsum.from_spec("sh,vh->sv", x, w))
    (guarded,) = when(lambda n: True, chunk_logsumexp)
    assert guarded(lse) is None  # too small to chunk by default
    assert len(guarded.with_options(chunks=3)(lse).children[0].children) == 3
    (never,) = when(lambda n: False, chunk_logsumexp)
    assert never.with_options(chunks=3)(lse) is None
