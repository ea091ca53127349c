"""TensorStore: content addressing, verified reads, prefix lookup, atomic and concurrent writes."""

import multiprocessing
import os
import pickle
import stat
import sys
import time
from pathlib import Path

import blake3
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as C
from circuits import Add, Array, Einsum, StoreError, TensorStore
from circuits.io.store import atomic_write, default_root, read_safetensors

DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
          "uint8", "uint16", "uint32", "uint64", "bool"]


def np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def random_array(rng, dtype, shape):
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(np_dtype(dtype))


def expected_key(arr):
    """The key written out from the spec: blake3 of 'dtype.str|shape|' then the C-order bytes."""
    arr = np.asarray(arr)
    h = blake3.blake3(f"{arr.dtype.str}|{','.join(map(str, arr.shape))}|".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


@pytest.fixture
def store(tmp_path):
    return TensorStore(tmp_path / "store")


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 5), max_size=4).map(tuple),
    seed=st.integers(0, 2**32 - 1),
    transpose=st.booleans(),
)
def test_put_get_round_trip(tmp_path_factory, dtype, shape, seed, transpose):
    store = TensorStore(tmp_path_factory.mktemp("s"))
    arr = random_array(np.random.default_rng(seed), dtype, shape)
    if transpose:  # a non-contiguous input is stored by value, in C order
        arr = arr.T
    key = store.put(arr)
    assert key == expected_key(arr)
    back = store.get(key)
    assert back.dtype == arr.dtype and back.shape == arr.shape
    assert back.tobytes() == np.ascontiguousarray(arr).tobytes()
    assert not back.flags.writeable
    if back.size:
        with pytest.raises(ValueError):
            back.flat[0] = back.flat[0]
    assert store.put(arr) == key  # idempotent
    assert key in store and store.find(key[:24]) == key


def test_scalar_and_vector_are_different_tensors(store):
    a = store.put(np.array(1.0, np.float32))
    b = store.put(np.array([1.0], np.float32))
    assert a != b
    assert store.get(a).shape == () and store.get(b).shape == (1,)


def test_byte_order_does_not_change_the_key(store):
    key = store.put(np.arange(5, dtype=">f8"))
    assert key == store.put(np.arange(5, dtype="<f8")) == expected_key(np.arange(5, dtype="<f8"))
    assert store.get(key).dtype == np.dtype("<f8")


def test_jax_values_are_stored_by_value(store):
    import jax.numpy as jnp

    key = store.put(jnp.arange(5, dtype=jnp.float32))
    np.testing.assert_array_equal(store.get(key), np.arange(5, dtype=np.float32))


def test_files_are_plain_safetensors_both_ways(store):
    arr = np.arange(12, dtype=np.int32).reshape(3, 4)
    key = store.put(arr)
    # The reference implementation reads what we write ...
    np.testing.assert_array_equal(safetensors.numpy.load_file(store.path(key))["tensor"], arr)
    # ... and we read what it writes, under any tensor name.
    other = np.linspace(0, 1, 7, dtype=np.float64)
    key2 = expected_key(other)
    store.path(key2).parent.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file({"w": other}, store.path(key2), metadata={"a": "b"})
    np.testing.assert_array_equal(store.get(key2), other)
    meta, tensors = read_safetensors(store.path(key2))
    assert meta == {"a": "b"} and list(tensors) == ["w"]


def test_npy_files_are_read_without_pickle(store, tmp_path):
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    key = expected_key(arr)
    path = store.root / key[:2] / f"{key}.npy"
    path.parent.mkdir(parents=True)
    np.save(path, arr)
    np.testing.assert_array_equal(store.get(key), arr)
    assert store.find(key[:10]) == key

    # An object .npy would run code when unpickled: it must be refused, not loaded.
    marker = tmp_path / "pwned"
    evil = np.array([_Evil(str(marker))], dtype=object)
    fake = "e" * 64
    evil_path = store.root / "ee" / f"{fake}.npy"
    evil_path.parent.mkdir(parents=True)
    np.save(evil_path, evil, allow_pickle=True)
    with pytest.raises(StoreError, match="npy"):
        store.get(fake)
    assert not marker.exists()


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_corrupted_files_raise_naming_the_file(store):
    arr = np.arange(1000, dtype=np.float32)
    key = store.put(arr)
    path = store.path(key)
    good = path.read_bytes()

    def check(data, match):
        os.chmod(path, 0o644)
        path.write_bytes(data)
        with pytest.raises(StoreError, match=match) as info:
            store.get(key)
        assert str(path) in str(info.value)

    flipped = bytearray(good)
    flipped[-5] ^= 0x01
    check(bytes(flipped), "tampered")
    check(good[:-4], "truncated")
    check(good[:5], "truncated")
    check(good + b"\0" * 8, "trailing")
    check(b"\x10\0\0\0\0\0\0\0" + b"{not json!!!!!!}" + good[-4000:], "corrupted")
    check(good.replace(b'"F32"', b'"I32"'), "tampered")  # same bytes read as another dtype
    # A valid file of another tensor under this tensor's name.
    other = store.put(np.zeros(1000, np.float32))
    check(store.path(other).read_bytes(), "not to its name")


