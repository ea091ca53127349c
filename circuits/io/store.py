"""A content-addressed tensor store: one safetensors file per tensor, named by its content hash.

A tensor's key is ``circuits.hashing.content_hash(array)`` (64 hex digits of blake3 over dtype,
shape and bytes); an Array prints the first 24 of them, and ``find`` turns any unique prefix back
into the full key.  Files are written atomically (temporary file in the same directory, fsync,
``os.replace``), so a reader sees a whole tensor or none, and two processes writing the same
tensor at once both succeed with the same bytes.  Nothing needs a lock: a key names its content.
Every read checks the hash, so a corrupted or tampered file raises ``StoreError`` and never
returns data.  Nothing is ever unpickled (``.npy`` files are read with ``allow_pickle=False``).

The store can sit on a directory several people share: files are always group-readable and the
shard directories group-writable (make the root group-owned, e.g. ``chmod 2775 root``, so new
directories inherit the group).

>>> import tempfile, numpy as np
>>> store = TensorStore(tempfile.mkdtemp())
>>> key = store.put(np.arange(4, dtype=np.float32))
>>> store.find(key[:8]) == key, key in store
(True, True)
>>> store.get(key)
array([0., 1., 2., 3.], dtype=float32)

The safetensors format is read and written here rather than through the ``safetensors`` package:
its numpy reader has no bfloat16 and copies every tensor, and its zero-copy writer exists only in
recent versions.  The format is small (8-byte header length, a JSON header, the raw bytes); the
tests check files both ways against the ``safetensors`` package itself.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from pathlib import Path

import numpy as np

from ..errors import StoreError
from ..hashing import content_hash

# numpy dtype name <-> safetensors dtype code (the subset circuits supports).
_CODE_BY_DTYPE = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
}
_DTYPE_BY_CODE = {code: name for name, code in _CODE_BY_DTYPE.items()}
# The safetensors reference implementation refuses headers above 100 MB; so do we, so that a
# corrupted length field cannot make us allocate gigabytes.
_MAX_HEADER = 100 * 1024 * 1024
_FULL_HASH = re.compile(r"[0-9a-f]{64}")
_STORED_FILE = re.compile(r"([0-9a-f]{64})\.(safetensors|npy)")
_EXTENSIONS = (".safetensors", ".npy")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a circuits dtype name (bfloat16 comes from ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def host_array(value) -> np.ndarray:
    """A C-contiguous numpy array of a numpy/jax value, with a dtype circuits can store."""
    arr = np.asarray(value, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    if arr.dtype.name not in _CODE_BY_DTYPE:
        raise StoreError(f"cannot store a tensor of dtype {arr.dtype}; use one of {', '.join(_CODE_BY_DTYPE)}")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr


# ---------------------------------------------------------------------------- atomic files
def _effective_mode(fd_or_path) -> int:
    st = os.fstat(fd_or_path) if isinstance(fd_or_path, int) else os.stat(fd_or_path)
    return stat.S_IMODE(st.st_mode)


def make_dirs(path: Path, shared: bool = False) -> None:
    """``mkdir -p`` that tolerates other processes creating the same directories; with
    ``shared``, directories this call creates are made group-writable."""
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o777)
        except FileExistsError:
            continue
        if shared:
            try:
                os.chmod(d, _effective_mode(str(d)) | 0o070 | (os.stat(d).st_mode & stat.S_ISGID))
            except OSError:  # another user's directory: leave it as they made it
                pass


def atomic_write(path, write, *, group_readable: bool = False) -> None:
    """Write a file through ``write(fileobj)`` so that ``path`` holds either its old content or
    the complete new one: a temporary file in the same directory, fsync, then ``os.replace``.

    The file gets the usual ``0o666 & ~umask`` mode (``group_readable`` adds group read).  If
    ``write`` fails the temporary file is removed; if the process is killed mid-write a stray
    ``.<name>.<random>.tmp`` may remain beside ``path``, never a partial ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        if group_readable:
            os.fchmod(fd, (_effective_mode(fd) & 0o644) | 0o440)
        with os.fdopen(fd, "wb", closefd=True) as f:
            fd = -1
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd != -1:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every filesystem/OS allows opening a directory.
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ---------------------------------------------------------------------------- safetensors
def safetensors_header(tensors: dict, metadata: dict | None = None) -> tuple[bytes, list]:
    """The header bytes of a safetensors file holding ``tensors`` (name -> C-contiguous array),
    and the arrays in the order their bytes follow it (widest dtype first, so each is aligned)."""
    order = sorted(tensors.items(), key=lambda kv: (-kv[1].dtype.itemsize, kv[0]))
    header: dict = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise StoreError(f"safetensors metadata must map str to str, got {k!r}: {type(v).__name__}")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, arr in order:
        header[name] = {
            "dtype": _CODE_BY_DTYPE[arr.dtype.name],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)  # 8-byte alignment of the data, as the reference writer does
    return len(raw).to_bytes(8, "little") + raw, [arr for _, arr in order]


