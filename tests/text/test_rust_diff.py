"""diff_circuits: rust_circuit's text diff (``nb_operations/src/diff.rs``), checked on its demo's
circuits and against a plain recursive transcription of rust's algorithm written here."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits import Add, Scalar, Symbol
from circuits.testing import dags
from circuits.text import parse, to_text
from circuits.text.rust_diff import diff_circuits, self_hash

from .rust_demo import DEMO as ORIG  # rust's demo circuit

LEGEND = "# legend: same: Same as original, changed: Children changed, new: New, removed: Removed"

def test_rusts_demo_symbol_renamed():
    # rust's printing_parsing demo: orig_circuit.update("sym2", lambda _: P("'sym3' [2] Symbol"))
    new = ORIG.update("sym2", lambda _: parse("'sym3' [2] Symbol"))
    assert diff_circuits(new, ORIG) == """'a0' Add # changed 0
  'a1' Add # changed 1
    'sym1' [2] Symbol # same 2
    'sym3' [2] Symbol # new
    'sym2' [2] Symbol # removed
  'a2' Add # changed 3
     # same 2
    'sym3' [2] Symbol # new
    'sym2' [2] Symbol # removed
    'sym3' [2] Symbol # new
    'sym2' [2] Symbol # removed
""" + LEGEND


def test_rusts_demo_symbol_replaced_by_a_scalar():
    new = ORIG.update("sym2", lambda _: parse("'sc0' [2] Scalar 1"))
    lines = diff_circuits(new, ORIG, print_legend=False).split("\n")
    assert lines[3:5] == ["    'sc0' [2] Scalar 1 # new", "    'sym2' [2] Symbol # removed"]
    assert lines.count("     # same 2") == 1  # the shared pair (sym1, sym1) is written once, then referred to


def test_equal_circuits_are_one_same_subtree():
    text = diff_circuits(ORIG, ORIG, print_legend=False)
    body = to_text(ORIG).split("\n")
    assert text.split("\n") == [body[0] + " # same 0"] + body[1:]


def test_name_and_child_count_requirements():
    x, y = Symbol((2,), name="x"), Symbol((2,), name="y")
    old = Add(x, name="old")
    new = Add(y, name="new")
    # names differ: by default the roots are different nodes
    assert diff_circuits(new, old, print_legend=False) == "'new' Add # new\n  'y' [2] Symbol\n'old' Add # removed\n  'x' [2] Symbol"
    assert diff_circuits(new, old, require_name_same=False, print_legend=False) == \
        "'new' Add # changed 0\n  'y' [2] Symbol # changed 1"  # the Symbols differ only by name too
    # another number of children is never a 'changed' pair (children are compared in pairs)
    assert "# changed" not in diff_circuits(Add(x, x, name="a"), Add(x, name="a"), require_child_count_same=False)
    # child shapes on request
    def summed(rows):
        return C.Einsum.from_spec("ab->b", Symbol((rows, 2), name="x"), name="a")

    assert "# changed" in diff_circuits(summed(3), summed(4))
    assert "# changed" not in diff_circuits(summed(3), summed(4), require_child_shapes_same=True)


def test_colour_mode_paints_as_rust():
    new = ORIG.update("sym2", lambda _: parse("'sym3' [2] Symbol"))
    text = diff_circuits(new, ORIG, color=True)
    assert "\x1b[32m'sym3' [2] Symbol\x1b[0m" in text  # new: green, no '# new' mark
    assert "\x1b[31m'sym2' [2] Symbol\x1b[0m" in text  # removed: red
    assert "# new" not in text
    assert text.split("\n")[-1] == ("None: Same as original \x1b[34mBlue: Children changed\x1b[0m "
                                    "\x1b[32mGreen: New\x1b[0m \x1b[31mRed: Removed\x1b[0m")
    with pytest.raises(ValueError, match="colour"):
        diff_circuits(new, ORIG, new_color="Mauve")


def test_deep_chains_do_not_recurse():
    a = b = Symbol((2,), name="x")
    for i in range(2500):
        a = C.GeneralFunction("tanh", a, name=f"n{i}")
        b = C.GeneralFunction("tanh", b, name=f"n{i}")
    b = b.update("x", lambda _: Scalar(1.0, (2,), name="x"))
    lines = diff_circuits(b, a, print_legend=False).split("\n")
    assert len(lines) == 2502 and lines[-1].strip() == "'x' [2] Symbol # removed"


def test_self_hash_ignores_children():
    x, y = Symbol((2,), name="x"), Symbol((2,), name="y")
    assert self_hash(Add(x, name="a")) == self_hash(Add(y, name="a"))
    assert self_hash(Add(x, name="a")) != self_hash(Add(x, x, name="a"))
    assert self_hash(Add(x, name="a"), child_count=False) == self_hash(Add(x, x, name="a"), child_count=False)
    assert self_hash(Scalar(1.0)) != self_hash(Scalar(2.0))


# ---------------------------------------------------------------------------- oracle
def rust_diff_reference(new, old):
    """rust's diff_circuits transcribed as it is written there (recursive; small circuits only)."""
    out, seen = [], {}

    def same_self(n, o):
        return (type(n), n.payload_text(), n.shape, n.dtype, n.name, len(n.children),
                n._payload_bytes()) == (type(o), o.payload_text(), o.shape, o.dtype, o.name,
                                        len(o.children), o._payload_bytes())

    def rec(n, o, depth):
        pad = "  " * depth
        if (n, o) in seen:
            out.append(pad + seen[(n, o)])
            return
        i = len(seen)
        if n == o:
            seen[(n, o)] = f" # same {i}"
            lines = to_text(n).split("\n")
            out.append(pad + lines[0] + f" # same {i}")
            out.extend(pad + x for x in lines[1:])
            return
        if same_self(n, o):
            seen[(n, o)] = f" # changed {i}"
            line = to_text(n, depth=0).split("\n")[0]
            out.append(pad + (line[2:] if n.name is None else line) + f" # changed {i}")
            for a, b in zip(n.children, o.children):
                rec(a, b, depth + 1)
            return
        for node, word in ((n, "new"), (o, "removed")):
            lines = to_text(node).split("\n")
            out.append(pad + lines[0] + f" # {word}")
            out.extend(pad + x for x in lines[1:])

    rec(new, old, 0)
    return "\n".join(out)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_rusts_algorithm_on_generated_pairs(data):
    old = data.draw(dags(max_nodes=10, max_depth=4, names=["p", "q", "r"]))
    nodes = list({n.hash: n for n in old.toposort()}.values())
    target = data.draw(st.sampled_from(nodes))
    replacement = Scalar(data.draw(st.sampled_from([0.5, 7.0])), target.shape, name=target.name)
    new = old.update(lambda n: n == target, lambda n: replacement if replacement.dtype == n.dtype else n)
    assert diff_circuits(new, old, print_legend=False) == rust_diff_reference(new, old)
