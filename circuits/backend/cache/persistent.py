"""Compiled code that outlives the process: JAX's persistent compilation cache, switched on for
every whole program and every per-operation kernel the backend compiles.

A new process then reuses what earlier ones compiled: the first ablation of a known model loads
its kernels from disk instead of waiting for XLA.  The cache lives in the user's cache folder
(``platformdirs.user_cache_dir('circuits')/compiled``).  The environment variable
``CIRCUITS_COMPILATION_CACHE`` moves it (a folder: ``~`` and ``~user`` are resolved, a ``~user``
that names no user is refused; a relative path is taken from the working directory of the first
compilation, once) or turns it off (``off``, ``0``, ``false``, ``no``).

What it trusts.  Compiled code read from the cache runs: JAX reads its own entries (native code)
itself, and a kept executable's payload is a pickle.  So the cache is used only in a folder this
library made, marked with a marker file when it was made (``circuits.backend.cache.cachedir``), this
user's and private, reached through folders only this user or root can change (a folder others
may write to must be sticky, as ``/tmp`` is), and no link is followed inside it.  The folders are
checked again before every read, write, compilation and trim, not once at start-up; a folder
that fails is not used (one warning naming it and the fix; JAX's cache is switched off for the
rest of the process).  A folder named by ``CIRCUITS_COMPILATION_CACHE`` that the library did not
make holds the cache in a marked subfolder, ``circuits-cache``: a user's files are never among
its entries.  A JAX cache folder the user configured already (``jax_compilation_cache_dir``,
``JAX_COMPILATION_CACHE_DIR``) is left to JAX as it is: circuits keeps its executables there only
when it passes the same checks (else one warning), and never trims it.

What it deletes.  The folder is kept under a budget of bytes (``DISK_BYTES``, 2 GiB; the
environment variable ``CIRCUITS_COMPILATION_CACHE_MAX_BYTES`` or ``set_cache_size(disk_bytes=)``
changes it): at most once a day, the first process to use it looks through it in a background
thread and, over the budget, removes the entries used longest ago until it is under 80% of it.
Only entries are counted and removed, never followed through a link: JAX's (their file names,
``<module>-<64 hex digits>-cache`` and ``-atime``) and the kept executables (their file names and
header), in the marked folder only.  An entry removed is compiled again when next needed.

>>> cache_directory({'CIRCUITS_COMPILATION_CACHE': 'off'}) is None
True
>>> cache_directory({'CIRCUITS_COMPILATION_CACHE': '/tmp/x'})
'/tmp/x'
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
import warnings

from ...errors import EvaluationError
from ...shapes import check_budget
from . import cachedir
from .cachedir import Untrusted

__all__ = ["ENV", "cache_directory", "ensure_persistent_cache", "persistent_cache_info", "compiled_before",
           "note_compiled", "compiled_earlier", "DISK_BYTES", "MAX_BYTES_ENV", "trim", "set_disk_budget", "disk_info", "open_folder",
           "recheck", "distrust", "FOLDER", "KEPT_MAGIC", "KEPT_NAME", "is_entry"]

# A program compiled whole is marked (an empty file named by its structural key, beside JAX's
# cache): a new process whose first evaluation is of a marked program runs it whole at once, its
# compilation loaded from JAX's cache (``circuits.backend.tiers``: the cold start).
_MARKS = "circuits-programs"

# The executables kept beside JAX's cache (``circuits.backend.cache.executables`` writes them, the trim
# removes them): their folder, their names, and the header each starts with (this format's, and
# earlier ones, which the trim still removes); ``cachedir.write_file``'s temporaries, and the age
# at which one is a killed writer's.
FOLDER = "circuits-kernels"
KEPT_NAME = re.compile(r"[0-9a-f]{64}")
KEPT_MAGIC = b"circuits-kernel 2\n"
_OLD_KEPT_MAGICS = (b"circuits-kernel 1\n",)
_TEMPORARY = re.compile(r"\.tmp-[0-9a-f]{16}")
_TEMPORARY_AGE = 3600.0
_noted: set = set()

ENV = "CIRCUITS_COMPILATION_CACHE"
_OFF = ("off", "0", "false", "no", "none", "")
DEFAULT_NAME = "compiled"
_lock = threading.Lock()
# mode: 'ours' (a marked folder circuits chose: JAX's cache switched on there, trimmed) or
# 'user' (the JAX cache folder the user configured: never trimmed)
_state = {"done": False, "directory": None, "reason": "not set up yet", "mode": None}
_distrusted: set = set()  # folders that failed a check: never used again in this process
_warned: set = set()

# The disk budget: bytes the directory may hold before its least recently used entries go.
DISK_BYTES = 2 << 30
MAX_BYTES_ENV = "CIRCUITS_COMPILATION_CACHE_MAX_BYTES"
TRIM_EVERY = 24 * 3600  # seconds between looks through the directory (a stamp file says when)
TRIM_RETRY = 600  # seconds before another process looks again when a look was not seen to finish
_STAMP = "circuits-trimmed"
# JAX's entries (jax/_src/lru_cache.py and cache_key.py: '<module name>-<sha256 hex>' + '-cache'
# or '-atime')
JAX_ENTRY = re.compile(r".+-[0-9a-f]{64}-(?:cache|atime)")
_budget: list = []  # [bytes] once read from the environment or set
_last_trim: dict = {}


def cache_directory(environ=None) -> str | None:
    """The folder the persistent cache should use, absolute (None: switched off); ``Untrusted``
    when ``CIRCUITS_COMPILATION_CACHE`` cannot be resolved (a ``~user`` that names no user)."""
    from ...io.remotefs import user_path

    environ = os.environ if environ is None else environ
    value = environ.get(ENV)
    if value is not None:
        if value.strip().lower() in _OFF:
            return None
        try:
            return os.path.abspath(user_path(value))
        except ValueError as e:
            raise Untrusted(value, str(e), f"set {ENV} to a folder that exists or can be made") from None
    import platformdirs

    return os.path.join(os.path.abspath(platformdirs.user_cache_dir("circuits")), DEFAULT_NAME)


def _warn_once(key: str, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _message(e: Untrusted, user: bool) -> str:
    fix = f"{e.fix}; " if e.fix else ""
    if user:
        return (f"circuits: the JAX compilation cache folder {e.path!r} cannot be trusted: {e.problem}; circuits "
                f"keeps no executables there, but JAX itself loads compiled code from it ({fix}or make the folder "
                f"private, or unset JAX_COMPILATION_CACHE_DIR)")
    return (f"circuits: the compilation cache folder {e.path!r} cannot be used: {e.problem}; compiled code is "
            f"not kept or loaded there ({fix}or set {ENV} to a private folder, or to 'off')")


def ensure_persistent_cache() -> str | None:
    """Switch JAX's persistent compilation cache on (once per process) in a folder that passes
    the checks (see the module docstring); returns its folder, checked again now, or None when
    it is off or cannot be trusted (after one warning saying why and what to do)."""
    if _state["done"]:
        directory = _state["directory"]
        return directory if directory is None or recheck() else None
    with _lock:
        if _state["done"]:
            return _state["directory"]
        import jax

        directory, reason, mode, problem = None, None, None, None
        configured = jax.config.jax_compilation_cache_dir
        if configured:
            mode = "user"
            try:
                fd, directory, _ = cachedir.walk(os.path.abspath(configured), create=True, follow=True, ours=1)
                os.close(fd)
                _key_outside(directory)
                reason = "configured by the user (jax_compilation_cache_dir)"
            except Untrusted as e:
                directory, problem = None, e
                reason = f"{e}: JAX's cache folder configured by the user cannot be trusted"
        else:
            try:
                path = cache_directory()
                if path is None:
                    reason = f"switched off by {ENV}"
                else:
                    directory = cachedir.make_root(path)
                    _key_outside(directory)
                    jax.config.update("jax_compilation_cache_dir", directory)
                    # every compilation, the per-operation kernels included (they take milliseconds)
                    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
                    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
                    mode, reason = "ours", "on"
            except Untrusted as e:
                directory, problem, reason = None, e, str(e)
        _state.update(done=True, directory=directory, reason=reason, mode=mode)
    if problem is not None:
        _distrusted.add(problem.path)
        _warn_once(problem.path, _message(problem, mode == "user"))
    if directory is not None and mode == "ours":
        _trim_later(directory)
    return directory


def _key_outside(root: str) -> None:
    """The key that authenticates kept executables must not be inside a cache folder."""
    key = cachedir.key_folder()
    if key == root or key.startswith(root.rstrip("/") + "/"):
        raise Untrusted(root, f"it holds circuits' key folder {key}", "give another folder")


def persistent_cache_info() -> dict:
    """``directory`` (None when off) and ``reason`` (why it is on or off)."""
    return {"directory": _state["directory"], "reason": _state["reason"]}


def distrust(e: Untrusted, root: str | None = None) -> None:
    """A check failed under the cache folder ``root`` (the active one when None): it is not used
    again in this process, JAX's cache is switched off when circuits switched it on there, and one
    warning says which folder failed and the fix."""
    root = _state["directory"] if root is None else root
    user = root is not None and root == _state["directory"] and _state["mode"] == "user"
    with _lock:
        first = root not in _distrusted
        _distrusted.add(root)
        if root is not None and root == _state["directory"]:
            mode = _state["mode"]
            _state.update(directory=None, reason=str(e))
        else:
            mode = None
    if first and mode == "ours":
        import jax
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()
    _warn_once(root or e.path, _message(e, user))


def _marked(root: str) -> bool:
    return not (_state["mode"] == "user" and root == _state["directory"])


def open_folder(root: str, name: str | None = None, *, create: bool = False) -> int | None:
    """A descriptor of the cache folder ``root`` (or of its subfolder ``name``, made when
    ``create``), every folder on the way checked now; None when the subfolder is absent, or the
    folder cannot be trusted (``distrust``: one warning, never used again).  The caller closes it."""
    if root in _distrusted:
        return None
    try:
        fd = cachedir.open_root(root, marked=_marked(root))
    except Untrusted as e:
        distrust(e, root)
        return None
    if name is None:
        return fd
    try:
        return cachedir.open_sub(fd, name, root, create=create)
    except Untrusted as e:
        distrust(e, root)
        return None
    finally:
        os.close(fd)


def recheck() -> bool:
    """Check the active cache folder again (before a compilation writes to it); False when it
    is off or failed (then switched off, with one warning)."""
    directory = _state["directory"]
    if directory is None:
        return False
    fd = open_folder(directory)
    if fd is None:
        return False
    os.close(fd)
    return True


# ---------------------------------------------------------------------------- the disk budget
def disk_budget() -> int:
    """The directory's budget in bytes: ``set_disk_budget``'s, else ``CIRCUITS_COMPILATION_CACHE_MAX_BYTES``'s
    (a value that is not a number of bytes is one warning, and the default holds), else ``DISK_BYTES``."""
    if _budget:
        return _budget[0]
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
    n = check_budget(n, "disk_bytes")  # the value cache's budget check: an int, 0 to a pebibyte
    _budget[:] = [n]
    directory = ensure_persistent_cache()
    if directory is None or _state["mode"] != "ours":  # off, or a directory the user configured for JAX
        return {}
    return trim(directory, n)


def disk_info() -> dict:
    """``directory`` (None when off), ``max_bytes`` (the budget) and ``last_trim`` (what this
    process's last look through it found: ``trim``'s result, {} before one)."""
    return {"directory": _state["directory"], "max_bytes": disk_budget(), "last_trim": dict(_last_trim)}


def _entries(fd: int, kernels: int | None) -> list:
    """``(time last used, size, folder descriptor, name)`` of every entry the trim may remove:
    JAX's (by name) in the root ``fd`` and the kept executables (by name and header) in its
    ``circuits-kernels`` folder ``kernels``; regular files of this user's, links not followed."""
    found = []
    for folder, keep in ((fd, lambda name: JAX_ENTRY.fullmatch(name)), (kernels, None)):
        if folder is None:
            continue
        for name in os.listdir(folder):
            try:
                if keep is not None:
                    if not keep(name):
                        continue
                    info = os.stat(name, dir_fd=folder, follow_symlinks=False)
                    if not stat.S_ISREG(info.st_mode) or not cachedir.is_ours(info):
                        continue
                else:
                    info = is_entry(folder, name)
                    if info is None:
                        continue
            except OSError:  # removed meanwhile (another process)
                continue
            found.append((max(info.st_atime, info.st_mtime), info.st_size, folder, name))
    return found


