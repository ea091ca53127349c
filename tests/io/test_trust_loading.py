"""Trust, second round (issue 21): a loaded tensor is a private copy hashed as it was read (item
1), remote reads are bounded and timed and never echo secrets (items 5, 6, 18), and bad paths
are library errors (item 12).  HTTP servers here listen on 127.0.0.1 only."""

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import circuits.io.remotefs as remotefs
from circuits import Array, Einsum, StoreError, TensorStore, evaluate
from circuits.io.files import load, save

REPO = Path(__file__).resolve().parents[2]


def big_circuit(seed=0, n=1 << 19):  # 2 MiB: above the old 1 MiB memory-map threshold
    w = Array(np.random.default_rng(seed).standard_normal(n).astype(np.float32), name="w")
    return Einsum.from_spec("a->", w, name="total")


# ---------------------------------------------------------------------------- item 1
def test_overwriting_a_loaded_file_in_place_changes_nothing_loaded(tmp_path):
    path, other = tmp_path / "a.circuit", tmp_path / "b.circuit"
    save(big_circuit(0), path)
    save(big_circuit(1), other)
    assert path.stat().st_size == other.stat().st_size
    c = load(path)
    w = c.children[0]
    before, total = w.value.copy(), float(evaluate(c))
    with open(path, "r+b") as f:  # `cp b a`: the same inode, new bytes
        f.write(other.read_bytes())
    assert np.array_equal(w.value, before)
    assert float(evaluate(c)) == total and float(evaluate(c, mode="ops")) == total
    from circuits.hashing import content_hash

    assert content_hash(w.value) == w.content_hash


def test_truncating_a_loaded_file_in_place_is_harmless(tmp_path):
    # In a child process: a memory-mapped value would kill it with SIGBUS.
    path = tmp_path / "a.circuit"
    save(big_circuit(0), path)
    code = (
        "import sys, numpy as np\n"
        "from circuits import evaluate\n"
        "from circuits.io.files import load\n"
        "c = load(sys.argv[1]); w = c.children[0].value; before = float(w.sum())\n"
        "open(sys.argv[1], 'r+b').truncate(100)\n"
        "assert float(w.sum()) == before, 'changed'\n"
        "evaluate(c)\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


# ---------------------------------------------------------------------------- a hostile server
class _Hostile(http.server.BaseHTTPRequestHandler):
    """Serves ``self.server.body`` (bytes, or a function writing to the socket) to GET; HEAD and
    GET send ``Content-Length`` only when ``self.server.declare`` is true."""

    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def _head(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if self.server.declare:
            self.send_header("Content-Length", str(self.server.size))
        self.end_headers()

    def do_HEAD(self):
        self._head()

    def do_GET(self):
        self._head()
        try:
            self.server.body(self.wfile)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def hostile_server():
    """``start(body, size, declare)`` -> base URL of a server on 127.0.0.1 (stopped afterwards)."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    servers = []

    def start(body, size=0, declare=True):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
        server.daemon_threads = True
        server.body, server.size, server.declare = body, size, declare
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join()


def safetensors_prefix(nbytes: int) -> bytes:
    """The start of a safetensors file whose header claims one uint8 tensor of ``nbytes``."""
    import json

    header = json.dumps({"t": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header


def _for_a_while(prefix: bytes, piece: bytes, pause: float, seconds: float):
    def body(out):
        out.write(prefix)
        out.flush()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            out.write(piece)
            out.flush()
            if pause:
                time.sleep(pause)
    return body


# ---------------------------------------------------------------------------- item 5
def test_an_undeclared_size_is_read_only_up_to_the_budget(hostile_server, monkeypatch):
    monkeypatch.setenv("CIRCUITS_MAX_ALLOC_BYTES", str(16 << 20))
    claimed = 64 << 20  # over the budget, and more than the server ever sends in 3 s
    url = hostile_server(_for_a_while(safetensors_prefix(claimed), b"\0" * 65536, 0, 3.0), declare=False)
    with pytest.raises(StoreError, match="does not say how large.*budget"):
        load(url + "/huge.circuit")
    with pytest.raises(StoreError, match="does not say how large.*budget"):
        TensorStore(url).get("ab" * 32)


# ---------------------------------------------------------------------------- item 18
def test_a_trickling_server_is_given_up_on(hostile_server, monkeypatch):
    monkeypatch.setattr(remotefs, "HTTP_STALL_SECONDS", 0.5)
    monkeypatch.setattr(remotefs, "HTTP_MIN_BYTES_PER_SECOND", 1000)
    url = hostile_server(_for_a_while(safetensors_prefix(1 << 20)[:4], b"\0", 0.05, 3.0), size=(1 << 20) + 64)
    with pytest.raises(StoreError, match="bytes/s, under the 1000 bytes/s"):
        load(url + "/slow.circuit")


def test_a_silent_server_is_given_up_on(hostile_server, monkeypatch):
    monkeypatch.setattr(remotefs, "HTTP_STALL_SECONDS", 0.5)
    url = hostile_server(_for_a_while(b"", b"", 0.05, 3.0), size=1000)
    with pytest.raises(StoreError, match="sent nothing for 0.5 s"):
        load(url + "/silent.circuit")


def test_a_refused_connection_is_not_a_missing_file():
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreError, match="cannot connect") as info:
        load(f"http://127.0.0.1:{port}/c.circuit")
    assert "no such file" not in str(info.value)


# ---------------------------------------------------------------------------- item 6
def test_secrets_in_urls_are_never_echoed(hostile_server, memory_or_skip):
    import socket
    import traceback

    secrets = ("hunter2", "s3kr1t", "ghp_tok3n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    missing = hostile_server(lambda out: None, declare=False)  # answers every file, empty
    urls = [f"http://ann:hunter2@127.0.0.1:{port}/c.circuit?token=s3kr1t",
            missing.replace("http://", "http://ghp_tok3n@") + "/c.circuit?sig=s3kr1t",
            f"{memory_or_skip}/nothing.circuit?X-Amz-Signature=s3kr1t"]
    for url in urls:
        with pytest.raises(StoreError) as info:
            load(url)
        shown = "".join(traceback.format_exception(info.value))
        assert not any(s in shown for s in secrets), shown
    store = TensorStore(f"http://ann:hunter2@127.0.0.1:{port}/tensors?token=s3kr1t")
    assert not any(s in repr(store) for s in secrets) and "ann" in repr(store)
    assert "hunter2" in store.path("ab" * 32)  # the real URL, to use
    with pytest.raises(StoreError) as info:
        store.get("ab" * 32)
    assert not any(s in "".join(traceback.format_exception(info.value)) for s in secrets)


@pytest.fixture
def memory_or_skip():
    pytest.importorskip("fsspec")
    return "memory://circuits-trust-loading"


# ---------------------------------------------------------------------------- item 12
def test_bad_store_roots_and_save_paths_are_store_errors(tmp_path, monkeypatch):
    with pytest.raises(StoreError, match="NUL"):
        save(big_circuit(), str(tmp_path / "a\0b.circuit"))
    monkeypatch.setenv("CIRCUITS_STORE", "~nouser_circuits_test/x")
    with pytest.raises(StoreError, match="CIRCUITS_STORE='~nouser_circuits_test/x': not a usable store location"):
        TensorStore()
    monkeypatch.chdir(tmp_path)
    for root in ("   ", "a/  /b", " "):
        with pytest.raises(StoreError, match="empty or only spaces"):
            TensorStore(root).put(np.ones(2, np.float32))
    assert os.listdir(tmp_path) == []  # nothing was created
