"""rust_circuit's text syntax, read as its parser (circuit_base/src/parsing.rs) means it, and the
``rust=True`` print option whose output its line grammar accepts."""

import math
import re

import numpy as np
import pytest

import circuits as C
from circuits.errors import ParseError
from circuits.text import parse, parse_many, to_text


def test_indentation_is_measured_from_the_first_node_line():
    text = """
        # a comment
        0 Add
          1 [2] Scalar 1.5
          2 [2] Scalar 2
    """
    c = parse(text)
    np.testing.assert_array_equal(C.evaluate(c), [3.5, 3.5])
    with pytest.raises(ParseError, match="less indented than the first node line"):
        parse("    0 Add\n  1 [2] Scalar 1")


def test_repeat_lines_restate_the_node():
    c = parse("0 Add\n  1 [2] Scalar 3\n  1 Scalar\n  1 [2] Scalar 3\n  1")
    assert len(c.children) == 4 and len({k.hash for k in c.children}) == 1
    np.testing.assert_array_equal(C.evaluate(c), [12.0, 12.0])
    with pytest.raises(ParseError, match="another shape"):
        parse("0 Add\n  1 [2] Scalar 3\n  1 [3] Scalar")
    with pytest.raises(ParseError, match="cannot have children"):
        parse("0 Add\n  1 Add\n    2 [] Scalar 1\n  1 Add\n    2")


def test_two_names_and_autoname_mark():
    c = parse("'sum' 'total' AD Add\n  'x' 'ex' [2] Scalar 1\n  'x'")
    assert c.name == "total" and [k.name for k in c.children] == ["ex", "ex"]
    assert c.children[0] is c.children[1]


def test_only_child_marker_and_rust_arrows():
    arrows = """0 Add
├‣1 Add
│ ▼
│ 2 [1] Scalar 0.7
└‣3 Add
  ├‣4 [1] Scalar 0.5
  └‣5 [1] Scalar 6.3"""
    plain = "0 Add\n  1 Add\n    2 [1] Scalar 0.7\n  3 Add\n    4 [1] Scalar 0.5\n    5 [1] Scalar 6.3"
    assert parse(arrows) == parse(plain)
    assert parse("0 Add\n▼\n1 [1] Scalar 0.7") == parse("0 Add\n  1 [1] Scalar 0.7")


def test_named_axes_underscored_sizes_trailing_comma():
    c = parse("'a' [small:1, large:3,] Scalar 2")
    assert c.shape == (1, 3)
    assert parse("'b' [1_000] Scalar 0").shape == (1000,)
    with pytest.raises(ParseError):
        parse("'b' [1__000] Scalar 0")


@pytest.mark.parametrize("rust, einops", [
    ("(a:2 b) -> a:2 b", lambda x: x.reshape(2, 3)),
    ("() a -> 4 (a 2)", lambda x: np.repeat(np.repeat(x.reshape(1, 1, 6), 4, 0).reshape(4, 6, 1), 2, 2).reshape(4, 12)),
    ("a:6 -> () a:6", lambda x: x.reshape(1, 6)),
])
def test_rust_rearrange_specs_against_numpy(rust, einops):
    x = np.arange(6, dtype=np.float32)
    inp = x.reshape(1, 6) if rust.startswith("()") else x
    shape = ",".join(map(str, inp.shape))
    c = parse(f"0 Rearrange {rust}\n  'x' [{shape}] Array rand")
    got = C.evaluate(c.update("x", lambda n: C.Array(inp, name="x")))
    np.testing.assert_array_equal(got, einops(x))
    assert parse(to_text(c)) == parse(to_text(c))  # (prints in our form and parses back)


@pytest.mark.parametrize("spec, shape, einops", [
    # rust's '()' unit with einops-style sizes after the spec (issue 23: refused after rust specs
    # were read, since '()' sent the whole payload to rust's reading, which has no 'name=size')
    ("a -> () a a=22", (22,), lambda x: x.reshape(1, 22)),
    ("() a -> n0 (a n1) n0=4 n1=2", (1, 3),
     lambda x: np.repeat(np.repeat(x.reshape(1, 3, 1), 4, 0), 2, 2).reshape(4, 6)),
    ("(a:2 b) -> b () a a=2", (6,), lambda x: x.reshape(2, 3).T.reshape(3, 1, 2)),
])
def test_rust_unit_axes_with_trailing_sizes(spec, shape, einops):
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    c = parse(f"0 Rearrange {spec}\n  'x' [{','.join(map(str, shape))}] Symbol")
    np.testing.assert_array_equal(C.evaluate(c.update("x", lambda n: C.Array(x, name="x"))), einops(x))
    assert parse(to_text(c)) == c  # prints in our form ('1' units, sizes after) and reads back
    assert parse(to_text(c, rust=True)) == c  # and in rust's