def is_entry(fd: int, name: str):
    """The ``lstat`` of ``name`` in the kept executables' folder ``fd`` when it is an entry (an
    entry's name, a regular file of this user's with an entry's header, of this format or an
    earlier one) or a writer's leftover temporary; else None.  What the trim may remove."""
    if _TEMPORARY.fullmatch(name):
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        old = time.time() - info.st_mtime > _TEMPORARY_AGE
        return info if old and stat.S_ISREG(info.st_mode) and cachedir.is_ours(info) else None
    if not KEPT_NAME.fullmatch(name):
        return None
    try:
        head = cachedir.read_file(fd, name, head=len(KEPT_MAGIC))
    except Untrusted:
        return None
    if head is None or not head.startswith((KEPT_MAGIC, *_OLD_KEPT_MAGICS)):
        return None
    return os.stat(name, dir_fd=fd, follow_symlinks=False)


def trim(directory: str, max_bytes: int) -> dict:
    """Remove the entries of the cache folder ``directory`` used longest ago (the later of a
    file's access and modification times) until it holds at most 80% of ``max_bytes``, when it
    holds more than ``max_bytes``.  Entries are JAX's compilations and the kept executables
    (``circuits-kernels``), by name (and header); nothing else is counted or removed, and nothing
    at all outside a folder that this library made and marked (``circuits.backend.cache.cachedir``).
    Returns ``{'bytes': before, 'removed': files, 'freed': bytes}`` (with ``'skipped'``: why,
    when the folder cannot be trimmed).

    >>> import tempfile, os
    >>> from circuits.backend.cache import cachedir
    >>> d = cachedir.make_root(os.path.join(tempfile.mkdtemp(), 'cache'))
    >>> for i, name in enumerate(['jit_f-' + '0' * 64 + '-cache', 'jit_g-' + '1' * 64 + '-cache', 'notes.txt']):
    ...     with open(os.path.join(d, name), 'wb') as f: _ = f.write(b'x' * 100)
    ...     os.utime(os.path.join(d, name), (1000 + i, 1000 + i))
    >>> trim(d, 150)
    {'bytes': 200, 'removed': 1, 'freed': 100}
    >>> sorted(name[:5] for name in os.listdir(d))  # the newer entry, the marker, not a user's file
    ['CACHE', 'jit_g', 'notes']
    """
    fd = kernels = None
    out = {"bytes": 0, "removed": 0, "freed": 0}
    try:
        if directory in _distrusted:
            raise Untrusted(directory, "failed a check earlier in this process")
        fd = cachedir.open_root(directory, marked=True)
        kernels = cachedir.open_sub(fd, FOLDER, directory)
        out = _trim_entries(_entries(fd, kernels), max_bytes)
    except Untrusted as e:
        if directory == _state["directory"]:
            distrust(e, directory)
        out["skipped"] = str(e)
    finally:
        for folder in (fd, kernels):
            if folder is not None:
                os.close(folder)
    _last_trim.clear()
    _last_trim.update(out)
    return out