def test_get_missing_or_malformed_keys(store):
    with pytest.raises(StoreError, match="no tensor"):
        store.get("a" * 64)
    with pytest.raises(StoreError, match="64 hex"):
        store.get("abc")
    with pytest.raises(StoreError, match="prefix"):
        store.find("xyz")
    assert store.find("abc") is None
    assert "abc" not in store
    assert store.hashes() == []


def test_find_unique_missing_and_ambiguous(store):
    keys = [store.put(np.full(3, i, np.int64)) for i in range(40)]
    # 40 hashes over 16 first digits: some digit is shared (pigeonhole).
    by_digit = {}
    for k in keys:
        by_digit.setdefault(k[0], []).append(k)
    digit, shared = next((d, ks) for d, ks in by_digit.items() if len(ks) > 1)
    with pytest.raises(StoreError, match="ambiguous") as info:
        store.find(digit)
    for k in shared:
        assert k in str(info.value)
    for k in keys:
        assert store.find(k[:16]) == k
        assert store.find(k.upper()[:20]) == k
    assert store.hashes() == sorted(keys)
    # Two names sharing their shard directory and more digits.
    a, b = "ab0" + "1" * 61, "ab0" + "2" * 61
    for k in (a, b):
        (store.root / "ab" / f"{k}.safetensors").parent.mkdir(exist_ok=True)
        (store.root / "ab" / f"{k}.safetensors").write_bytes(b"")
    with pytest.raises(StoreError, match="ambiguous"):
        store.find("ab0")
    assert store.find("ab01") == a
    # Temporary files and strangers are not tensors.
    (store.root / "ab" / f".{a}.safetensors.1234.tmp").write_bytes(b"")
    (store.root / "ab" / "README").write_bytes(b"")
    assert store.find("ab02") == b


def test_contains_accepts_hashes_prefixes_and_arrays(store):
    x = Array(np.ones((2, 2), np.float32), name="x")
    assert x not in store and x.content_hash not in store
    store.put(x.value)
    assert x in store and x.content_hash in store and x.short_hash in store


def test_put_circuit_stores_every_array_with_a_value(store):
    x = Array(np.arange(4, dtype=np.float32), name="x")
    y = Array(np.ones(4, np.float32), name="y")
    x_again = Array(np.arange(4, dtype=np.float32), name="x2")  # same content, other name
    hole = Array.placeholder((4,), "ab" * 12, name="hole")
    c = Add(Einsum.from_spec("a,a->a", x, y), x_again, hole)
    keys = store.put_circuit(c)
    assert sorted(keys) == sorted({x.content_hash, y.content_hash})
    assert store.hashes() == sorted(keys)
    np.testing.assert_array_equal(store.get(x.content_hash), x.value)


def _stored_text(store):
    w = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
    toks = Array(np.array([1, 0, 1]), name="toks")
    c = Einsum.from_spec("ab,cb->ac", w, C.GeneralFunction("gen_index_at_0_c", w, toks), name="out")
    store.put_circuit(c)
    return c.to_text(), c.hash, w.content_hash


def test_the_parser_resolves_arrays_through_the_store(store, tmp_path):
    text, h, w_hash = _stored_text(store)  # the circuit itself is gone when this returns
    assert C.parse(text).children[0].is_placeholder  # nothing to resolve it with
    back = C.parse(text, store=store)
    assert back.hash == h
    got = {n.name: n for n in C.toposort(back) if isinstance(n, Array)}
    assert not got["w"].is_placeholder and got["toks"].value.dtype == np.int64
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(C.evaluate(back), w @ w[[1, 0, 1]].T)
    # A prefix that the store cannot tell apart is a parse error pointing at the line.
    fake = w_hash[:6] + "0" * 58
    store.path(fake).parent.mkdir(parents=True, exist_ok=True)
    store.path(fake).write_bytes(b"")
    with pytest.raises(C.ParseError, match="ambiguous"):
        C.parse(f"'w2' [2,3] Array {w_hash[:6]}", store=store)
    # A store file damaged after the fact is refused, not parsed into a circuit.
    other = TensorStore(tmp_path / "other")
    text2, _, w_hash2 = _stored_text(other)
    data = bytearray(other.path(w_hash2).read_bytes())
    data[-1] ^= 1
    os.chmod(other.path(w_hash2), 0o644)
    other.path(w_hash2).write_bytes(bytes(data))
    with pytest.raises((StoreError, C.ParseError), match="tampered"):
        C.parse(text2, store=other)


