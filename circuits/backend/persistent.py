"""Compiled code that outlives the process: JAX's persistent compilation cache, switched on for
every whole program and every per-operation kernel the backend compiles.

A new process then reuses what earlier ones compiled: the first ablation of a known model loads
its kernels from disk instead of waiting for XLA.  The cache lives in the user's cache directory
(``platformdirs.user_cache_dir('circuits')/jax``, created private: mode 0700).  The environment
variable ``CIRCUITS_COMPILATION_CACHE`` moves it (a directory path) or turns it off (``off``,
``0``, ``false``, ``no``).  A directory that cannot be used (a file, not writable, writable by
others) gives one warning naming it and the fix; evaluation goes on without the cache.  A JAX
cache directory the user configured already (``jax_compilation_cache_dir``) is left as it is.

The directory is kept under a budget of bytes (``DISK_BYTES``, 2 GiB; the environment variable
``CIRCUITS_COMPILATION_CACHE_MAX_BYTES`` or ``set_cache_size(disk_bytes=)`` changes it): at most
once a day, the first process to use it looks through it in a background thread and, over the
budget, removes the entries used longest ago (JAX's compilations and the kept executables) until
it is under 80% of it.  An entry removed is compiled again when next needed.

>>> import os
>>> cache_directory({'CIRCUITS_COMPILATION_CACHE': 'off'}) is None
True
>>> cache_directory({'CIRCUITS_COMPILATION_CACHE': '/tmp/x'})
'/tmp/x'
"""

from __future__ import annotations

import os
import stat
import threading
import time
import warnings

__all__ = ["ENV", "cache_directory", "ensure_persistent_cache", "persistent_cache_info", "compiled_before",
           "note_compiled", "COLD_COMPILE_MAX_OPS", "DISK_BYTES", "MAX_BYTES_ENV", "trim", "set_disk_budget",
           "disk_info"]

# A program compiled whole is marked (an empty file named by its structural key, beside JAX's
# cache): a new process whose first evaluation is of a marked program runs it whole at once, its
# compilation loaded from JAX's cache.  A new process's first op-by-op evaluation of a program of
# at most this many nodes compiles it whole in the background (once per process), so that the
# next process finds it.
COLD_COMPILE_MAX_OPS = 1000
_MARKS = "circuits-programs"
_noted: set = set()

ENV = "CIRCUITS_COMPILATION_CACHE"
_OFF = ("off", "0", "false", "no", "none", "")
_lock = threading.Lock()
_state = {"done": False, "directory": None, "reason": "not set up yet"}

# The disk budget: bytes the directory may hold before its least recently used entries go.
DISK_BYTES = 2 << 30
MAX_BYTES_ENV = "CIRCUITS_COMPILATION_CACHE_MAX_BYTES"
TRIM_EVERY = 24 * 3600  # seconds between looks through the directory (a stamp file says when)
TRIM_RETRY = 600  # seconds before another process looks again when a look was not seen to finish
_STAMP = "circuits-trimmed"
_budget: list = []  # [bytes] once read from the environment or set
_last_trim: dict = {}


