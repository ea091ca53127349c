"""Compiled code that outlives the process: JAX's persistent compilation cache, switched on for
every whole program and every per-operation kernel the backend compiles.

A new process then reuses what earlier ones compiled: the first ablation of a known model loads
its kernels from disk instead of waiting for XLA.  The cache lives in the user's cache directory
(``platformdirs.user_cache_dir('circuits')/jax``, created private: mode 0700).  The environment
variable ``CIRCUITS_COMPILATION_CACHE`` moves it (a directory path) or turns it off (``off``,
``0``, ``false``, ``no``).  A directory that cannot be used (a file, not writable, writable by
others) gives one warning naming it and the fix; evaluation goes on without the cache.  A JAX
cache directory the user configured already (``jax_compilation_cache_dir``) is left as it is.

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
import warnings

__all__ = ["ENV", "cache_directory", "ensure_persistent_cache", "persistent_cache_info", "compiled_before",
           "note_compiled", "COLD_COMPILE_MAX_OPS"]

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
        return directory


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
