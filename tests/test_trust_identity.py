"""Node identity: placeholders vs valued Arrays, dtype identity.

A placeholder Array (shape, dtype, hash, no value) and the valued Array it stands for print the
same line but are different nodes, so binding the true values to a parsed circuit changes it and
it evaluates (see ``circuits.nodes.leaves``).
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import circuits as C
from circuits.models import attn_only, causal_mask, random_weights
from circuits.select import update
from circuits.traversal import deep_map, replace
from circuits.values import placeholders

REPO = Path(__file__).resolve().parents[1]

# A small attn_only model: the README's workflow, fast enough for a fresh process in a test.
CONFIG = dict(vocab=53, d_model=16, n_heads=2, head_size=8, n_layers=2, max_positions=32)
N_POS = 12


def _true_values():
    """Every named Array of the model, computed the same way in any process."""
    weights = dict(random_weights(seed=3, **CONFIG))
    weights["toks_int_var"] = np.random.default_rng(3).integers(0, CONFIG["vocab"], N_POS + 2)
    weights["t.a.c.causal_mask"] = causal_mask(N_POS)
    return weights


def _model():
    values = _true_values()
    return attn_only(values, values["toks_int_var"]), values


# The other side of the share: a process that has only the text and the true weights.
_TEAMMATE = """
import sys
import numpy as np
import circuits as C
sys.path.insert(0, sys.argv[3])
from test_trust_identity import _true_values
from circuits.values import placeholders

c = C.parse(open(sys.argv[1]).read())
assert all(a.is_placeholder for a in c.get(C.Array)), "parse without a store gives placeholders"
values = _true_values()
bound = C.bind(c, {n: values[n] for n in {a.name for a in placeholders(c)}})
assert bound != c and not placeholders(bound), "bind changed the circuit and left no placeholder"
np.save(sys.argv[2], C.evaluate(bound))
print(bound.hash.hex())
"""


def test_share_parse_bind_the_true_weights_in_a_fresh_process(tmp_path):
    loss, _ = _model()
    expected = C.evaluate(loss)
    text_path, out_path = tmp_path / "loss.txt", tmp_path / "loss.npy"
    text_path.write_text(loss.to_text())
    done = subprocess.run(
        [sys.executable, "-c", _TEAMMATE, str(text_path), str(out_path), str(Path(__file__).parent)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == loss.hash.hex()  # the very circuit that was shared
    np.testing.assert_array_equal(np.load(out_path), expected)


def test_parse_without_a_store_gives_placeholders_while_the_original_is_alive():
    loss, values = _model()
    parsed = C.parse(loss.to_text())
    arrays = parsed.get(C.Array)
    assert arrays and all(a.is_placeholder for a in arrays)
    assert parsed != loss and parsed.to_text() == loss.to_text()
    with pytest.raises(C.EvaluationError, match="placeholder"):
        C.evaluate(parsed)
    bound = C.bind(parsed, {a.name: values[a.name] for a in arrays})
    assert bound is loss  # interned: binding the true values gives back the live original
    # The reverse: a live placeholder never stands in for a valued Array being built.
    w = values["a0.w.q"]
    ph = C.Array.placeholder(w.shape, C.Array(w).content_hash, name="q", dtype="float32")
    valued = C.Array(w, name="q")
    assert ph.is_placeholder and not valued.is_placeholder and ph != valued


def test_placeholder_and_valued_array_are_different_nodes_everywhere():
    value = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.25
    w = C.Array(value, name="w")
    x = C.Symbol((3,), name="x")
    c = C.Einsum.from_spec("ab,b->a", w, x, name="y")
    ph = C.parse(c.to_text()).children[0]
    assert ph.is_placeholder and ph.line() == w.line()
    assert ph != w and hash(ph) != hash(w) and ph.hash != w.hash
    # ... but structure and compiled code do not depend on having the value.
    assert ph.structure_hash == w.structure_hash
    parsed = C.parse(c.to_text())
    inputs = {"x": np.ones(3, np.float32)}
    want = value.sum(-1)
    # Every "did this change?" path turns the placeholder circuit into one that evaluates.
    assert parsed.with_children([w, x]) == c
    assert replace(parsed, {ph: w}) == c
    assert deep_map(parsed, lambda n: w if n == ph else None) == c
    assert update(parsed, "w", lambda n: C.Array(value, name="w")) == c
    for out in (replace(parsed, {ph: w}), update(parsed, "w", lambda n: C.Array(value, name="w"))):
        np.testing.assert_allclose(C.evaluate(out, inputs), want)


def test_a_rewrite_that_fills_a_placeholder_is_a_change():
    import rewrites

    value = np.full((2,), 1.5, np.float32)
    w = C.Array(value, name="w")
    parsed = C.parse(C.Add(w, C.Scalar(1.0, (2,)), name="s").to_text())
    assert parsed.children[0].is_placeholder

    @rewrites.rule(on=C.Array)
    def fill(node):
        """Give the placeholder 'w' its value."""
        return C.Array(value, name=node.name) if node.is_placeholder else None

    for strategy in (rewrites.bottom_up(fill), rewrites.top_down(fill), rewrites.once(fill),
                     rewrites.fixpoint(fill), rewrites.normalize(fill)):
        out = rewrites.apply(strategy, parsed)
        assert not placeholders(out), strategy
        np.testing.assert_allclose(C.evaluate(out), value + 1.0)


def test_dtype_is_part_of_a_placeholders_identity():
    as_int = C.Array.placeholder((3,), "0abc", name="i", dtype="int64")
    as_float = C.Array.placeholder((3,), "0abc", name="i", dtype="float32")
    assert as_int != as_float and as_int.dtype == "int64" and as_float.dtype == "float32"
    assert as_int.line() == as_float.line()
    assert C.Array.placeholder((3,), "0abc", name="i", dtype="int64") is as_int
    # A parsed placeholder gets the parser's dtype (float32 here) whatever twin is alive ...
    del as_float
    parsed = C.parse("'i' [3] Array 0abc")
    assert parsed.dtype == "float32" and parsed != as_int and as_int.dtype == "int64"
    # ... and an int index feeding a gather parses as int64 while a float32 twin is alive.
    toks_f32 = C.Array.placeholder((4,), "0def", name="toks", dtype="float32")
    g = C.parse("'e' GeneralFunction gen_index_at_0_c\n  'table' [5,3] Array 01ab\n  'toks' [4] Array 0def")
    assert g.children[1].dtype == "int64" and toks_f32.dtype == "float32"
    # Valued Arrays of equal values but different dtypes were always different nodes.
    assert C.Array(np.zeros(2, np.int64)) != C.Array(np.zeros(2, np.float64))


def test_a_file_keeps_placeholder_dtypes_and_refuses_twins_it_cannot_tell_apart(tmp_path):
    idx = C.Array.placeholder((3,), "0abc", name="i", dtype="int64")
    w = C.Array(np.ones(3, np.float32), name="w")
    c = C.Add(w, idx, name="s")
    C.save(c, tmp_path / "c.circuit", allow_placeholders=True)
    again = C.load(tmp_path / "c.circuit")
    assert again == c and again.children[1].dtype == "int64" and not again.children[0].is_placeholder
    twin = C.Array.placeholder((3,), "0abc", name="i", dtype="float32")
    with pytest.raises(C.StoreError, match="differ only in dtype"):
        C.save(C.Add(idx, twin), tmp_path / "twins.circuit", allow_placeholders=True)
