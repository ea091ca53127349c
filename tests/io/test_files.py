"""Circuit files: exact round trips, verified loads, refusal of damaged files, atomic saves."""

import gc
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy
from hypothesis import HealthCheck, given, settings

import circuits as C
from circuits import Add, Array, Einsum, GeneralFunction, Index, Scalar, StoreError, Symbol
from circuits.io.files import load, load_many, save, save_many
from circuits.testing import strategies as cst

SEED = Path(__file__).resolve().parents[1] / "golden" / "attn_only_loss.txt"  # the seed file, byte for byte
REPO = Path(__file__).resolve().parents[2]


def arrays_by_name(circuit):
    return {n.name: np.array(n.value) for n in C.toposort(circuit) if isinstance(n, Array) and n.value is not None}


def assert_same_values(loaded, values):
    got = arrays_by_name(loaded)
    assert got.keys() == values.keys()
    for name, v in values.items():
        assert got[name].dtype == v.dtype and got[name].shape == v.shape, name
        assert got[name].tobytes() == v.tobytes(), name


@pytest.fixture(scope="module")
def seed_circuit():
    return C.fill_random(C.parse(SEED.read_text()), seed=0)


def test_seed_round_trip_in_this_process_and_in_a_fresh_one(tmp_path, seed_circuit):
    path = tmp_path / "seed.circuit"
    save(seed_circuit, path)
    again = load(path)
    assert again == seed_circuit and again.to_text() == seed_circuit.to_text()
    assert_same_values(again, arrays_by_name(seed_circuit))
    # A teammate's process: nothing in memory but the file.
    code = (
        "import sys, hashlib, circuits as C\n"
        "c = C.load(sys.argv[1])\n"
        "print(c.hash.hex())\n"
        "for n in C.toposort(c):\n"
        "    if isinstance(n, C.Array): print(n.name, hashlib.sha256(n.value.tobytes()).hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         cwd=REPO, timeout=120, check=True).stdout.split("\n")
    assert out[0] == seed_circuit.hash.hex()
    import hashlib

    digests = dict(line.split(" ") for line in out[1:] if line)
    assert digests == {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in arrays_by_name(seed_circuit).items()}


def test_file_is_plain_safetensors_with_tensors_keyed_by_content_hash(tmp_path):
    w = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
    w_again = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name="w_again")
    b = Array(np.ones(2, np.float64), name="b")
    c = Add(Einsum.from_spec("ab,ab->a", w, w_again), b, name="out")
    path = tmp_path / "c.circuit"
    save(c, path)
    with safetensors.safe_open(path, framework="numpy") as f:
        # Tensors shared once; the text is a uint8 tensor in the body (format 2).
        assert sorted(f.keys()) == sorted({w.content_hash, b.content_hash, "__circuit_text__"})
        meta = f.metadata()
        np.testing.assert_array_equal(f.get_tensor(w.content_hash), w.value)
        text = f.get_tensor("__circuit_text__").tobytes().decode()
    assert meta["format"] == "circuits" and meta["format_version"] == "2"
    assert text == c.to_text() and "text" not in meta
    assert C.parse(text, store=None).to_text() == c.to_text()


def test_every_dtype_and_odd_shapes_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    values = {
        "f16": rng.standard_normal((3, 2)).astype(np.float16),
        "bf16": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
        "f64": rng.standard_normal(4),
        "i8": np.arange(-3, 3, dtype=np.int8),
        "u8": np.arange(4, dtype=np.uint8),
        "i32": np.arange(5, dtype=np.int32),
        "flag": np.array([True, False, True]),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 3), np.float32),
        "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,
    }
    roots = [Array(v, name=k) for k, v in values.items()]
    path = tmp_path / "dtypes.circuit"
    save_many(roots, path)
    expected = [(r.hash, r.dtype, r.shape) for r in roots]
    del roots
    gc.collect()
    loaded = load_many(path)
    assert [(r.hash, r.dtype, r.shape) for r in loaded] == expected
    for r in loaded:
        assert r.value.tobytes() == np.ascontiguousarray(values[r.name]).tobytes()
        assert not r.value.flags.writeable


def test_big_endian_values_load_as_the_same_node(tmp_path):
    be = Array(np.arange(4, dtype=">i4"), name="be")
    assert be == Array(np.arange(4, dtype="<i4"), name="be")  # same values, same node
    path = tmp_path / "be.circuit"
    save(be, path)
    h = be.hash
    del be
    gc.collect()
    back = load(path)
    assert back.hash == h and back.value.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(back.value, np.arange(4))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(circuit=cst.dags(max_nodes=12))
def test_generated_circuits_round_trip(tmp_path, circuit):
    path = tmp_path / "gen.circuit"
    save(circuit, path)
    back = load(path)
    assert back == circuit and back.to_text() == circuit.to_text()
    assert_same_values(back, arrays_by_name(circuit))