def cache_directory(environ=None) -> str | None:
    """The directory the persistent cache should use (None: switched off)."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV)
    if value is not None:
        if value.strip().lower() in _OFF:
            return None
        return os.path.expanduser(value)
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("circuits"), "jax")


def _usable(path: str) -> str | None:
    """Why ``path`` cannot hold the cache (None: it can, created if needed)."""
    try:
        if os.path.lexists(path) and not os.path.isdir(path):
            return "it exists and is not a directory"
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except OSError as e:
        return f"it cannot be created ({e.strerror or e})"
    except ValueError as e:  # a NUL in the path
        return f"it is not a valid path ({e})"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return "it belongs to another user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "others can write to it (compiled code is loaded from it: make it private with chmod 700)"
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def ensure_persistent_cache() -> str | None:
    """Switch JAX's persistent compilation cache on (once per process); returns its directory,
    or None when it is off or unusable (after one warning saying why and what to do)."""
    if _state["done"]:
        return _state["directory"]
    with _lock:
        if _state["done"]:
            return _state["directory"]
        import jax

        directory, reason = None, None
        configured = jax.config.jax_compilation_cache_dir
        if configured:
            directory, reason = configured, "configured by the user (jax_compilation_cache_dir)"
        else:
            path = cache_directory()
            if path is None:
                reason = f"switched off by {ENV}"
            else:
                problem = _usable(path)
                if problem is not None:
                    reason = f"{path}: {problem}"
                    warnings.warn(
                        f"circuits: the compilation cache directory {path!r} cannot be used: {problem}; "
                        f"compiled code will not be kept across processes (set {ENV} to a private, writable "
                        f"directory, or to 'off')", RuntimeWarning, stacklevel=3)
                else:
                    jax.config.update("jax_compilation_cache_dir", path)
                    # every compilation, the per-operation kernels included (they take milliseconds)
                    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
                    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
                    directory, reason = path, "on"
        _state.update(done=True, directory=directory, reason=reason)
    if directory is not None and reason == "on":
        _trim_later(directory)
    return directory


# ---------------------------------------------------------------------------- the disk budget
def disk_budget() -> int:
    """The directory's budget in bytes: ``set_disk_budget``'s, else ``CIRCUITS_COMPILATION_CACHE_MAX_BYTES``'s
    (a value that is not a number of bytes is one warning, and the default holds), else ``DISK_BYTES``."""
    if _budget:
        return _budget[0]
    from ..errors import EvaluationError
    from .incremental import check_budget

    value, n = os.environ.get(MAX_BYTES_ENV), DISK_BYTES
    if value is not None:
        try:
            n = check_budget(int(value.strip()), MAX_BYTES_ENV)
        except (ValueError, EvaluationError) as e:
            warnings.warn(f"circuits: {MAX_BYTES_ENV}={value!r} is not a budget ({e}); the compilation cache "
                          f"keeps its default of {DISK_BYTES} bytes (give a number of bytes, e.g. {DISK_BYTES})",
                          RuntimeWarning, stacklevel=2)
            n = DISK_BYTES
    _budget[:] = [n]
    return n


def set_disk_budget(n: int) -> dict:
    """Keep the compilation cache's directory under ``n`` bytes from now on, trimming it at once
    (see the module docstring); returns what ``trim`` removed ({} when the cache is off)."""
    from .incremental import check_budget

    n = check_budget(n, "disk_bytes")  # the value cache's budget check: an int, 0 to a pebibyte
    _budget[:] = [n]
    directory = ensure_persistent_cache()
    if directory is None or _state["reason"] != "on":  # off, or a directory the user configured for JAX
        return {}
    return trim(directory, n)


def disk_info() -> dict:
    """``directory`` (None when off), ``max_bytes`` (the budget) and ``last_trim`` (what this
    process's last look through it found: ``trim``'s result, {} before one)."""
    return {"directory": _state["directory"], "max_bytes": disk_budget(), "last_trim": dict(_last_trim)}


def trim(directory: str, max_bytes: int) -> dict:
    """Remove the entries of the cache ``directory`` used longest ago (the later of a file's
    access and modification times) until it holds at most 80% of ``max_bytes``, when it holds
    more than ``max_bytes``.  Entries are JAX's compilations and the kept executables
    (``circuits-kernels``); the marks of programs compiled whole are not counted or removed.
    Returns ``{'bytes': before, 'removed': files, 'freed': bytes}``.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> for i, name in enumerate(['old-cache', 'new-cache']):
    ...     with open(os.path.join(d, name), 'wb') as f: _ = f.write(b'x' * 100)
    ...     os.utime(os.path.join(d, name), (1000 + i, 1000 + i))
    >>> trim(d, 150), sorted(os.listdir(d))
    ({'bytes': 200, 'removed': 1, 'freed': 100}, ['new-cache'])
    """
    from .executables import FOLDER

    entries = []
    total = 0
    for folder in (directory, os.path.join(directory, FOLDER)):
        try:
            listing = os.scandir(folder)
        except OSError:
            continue
        with listing:
            for entry in listing:
                try:
                    if not entry.is_file(follow_symlinks=False) or entry.name == _STAMP:
                        continue
                    info = entry.stat(follow_symlinks=False)
                except OSError:  # removed meanwhile (another process)
                    continue
                total += info.st_size
                entries.append((max(info.st_atime, info.st_mtime), info.st_size, entry.path))
    out = {"bytes": total, "removed": 0, "freed": 0}
    if total > max_bytes:
        entries.sort()
        goal = int(max_bytes * 0.8)
        for _, size, path in entries:
            if total <= goal:
                break
            try:
                os.unlink(path)
            except OSError:
                continue
            total -= size
            out["removed"] += 1
            out["freed"] += size
    _last_trim.clear()
    _last_trim.update(out)
    return out


def _trim_later(directory: str) -> None:
    """Trim ``directory`` in a background thread when no process finished a trim in the last
    ``TRIM_EVERY`` seconds (the stamp file's time).  The stamp is first set ``TRIM_RETRY``
    seconds short of due, so that processes starting together do not all look, and a process
    that ends before its look is done (a short script) leaves it to one a few minutes later; it
    is set to now when the look is done."""
    stamp = os.path.join(directory, _STAMP)
    now = time.time()
    try:
        if now - os.stat(stamp).st_mtime < TRIM_EVERY:
            return
    except OSError:
        pass
    try:
        with open(stamp, "a"):
            pass
        due = now - TRIM_EVERY + TRIM_RETRY
        os.utime(stamp, (due, due))
    except OSError:
        return
    budget = disk_budget()
    # A daemon thread: a process that ends meanwhile is not held up (removal is one unlink at a
    # time, so a look cut short leaves nothing half done).
    threading.Thread(target=_quiet_trim, args=(directory, budget, stamp), name="circuits-trim", daemon=True).start()


def _quiet_trim(directory: str, budget: int, stamp: str) -> None:
    try:
        if hasattr(os, "nice"):
            os.nice(10)  # this thread only (Linux)
    except OSError:
        pass
    try:
        trim(directory, budget)
        os.utime(stamp)
    except Exception:  # noqa: BLE001 - trimming never fails anything: a later process tries again
        pass


def persistent_cache_info() -> dict:
    """``directory`` (None when off) and ``reason`` (why it is on or off)."""
    return {"directory": _state["directory"], "reason": _state["reason"]}


def _mark_path(key: bytes) -> str | None:
    directory = ensure_persistent_cache()
    if directory is None:
        return None
    return os.path.join(directory, _MARKS, key.hex())


def compiled_before(key: bytes) -> bool:
    """Whether a process compiled the program of structural key ``key`` whole, with this cache.

    >>> compiled_before(b'never compiled')
    False
    """
    path = _mark_path(key)
    return path is not None and os.path.exists(path)


def note_compiled(key: bytes) -> None:
    """Mark the program of structural key ``key`` as compiled whole (nothing when the cache is off;
    a mark that cannot be written is skipped)."""
    if key in _noted:
        return
    _noted.add(key)
    path = _mark_path(key)
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError:
        pass