def write_safetensors(path, tensors: dict, metadata: dict | None = None, *, group_readable=False) -> None:
    """Atomically write ``tensors`` (name -> array) and string ``metadata`` as a safetensors file."""
    tensors = {name: host_array(arr) for name, arr in tensors.items()}
    header, order = safetensors_header(tensors, metadata)

    def write(f):
        f.write(header)
        for arr in order:
            if arr.nbytes:
                f.write(memoryview(arr.reshape(-1).view(np.uint8)))  # bfloat16 has no buffer format

    atomic_write(path, write, group_readable=group_readable)


def read_safetensors(path) -> tuple[dict, dict]:
    """``(metadata, {name: read-only array})`` of a safetensors file, read with one copy.

    The arrays are views into one read-only buffer holding the whole file.  A file whose header
    is malformed, whose tensors overrun it (truncation) or that has bytes no tensor claims
    raises ``StoreError`` naming the file and the tensor.
    """
    path = Path(path)
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            buf = np.empty(size, np.uint8)
            view = memoryview(buf)
            got = 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
    except FileNotFoundError:
        raise StoreError(f"{path}: no such file") from None
    except OSError as e:
        raise StoreError(f"{path}: cannot read ({e})") from None
    if got != size:
        raise StoreError(f"{path}: file shrank while being read ({got} of {size} bytes)")
    buf.flags.writeable = False
    return parse_safetensors(buf, path)