def _trim_entries(entries: list, max_bytes: int) -> dict:
    total = sum(size for _, size, _, _ in entries)
    out = {"bytes": total, "removed": 0, "freed": 0}
    if total > max_bytes:
        entries.sort(key=lambda e: (e[0], e[1], e[3]))
        goal = int(max_bytes * 0.8)
        for _, size, folder, name in entries:
            if total <= goal:
                break
            if not cachedir.remove(folder, name):
                continue
            total -= size
            out["removed"] += 1
            out["freed"] += size
    return out


def _trim_later(directory: str) -> None:
    """Trim ``directory`` in a background thread when no process finished a trim in the last
    ``TRIM_EVERY`` seconds (the stamp file's time).  The stamp is first set ``TRIM_RETRY``
    seconds short of due, so that processes starting together do not all look, and a process
    that ends before its look is done (a short script) leaves it to one a few minutes later; it
    is set to now when the look is done."""
    fd = open_folder(directory)
    if fd is None:
        return
    now = time.time()
    try:
        try:
            if now - os.stat(_STAMP, dir_fd=fd, follow_symlinks=False).st_mtime < TRIM_EVERY:
                return
        except OSError:
            pass
        try:
            due = now - TRIM_EVERY + TRIM_RETRY
            _touch(fd, _STAMP, due)
        except OSError:
            return
    finally:
        os.close(fd)
    budget = disk_budget()
    # A daemon thread: a process that ends meanwhile is not held up (removal is one unlink at a
    # time, so a look cut short leaves nothing half done).
    threading.Thread(target=_quiet_trim, args=(directory, budget), name="circuits-trim", daemon=True).start()


