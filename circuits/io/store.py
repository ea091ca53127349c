"""A content-addressed tensor store: one safetensors file per tensor, named by its content hash.

A tensor's key is ``circuits.hashing.content_hash(array)`` (64 hex digits of blake3 over dtype,
shape and bytes); an Array prints the first 24 of them, and ``find`` turns any unique prefix back
into the full key.  Files are written atomically (temporary file in the same directory, fsync,
``os.replace``), so a reader sees a whole tensor or none, and two processes writing the same
tensor at once both succeed with the same bytes.  Nothing needs a lock: a key names its content.
Every read checks the hash, so a corrupted or tampered file raises ``StoreError`` and never
returns data, and ``put`` replaces a damaged file.  Nothing is ever unpickled (``.npy`` headers
are parsed as data; object dtypes are refused).

The store can sit on a directory several people share (``shared=True``, or a root that is
already group-writable, e.g. ``chmod 2775 root``): then its files are group-readable and the
shard directories it creates group-writable.  It never follows a symbolic link inside the root
(a planted link is refused, never written through, read or cleaned through), and it never
changes the mode of a directory it did not create.  The root can also be an fsspec URL
(``s3://``, ``gs://``, ``https://`` read-only...; see ``circuits.io.remotefs``), with the same
checks.  Local file handling lives in ``circuits.io.localfs``.

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

import ast
import json
import math
import os
import re
from pathlib import Path

import numpy as np

from ..errors import StoreError
from ..hashing import content_hash, content_hasher
from ..nodes.leaves import FRESH_VALUE_STORES
from ..shapes import check_allocation
from .localfs import DEAD_TEMPORARY_AGE, LocalDir, aligned_bytes, atomic_write, open_file
from .remotefs import RemoteDir, is_url, redact, user_path

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
_SHARD = re.compile(r"[0-9a-f]{2}")


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


# ---------------------------------------------------------------------------- safetensors
def safetensors_header(tensors: dict, metadata: dict | None = None) -> tuple[bytes, list]:
    """The header bytes of a safetensors file holding ``tensors`` (name -> C-contiguous array),
    and the arrays in the order their bytes follow it (widest dtype first, so each is aligned).

    Raises ``StoreError`` for a header over the 100 MB every safetensors reader (this one
    included) refuses: what is written must load.
    """
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
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    raw += b" " * (-len(raw) % 8)  # 8-byte alignment of the data, as the reference writer does
    if len(raw) > _MAX_HEADER:
        raise StoreError(
            f"{len(tensors)} tensors need a safetensors header of {len(raw) >> 20} MB, over the "
            f"{_MAX_HEADER >> 20} MB that readers accept; split them over several files or a TensorStore"
        )
    return len(raw).to_bytes(8, "little") + raw, [arr for _, arr in order]


def safetensors_writer(tensors: dict, metadata: dict | None = None):
    """A ``write(fileobj)`` function that writes ``tensors`` and ``metadata`` as safetensors."""
    tensors = {name: host_array(arr) for name, arr in tensors.items()}
    header, order = safetensors_header(tensors, metadata)

    def write(f):
        f.write(header)
        for arr in order:
            if arr.nbytes:
                f.write(memoryview(arr.reshape(-1).view(np.uint8)))  # bfloat16 has no buffer format

    return write


def write_safetensors(path, tensors: dict, metadata: dict | None = None, *, group_readable=False) -> None:
    """Atomically write ``tensors`` (name -> array) and string ``metadata`` as a safetensors file."""
    atomic_write(path, safetensors_writer(tensors, metadata), group_readable=group_readable)


def read_safetensors(path) -> tuple[dict, dict]:
    """``(metadata, {name: read-only array})`` of a local safetensors file.

    The header is read and checked first, against the file's size; each tensor is then read into
    a fresh read-only array of its own (see ``read_safetensors_from``).  A file whose header is malformed,
    whose tensors overrun it (truncation) or that has bytes no tensor claims raises
    ``StoreError`` naming the file and the tensor; so does anything but a regular file.
    """
    try:
        source = open_file(path)
    except FileNotFoundError:
        raise StoreError(f"{path}: no such file") from None
    with source:
        return read_safetensors_from(source)


def _short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def read_safetensors_from(source, hashes: dict | None = None) -> tuple[dict, dict]:
    """``read_safetensors`` for an open ``localfs.Source`` or ``remotefs.RemoteSource``.

    Each tensor is copied from the file into memory of its own, never mapped: a verified value
    must stay that value whatever later happens to the file.  The copy is hashed as it is read,
    piece by piece while each piece is still in the cache: with a ``hashes`` dict given, it
    receives ``name -> content_hash`` of every tensor (``circuits.hashing.content_hash``), at
    no second pass over the data.  A source that does not say its size (a web server without
    ``Content-Length``) may claim at most the allocation budget
    (``circuits.shapes.max_alloc_bytes``) in its header.
    """
    path, size = source.name, source.size
    head = source.read(8)
    if len(head) < 8:
        raise StoreError(f"{path}: not a safetensors file (only {len(head)} bytes; truncated?)")
    n = int.from_bytes(head, "little")
    if n > _MAX_HEADER or (size is not None and 8 + n > size):
        raise StoreError(
            f"{path}: not a safetensors file or truncated (its header length field is "
            f"{'over 100 MB' if n > _MAX_HEADER else n} and the file has {size} bytes)"
        )
    raw = source.read(n)
    if len(raw) < n:
        raise StoreError(f"{path}: truncated file (header of {n} bytes, {len(raw)} there)")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise StoreError(f"{path}: corrupted safetensors header ({e})") from None
    except RecursionError:
        raise StoreError(f"{path}: corrupted safetensors header (nested too deeply)") from None
    if not isinstance(header, dict):
        raise StoreError(f"{path}: corrupted safetensors header (not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise StoreError(f"{path}: corrupted safetensors header (__metadata__ must map str to str)")
    entries = [_entry(path, name, info) for name, info in header.items()]
    # Every byte after the header belongs to exactly one tensor: checked before reading them.
    covered = 0
    for start, end, name, _, _ in sorted(entries, key=lambda e: (e[0], e[1])):
        if start < covered:
            raise StoreError(f"{path}: tensor {_short(name)} overlaps another tensor's bytes (corrupted header)")
        if start > covered:
            raise StoreError(f"{path}: {start - covered} bytes before tensor {_short(name)} belong to no tensor")
        covered = end
    if size is not None:
        held = size - 8 - n
        if held < covered:
            last = max(entries, key=lambda e: e[1])[2]
            raise StoreError(
                f"{path}: tensor {_short(last)} needs bytes up to {covered} but the file holds {held} "
                "after its header (truncated file?)"
            )
        if held > covered:
            raise StoreError(f"{path}: {held - covered} trailing bytes belong to no tensor (corrupted file?)")
    if size is None:
        _check_undeclared(path, covered)
    for _, _, name, dtype, shape in entries:  # each within the allocation budget, before reading any
        check_allocation(shape, dtype.name, lambda: f"{path}: tensor {_short(name)}", StoreError)
    arrays = {}
    for start, end, name, dtype, shape in sorted(entries, key=lambda e: (e[0], e[1])):
        arrays[name], digest = _read_tensor(source, path, name, dtype, shape, end - start)
        if hashes is not None:
            hashes[name] = digest
    if size is None and not source.at_end():
        raise StoreError(f"{path}: trailing bytes belong to no tensor (corrupted file?)")
    return metadata, arrays


def _check_undeclared(path, nbytes: int) -> None:
    """Refuse to read ``nbytes`` from a source of unknown size beyond the allocation budget."""
    from ..shapes import MAX_ALLOC_ENV, max_alloc_bytes

    limit = max_alloc_bytes()
    if nbytes > limit:
        raise StoreError(
            f"{path}: the server does not say how large the file is, and its header claims {nbytes} "
            f"bytes of tensors, over the allocation budget of {limit} bytes; raise {MAX_ALLOC_ENV} "
            "if that is intended"
        )


# Hashed while read in pieces of this size: each is hashed while it is still in the CPU's cache.
_READ_PIECE = 1 << 22


def _read_tensor(source, path, name, dtype, shape, nbytes):
    """``(read-only array, its content hash)``: one tensor's bytes read into a fresh array and
    hashed as they arrive."""
    try:
        buf = aligned_bytes(nbytes)
    except MemoryError:
        raise StoreError(f"{path}: not enough memory to read tensor {_short(name)} ({nbytes} bytes); free some "
                         "or read it on a larger machine") from None
    try:
        arr = buf.view(dtype).reshape(shape)
    except (ValueError, OverflowError) as e:  # numpy's limits on dimensions
        raise StoreError(f"{path}: tensor {_short(name)} has a shape numpy cannot hold ({e})") from None
    hasher = content_hasher(dtype, shape, nbytes)
    view = memoryview(buf)
    for start in range(0, nbytes, _READ_PIECE):
        piece = view[start:min(start + _READ_PIECE, nbytes)]
        source.read_into(piece)
        hasher.update(piece)
    arr.flags.writeable = False
    return arr, hasher.hexdigest()


def _entry(path, name, info):
    """``(start, end, name, dtype, shape)`` of one header entry, every field checked."""
    ok = isinstance(info, dict)
    if ok:
        code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        ok = (
            isinstance(code, str) and isinstance(shape, list) and isinstance(offsets, list)
            and len(offsets) == 2 and all(type(s) is int and s >= 0 for s in shape)
            and all(type(o) is int for o in offsets)
        )
    if not ok:
        raise StoreError(f"{path}: corrupted safetensors header entry for tensor {_short(name)}: {_short(info)}")
    if code not in _DTYPE_BY_CODE:
        raise StoreError(f"{path}: tensor {_short(name)} has dtype {_short(code)}, which circuits does not support")
    dtype = numpy_dtype(_DTYPE_BY_CODE[code])
    start, end = offsets
    expected = dtype.itemsize * math.prod(shape)
    if not 0 <= start <= end or end - start != expected:
        raise StoreError(
            f"{path}: tensor {_short(name)} claims bytes {start}..{end}, but {code}{_short(shape)} "
            f"needs {expected} bytes (corrupted header)"
        )
    return start, end, name, dtype, tuple(shape)


# ---------------------------------------------------------------------------- .npy
_NPY_MAGIC = b"\x93NUMPY"
_NPY_MAX_HEADER = 1 << 16


def read_npy_from(source) -> np.ndarray:
    """The array in a ``.npy`` file, read-only, without pickle and without trusting its header:
    the header (a Python literal) is parsed as data, its dtype must be one circuits stores and
    its shape must account for exactly the bytes that follow it."""
    path = source.name
    magic = source.read(8)
    if len(magic) < 8 or magic[:6] != _NPY_MAGIC or magic[6] not in (1, 2, 3):
        raise StoreError(f"{path}: not a .npy file (bad magic bytes)")
    width = 2 if magic[6] == 1 else 4
    length = int.from_bytes(source.read(width).ljust(width, b"\0"), "little")
    if length > _NPY_MAX_HEADER:
        raise StoreError(f"{path}: unreadable .npy file (header of {length} bytes)")
    raw = source.read(length)
    try:
        header = ast.literal_eval(raw.decode("utf-8" if magic[6] == 3 else "latin1"))
        descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
        dtype = np.dtype(descr) if isinstance(descr, str) else None
    except (ValueError, SyntaxError, TypeError, KeyError, RecursionError, MemoryError, UnicodeDecodeError):
        raise StoreError(f"{path}: unreadable .npy file (malformed header)") from None
    if dtype is None or dtype.name not in _CODE_BY_DTYPE or dtype.hasobject:
        raise StoreError(f"{path}: unreadable .npy file (dtype {_short(descr)}; circuits stores {', '.join(_CODE_BY_DTYPE)})")
    if not (isinstance(shape, tuple) and all(type(s) is int and s >= 0 for s in shape) and type(fortran) is bool):
        raise StoreError(f"{path}: unreadable .npy file (shape {_short(shape)})")
    nbytes = dtype.itemsize * math.prod(shape)
    if source.size is not None and source.size - source.position != nbytes:
        raise StoreError(
            f"{path}: unreadable .npy file ({dtype}{list(shape)} needs {nbytes} bytes, the file holds "
            f"{source.size - source.position}; truncated?)"
        )
    if source.size is None:
        _check_undeclared(path, nbytes)
    check_allocation(shape, dtype.name, lambda: f"{path}: the tensor", StoreError)
    data = source.take(nbytes)
    if source.size is None and not source.at_end():
        raise StoreError(f"{path}: unreadable .npy file (trailing bytes)")
    try:
        arr = data.view(dtype).reshape(shape[::-1]).T if fortran else data.view(dtype).reshape(shape)
    except (ValueError, OverflowError) as e:
        raise StoreError(f"{path}: unreadable .npy file ({e})") from None
    if dtype.byteorder == ">":
        arr = arr.astype(dtype.newbyteorder("<"))
        arr.flags.writeable = False
    return arr


# ---------------------------------------------------------------------------- the store
def default_root():
    """``$CIRCUITS_STORE`` if set (a path or an fsspec URL), else ``<user cache dir>/circuits/tensors``."""
    env = os.environ.get("CIRCUITS_STORE")
    if env:
        return env if is_url(env) else user_path(env)
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
    """Content-addressed tensors: ``root/<first 2 hex digits>/<hash>.safetensors``.

    ``root`` is a directory or an fsspec URL (``s3://bucket/tensors``, ``https://host/tensors``
    read-only, ``memory://...``; ``storage_options`` go to fsspec); it defaults to
    ``$CIRCUITS_STORE``, else ``<user cache dir>/circuits/tensors``.  Files ending in ``.npy``
    under the same names are read too (without pickle).

    ``shared``: whether the group may write the store.  ``True`` makes the directories the store
    creates group-writable and its files group-readable, ``False`` never; ``None`` (default)
    shares exactly when the root directory already is group-writable (``chmod 2775 root``).
    The store never changes the mode of a directory it did not create.

    >>> import tempfile, numpy as np
    >>> from circuits import Array, Add
    >>> store = TensorStore(tempfile.mkdtemp())
    >>> x = Array(np.ones(3, np.float32), name='x')
    >>> store.put_circuit(Add(x, x)) == [x.content_hash]
    True
    """

    def __init__(self, root=None, *, shared: bool | None = None, storage_options: dict | None = None):
        env = os.environ.get("CIRCUITS_STORE") if root is None else None
        try:
            root = default_root() if root is None else root
            if isinstance(root, str) and is_url(root):
                self._dir = RemoteDir(root, storage_options)
                self.root = self._dir.url
            else:
                self.root = user_path(root)
                self._dir = LocalDir(self.root, shared)
        except (StoreError, TypeError, ValueError) as e:
            origin = f"CIRCUITS_STORE={redact(env)!r}" if env else f"TensorStore({redact(_short(root))})"
            raise StoreError(f"{origin}: not a usable store location ({redact(str(e))})") from None

    # ``get`` returns only tensors whose content hash it checked to be the key asked for: the
    # parser may build their Arrays without hashing them again (``Array.from_payload``).
    hashes_verified = True

    def __repr__(self):
        return f"TensorStore({redact(str(self.root))!r})"

    def path(self, full_hash: str):
        """Where the tensor with this hash is (or would be) stored: a ``Path``, or a URL."""
        full_hash = _check_full_hash(full_hash)
        parts = (full_hash[:2], f"{full_hash}.safetensors")
        return self._dir.url_of(*parts) if isinstance(self.root, str) else Path(self._dir.where(*parts))

    # ------------------------------------------------------------------ writing
    def put(self, array) -> str:
        """Store a tensor (numpy or jax); returns its full content hash.  Idempotent; a damaged
        file under the tensor's name is replaced."""
        arr = host_array(array)
        return self._put(content_hash(arr), arr)

    def _put(self, full_hash: str, arr: np.ndarray) -> str:
        try:
            self._read(full_hash)  # hash-checked: a damaged copy is no copy
            return full_hash
        except StoreError:
            pass
        self._dir.write(safetensors_writer({"tensor": arr}), full_hash[:2], f"{full_hash}.safetensors")
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
        return self._read(_check_full_hash(full_hash))

    def _read(self, full_hash: str) -> np.ndarray:
        for ext in _EXTENSIONS:
            try:
                source = self._dir.open(full_hash[:2], full_hash + ext)
            except FileNotFoundError:
                continue
            with source:
                if ext == ".npy":
                    arr = read_npy_from(source)
                    actual = content_hash(arr)
                else:
                    hashes: dict = {}
                    _, tensors = read_safetensors_from(source, hashes)
                    if len(tensors) != 1:
                        raise StoreError(f"{source.name}: a store file holds exactly one tensor, this one {len(tensors)}")
                    ((name, arr),) = tensors.items()
                    actual = hashes[name]
            if actual != full_hash:
                raise StoreError(
                    f"{source.name}: the tensor in this file hashes to {actual}, not to its name; the "
                    "file is corrupted or was tampered with (put the tensor again to replace it)"
                )
            return arr
        raise StoreError(f"no tensor {full_hash} in {self}; put it there or load a circuit file")

    def find(self, prefix: str) -> str | None:
        """The full hash of the one stored tensor whose hash starts with ``prefix``; ``None``
        when there is none, ``StoreError`` (listing them) when there are several."""
        prefix = str(prefix).lower()
        if not prefix or not re.fullmatch(r"[0-9a-f]{1,64}", prefix):
            raise StoreError(f"{_short(prefix)} is not a hash prefix (1 to 64 hex digits)")
        if len(prefix) >= 2:
            shards = [prefix[:2]]
        else:
            shards = [s for s in self._shards() if s.startswith(prefix)]
        found = set()
        for shard in shards:
            for name in self._dir.list(shard):
                m = _STORED_FILE.fullmatch(name)
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
            return any(self._dir.isfile(key[:2], key + ext) for ext in _EXTENSIONS)
        return self.find(key) is not None

    def remove_stale_temporaries(self, older_than: float = DEAD_TEMPORARY_AGE) -> int:
        """Delete temporary files that writers killed mid-write left behind: those untouched for
        ``older_than`` seconds whose writer holds no lock on them (live writes keep theirs).
        Returns how many.  Writing a tensor already does this in its shard; local stores only."""
        return sum(self._dir.remove_dead_temporaries(shard, older_than) for shard in self._shards())

    def _shards(self) -> list[str]:
        return [name for name in self._dir.list(dirs=True) if _SHARD.fullmatch(name)]

    def hashes(self) -> list[str]:
        """Every stored tensor's full hash, sorted."""
        found = set()
        for shard in self._shards():
            for name in self._dir.list(shard):
                m = _STORED_FILE.fullmatch(name)
                if m:
                    found.add(m.group(1))
        return sorted(found)


# ``get`` reads every tensor into memory of its own: an Array built from it keeps that memory.
FRESH_VALUE_STORES.add(TensorStore)