def parse_safetensors(buf: np.ndarray, path="<bytes>") -> tuple[dict, dict]:
    """Parse a safetensors file held in a uint8 buffer; see ``read_safetensors``."""
    size = buf.size
    if size < 8:
        raise StoreError(f"{path}: not a safetensors file (only {size} bytes; truncated?)")
    n = int.from_bytes(buf[:8].tobytes(), "little")
    if n > _MAX_HEADER or 8 + n > size:
        raise StoreError(
            f"{path}: not a safetensors file or truncated (header claims {n} bytes, file has {size})"
        )
    try:
        header = json.loads(buf[8 : 8 + n].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"{path}: corrupted safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise StoreError(f"{path}: corrupted safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise StoreError(f"{path}: corrupted safetensors header (__metadata__ must map str to str)")
    data = buf[8 + n :]
    arrays = {}
    spans = []
    for name, info in header.items():
        try:
            code = info["dtype"]
            shape = tuple(info["shape"])
            start, end = info["data_offsets"]
            ok = (
                all(type(s) is int and s >= 0 for s in shape)
                and type(start) is int and type(end) is int
            )
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise StoreError(f"{path}: corrupted safetensors header entry for tensor {name!r}: {info!r}")
        if code not in _DTYPE_BY_CODE:
            raise StoreError(f"{path}: tensor {name!r} has dtype {code!r}, which circuits does not support")
        dtype = numpy_dtype(_DTYPE_BY_CODE[code])
        expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if not 0 <= start <= end or end - start != expected:
            raise StoreError(
                f"{path}: tensor {name!r} claims bytes {start}..{end}, but {code}{list(shape)} "
                f"needs {expected} bytes (corrupted header)"
            )
        if end > data.size:
            raise StoreError(
                f"{path}: tensor {name!r} needs bytes up to {end} but the file holds {data.size} "
                "after its header (truncated file?)"
            )
        arrays[name] = data[start:end].view(dtype).reshape(shape)
        spans.append((start, end, name))
    spans.sort()
    covered = 0
    for start, end, name in spans:
        if start < covered:
            raise StoreError(f"{path}: tensor {name!r} overlaps another tensor's bytes (corrupted header)")
        if start > covered:
            raise StoreError(f"{path}: {start - covered} bytes before tensor {name!r} belong to no tensor")
        covered = end
    if covered != data.size:
        raise StoreError(f"{path}: {data.size - covered} trailing bytes belong to no tensor (corrupted file?)")
    return metadata, arrays


# ---------------------------------------------------------------------------- the store
def default_root() -> Path:
    """``$CIRCUITS_STORE`` if set, else ``<user cache dir>/circuits/tensors``."""
    env = os.environ.get("CIRCUITS_STORE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("circuits")) / "tensors"


def _check_full_hash(key) -> str:
    key = str(key).lower()
    if not _FULL_HASH.fullmatch(key):
        raise StoreError(
            f"{key!r} is not a full content hash (64 hex digits); use store.find(prefix) to "
            "complete a prefix"
        )
    return key


class TensorStore:
    """Content-addressed tensors on disk: ``root/<first 2 hex digits>/<hash>.safetensors``.

    ``root`` defaults to ``$CIRCUITS_STORE``, else ``<user cache dir>/circuits/tensors``.  Files
    ending in ``.npy`` under the same names are read too (with ``allow_pickle=False``).

    >>> import tempfile, numpy as np
    >>> from circuits import Array, Add
    >>> store = TensorStore(tempfile.mkdtemp())
    >>> x = Array(np.ones(3, np.float32), name='x')
    >>> store.put_circuit(Add(x, x)) == [x.content_hash]
    True
    """

    def __init__(self, root=None):
        self.root = Path(root).expanduser() if root is not None else default_root()

    def __repr__(self):
        return f"TensorStore({str(self.root)!r})"

    def path(self, full_hash: str) -> Path:
        """Where the tensor with this hash is (or would be) stored."""
        full_hash = _check_full_hash(full_hash)
        return self.root / full_hash[:2] / f"{full_hash}.safetensors"

    def _existing(self, full_hash: str) -> Path | None:
        base = self.root / full_hash[:2] / full_hash
        for ext in _EXTENSIONS:
            p = base.with_name(full_hash + ext)
            if p.is_file():
                return p
        return None

    # ------------------------------------------------------------------ writing
    def put(self, array) -> str:
        """Store a tensor (numpy or jax); returns its full content hash.  Idempotent."""
        arr = host_array(array)
        return self._put(content_hash(arr), arr)

    def _put(self, full_hash: str, arr: np.ndarray) -> str:
        target = self.path(full_hash)
        if target.is_file():
            # Same name means same content; a damaged copy is rewritten (and get() would refuse it).
            header, _ = safetensors_header({"tensor": arr})
            if target.stat().st_size == len(header) + arr.nbytes:
                return full_hash
        make_dirs(target.parent, shared=True)
        write_safetensors(target, {"tensor": arr}, group_readable=True)
        return full_hash

    def put_circuit(self, circuit) -> list[str]:
        """Store the value of every Array (with a value) in ``circuit``; returns their hashes
        in traversal order, each once.  Placeholder Arrays are skipped."""
        from ..nodes.leaves import Array
        from ..traversal import toposort

        done: dict[str, None] = {}
        for node in toposort(circuit):
            if isinstance(node, Array) and node.value is not None and node.content_hash not in done:
                self._put(node.content_hash, host_array(node.value))
                done[node.content_hash] = None
        return list(done)

    # ------------------------------------------------------------------ reading
    def get(self, full_hash: str) -> np.ndarray:
        """The tensor with this full hash, read-only, its hash checked (``StoreError`` if the
        file is missing, corrupted or tampered with)."""
        full_hash = _check_full_hash(full_hash)
        path = self._existing(full_hash)
        if path is None:
            raise StoreError(f"no tensor {full_hash} in {self}; put it there or load a circuit file")
        if path.suffix == ".npy":
            try:
                arr = np.load(path, allow_pickle=False, mmap_mode=None)
            except (ValueError, OSError, EOFError) as e:
                raise StoreError(f"{path}: unreadable .npy file ({e})") from None
            arr.flags.writeable = False
        else:
            _, tensors = read_safetensors(path)
            if len(tensors) != 1:
                raise StoreError(f"{path}: a store file holds exactly one tensor, this one {len(tensors)}")
            (arr,) = tensors.values()
        actual = content_hash(arr)
        if actual != full_hash:
            raise StoreError(
                f"{path}: the tensor in this file hashes to {actual}, not to its name; the file is "
                "corrupted or was tampered with (delete it and put the tensor again)"
            )
        return arr

    def find(self, prefix: str) -> str | None:
        """The full hash of the one stored tensor whose hash starts with ``prefix``; ``None``
        when there is none, ``StoreError`` (listing them) when there are several."""
        prefix = str(prefix).lower()
        if not prefix or not re.fullmatch(r"[0-9a-f]{1,64}", prefix):
            raise StoreError(f"{prefix!r} is not a hash prefix (1 to 64 hex digits)")
        if len(prefix) >= 2:
            shards = [self.root / prefix[:2]]
        else:
            try:
                shards = [e.path for e in os.scandir(self.root) if e.name.startswith(prefix) and len(e.name) == 2]
            except FileNotFoundError:
                return None
        found = set()
        for shard in shards:
            try:
                entries = os.scandir(shard)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for e in entries:
                    m = _STORED_FILE.fullmatch(e.name)
                    if m and m.group(1).startswith(prefix):
                        found.add(m.group(1))
        if not found:
            return None
        if len(found) > 1:
            listed = sorted(found)
            more = f" and {len(listed) - 10} more" if len(listed) > 10 else ""
            raise StoreError(
                f"hash prefix {prefix!r} is ambiguous in {self}: it matches "
                + ", ".join(listed[:10]) + more + "; give more digits"
            )
        return found.pop()

    def __contains__(self, key) -> bool:
        """``full_hash in store``, ``prefix in store`` (a unique prefix) or ``array in store``."""
        key = getattr(key, "content_hash", key)
        key = str(key).lower()
        if _FULL_HASH.fullmatch(key):
            return self._existing(key) is not None
        return self.find(key) is not None

    def remove_stale_temporaries(self, older_than: float = 24 * 3600) -> int:
        """Delete temporary files that writers killed mid-write left behind (only those older
        than ``older_than`` seconds, so that live writes are untouched); returns how many."""
        import time

        cutoff = time.time() - older_than
        removed = 0
        for shard in self._shards():
            with os.scandir(shard) as entries:
                for e in entries:
                    if e.name.startswith(".") and e.name.endswith(".tmp") and e.stat().st_mtime < cutoff:
                        try:
                            os.unlink(e.path)
                            removed += 1
                        except FileNotFoundError:
                            pass
        return removed

    def _shards(self) -> list[str]:
        try:
            return [e.path for e in os.scandir(self.root) if e.is_dir() and len(e.name) == 2]
        except FileNotFoundError:
            return []

    def hashes(self) -> list[str]:
        """Every stored tensor's full hash, sorted."""
        found = set()
        for shard in self._shards():
            with os.scandir(shard) as entries:
                for e in entries:
                    m = _STORED_FILE.fullmatch(e.name)
                    if m:
                        found.add(m.group(1))
        return sorted(found)