def _touch(fd: int, name: str, when: float | None = None) -> None:
    """Make the empty file ``name`` in the folder ``fd`` (no link followed) and set its times."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    os.close(os.open(name, flags, 0o600, dir_fd=fd))
    os.utime(name, None if when is None else (when, when), dir_fd=fd, follow_symlinks=False)


def _quiet_trim(directory: str, budget: int) -> None:
    try:
        if hasattr(os, "nice"):
            os.nice(10)  # this thread only (Linux)
    except OSError:
        pass
    try:
        out = trim(directory, budget)
        if "skipped" not in out:
            fd = open_folder(directory)
            if fd is not None:
                try:
                    _touch(fd, _STAMP)
                finally:
                    os.close(fd)
    except Exception:  # noqa: BLE001 - trimming never fails anything: a later process tries again
        pass


def compiled_before(key: bytes) -> bool:
    """Whether a process compiled the program of structural key ``key`` whole, with this cache.

    >>> compiled_before(b'never compiled')
    False
    """
    directory = ensure_persistent_cache()
    if directory is None:
        return False
    fd = open_folder(directory, _MARKS)
    if fd is None:
        return False
    try:
        return stat.S_ISREG(os.stat(key.hex(), dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(fd)


def compiled_earlier(key: bytes) -> bool:
    """Whether another process compiled the program of structural key ``key`` whole, with this
    cache (``compiled_before``, and this process has not marked it itself)."""
    return key not in _noted and compiled_before(key)


def note_compiled(key: bytes) -> None:
    """Mark the program of structural key ``key`` as compiled whole (nothing when the cache is off;
    a mark that cannot be written is skipped)."""
    if key in _noted:
        return
    _noted.add(key)
    directory = ensure_persistent_cache()
    if directory is None:
        return
    fd = open_folder(directory, _MARKS, create=True)
    if fd is None:
        return
    try:
        _touch(fd, key.hex())
    except OSError:
        pass
    finally:
        os.close(fd)