def test_rust_spec_trailing_size_disagreeing_with_inner_size():
    with pytest.raises(ParseError, match="axis a has sizes 2 and 3"):
        parse("0 Rearrange (a:2 b) -> b () a a=3\n  'x' [6] Array rand")


def test_fancy_einsum_against_numpy():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 4))
    c = parse("0 Einsum fancy: first second, first third -> second third\n  'a' [2,3] Array rand\n  'b' [2,4] Array rand")
    c = c.update("a", lambda n: C.Array(a.astype(np.float32), name="a")).update(
        "b", lambda n: C.Array(b.astype(np.float32), name="b"))
    np.testing.assert_allclose(C.evaluate(c), np.einsum("ij,ik->jk", a, b), rtol=1e-5)


def test_random_arrays_and_symbols():
    text = "0 Add\n  'r' [3,2] Array rand\n  's' [3,2] Array"
    one, two = parse(text, seed=5), parse(text, seed=5)
    assert one == two and parse(text, seed=6) != one
    r, s = (np.asarray(k.value) for k in one.children)
    assert r.shape == (3, 2) and not np.array_equal(r, s)
    a, b = parse_many("'x' [2] Symbol rand\n'y' [2] Symbol rand")
    assert a.uuid is not None and b.uuid is not None and a.uuid != b.uuid


@pytest.mark.parametrize("name, ref, xs", [
    ("step", lambda v: 1.0 if v > 0 else 0.0, [-2.0, 0.0, 0.5]),
    ("log_exp_p_1", lambda v: math.log(math.exp(v) + 1), [-3.0, 0.0, 2.5]),
    ("gaussian_pdf", lambda v: math.exp(-v * v / 2) / math.sqrt(2 * math.pi), [-1.0, 0.0, 2.0]),
    ("gaussian_cdf", lambda v: (1 + math.erf(v / math.sqrt(2))) / 2, [-1.0, 0.0, 2.0]),
    ("logit", lambda v: math.log(v / (1 - v)), [0.1, 0.5, 0.8]),
])
def test_rust_function_names(name, ref, xs):
    c = parse(f"0 GeneralFunction {name}\n  'x' [3] Array rand")
    c = c.update("x", lambda n: C.Array(np.array(xs, np.float32), name="x"))
    np.testing.assert_allclose(C.evaluate(c, dtype="float64"), [ref(v) for v in xs], rtol=1e-6, atol=1e-7)


# rust's line grammar (parsing.rs), transcribed: identifier, optional name, AD, shape, variant, extra.
_RUST_LINE = re.compile(
    r"^([\s│└├‣─]*)(?:(\d+)|'((?:(?:\\')?[^']*)*)')(?: \s*'((?:(?:\\')?[^']*)*)')?( \s*AD)?"
    r"(?: \s*\[\s*((?:[^\s:\[\]]*\s*:\s*)?[0-9s*]+\s*,\s*)*(?:(?:[^\s:\[\]]*\s*:\s*)?[0-9s*]+\s*)?\])?"
    r"(?: \s*([a-zA-Z]+))?(?: \s*(.*?))?(?:[\s│└├‣─]*)(?:#.*?)?$")
_RUST_REARRANGE = re.compile(r"^[\w:() ]*->[\w:() ]*$")


def test_rust_print_option_writes_rust_grammar():
    x = C.Symbol((6, 3), name="x", uuid="00000000-0000-0000-0000-000000000001")
    r = C.Rearrange(x, "(h d) s -> h s d 1", h=2)
    e = C.GeneralFunction("exp", r)
    c = C.Add(e, e, C.Scalar(1.0), name="z")
    text = to_text(c, rust=True)
    assert "(h:2 d) s -> h:2 s d ()" in text and "float32" not in text
    for line in text.split("\n"):
        m = _RUST_LINE.match(line)
        assert m is not None, line
        if m.group(7) == "Rearrange":
            assert _RUST_REARRANGE.match(m.group(8)), line
    assert parse(text) == c
    deep = x
    for i in range(80):
        deep = C.GeneralFunction("exp", deep)
    assert "~" not in to_text(deep, rust=True) and parse(to_text(deep, rust=True)) == deep


