"""Stores and circuit files behind fsspec URLs (issue "Trust", item 8): fsspec's memory
filesystem, and a web server started here (127.0.0.1 only, shut down by the test, and by a
timer should the test never get there)."""

import functools
import http.server
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

import circuits as C
from circuits import Add, Array, Einsum, StoreError, TensorStore
from circuits.io.files import load, save

fsspec = pytest.importorskip("fsspec")  # the `remote` extra; CI installs it with `test`
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def memory_url():
    url = f"memory://circuits-test-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    fs.rm(url[len("memory://"):], recursive=True) if fs.exists(url[len("memory://"):]) else None


def circuit():
    w = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
    b = Array(np.ones(2, np.int64), name="b")
    return Add(Einsum.from_spec("ab->a", w), b, name="out")


def test_a_store_on_a_memory_filesystem(memory_url):
    store = TensorStore(memory_url + "/tensors")
    arr = np.arange(5, dtype=np.float32)
    key = store.put(arr)
    assert store.root == memory_url + "/tensors"
    assert store.path(key) == f"{memory_url}/tensors/{key[:2]}/{key}.safetensors"
    np.testing.assert_array_equal(store.get(key), arr)
    assert store.find(key[:10]) == key and key in store and store.hashes() == [key]
    assert store.put(arr) == key
    c = circuit()
    store.put_circuit(c)
    back = C.parse(c.to_text(), store=store)
    assert back == c
    fs = fsspec.filesystem("memory")
    names = [p.rsplit("/", 1)[-1] for p in fs.find(memory_url[len("memory://"):])]
    assert not [n for n in names if n.endswith(".tmp")]  # temporaries were moved into place


def test_remote_reads_are_verified_and_damage_is_repaired(memory_url):
    store = TensorStore(memory_url)
    arr = np.arange(100, dtype=np.float32)
    key = store.put(arr)
    fs = fsspec.filesystem("memory")
    where = store.path(key)[len("memory://"):]
    data = bytearray(fs.cat_file(where))
    data[-3] ^= 1
    fs.pipe_file(where, bytes(data))  # same size, wrong bytes
    with pytest.raises(StoreError, match="tampered"):
        store.get(key)
    store.put(arr)
    np.testing.assert_array_equal(store.get(key), arr)
    fs.pipe_file(where, bytes(data[:50]))
    with pytest.raises(StoreError, match="truncated"):
        store.get(key)
    fs.pipe_file(where, (10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(StoreError, match="not a safetensors file"):
        store.get(key)
    with pytest.raises(StoreError, match="no tensor"):
        store.get("0" * 64)


def test_circuit_files_on_a_memory_filesystem(memory_url):
    c = circuit()
    save(c, memory_url + "/c.circuit")
    assert load(memory_url + "/c.circuit") == c
    with pytest.raises(StoreError, match="no such file"):
        load(memory_url + "/nothing.circuit")


def test_a_failed_remote_write_leaves_nothing(memory_url, monkeypatch):
    store = TensorStore(memory_url)
    fs = fsspec.filesystem("memory")

    def broken_mv(*args, **kwargs):
        raise ConnectionError("the bucket went away")

    monkeypatch.setattr(type(fs), "mv", broken_mv)
    with pytest.raises(StoreError, match="bucket went away"):
        store.put(np.ones(3, np.float32))
    monkeypatch.undo()
    assert fs.find(memory_url[len("memory://"):]) == []


# ---------------------------------------------------------------------------- over http
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def web_server(tmp_path):
    """A read-only web server for ``tmp_path/site`` on 127.0.0.1; ``(directory, url)``."""
    site = tmp_path / "site"
    site.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    stopper = threading.Timer(300, server.shutdown)  # stops by itself should teardown never run
    stopper.daemon = True
    stopper.start()
    try:
        yield site, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stopper.cancel()
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_store_and_a_circuit_file_served_over_http(web_server):
    pytest.importorskip("aiohttp")
    site, url = web_server
    local = TensorStore(site / "tensors")
    c = circuit()
    keys = local.put_circuit(c)
    save(c, site / "c.circuit")

    remote = TensorStore(url + "/tensors")
    for key in keys:
        np.testing.assert_array_equal(remote.get(key), local.get(key))
        assert remote.find(key[:24]) == key and key in remote
    assert remote.hashes() == sorted(keys)
    assert C.parse(c.to_text(), store=remote) == c
    assert load(url + "/c.circuit") == c

    with pytest.raises(StoreError, match="read-only"):
        remote.put(np.zeros(2, np.float32))
    with pytest.raises(StoreError, match="read-only"):
        save(c, url + "/other.circuit")
    with pytest.raises(StoreError, match="no such file"):
        load(url + "/missing.circuit")
    with pytest.raises(StoreError, match="no tensor"):
        remote.get("0" * 64)
    # Damage on the server is caught by the reader.
    path = local.path(keys[0])
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="tampered"):
        remote.get(keys[0])


def test_an_unreachable_server_is_a_store_error():
    pytest.importorskip("aiohttp")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
        load(f"http://127.0.0.1:{port}/c.circuit")


# ---------------------------------------------------------------------------- optional
def test_fsspec_is_imported_only_for_urls(tmp_path):
    code = (
        "import sys, numpy as np, circuits as C\n"
        "s = C.TensorStore(sys.argv[1]); s.get(s.put(np.ones(2, np.float32)))\n"
        "C.save(C.Add(C.Array(np.ones(2, np.float32), name='x')), sys.argv[1] + '/c.circuit')\n"
        "C.load(sys.argv[1] + '/c.circuit')\n"
        "assert 'fsspec' not in sys.modules, 'fsspec imported'\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, check=True, timeout=120)


def test_without_fsspec_a_url_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # import fsspec now fails
    with pytest.raises(StoreError, match=r"circuits\[remote\]"):
        TensorStore("s3://bucket/tensors")
    with pytest.raises(StoreError, match=r"circuits\[remote\]"):
        load("s3://bucket/c.circuit")
