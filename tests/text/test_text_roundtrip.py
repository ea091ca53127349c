"""Round trip: ``parse(to_text(c, **options), store=store_of(c)) == c`` over generated DAGs of
every node type (text plus its tensors is lossless; the text alone parses to placeholders that
print the same, see ``circuits.testing.roundtrip``).

Two generators: the public ``circuits.testing.dags`` strategy, and a local one that draws
nodes from a pool of already-built nodes (so sharing is real) with names that need escapes,
Symbols with dtypes and uuids, Tags, NaN/inf Scalars and hash-only placeholder Arrays.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as C
from circuits import Add, Array, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag
from circuits.testing import dags as public_circuits
from circuits.testing import store_of
from circuits.text import parse, parse_many, print_many, to_text

TRICKY_NAMES = ("x", "w", "it's", "a\\b", "new\nline\r", "# hash", "", " sp ", "ünï∑", "7", "7 'x'",
                "\x1b[1m", "~ y", "...", "[2]", "Add")
name_strategy = st.one_of(st.none(), st.sampled_from(TRICKY_NAMES), st.text(max_size=4))

OPTIONS = st.sampled_from([
    {}, dict(tree=True), dict(color=True), dict(comments=True, shapes=True), dict(max_indent=1),
    dict(max_indent=2, tree=True), dict(max_indent=3, color=True, comments=True),
])

# Every node has one of these shapes, so any of them can be children of an Add.
SHAPES = ((), (3,), (2, 3))


@st.composite
def pool_dags(draw, max_steps=14):
    """A DAG built step by step; each step's children come from the pool of earlier nodes."""
    pool = {s: [] for s in SHAPES}

    def name():
        return draw(name_strategy)

    def pick(shape):
        options = pool[shape]
        return options[draw(st.integers(0, len(options) - 1))]

    def leaf(shape):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            value = draw(st.one_of(st.floats(width=32), st.sampled_from([0.0, -0.0, 1e-5, -1e4, 1e300])))
            if value != value:  # the text keeps NaN, not its sign and payload bits
                value = float("nan")
            return Scalar(value, shape, name=name())
        if kind == 1:
            dtype = draw(st.sampled_from(["float32", "float64", "int64", "bool"]))
            uid = draw(st.one_of(st.none(), st.uuids()))
            return Symbol(shape, name=name(), dtype=dtype, uuid=uid)
        if kind == 2:
            # Placeholders that share name and hash are one interned node whatever their shape
            # (Array identity is name + hash), so the digest encodes the shape.
            digest = draw(st.text("0123456789abcdef", min_size=1, max_size=20)) + f"{len(shape):x}{sum(shape):03x}"
            return Array.placeholder(shape, digest, name=name())
        value = draw(st.integers(-3, 3))
        return Array(np.full(shape, value, np.float32), name=name())

    for s in SHAPES:
        node = leaf(s)
        pool[node.shape].append(node)
    last = None
    for _ in range(draw(st.integers(1, max_steps))):
        op = draw(st.integers(0, 9))
        s = draw(st.sampled_from(SHAPES))
        if op == 0:
            node = leaf(s)
        elif op == 1:
            kids = [pick(draw(st.sampled_from(SHAPES))) for _ in range(draw(st.integers(0, 3)))]
            node = Add(*kids, name=name())
        elif op == 2:
            fn = draw(st.sampled_from(["exp", "tanh", "relu", "sigmoid"]))
            node = GeneralFunction(fn, pick(s), name=name())
        elif op == 3:
            spec, shapes = draw(st.sampled_from([
                ("ab->b", [(2, 3)]), ("a->", [(3,)]), ("ab,b->ab", [(2, 3), (3,)]), ("->", []),
                (",a->a", [(), (3,)]), ("ab,ab->", [(2, 3), (2, 3)]), ("ba->a", [(2, 3)]),
            ]))
            node = Einsum.from_spec(spec, *[pick(sh) for sh in shapes], name=name())
        elif op == 4:
            if s == (2, 3):
                index = draw(st.sampled_from([(0,), (slice(None, None, -1),), (np.array([1, 0]),),
                                              (slice(0, 2), slice(None)), (-1, slice(None, None, 1))]))
            elif s == (3,):
                index = draw(st.sampled_from([(np.array([2, 0, 1]),), (slice(-3, None),), (slice(None),), ()]))
            else:
                index = ()
            node = Index(pick(s), index, name=name())
        elif op == 5:
            spec = {(): " -> ", (3,): "a -> a", (2, 3): draw(st.sampled_from(["a b -> a b", "(a) b -> a b"]))}[s]
            node = Rearrange(pick(s), spec, name=name())
        elif op == 6 and s == (2, 3):
            c = pick(s)
            node = Concat(Index(c, (slice(0, 1),)), Index(c, (slice(1, None),)), axis=0, name=name())
        elif op == 6:
            node = Concat(pick((3,)), axis=-1, name=name())
        elif op == 7:
            node = Tag(pick(s), draw(st.uuids()), name=name())
        else:
            node = pick(s).rename(name())
        pool[node.shape].append(node)
        last = node
    return last, [n for s in SHAPES for n in pool[s]]


@settings(max_examples=60, deadline=None)
@given(pool_dags(), OPTIONS)
def test_roundtrip_pool_dags(case, options):
    circuit, _ = case
    text = to_text(circuit, **options)
    assert parse(text, store=store_of(circuit)) == circuit
    assert to_text(parse(text), **options) == text


@settings(max_examples=40, deadline=None)
@given(pool_dags(), st.data())
def test_roundtrip_several_roots(case, data):
    _, pool = case
    roots = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
    options = data.draw(OPTIONS)
    text = print_many(roots, **options)
    assert parse_many(text, store=store_of(*roots)) == roots
    # Nothing is printed twice: each distinct node has exactly one defining line.
    definitions = [l for l in text.split("\n") if _is_definition(l)]
    assert len(definitions) == len(C.toposort(*roots))


def _is_definition(line):
    from circuits.text.lexer import read_line

    parsed = read_line(line, 1)
    return parsed is not None and parsed[5] is not None


@settings(max_examples=40, deadline=None)
@given(pool_dags())
def test_names_off_roundtrips_to_stripped(case):
    circuit, _ = case
    assert parse(to_text(circuit, names=False), store=store_of(C.strip_names(circuit))) == C.strip_names(circuit)


@settings(max_examples=50, deadline=None)
@given(public_circuits(max_nodes=14, names=TRICKY_NAMES), OPTIONS)
def test_roundtrip_public_strategy(circuit, options):
    text = to_text(circuit, **options)
    assert parse(text, store=store_of(circuit)) == circuit
    assert to_text(parse(text), **options) == text