RUST_COMMENTED = [  # rust_circuit's test_rust_printing_comments: rust parses all to one circuit
    """
0 [5, 3, 6] Add
  1 [3, 1] Scatter [0:2,0:1]
    2 [2, 1] Scalar 1.0
  10 [5, 3, 6] Scatter [0:5,0:3,0:3]
    4 '# my name' [5, 3, 3] Concat 0
      5 '#\\\\'\\\\' [2, 3, 3] Scalar 1.2
      6 '\\' hi\\\\' [3, 3, 3] Scalar 1.2""",
    """
        # comment before
0 [5, 3, 6] Add
  1 [3, 1] Scatter [0:2,0:1] # comment
# comment mid
    2 [2, 1] Scalar 1.0
  10 [5, 3, 6] Scatter [0:5,0:3,0:3]###
    4 '# my name' [5, 3, 3] Concat 0#dfj
      5 '#\\\\'\\\\' [2, 3, 3] Scalar 1.2      #  sldkj#*$&fstuf
      6 '\\' hi\\\\' [3, 3, 3] Scalar 1.2""",
]


def test_quoted_names_read_as_rusts_pattern_reads_them():
    # rust's name pattern keeps a quote that follows a backslash inside the name, then replaces
    # \' by ' and \\ by \: its test's '#\\'\\' is the name #\'\ (a plain Python reference below)
    first, second = (parse(t) for t in RUST_COMMENTED)
    assert first == second
    concat = first.children[1].children[0]
    raw = "#\\\\'\\\\"
    assert [k.name for k in concat.children] == [raw.replace("\\'", "'").replace("\\\\", "\\"), "' hi\\"]
    assert concat.children[0].name == "#\\'\\"
    assert parse(first.to_text()) == first  # and this format's escapes write it back
    with pytest.raises(ParseError):  # a name whose quote is never closed is still an error
        parse("5 '\\\\'\\\\ [2] Scalar 1")


def test_a_repeated_complete_leaf_line_is_the_same_node():
    # rust's test_module_pusher_naming_edge_cases: two "'my_arg' [] Scalar 3874" lines are one node
    # (one random draw for 'Array rand'), so the later reference by name is not ambiguous
    b, c = parse_many("'b' Add\n  'x' [2] Array rand\n  'x' [2] Array rand\n'c' Add\n  'x'")
    assert b.children[0] is b.children[1] is c.children[0]
    with pytest.raises(ParseError, match="2 nodes are named 'x'"):  # two different nodes: ambiguous
        parse_many("'b' Add\n  'x' [2] Scalar 1\n  'x' [2] Scalar 2\n'c' Add\n  'x'")


def test_child_info_may_carry_a_comment():
    m = parse("""
'm' Module
  'body' Add
    'x' [0s] Symbol
  'arg' [3] Scalar 2 ! 'x' ftt # a commenter's comment
""")
    assert m.spec.arg_specs[0].flags == "ftt" and m.shape == (3,)


def test_rust_symbolic_sizes_are_rusts_ints_and_four_factors_fit():
    # rust's test_expand_symbolic / test_multiple_symbolic_product: the printed forms it asserts
    a, b, d = parse_many("""
    'a' [0s*0s*1s*3s] Symbol 07a8025a-d8ba-4c57-946d-cd7cc7e78a66
    'b' Rearrange a b c -> (a b c)
      'c' [1s, 3s, 1s] Symbol 0b108f80-b37f-4e2c-821f-45cbedcbde75
    'd' Rearrange a c -> (a c)
      'e' [1s, 1s] Symbol 3f8aaf28-58f8-44fc-8dbc-497844a5a837
    """)
    assert C.symbolic_size(0) == 10007 and C.symbolic_size(255) == 12437  # rust's symbolic_sizes()
    assert a.to_text(rust=True) == "'a' [0s*0s*1s*3s] Symbol 07a8025a-d8ba-4c57-946d-cd7cc7e78a66"
    assert b.to_text(rust=True, shapes=True) == (
        "'b' [1s*1s*3s] Rearrange a b c -> (a b c)\n  'c' [1s,3s,1s] Symbol 0b108f80-b37f-4e2c-821f-45cbedcbde75")
    # rust prints 'd' as 'a b -> (a b)' (its specs hold axis numbers, lettered on printing); ours
    # keeps the text's axis names, so only the shape is rust's here
    assert d.to_text(rust=True, shapes=True).startswith("'d' [1s*1s] Rearrange a c -> (a c)")
    for c in (a, b, d):
        assert parse_many(c.to_text(rust=True)) == [c] and parse_many(c.to_text()) == [c]
    with pytest.raises(ParseError, match="at most four symbolic factors"):
        parse("'x' [0s*0s*1s*3s*4s] Symbol")
    # a symbolic size inside a rust Rearrange spec prints symbolic
    x = C.Rearrange(C.Symbol((C.symbolic_size(1),), name="x"), "a -> a b", b=C.symbolic_size(2))
    assert "a -> a b:2s" in x.to_text(rust=True)
    assert parse(x.to_text(rust=True)) == x


