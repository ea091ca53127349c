"""Files behind an fsspec URL (``s3://``, ``gs://``, ``https://``, ``memory://``...).

Teams share tensors through buckets and web servers: ``TensorStore(url)``, ``load(url)`` and
``save(circuit, url)`` take any URL fsspec understands, with the same guarantees as on a local
disk where the filesystem allows them:

- reads check the size before the data (a header that claims more than the file holds is refused
  before anything is allocated) and every tensor's hash, as locally;
- writes go to a hidden temporary name and are then moved onto the final name, so a reader never
  sees a partial file (object stores move by a server-side copy, which publishes the object
  whole); a failed write removes its temporary;
- ``http://`` and ``https://`` are read-only (fsspec cannot write there): writing raises
  ``StoreError``;
- every failure of the filesystem (missing package, network, permissions) is a ``StoreError``
  naming the URL.

fsspec is an optional dependency (``pip install 'circuits[remote]'``), imported on first use.
``file://`` URLs are plain local paths and never need it.
"""

from __future__ import annotations

import posixpath

import numpy as np

from ..errors import StoreError
from .localfs import temporary_name

READ_ONLY_PROTOCOLS = frozenset(("http", "https"))
_CHUNK = 1 << 24


def is_url(path) -> bool:
    """Whether ``path`` is a URL for fsspec (a ``str`` with ``://``, other than ``file://``)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def local_path(path):
    """``path`` with a ``file://`` prefix removed (fsspec's spelling of a local path)."""
    if isinstance(path, str) and path.startswith("file://"):
        return path[len("file://"):]
    return path


def _fail(what: str, e: BaseException) -> StoreError:
    return StoreError(f"{what}: {type(e).__name__}: {e}".rstrip(": "))


def filesystem(url: str, storage_options: dict | None = None):
    """``(fs, path)`` for a URL, importing fsspec on first use."""
    try:
        import fsspec
    except ImportError:
        raise StoreError(
            f"{url}: reading or writing a URL needs fsspec; install it with "
            "pip install 'circuits[remote]'"
        ) from None
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        raise StoreError(f"{url}: fsspec needs another package for this kind of URL ({e})") from None
    except Exception as e:  # fsspec and its backends raise many kinds for a bad URL
        raise _fail(f"{url}: not a URL fsspec can open", e) from e


def _protocols(fs) -> set:
    p = fs.protocol
    return set(p) if isinstance(p, (tuple, list)) else {p}


class RemoteSource:
    """One remote file read front to back; the same interface as ``localfs.Source``."""

    def __init__(self, fs, path: str, name: str):
        self.name = name
        self.position = 0
        try:
            info = fs.info(path)
        except FileNotFoundError:
            raise
        except Exception as e:  # the backend's own error types (network, permissions...)
            raise _fail(f"{name}: cannot read", e) from e
        if info.get("type", "file") != "file":
            raise StoreError(f"{name} is a {info.get('type')}, not a file")
        size = info.get("size")
        self.size = int(size) if isinstance(size, int) and size >= 0 else None
        # Web servers need not serve byte ranges: read them as one stream, front to back.
        kwargs = {"block_size": 0} if _protocols(fs) & READ_ONLY_PROTOCOLS else {}
        try:
            self.file = fs.open(path, "rb", **kwargs)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise _fail(f"{name}: cannot open", e) from e

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        try:
            self.file.close()
        except Exception:  # closing a read-only remote file has nothing left to lose
            pass

    def read(self, n: int) -> bytes:
        if self.size is not None:
            n = max(0, min(n, self.size - self.position))
        parts, got = [], 0
        while got < n:
            try:
                chunk = self.file.read(min(n - got, _CHUNK))
            except Exception as e:
                raise _fail(f"{self.name}: cannot read", e) from e
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        self.position += got
        return b"".join(parts)

    def map(self, n: int) -> np.ndarray:
        if self.size is not None and self.position + n > self.size:
            raise StoreError(f"{self.name}: truncated file ({self.size - self.position} bytes left, {n} needed)")
        # Grown chunk by chunk: memory follows the bytes that arrive, not what a header claims.
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.file.read(min(n - len(buf), _CHUNK))
            except Exception as e:
                raise _fail(f"{self.name}: cannot read", e) from e
            if not chunk:
                raise StoreError(f"{self.name}: truncated file ({len(buf)} of {n} bytes)")
            buf += chunk
        self.position += n
        arr = np.frombuffer(buf, np.uint8) if n else np.empty(0, np.uint8)
        arr.flags.writeable = False
        return arr

    def at_end(self) -> bool:
        if self.size is not None:
            return self.position >= self.size
        return not self.read(1)


