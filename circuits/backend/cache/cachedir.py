"""The compilation cache's folders and files, trusted only while no one else can change them.

Compiled code read from the cache runs (JAX's entries are native code; a kept executable's
payload is a pickle, ``jax.experimental.serialize_executable``'s), so what is read must be what
this user wrote.  Every operation on the cache (``circuits.backend.cache.persistent``,
``circuits.backend.cache.executables``) goes through this module, which checks, at the moment of use:

- **the folders on the way down**, from ``/``, opened one at a time without following links
  (``walk``): every folder and link belongs to this user or to root, and a folder others can write
  to is sticky (``/tmp``: no one else can rename or remove what is ours in it).  The cache's own
  folders (the root and the ones below it) belong to this user, nobody else can write to them,
  and no link is followed there.  Links above the root are followed once, when the root is
  chosen; its path without links is used from then on, so a link re-pointed later changes
  nothing.  Every folder made here is made 0700, whatever the umask.
- **the root's marker** (``MARKER``): a folder is a cache root only if this library made it and
  wrote the marker into it before it took its name (``open_root``).  Anything deleted is deleted
  inside such a folder only; a folder named for the cache that the library did not make gets a
  marked subfolder (``SUBFOLDER``), so that ``.`` or ``~`` never hold entries among the user's files.
- **each file** (``read_file``), opened without following a link and checked through the open
  descriptor: a regular file of this user's that no one else can write.

A check that fails raises ``Untrusted`` (the path, the problem, the fix); the cache's modules
turn it into one warning and stop using the folder.

>>> import tempfile, os
>>> root = make_root(os.path.join(tempfile.mkdtemp(), 'cache'))
>>> fd = open_root(root, marked=True)
>>> write_file(fd, 'entry', b'data'); read_file(fd, 'entry')
b'data'
>>> os.close(fd)
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading

__all__ = ["Untrusted", "MARKER", "SUBFOLDER", "walk", "make_root", "open_root", "open_sub", "read_file",
           "write_file", "remove", "is_ours", "mac_key", "KEY_NAME", "loading", "dead_loads"]

MARKER = "CACHEDIR.TAG"  # the Cache Directory Tagging convention: backup tools skip the folder
MARKER_TEXT = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
               b"# A cache of compiled code made by circuits (circuits.backend.cache.persistent): it deletes\n"
               b"# only its own entries and JAX's here.  The whole folder may be removed.\n")
SUBFOLDER = "circuits-cache"
KEY_NAME = "compilation-cache.key"
KEY_BYTES = 32
MAX_LINKS = 40

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
_READ = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC


class Untrusted(Exception):
    """A folder or file of the cache that cannot be trusted (or used): ``path``, ``problem``
    (what is wrong) and ``fix`` (what the user can do)."""

    def __init__(self, path: str, problem: str, fix: str = ""):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem, self.fix = path, problem, fix


def _me() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else -1


def _owner_problem(st, ours_only: bool) -> str | None:
    """Why a folder or link with ``st`` is not to be trusted (None: it is)."""
    me = _me()
    if me == -1:  # no owners here (not POSIX): nothing to compare
        return None
    if st.st_uid != me and (ours_only or st.st_uid != 0):
        return f"it belongs to another user (uid {st.st_uid})"
    if stat.S_ISDIR(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if ours_only or not st.st_mode & stat.S_ISVTX:
            return "others can write to it"
    return None


def _fix_for(problem: str, path: str) -> str:
    if "others can write" in problem:
        return f"make it private: chmod go-w {path}"
    if "another user" in problem:
        return "use a folder of your own"
    if "symbolic link" in problem:
        return "give the folder it points to, or remove the link"
    return "use another folder"


def _split(path: str) -> list:
    return [p for p in path.split("/") if p and p != "."]


def walk(path: str, *, create: bool = False, follow: bool = False, mark: bool = False, ours: int = 0):
    """``(descriptor, path without links, made)`` for the folder ``path`` (absolute), every folder
    on the way checked (see the module docstring).  ``create``: missing folders are made (0700);
    ``mark``: the last one, if made, is made with the marker (``made`` says whether it was made
    here).  ``follow``: links of this user or root are followed, except among the last ``ours``
    folders, which must be this user's and private (the cache's own); without ``follow`` a link
    is ``Untrusted``."""
    if not os.path.isabs(path):
        raise Untrusted(path, "is not an absolute path")
    todo = _split(path)[::-1]  # a stack: the next name last
    real: list = []
    made = False
    links = 0
    try:
        fd = os.open("/", _DIR)
    except OSError as e:
        raise Untrusted("/", f"cannot be opened ({e.strerror or e})") from None
    try:
        while todo:
            name = todo.pop()
            if name == "..":  # from a link's target: back up, checking again from the top
                todo.extend(real[:-1][::-1])
                real = []
                os.close(fd)
                fd = os.open("/", _DIR)
                continue
            here = "/" + "/".join(real + [name])
            strict = len(todo) < ours
            made = False
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise Untrusted(here, "does not exist") from None
                if mark and not todo:
                    made = _make_marked(fd, name)
                else:
                    try:
                        os.mkdir(name, 0o700, dir_fd=fd)
                        made = True
                    except FileExistsError:
                        pass
                child = os.open(name, _DIR, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise Untrusted(here, "exists and is not a folder", "remove it, or give another folder") from None
                if not follow or strict:
                    raise Untrusted(here, "is a symbolic link (no link is followed inside the cache)",
                                    _fix_for("symbolic link", here)) from None
                problem = _owner_problem(st, False)
                if problem is not None:
                    raise Untrusted(here, f"is a symbolic link and {problem}", _fix_for(problem, here)) from None
                links += 1
                if links > MAX_LINKS:
                    raise Untrusted(here, "is one of too many symbolic links") from None
                target = os.readlink(name, dir_fd=fd)
                todo.extend(_split(target)[::-1])
                if target.startswith("/"):
                    real = []
                    os.close(fd)
                    fd = os.open("/", _DIR)
                continue
            try:
                if made:  # 0700 whatever the umask (mkdir's mode is masked by it)
                    os.fchmod(child, 0o700)
                st = os.fstat(child)
                problem = _owner_problem(st, strict or made)
                if problem is not None:
                    raise Untrusted(here, problem, _fix_for(problem, here))
            except BaseException:
                os.close(child)
                raise
            os.close(fd)
            fd = child
            real.append(name)
    except OSError as e:
        os.close(fd)
        where = "/" + "/".join(real)
        raise Untrusted(path, f"cannot be used ({e.strerror or e}, at {where})") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, "/" + "/".join(real), made


def _make_marked(dir_fd: int, name: str) -> bool:
    """Make the folder ``name`` with the marker in it before it takes its name (a temporary
    folder renamed), so that no process sees it unmarked; False when another process made it
    first (the caller opens theirs)."""
    tmp = f".{name}.new-{secrets.token_hex(6)}"
    os.mkdir(tmp, 0o700, dir_fd=dir_fd)
    fd = os.open(tmp, _DIR, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o700)
        write_file(fd, MARKER, MARKER_TEXT)
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return True
        except OSError:  # there meanwhile (a marked folder is never empty: not replaced)
            os.unlink(MARKER, dir_fd=fd)
            os.rmdir(tmp, dir_fd=dir_fd)
            return False
    finally:
        os.close(fd)


def has_marker(fd: int) -> bool:
    """Whether the folder ``fd`` holds the marker this library writes into a cache root it makes."""
    try:
        return read_file(fd, MARKER, limit=len(MARKER_TEXT)) == MARKER_TEXT
    except Untrusted:
        return False


def make_root(path: str) -> str:
    """The cache root for the folder ``path`` (absolute; made, with missing folders above it,
    when absent): ``path`` itself when this library made it (its marker), else its marked
    subfolder ``SUBFOLDER``.  Returns the root's path without links; ``Untrusted`` when a folder on
    the way fails the checks."""
    fd, real, made = walk(path, create=True, follow=True, mark=True)
    try:
        if made or has_marker(fd):
            _check_root(fd, real)
            return real
    finally:
        os.close(fd)
    sub = real.rstrip("/") + "/" + SUBFOLDER
    fd, sub, made = walk(sub, create=True, mark=True, ours=1)
    try:
        if not made and not has_marker(fd):
            raise Untrusted(sub, "exists and was not made by circuits (it holds no marker file "
                            f"{MARKER})", "remove it, or give another folder")
    finally:
        os.close(fd)
    return sub


def _check_root(fd: int, path: str) -> None:
    problem = _owner_problem(os.fstat(fd), True)
    if problem is not None:
        raise Untrusted(path, problem, _fix_for(problem, path))


def open_root(root: str, *, marked: bool) -> int:
    """A descriptor of the cache root ``root`` (a path without links) after checking every folder
    on the way (the root itself this user's and private) and, when ``marked``, its marker."""
    fd, _, _ = walk(root, ours=1)
    if marked and not has_marker(fd):
        os.close(fd)
        raise Untrusted(root, f"its marker file {MARKER} is gone or not circuits'",
                        "remove the folder (circuits makes it again)")
    return fd


def open_sub(fd: int, name: str, where: str, *, create: bool = False) -> int | None:
    """A descriptor of the folder ``name`` in the cache folder ``fd`` (at path ``where``): this
    user's, private, not a link (made 0700 when ``create``); None when absent."""
    here = f"{where.rstrip('/')}/{name}"
    made = False
    try:
        child = os.open(name, _DIR, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            return None
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
            made = True
        except FileExistsError:
            pass
        try:
            child = os.open(name, _DIR, dir_fd=fd)
        except OSError as e:
            raise Untrusted(here, f"cannot be opened ({e.strerror or e})") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise Untrusted(here, "is a symbolic link (no link is followed inside the cache)",
                                f"remove it: rm {here}") from None
            raise Untrusted(here, "exists and is not a folder", f"remove it: rm {here}") from None
        raise Untrusted(here, f"cannot be opened ({e.strerror or e})") from None
    try:
        if made:
            os.fchmod(child, 0o700)
        problem = _owner_problem(os.fstat(child), True)
        if problem is not None:
            raise Untrusted(here, problem, _fix_for(problem, here) if "others" in problem else f"remove it: rm -r {here}")
    except BaseException:
        os.close(child)
        raise
    return child


def read_file(fd: int, name: str, *, limit: int = 1 << 34, private: bool = False,
              head: int | None = None) -> bytes | None:
    """The bytes of the file ``name`` in the cache folder ``fd`` (its first ``head`` only, when
    given: then its time of last use is left as it is), opened without following a link and checked through its descriptor: a regular file of
    this user's that no one else can write (nor read, when ``private``), at most ``limit`` bytes.
    None when absent; ``Untrusted`` when it fails a check."""
    # a look at the head leaves the time of last use alone (the trim orders entries by it)
    flags = _READ | (getattr(os, "O_NOATIME", 0) if head is not None else 0)
    try:
        f = os.open(name, flags, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Untrusted(name, f"cannot be opened ({e.strerror or e})") from None
    with os.fdopen(f, "rb") as file:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(name, "is not a regular file")
        if not is_ours(st):
            raise Untrusted(name, "belongs to another user or others can write to it")
        if private and st.st_mode & 0o077:
            raise Untrusted(name, "others can read it")
        if st.st_size > limit and head is None:
            raise Untrusted(name, f"is larger than {limit} bytes")
        try:
            return file.read(min(st.st_size, limit) + 1 if head is None else head)
        except OSError as e:
            raise Untrusted(name, f"cannot be read ({e.strerror or e})") from None


def is_ours(st) -> bool:
    """Whether a file with ``st`` (an ``lstat``/``fstat``) is this user's and no one else can write it."""
    me = _me()
    return (me == -1 or st.st_uid == me) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def write_file(fd: int, name: str, data: bytes) -> None:
    """Write ``data`` as the file ``name`` in the cache folder ``fd``: a private temporary renamed
    over it (readers see the old file or the new one, never half of one)."""
    tmp = f".tmp-{secrets.token_hex(8)}"
    f = os.open(tmp, _CREATE, 0o600, dir_fd=fd)
    try:
        with os.fdopen(f, "wb") as file:
            os.fchmod(f, 0o600)
            file.write(data)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        raise


def remove(fd: int, name: str) -> bool:
    """Remove the entry ``name`` from the cache folder ``fd`` (a link itself, never what it
    points to); whether it was there."""
    try:
        os.unlink(name, dir_fd=fd)
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------- the key
_key_lock = threading.Lock()
_NEW_KEY = "remove it: a new key is made (the executables kept so far are then compiled again)"


def key_folder() -> str:
    """Where the per-user key that authenticates kept executables lives: the user's data folder
    (``platformdirs.user_data_dir('circuits')``), outside every cache folder."""
    import platformdirs

    return os.path.abspath(platformdirs.user_data_dir("circuits"))


def mac_key(folder: str | None = None) -> bytes:
    """This user's key (``KEY_BYTES`` random bytes) for the keyed digests of kept executables,
    read from ``KEY_NAME`` in ``folder`` (``key_folder()``), made there (0600, atomically: two
    processes agree on one) when absent.  The file is opened without following a link and must
    be this user's regular file that no one else can read or write."""
    folder = key_folder() if folder is None else folder
    with _key_lock:
        fd, real, _ = walk(folder, create=True, follow=True, ours=1)
        try:
            for _ in range(2):
                try:
                    data = read_file(fd, KEY_NAME, limit=KEY_BYTES, private=True)
                except Untrusted as e:
                    raise Untrusted(f"{real}/{KEY_NAME}", e.problem, _NEW_KEY) from None
                if data is None:
                    _make_key(fd)
                    continue
                if len(data) != KEY_BYTES:
                    raise Untrusted(f"{real}/{KEY_NAME}", "is not a key", _NEW_KEY)
                return data
            raise Untrusted(f"{real}/{KEY_NAME}", "cannot be made")
        finally:
            os.close(fd)


def _make_key(fd: int) -> None:
    tmp = f".key-{secrets.token_hex(8)}"
    f = os.open(tmp, _CREATE, 0o600, dir_fd=fd)
    try:
        with os.fdopen(f, "wb") as file:
            os.fchmod(f, 0o600)
            file.write(secrets.token_bytes(KEY_BYTES))
            file.flush()
            os.fsync(f)
        try:  # a link never replaces: the first process's key is everyone's
            os.link(tmp, KEY_NAME, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp, dir_fd=fd)


# ---------------------------------------------------------------------------- loading marks
def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, with the boot's id), None when it
    does not run; '' where the system does not say (no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip().decode()
        return f"{int(fields[19])}@{boot}"
    except FileNotFoundError:
        if not os.path.isdir("/proc/self"):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except OSError:
                pass
            return ""
        return None
    except (OSError, IndexError, ValueError):
        return ""


_self_start: list = []


def loading(fd: int, entry: str) -> str:
    """Mark the entry ``entry`` of the folder ``fd`` as being loaded by this thread (a file in
    ``fd`` naming the process and when it started); returns the mark's name, for ``done``."""
    if not _self_start:
        _self_start.append(_process_start(os.getpid()) or "")
    name = f"{entry}.{os.getpid()}.{threading.get_ident()}.loading"
    write_file(fd, name, f"{os.getpid()} {_self_start[0]}\n".encode())
    return name


def dead_loads(fd: int) -> list:
    """The entries whose loading marks in the folder ``fd`` outlived the process that wrote them
    (it died loading them: a crash); those marks are removed.  A mark of a live process (a
    concurrent loader) stays."""
    dead = []
    for name in os.listdir(fd):
        if not name.endswith(".loading"):
            continue
        try:
            data = read_file(fd, name, limit=256)
            pid_text, start = (data or b"").decode().split(" ", 1)
            alive = _process_start(int(pid_text))
            if alive is not None and (start.strip() == alive or alive == "" or start.strip() == ""):
                continue
        except (Untrusted, ValueError, UnicodeDecodeError):
            pass  # a mark cut short by the crash itself, or not ours: its loader is gone
        dead.append(name.split(".", 1)[0])
        remove(fd, name)
    return dead
