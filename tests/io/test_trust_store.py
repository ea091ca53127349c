"""A tensor store you can trust: it changes no modes it was not asked to, never follows a link
planted inside it, repairs damaged files, refuses odd files with library errors (issue "Trust",
items 5, 6 and 12)."""

import os
import stat
import sys

import numpy as np
import pytest

from circuits import StoreError, TensorStore
from circuits.io.store import default_root


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# ---------------------------------------------------------------------------- item 5
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="platformdirs follows XDG on Linux")
def test_the_default_store_changes_no_modes_it_was_not_asked_to(tmp_path, monkeypatch, umask022):
    monkeypatch.delenv("CIRCUITS_STORE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # does not exist yet
    store = TensorStore()
    assert store.root == tmp_path / "cache" / "circuits" / "tensors" == default_root()
    key = store.put(np.arange(3, dtype=np.float32))
    for d in (tmp_path / "cache", tmp_path / "cache" / "circuits", store.root, store.path(key).parent):
        assert mode(d) == 0o755, d  # umask only: no group write anywhere
    assert mode(store.path(key)) == 0o644


def test_existing_directories_keep_their_modes_even_in_a_shared_store(tmp_path, umask022):
    parent = tmp_path / "mine"
    parent.mkdir(mode=0o700)
    os.chmod(parent, 0o700)
    store = TensorStore(parent / "shared" / "store", shared=True)
    key = store.put(np.ones(2, np.float32))
    assert mode(parent) == 0o700  # existed before: untouched
    assert mode(parent / "shared") == 0o755  # created on the way, not part of the store
    assert mode(store.root) & 0o070 == 0o070 and mode(store.path(key).parent) & 0o070 == 0o070
    assert mode(store.path(key)) & 0o040


def test_a_group_writable_root_is_a_shared_store(tmp_path, umask022):
    root = tmp_path / "team"
    root.mkdir()
    os.chmod(root, 0o2775)
    key = TensorStore(root).put(np.ones(2, np.float32))
    assert mode(root) == 0o2775
    shard = TensorStore(root).path(key).parent
    assert mode(shard) & 0o070 == 0o070 and mode(TensorStore(root).path(key)) & 0o040
    private = TensorStore(tmp_path / "private", shared=False)
    old = os.umask(0o077)
    try:
        key = private.put(np.ones(2, np.float32))
    finally:
        os.umask(old)
    assert mode(private.path(key)) == 0o600 and mode(private.path(key).parent) == 0o700


# ---------------------------------------------------------------------------- item 6
def test_a_planted_shard_link_is_refused_for_writes_reads_and_clean_up(tmp_path):
    store = TensorStore(tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / ".precious.tmp"  # looks like a temporary, must survive
    victim.write_bytes(b"precious")
    os.utime(victim, (0, 0))
    arr = np.arange(5, dtype=np.float32)
    key = TensorStore(tmp_path / "scratch").put(arr)
    store.root.mkdir()
    os.symlink(outside, store.root / key[:2])
    with pytest.raises(StoreError, match="symbolic link"):
        store.put(arr)
    with pytest.raises(StoreError, match="symbolic link"):
        store.get(key)
    assert store.remove_stale_temporaries(older_than=0) == 0
    assert sorted(os.listdir(outside)) == [victim.name]
    assert store.hashes() == []  # a link is no shard
    with pytest.raises(StoreError, match="symbolic link"):
        store.find(key[:8])
    with pytest.raises(StoreError, match="symbolic link"):
        key in store


def test_a_planted_file_link_is_never_read_and_put_replaces_it(tmp_path):
    store = TensorStore(tmp_path / "store")
    arr = np.arange(5, dtype=np.float32)
    key = store.put(arr)
    secret = tmp_path / "secret"
    secret.write_bytes(b"SECRETBYTES-" * 100)
    path = store.path(key)
    os.unlink(path)
    os.symlink(secret, path)
    with pytest.raises(StoreError, match="symbolic link") as info:
        store.get(key)
    assert "SECRET" not in str(info.value) and "0x" not in str(info.value)
    assert key not in store
    assert store.put(arr) == key  # repaired: a regular file again
    assert not os.path.islink(path) and secret.read_bytes() == b"SECRETBYTES-" * 100
    np.testing.assert_array_equal(store.get(key), arr)


def test_put_repairs_a_damaged_file_of_the_right_size(tmp_path):
    store = TensorStore(tmp_path / "store")
    arr = np.arange(1000, dtype=np.float32)
    key = store.put(arr)
    path = store.path(key)
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x10
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="tampered"):
        store.get(key)
    assert store.put(arr) == key
    np.testing.assert_array_equal(store.get(key), arr)


def test_odd_files_under_a_tensor_name_are_refused_and_replaced(tmp_path):
    store = TensorStore(tmp_path / "store")
    arr = np.ones(3, np.int64)
    key = store.put(arr)
    path = store.path(key)
    os.unlink(path)
    os.mkfifo(path)
    with pytest.raises(StoreError, match="FIFO"):
        store.get(key)  # never blocks
    store.put(arr)
    np.testing.assert_array_equal(store.get(key), arr)


# ---------------------------------------------------------------------------- item 12: .npy
def _npy(store, key, header: dict | str, body: bytes = b"", version=1):
    text = header if isinstance(header, str) else repr(header)
    raw = text.encode("latin1")
    path = store.root / key[:2] / f"{key}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    width = 2 if version == 1 else 4
    path.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + len(raw).to_bytes(width, "little") + raw + body)
    return path


