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
  naming the URL, with any password or token in it redacted (``redact``): ``user:***@host``,
  ``?token=***``; so is ``repr(TensorStore(url))``;
- a read never takes more memory than the file's declared size (``Content-Length``), and a
  file whose size the server does not declare is read only up to the allocation budget
  (``circuits.shapes.max_alloc_bytes``);
- ``http(s)`` reads have their own time limits: connecting may take ``HTTP_CONNECT_SECONDS``, no
  byte for ``HTTP_STALL_SECONDS`` ends the read, and so does a server that sends fewer than
  ``HTTP_MIN_BYTES_PER_SECOND`` over any such stretch (a trickle would otherwise hold a ``load``
  for minutes); a refused connection says so, rather than "no such file".

fsspec is an optional dependency (``pip install 'circuits[remote]'``), imported on first use.
``file://`` URLs are plain local paths and never need it.
"""

from __future__ import annotations

import os
import posixpath
import re
import time
from collections.abc import Mapping

import numpy as np

from ..errors import StoreError
from .localfs import aligned_bytes, temporary_name

READ_ONLY_PROTOCOLS = frozenset(("http", "https"))
_CHUNK = 1 << 24
# Time limits of http(s) reads (module settings: a caller may change them).
HTTP_CONNECT_SECONDS = 30.0
HTTP_STALL_SECONDS = 60.0
HTTP_MIN_BYTES_PER_SECOND = 1024

# A URL's user information (``user:password@``, ``token@``) and its query values.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s?#]*)(?::[^/@\s?#]*)?@")
_QUERY_VALUE = re.compile(r"(?P<key>[?&;][^=&;#\s/'\"]+=)[^&;:#\s'\"]*")


def redact(text: str) -> str:
    """``text`` with the secrets of any URL in it replaced by ``***``: a password or a bare
    token before ``@``, and every query value (presigned URLs carry signatures there).

    >>> redact("https://ann:hunter2@host/x?token=abc&v=1: not found")
    'https://ann:***@host/x?token=***&v=***: not found'
    >>> redact("s3://bucket/key"), redact("https://ghp_secret@host/f")
    ('s3://bucket/key', 'https://***@host/f')
    """
    text = str(text)
    if "@" in text:
        text = _USERINFO.sub(_hide_userinfo, text)
    if "=" in text and "?" in text:
        text = _QUERY_VALUE.sub(lambda m: m.group("key") + "***", text)
    return text


def _hide_userinfo(m) -> str:
    if m.group(0).count(":") > 1:  # user:password@
        return f"{m.group('scheme')}{m.group('user')}:***@"
    return f"{m.group('scheme')}***@"  # a bare token


def is_url(path) -> bool:
    """Whether ``path`` is a URL for fsspec (a ``str`` with ``://``, other than ``file://``)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def local_path(path):
    """``path`` with a ``file://`` prefix removed (fsspec's spelling of a local path)."""
    if isinstance(path, str) and path.startswith("file://"):
        return path[len("file://"):]
    return path


def user_path(text):
    """A local path as a user typed it (an argument, ``CIRCUITS_STORE``,
    ``CIRCUITS_COMPILATION_CACHE``): a ``file://`` prefix removed, ``~`` and ``~user`` resolved.
    ``ValueError`` saying what is wrong when a folder name in it is empty or only spaces (a typo)
    or a ``~user`` names no user (it is never taken as a folder of that name).

    >>> str(user_path('file:///tmp/x'))
    '/tmp/x'
    >>> user_path('~no_such_user_here/x')
    Traceback (most recent call last):
    ...
    ValueError: '~no_such_user_here' names no user here (so '~' cannot be resolved)
    """
    from pathlib import Path

    text = local_path(os.fspath(text))
    if not str(text).strip() or any(p and not p.strip() for p in str(text).split(os.sep)):
        raise ValueError("a directory name there is empty or only spaces (a typo?)")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # pathlib's '~user' for a user that does not exist, or no home at all
        raise ValueError(f"{str(text).split(os.sep)[0]!r} names no user here (so '~' cannot be resolved)") from None


def _fail(what: str, e: BaseException) -> StoreError:
    reason = str(e)
    if len(reason) > 300:  # (a backend may quote whole responses)
        reason = reason[:300] + "..."
    return StoreError(redact(f"{what}: {type(e).__name__}: {reason}".rstrip(": ")))


def _not_found_or_failure(name: str, e: FileNotFoundError) -> StoreError | None:
    """None when ``e`` means the file is not there; else the failure it hides (fsspec's http
    turns every error of its size request, a refused connection included, into
    ``FileNotFoundError``)."""
    cause = e.__cause__
    if cause is None or isinstance(cause, FileNotFoundError) or getattr(cause, "status", None) in (404, 410):
        return None
    if isinstance(cause, OSError) or "Connect" in type(cause).__name__:
        return _fail(f"{name}: cannot connect to the server", cause)
    if isinstance(cause, TimeoutError) or "Timeout" in type(cause).__name__:
        return StoreError(redact(f"{name}: the server did not answer within {HTTP_STALL_SECONDS:g} s "
                                 "(circuits.io.remotefs.HTTP_STALL_SECONDS)"))
    return _fail(f"{name}: cannot read", cause)


def filesystem(url: str, storage_options: dict | None = None):
    """``(fs, path)`` for a URL, importing fsspec on first use."""
    try:
        import fsspec
    except ImportError:
        raise StoreError(
            f"{url}: reading or writing a URL needs fsspec; install it with "
            "pip install 'circuits[remote]'"
        ) from None
    if storage_options is not None and (
            not isinstance(storage_options, Mapping) or not all(isinstance(k, str) for k in storage_options)):
        # (its content is not shown: storage options hold passwords and tokens)
        raise StoreError(redact(
            f"{url}: storage_options must be a dict of fsspec options by name (like {{'anon': True}}), got type "
            f"{type(storage_options).__name__}" + (" with keys that are not str" if isinstance(storage_options, Mapping)
                                                   else "")))
    options = dict(storage_options or {})
    if url.split("://", 1)[0].lower() in READ_ONLY_PROTOCOLS:
        options = _with_http_timeouts(options)
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as e:
        raise StoreError(redact(f"{url}: fsspec needs another package for this kind of URL ({e})")) from None
    except Exception as e:  # fsspec and its backends raise many kinds for a bad URL
        raise _fail(f"{url}: not a URL fsspec can open", e) from None


def _with_http_timeouts(options: dict) -> dict:
    """Storage options for fsspec's http filesystem with our time limits, unless the caller gave
    aiohttp's ``timeout`` in ``client_kwargs`` already."""
    client = dict(options.get("client_kwargs") or {})
    if "timeout" not in client:
        try:
            import aiohttp
        except ImportError:  # fsspec says what to install when it needs it
            return options
        client["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=HTTP_CONNECT_SECONDS,
                                                  sock_read=HTTP_STALL_SECONDS)
        options["client_kwargs"] = client
    return options


def _protocols(fs) -> set:
    p = fs.protocol
    return set(p) if isinstance(p, (tuple, list)) else {p}


class RemoteSource:
    """One remote file read front to back; the same interface as ``localfs.Source``.  ``name``
    is the URL as messages show it (redacted)."""

    def __init__(self, fs, path: str, name: str):
        self.name = name = redact(name)
        self.position = 0
        self.http = bool(_protocols(fs) & READ_ONLY_PROTOCOLS)
        try:
            info = fs.info(path)
        except FileNotFoundError as e:
            failure = _not_found_or_failure(name, e)
            if failure is not None:
                raise failure from None
            raise
        except Exception as e:  # the backend's own error types (network, permissions...)
            raise _fail(f"{name}: cannot read", e) from None
        if info.get("type", "file") != "file":
            raise StoreError(f"{name} is a {info.get('type')}, not a file")
        size = info.get("size")
        self.size = int(size) if isinstance(size, int) and size >= 0 else None
        # Web servers need not serve byte ranges: read them as one stream, front to back.
        kwargs = {"block_size": 0} if self.http else {}
        try:
            self.file = fs.open(path, "rb", **kwargs)
        except FileNotFoundError as e:
            failure = _not_found_or_failure(name, e)
            if failure is not None:
                raise failure from None
            raise
        except Exception as e:
            raise _fail(f"{name}: cannot open", e) from None
        self._window = (time.monotonic(), 0)  # (start of the current stretch, bytes since)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        try:
            self.file.close()
        except Exception:  # closing a read-only remote file has nothing left to lose
            pass

    def _chunk(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer when the server sends less at once), timed for http."""
        try:
            chunk = self.file.read(n)
        except Exception as e:
            if "Timeout" in type(e).__name__ or isinstance(e, TimeoutError):
                raise StoreError(f"{self.name}: the server sent nothing for {HTTP_STALL_SECONDS:g} s "
                                 "(circuits.io.remotefs.HTTP_STALL_SECONDS)") from None
            raise _fail(f"{self.name}: cannot read", e) from None
        if self.http:
            start, got = self._window
            got += len(chunk)
            now = time.monotonic()
            if now - start >= HTTP_STALL_SECONDS:
                if got < HTTP_MIN_BYTES_PER_SECOND * (now - start):
                    raise StoreError(
                        f"{self.name}: the server sends {got / (now - start):.0f} bytes/s, under the "
                        f"{HTTP_MIN_BYTES_PER_SECOND} bytes/s a read needs "
                        "(circuits.io.remotefs.HTTP_MIN_BYTES_PER_SECOND); try again later")
                start, got = now, 0
            self._window = (start, got)
        return chunk

    def read(self, n: int) -> bytes:
        if self.size is not None:
            n = max(0, min(n, self.size - self.position))
        parts, got = [], 0
        while got < n:
            chunk = self._chunk(min(n - got, _CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        self.position += got
        return b"".join(parts)

    def read_into(self, view) -> None:
        """Fill ``view`` with the next ``len(view)`` bytes; ``StoreError`` if the file ends first."""
        n = len(view)
        if self.size is not None and self.position + n > self.size:
            raise StoreError(f"{self.name}: truncated file ({self.size - self.position} bytes left, {n} needed)")
        got = 0
        while got < n:
            chunk = self._chunk(min(n - got, _CHUNK))
            if not chunk:
                raise StoreError(f"{self.name}: truncated file ({self.position + got} bytes, more needed)")
            view[got:got + len(chunk)] = chunk
            got += len(chunk)
        self.position += n

    def take(self, n: int) -> np.ndarray:
        arr = aligned_bytes(n)
        self.read_into(memoryview(arr))
        arr.flags.writeable = False
        return arr

    def at_end(self) -> bool:
        if self.size is not None:
            return self.position >= self.size
        return not self._chunk(1)


class RemoteDir:
    """A directory behind a URL: open, write (temporary + move), list."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url.rstrip("/")
        self.shown = redact(self.url)
        self.fs, path = filesystem(self.url, storage_options)
        self.path = path.rstrip("/")
        self.read_only = bool(_protocols(self.fs) & READ_ONLY_PROTOCOLS)

    def where(self, *parts) -> str:
        """The URL of a name below this directory, as messages show it (redacted)."""
        return "/".join((self.shown, *parts))

    def url_of(self, *parts) -> str:
        """The URL of a name below this directory (``TensorStore.path``)."""
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
            raise _fail(f"{self.where(*parts)}: cannot look at it", e) from None

    def list(self, *parts, dirs: bool = False) -> list:
        """Names of the files (or with ``dirs`` the directories) in a directory; [] if none."""
        try:
            entries = self.fs.ls(self._path(*parts), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except Exception as e:
            raise _fail(f"{self.where(*parts)}: cannot list it", e) from None
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
        raise StoreError(f"{redact(url)}: no such file") from None


def write_url(url: str, write, storage_options: dict | None = None) -> None:
    """Write the file at a URL through ``write(fileobj)``: a temporary name, then a move."""
    fs, path = filesystem(url, storage_options)
    _write(fs, path, redact(url), write)


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
            raise _fail(f"cannot write {target}", e) from None
        raise