def _every_node_type(path):
    rng = np.random.default_rng(1)
    w = Array(rng.standard_normal((4, 6)).astype(np.float32), name="w")
    x = Symbol((6,), name="x")
    idx = Array(np.array([3, 0, 2]), name="idx")
    h = Einsum.from_spec("ab,b->a", w, x, name="h")
    r = C.Rearrange(Index(w, (np.array([3, 0, 2]), slice(1, None))), "a (b c) -> b a c", b=5, c=1, name="r")
    rows = GeneralFunction("gen_index_at_0_c", w, idx, name="rows")
    cat = C.Concat(h, Scalar(2.0, shape=(2,)), axis=0, name="cat")
    c = Add(GeneralFunction("tanh", C.Tag(cat, name="tagged")), Einsum.from_spec("bac->", r),
            Einsum.from_spec("ab->", rows), name="out")
    save(c, path)
    return c.hash, c.to_text(), arrays_by_name(c)


def test_every_node_type_round_trips_without_the_original_alive(tmp_path):
    path = tmp_path / "all.circuit"
    h, text, values = _every_node_type(path)  # the circuit is gone when this returns
    gc.collect()
    back = load(path)
    assert back.hash == h and back.to_text() == text
    assert_same_values(back, values)
    x = np.arange(6, dtype=np.float32)
    w = values["w"]
    expected = np.tanh(np.concatenate([w @ x, [2.0, 2.0]])) + w[[3, 0, 2], 1:].sum() + w[[3, 0, 2]].sum()
    symbol = next(n for n in C.toposort(back) if isinstance(n, Symbol))
    np.testing.assert_allclose(C.evaluate(back, {symbol: x}), expected, rtol=1e-5)


def test_save_many_shares_nodes_and_load_wants_one_root(tmp_path):
    w = Array(np.ones((2, 2), np.float32), name="w")
    h = Einsum.from_spec("ab,bc->ac", w, w, name="h")
    a, b = GeneralFunction("exp", h, name="a"), Add(h, w, name="b")
    path = tmp_path / "two.circuit"
    save_many([a, b], path)
    a2, b2 = load_many(path)
    assert (a2, b2) == (a, b) and a2.children[0] is b2.children[0]
    with pytest.raises(StoreError, match="load_many"):
        load(path)


# ---------------------------------------------------------------------------- placeholders
def test_placeholders_are_refused_by_default_naming_them(tmp_path):
    hole = Array.placeholder((3,), "0123abcd", name="missing.w")
    c = Add(hole, Array(np.ones(3, np.float32), name="b"), name="out")
    path = tmp_path / "p.circuit"
    with pytest.raises(StoreError, match="missing.w") as info:
        save(c, path)
    assert "allow_placeholders=True" in str(info.value) and "bind" in str(info.value)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_placeholders_saved_on_request_keep_dtype_and_hash(tmp_path):
    real = Array(np.arange(3, dtype=np.float32), name="real")
    ints = Array.placeholder((3,), "9" * 64, name="ids", dtype="int32")  # not on an index path
    # A placeholder whose short hash is a prefix of a real tensor's hash stays a placeholder.
    short = Array.placeholder((3,), real.content_hash[:8], name="short")
    c = Add(real, ints, short, name="out")
    path = tmp_path / "p.circuit"
    save(c, path, allow_placeholders=True)
    h, text = c.hash, c.to_text()
    del c, ints, short
    gc.collect()
    back = load(path)
    assert back.hash == h and back.to_text() == text
    got = {n.name: n for n in back.children}
    assert got["ids"].is_placeholder and got["ids"].dtype == "int32" and got["ids"].content_hash == "9" * 64
    assert got["short"].is_placeholder and got["short"].content_hash == real.content_hash[:8]
    np.testing.assert_array_equal(got["real"].value, np.arange(3, dtype=np.float32))
    filled = C.bind(back, {"ids": np.arange(3, dtype=np.int32), "short": np.ones(3, np.float32)})
    np.testing.assert_allclose(C.evaluate(filled), np.arange(3) * 2 + 1)


def test_seed_without_weights_saves_as_placeholders(tmp_path):
    c = C.parse(SEED.read_text())
    path = tmp_path / "seed.circuit"
    with pytest.raises(StoreError, match="19 placeholder"):
        save(c, path)
    save(c, path, allow_placeholders=True)
    assert load(path) == c and load(path).to_text() == SEED.read_text()


# ---------------------------------------------------------------------------- damaged files
@pytest.fixture
def saved(tmp_path):
    w = Array(np.arange(64, dtype=np.float32).reshape(8, 8), name="w.big")
    b = Array(np.full(8, 3, np.int64), name="b.ints")
    c = Add(Einsum.from_spec("ab->a", w, name="rowsum"), b, name="out")
    path = tmp_path / "c.circuit"
    save(c, path)
    return path, w.content_hash, b.content_hash