class RemoteDir:
    """A directory behind a URL: open, write (temporary + move), list."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url.rstrip("/")
        self.fs, path = filesystem(self.url, storage_options)
        self.path = path.rstrip("/")
        self.read_only = bool(_protocols(self.fs) & READ_ONLY_PROTOCOLS)

    def where(self, *parts) -> str:
        """The URL of a name below this directory (for messages and ``TensorStore.path``)."""
        return "/".join((self.url, *parts))

    def _path(self, *parts) -> str:
        return posixpath.join(self.path, *parts)

    def open(self, *parts) -> RemoteSource:
        return RemoteSource(self.fs, self._path(*parts), self.where(*parts))

    def isfile(self, *parts) -> bool:
        try:
            return bool(self.fs.isfile(self._path(*parts)))
        except FileNotFoundError:
            return False
        except Exception as e:
            raise _fail(f"{self.where(*parts)}: cannot look at it", e) from e

    def list(self, *parts, dirs: bool = False) -> list:
        """Names of the files (or with ``dirs`` the directories) in a directory; [] if none."""
        try:
            entries = self.fs.ls(self._path(*parts), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except Exception as e:
            raise _fail(f"{self.where(*parts)}: cannot list it", e) from e
        wanted = "directory" if dirs else "file"
        names = []
        for entry in entries:
            kind = entry.get("type")
            if kind == wanted or (kind is None and not dirs):
                names.append(posixpath.basename(str(entry["name"]).rstrip("/")))
        return names

    def write(self, write, *parts) -> None:
        """Write a file through ``write(fileobj)``: to a temporary name, then moved into place."""
        _write(self.fs, self._path(*parts), self.where(*parts), write)

    def remove_dead_temporaries(self, shard: str, older_than: float) -> int:
        return 0  # no locks to tell a live writer from a dead one remotely: left alone


def open_url(url: str, storage_options: dict | None = None) -> RemoteSource:
    """The file at a URL, opened for ``read_safetensors_from``; ``StoreError`` when missing."""
    fs, path = filesystem(url, storage_options)
    try:
        return RemoteSource(fs, path, url)
    except FileNotFoundError:
        raise StoreError(f"{url}: no such file") from None


def write_url(url: str, write, storage_options: dict | None = None) -> None:
    """Write the file at a URL through ``write(fileobj)``: a temporary name, then a move."""
    fs, path = filesystem(url, storage_options)
    _write(fs, path, url, write)


def _write(fs, final: str, target: str, write) -> None:
    if _protocols(fs) & READ_ONLY_PROTOCOLS:
        raise StoreError(f"cannot write {target}: http(s) URLs are read-only")
    directory = posixpath.dirname(final)
    tmp = posixpath.join(directory, temporary_name(posixpath.basename(final)))
    try:
        if directory:
            fs.makedirs(directory, exist_ok=True)
        with fs.open(tmp, "wb") as f:
            write(f)
        fs.mv(tmp, final)
    except BaseException as e:
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        except Exception:  # the first error is the one to report
            pass
        if isinstance(e, Exception) and not isinstance(e, StoreError):
            raise _fail(f"cannot write {target}", e) from e
        raise