class _Tensors:
    """A store of tensors by hash (the parser's store protocol: find a prefix, get the value)."""

    def __init__(self, tensors):
        self.tensors = tensors

    def find(self, prefix):
        found = [h for h in self.tensors if h.startswith(prefix)]
        return found[0] if len(found) == 1 else None

    def get(self, full):
        return self.tensors[full]


def test_index_tensor_literals_read_from_the_store():
    # rust_circuit's test_print_tensor_index: Index(Scalar(1.0, (10, 10)), (tensor, 0)) prints so
    text = "0 [6] Index [t292d9fdb22 [6],0]\n  1 [10,10] Scalar 1"
    idx = np.array([1, 2, 3, 3, 2, 1])
    c = parse(text, store=_Tensors({"292d9fdb22aa": idx}))
    assert c.shape == (6,)
    np.testing.assert_array_equal(c.index[0], idx)
    x = np.arange(100.0).reshape(10, 10)
    patched = C.Index(C.Array(x, name="x"), c.index)
    np.testing.assert_allclose(C.evaluate(patched, dtype="float64"), x[idx, 0])
    assert parse(c.to_text()) == c  # printed back with its ints inline
    with pytest.raises(ParseError, match=r"index tensor t292d9fdb22 \[6\] is not in the store \(no store="):
        parse(text)
    with pytest.raises(ParseError, match="not 6 ints"):
        parse(text, store=_Tensors({"292d9fdb22": np.arange(5)}))
    with pytest.raises(ParseError, match="is not an index tensor"):
        parse("0 [6] Index [tzz [6],0]\n  1 [10,10] Scalar 1")


def test_unchecked_repeats_read_rusts_bijection_false_prints():
    # rust's demos parse their printed GPT-2 with on_repeat_check_info_same=False: '8 tok_embeds'
    text = "0 Add\n  8 'tok_embeds' [2] Scalar 1\n  1 Add\n    8 tok_embeds\n    8 [3] Scalar 9"
    with pytest.raises(ParseError):
        parse(text)  # checked (the default): 'tok_embeds' is no node type, and [3] is not [2]
    c = parse(text, check_repeats=False)
    emb = c.children[0]
    assert c.children[1].children[0] is emb and c.children[1].children[1] is emb
    with pytest.raises(ParseError, match="unknown node type 'tok_embeds'"):  # 9 is no earlier node
        parse("0 Add\n  9 tok_embeds", check_repeats=False)


def test_reference_circuits_as_rusts_tests_pass_them():
    # rust's test_rust_printing_bijection_ref: 'asdfadsf' names a circuit given to the parser
    referred = C.Scalar(1.0, (2, 1), name="asdfadsf_the_referred")
    c = parse("""
0 [5, 3, 6] Add
  1 [3, 1] Scatter [0:2,0:1]
    'asdfadsf'
  10 [5, 3, 6] Scatter [0:5,0:3,0:3]
    4 [5, 3, 3] Concat 0
      5 'sc1' [2, 3, 3] Scalar 1.0
      6 'sc2' [3, 3, 3] Scalar 1.0""", references={"asdfadsf": referred})
    assert c.children[0].children[0] is referred
    want = np.zeros((5, 3, 6))
    want[:, :2, :] += 1  # the [3,1] Scatter (ones in rows 0-1) broadcast against [5,3,6]
    want[:5, :3, :3] += 1
    np.testing.assert_allclose(C.evaluate(c, dtype="float64"), want)
    # rust's test_probs_dtype: a DiscreteVar over int values is an int variable
    int_vals = C.Array(np.arange(100), name="int_vals")
    v = parse("""
    'int_var' DiscreteVar
      'int_vals'
      'group' Tag 2ef9f1ac-28bb-4bed-ab7b-09b9050483ac
        'uniform_probs' [100] Scalar 0.01
    """, references=[int_vals])
    assert v.dtype == "int64" and v.shape == ()