@pytest.mark.parametrize("header, body", [
    ({"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)}, b"\0" * 16),  # MemoryError before
    ({"descr": "<f4", "fortran_order": False, "shape": (1 << 62, 1 << 62)}, b""),
    ({"descr": "|O", "fortran_order": False, "shape": (1,)}, b"\0" * 8),
    ({"descr": [("a", "<f4")], "fortran_order": False, "shape": (1,)}, b"\0" * 4),
    ({"descr": "<U3", "fortran_order": False, "shape": (1,)}, b"\0" * 12),
    ({"descr": "<f4", "fortran_order": False, "shape": (2,)}, b"\0" * 12),  # trailing
    ({"descr": "<f4", "fortran_order": False, "shape": (-1,)}, b""),
    ({"descr": "<f4", "fortran_order": "yes", "shape": (1,)}, b"\0" * 4),
    ({"descr": "<f4", "shape": (1,)}, b"\0" * 4),
    ("(" * 10000 + ")" * 10000, b""),
    ("__import__('os').system('false')", b""),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", b""),
])
def test_odd_npy_files_give_store_errors(tmp_path, header, body):
    store = TensorStore(tmp_path / "store")
    key = "f" * 64
    _npy(store, key, header, body)
    with pytest.raises(StoreError, match="npy"):
        store.get(key)


def test_npy_files_in_every_layout_numpy_writes(tmp_path):
    store = TensorStore(tmp_path / "store")
    for arr in (np.arange(6, dtype=">f8").reshape(2, 3), np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
                np.array(3.5, np.float16), np.zeros((0, 4), np.uint8), np.arange(1 << 19, dtype=np.float32)):
        key = TensorStore(tmp_path / "scratch").put(arr)
        path = store.root / key[:2] / f"{key}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, arr)
        got = store.get(key)
        assert got.shape == arr.shape and np.array_equal(got, arr) and not got.flags.writeable


# ---------------------------------------------------------------------------- item 12: location
def test_a_bad_circuits_store_is_a_store_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_bytes(b"")
    monkeypatch.setenv("CIRCUITS_STORE", str(blocker / "store"))
    with pytest.raises(StoreError, match="a_file"):
        TensorStore().put(np.ones(2, np.float32))
    with pytest.raises(StoreError, match="a_file"):
        TensorStore().find("ab")
    monkeypatch.setenv("CIRCUITS_STORE", "nosuchprotocol://bucket/x")
    with pytest.raises(StoreError, match="CIRCUITS_STORE"):
        TensorStore()
    with pytest.raises(StoreError, match="NUL"):
        TensorStore(str(tmp_path / "a\0b"))
    with pytest.raises(StoreError):
        TensorStore(blocker).put(np.ones(2, np.float32))
