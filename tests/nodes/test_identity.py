"""Node identity: placeholders vs valued Arrays, dtype identity, thread-safe interning.

A placeholder Array (shape, dtype, hash, no value) and the valued Array it stands for print the
same line but are different nodes, so binding the true values to a parsed circuit changes it and
it evaluates (see ``circuits.nodes.leaves``).  Interning hands every thread the same object.
"""

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import circuits as C
from circuits.io.values import placeholders
from circuits.models import attn_only, causal_mask, random_weights
from circuits.nodes import base
from circuits.select import update
from circuits.traversal import deep_map, replace

REPO = Path(__file__).resolve().parents[2]

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
from tests.nodes.test_identity import _true_values
from circuits.io.values import placeholders

c = C.parse(open(sys.argv[1]).read())
assert all(a.is_placeholder for a in c.get(C.Array)), "parse without a store gives placeholders"
values = _true_values()
bound = C.bind(c, {n: values[n] for n in {a.name for a in placeholders(c)}})
assert bound != c and not placeholders(bound), "bind changed the circuit and left no placeholder"
np.save(sys.argv[2], C.evaluate(bound, mode='jit'))  # one tier on both sides: bit for bit
print(bound.hash.hex())
"""


def test_share_parse_bind_the_true_weights_in_a_fresh_process(tmp_path):
    loss, _ = _model()
    expected = C.evaluate(loss, mode="jit")  # a new process may take either tier first: pin one
    text_path, out_path = tmp_path / "loss.txt", tmp_path / "loss.npy"
    text_path.write_text(loss.to_text())
    done = subprocess.run(
        [sys.executable, "-c", _TEAMMATE, str(text_path), str(out_path)],
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


# ---------------------------------------------------------------------------- threads
N_THREADS = 8
ROUNDS = 12
NODES_PER_ROUND = 1500


def _build(round_number):
    """The same fresh nodes in every thread (new each round, so the threads race to intern them):
    leaves, parents over them, and parents over parents."""
    out = []
    base_value = float(round_number * NODES_PER_ROUND)
    for i in range(NODES_PER_ROUND // 3):
        leaf = C.Scalar(base_value + i, (2,))
        parent = C.Add(leaf, leaf, name="p")
        out += [leaf, parent, C.GeneralFunction("exp", parent)]
    return out


def test_interning_is_thread_safe():
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up quickly
    try:
        start, finish = threading.Barrier(N_THREADS), threading.Barrier(N_THREADS)
        results = [None] * N_THREADS
        errors = []

        def work(t):
            try:
                for r in range(ROUNDS):
                    start.wait()
                    # Drop last round's nodes and rebuild: the shared part (the same every round)
                    # dies in one thread while another builds it again, racing the table's
                    # removal of a dead node against the insertion of its successor; the fresh
                    # part races threads that all miss the table at once.
                    results[t] = None
                    results[t] = _build(0) + _build(r + 1)
                    finish.wait()
                    if t == 0:
                        check(r)
            except BaseException as e:  # noqa: BLE001  (reported by the main thread)
                errors.append(e)
                start.abort()
                finish.abort()

        def check(r):
            first = results[0]
            for other in results[1:]:
                twins = sum(a is not b for a, b in zip(first, other))
                assert twins == 0, f"round {r}: {twins} nodes built twice"
            missing = sum(base._INTERNED.get(n.hash) is None or base._INTERNED[n.hash]() is not n
                          for n in first)
            assert missing == 0, f"round {r}: {missing} live nodes missing from the intern table"

        threads = [threading.Thread(target=work, args=(t,)) for t in range(N_THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old_interval)
    assert not errors, errors[0]


def test_forgetting_a_dead_node_never_drops_the_entry_of_its_successor(monkeypatch):
    """The race the stress test above rarely hits, forced: node N has died and its weak reference
    callback has just read the table (N's dead entry) when another thread builds N again.  The
    callback must not then delete the new node's entry (a later build would make a twin)."""
    node = C.Scalar(0.375, (5,), name="reborn")
    key = node.hash
    del node

    class Dead:
        pass

    corpse = Dead()
    dead = base._Ref(corpse)
    dead.key = key
    del corpse
    assert dead() is None
    successor = []

    class Table(dict):
        """The intern table, which lets another thread build N right after the callback's read."""
        rebuild = True

        def get(self, k, default=None):
            out = dict.get(self, k, default)
            if k == key and self.rebuild:
                self.rebuild = False
                builder = threading.Thread(target=lambda: successor.append(C.Scalar(0.375, (5,), name="reborn")))
                builder.start()
                builder.join(timeout=0.5)  # it finishes now unless the table is locked (it must be)
                self.builder = builder
            return out

    table = Table({key: dead})
    monkeypatch.setattr(base, "_INTERNED", table)
    base._forget(dead, table)
    table.builder.join()
    assert successor and key in table, "the dead node's callback deleted its successor's entry"
    assert table[key]() is successor[0]