def _rewrite(path, change):
    """Rewrite a circuit file through the safetensors package after ``change(meta, tensors)``."""
    with safetensors.safe_open(path, framework="numpy") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    change(meta, tensors)
    safetensors.numpy.save_file(tensors, path, metadata=meta)


def test_flipped_tensor_byte_names_the_array(saved):
    path, w_key, _ = saved
    data = bytearray(path.read_bytes())
    # Flip one byte inside w's data (found by its float32 pattern: 37.0).
    at = data.find(np.float32(37.0).tobytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError) as info:
        load(path)
    msg = str(info.value)
    assert str(path) in msg and w_key in msg and "'w.big'" in msg and "tampered" in msg


def test_truncated_files(saved):
    path, _, _ = saved
    good = path.read_bytes()
    for cut in (len(good) - 1, len(good) - 200, len(good) // 2, 100, 7, 0):
        path.write_bytes(good[:cut])
        with pytest.raises(StoreError, match="truncated|not a safetensors"):
            load(path)


def test_tensor_removed_or_swapped(saved):
    path, w_key, b_key = saved
    good = path.read_bytes()
    _rewrite(path, lambda meta, t: t.pop(w_key))
    with pytest.raises(StoreError, match=r"'w.big'.*no tensor in this file"):
        load(path)
    path.write_bytes(good)
    # A consistent reshape of w in the header: its bytes fit, its hash does not.
    _rewrite(path, lambda meta, t: t.update({w_key: t[w_key].reshape(4, 16)}))
    with pytest.raises(StoreError, match=w_key):
        load(path)
    path.write_bytes(good)
    _rewrite(path, lambda meta, t: t.update({b_key: t[b_key] + 1}))
    with pytest.raises(StoreError, match=r"'b.ints'.*tampered"):
        load(path)


def test_edited_text_and_foreign_files(saved, tmp_path):
    path, _, _ = saved
    good = path.read_bytes()
    edited = lambda t: np.frombuffer(t.tobytes().replace(b"ab->a", b"ab->b"), np.uint8)  # noqa: E731
    _rewrite(path, lambda meta, t: t.update(__circuit_text__=edited(t["__circuit_text__"])))
    with pytest.raises(StoreError, match="checksum"):
        load(path)
    path.write_bytes(good)
    _rewrite(path, lambda meta, t: meta.update(format_version="99"))
    with pytest.raises(StoreError, match="newer"):
        load(path)
    plain = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file({"x": np.ones(2, np.float32)}, plain)
    with pytest.raises(StoreError, match="not a circuit file"):
        load(plain)
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(1000))
    with pytest.raises(StoreError):
        load(junk)
    with pytest.raises(StoreError, match="no such file"):
        load(tmp_path / "nothing.circuit")


def test_loading_never_unpickles(saved, monkeypatch):
    path, _, _ = saved

    def refuse(*args, **kwargs):
        raise AssertionError("load must not unpickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(np, "load", refuse)
    assert load(path).name == "out"


# ---------------------------------------------------------------------------- atomic saves
def test_failed_save_keeps_the_old_file(saved, monkeypatch):
    path, _, _ = saved
    good = path.read_bytes()
    other = Add(Array(np.zeros(3, np.float32), name="z"), name="new")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        save(other, path)
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert os.listdir(path.parent) == [path.name]
    assert load(path).name == "out"
    with pytest.raises(StoreError, match="does not exist"):
        save(other, path.parent / "no_such_dir" / "x.circuit")


_SAVER = """
import sys, numpy as np, circuits as C
path = sys.argv[1]
rng = np.random.default_rng(0)
c = C.Add(*[C.Array(rng.standard_normal(1 << 20).astype(np.float32), name=f"w{i}") for i in range(16)],
          name="new")
print("ready", flush=True)
while True:
    C.save(c, path)
"""


def test_killed_save_never_leaves_a_partial_file(tmp_path, seed_circuit):
    path = tmp_path / "target.circuit"
    save(seed_circuit, path)
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(path)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.4)  # 64 MiB saves in a loop: the kill lands mid-write
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    back = load(path)  # whichever save finished last, whole and verified
    assert back.name in ("new", seed_circuit.name)
    names = os.listdir(tmp_path)
    assert [n for n in names if not n.endswith(".tmp")] == ["target.circuit"]
    for n in names:
        if n.endswith(".tmp"):  # a killed save may leave its temporary file, named as such
            assert n.startswith(".target.circuit.")
            os.utime(tmp_path / n, (time.time() - 3600,) * 2)
    save(seed_circuit, path)  # its writer is dead (no lock) and it is old: the next save removes it
    assert os.listdir(tmp_path) == ["target.circuit"]