def test_location_argument_env_var_and_default(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRCUITS_STORE", str(tmp_path / "from_env"))
    assert TensorStore().root == tmp_path / "from_env"
    assert TensorStore(tmp_path / "arg").root == tmp_path / "arg"
    monkeypatch.delenv("CIRCUITS_STORE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if sys.platform.startswith("linux"):  # platformdirs follows XDG there
        assert default_root() == tmp_path / "cache" / "circuits" / "tensors"
    key = TensorStore().put(np.zeros(2, np.float32))
    assert TensorStore().path(key).is_file()


def test_shared_store_permissions_even_with_a_private_umask(tmp_path):
    store = TensorStore(tmp_path / "store", shared=True)  # sharing is asked for
    old = os.umask(0o077)
    try:
        key = store.put(np.arange(3, dtype=np.float32))
    finally:
        os.umask(old)
    path = store.path(key)
    assert stat.S_IMODE(path.stat().st_mode) & 0o040, "files must be group-readable"
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o070 == 0o070, "shards must be group-writable"
    assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0, "content-addressed files need no write bits"


def test_atomic_write_never_leaves_partial_files(tmp_path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"old content")

    def failing(f):
        f.write(b"half of the new cont")
        raise KeyboardInterrupt  # an interruption, not just an error

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, failing)
    assert target.read_bytes() == b"old content"
    assert os.listdir(tmp_path) == ["file.bin"]

    atomic_write(target, lambda f: f.write(b"new"))
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["file.bin"]


def test_stale_temporary_files_are_cleaned_but_live_ones_kept(store):
    key = store.put(np.ones(3, np.float32))
    shard = store.path(key).parent
    old, fresh = shard / f".{key}.safetensors.aaaa.tmp", shard / f".{key}.safetensors.bbbb.tmp"
    old.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(old, (time.time() - 3 * 24 * 3600,) * 2)
    assert store.remove_stale_temporaries() == 1
    assert sorted(os.listdir(shard)) == sorted([fresh.name, store.path(key).name])
    assert store.hashes() == [key]


def test_store_files_cannot_be_pickled_into():
    # Circuits refuse pickle; the store never needs it.
    with pytest.raises(TypeError):
        pickle.dumps(Array(np.zeros(2, np.float32)))


# ---------------------------------------------------------------------------- concurrency
ROUNDS = 8


def _tensor(round_):
    return np.random.default_rng(round_).standard_normal(1 << 18).astype(np.float32)  # 1 MiB


def _writer(root, barrier, errors):
    from circuits.io.store import write_safetensors

    store = TensorStore(root)
    try:
        for r in range(ROUNDS):
            arr = _tensor(r)
            barrier.wait(timeout=30)
            key = store.put(arr)
            # Rewrite it on top of the other writer and under the reader's feet.
            write_safetensors(store.path(key), {"tensor": arr}, group_readable=True)
            np.testing.assert_array_equal(store.get(key), arr)
    except BaseException as e:  # reported to the parent, which fails the test
        errors.put(f"writer: {e!r}")


def _reader(root, keys, errors):
    store = TensorStore(root)
    try:
        seen = set()
        reads = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for r, key in enumerate(keys):
                try:
                    arr = store.get(key)
                except StoreError as e:
                    if "no tensor" not in str(e):
                        raise
                    continue
                np.testing.assert_array_equal(arr, _tensor(r))
                seen.add(key)
                reads += 1
            if len(seen) == len(keys) and reads > 50:
                break
        else:
            errors.put(f"reader: saw only {len(seen)} of {len(keys)} tensors in 60 s")
    except BaseException as e:
        errors.put(f"reader: {e!r}")


def test_concurrent_writers_and_a_reader(tmp_path):
    ctx = multiprocessing.get_context("spawn")  # fork is unsafe once JAX has started threads
    root = str(tmp_path / "shared")
    keys = [expected_key(_tensor(r)) for r in range(ROUNDS)]
    barrier = ctx.Barrier(3)
    errors = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(root, barrier, errors)) for _ in range(3)]
    procs.append(ctx.Process(target=_reader, args=(root, keys, errors)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    messages = []
    while not errors.empty():
        messages.append(errors.get())
    assert not messages, messages
    assert [p.exitcode for p in procs] == [0] * len(procs)
    store = TensorStore(root)
    assert store.hashes() == sorted(keys)
    for r, key in enumerate(keys):
        np.testing.assert_array_equal(store.get(key), _tensor(r))
    leftovers = [n for d in Path(root).iterdir() for n in os.listdir(d) if n.endswith(".tmp")]
    assert leftovers == []
