"""Reading and writing single files on a local disk without the usual traps.

Circuit files and the tensor store (``circuits.io.files``, ``circuits.io.store``) do all their local
file work here, so the rules are written once:

- **Read what the size allows, into memory the reader owns.**  ``open_file`` refuses anything
  but a regular file before reading a byte (a FIFO would block forever, a device never end), and
  opens without blocking.  A ``Source`` reads the header with small reads and the data straight
  into fresh buffers (``read_into``, ``take``): never a memory map, because a map of a file
  someone overwrites in place shows the new bytes under a value that was verified against its
  hash, and one of a file truncated in place kills the reader with SIGBUS (a private map does
  not help: Linux shows it the file's writes until a page is copied, and faults the same).
  The copy is one pass that the reader hashes as it goes (``circuits.io.store``).
- **Never follow a planted link.**  Inside a store, ``open_dir(..., follow=False)`` and
  ``open_file(..., follow=False)`` refuse symbolic links (``O_NOFOLLOW``) and everything after
  them works relative to the opened directory, so a link swapped in meanwhile changes nothing.
- **Atomic writes that keep the file's mode.**  ``atomic_write`` writes a hidden temporary beside
  the target, fsyncs it and renames it over the target.  A file that existed keeps its mode
  (a 0600 file stays 0600).  The writer holds an advisory lock on its temporary for as long as
  it lives, so ``remove_dead_temporaries`` can tell a killed writer's leftover from a live write.
- **Library errors.**  Every ``OSError`` leaves as a ``StoreError`` naming the file the user
  asked for (never only the hidden temporary) and what to do.
- **No mode changes on directories the library did not create**: ``make_dirs`` makes missing
  directories with the process umask and only the ones the caller marks as shared get group
  write.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from pathlib import Path

import numpy as np

from ..errors import StoreError

try:  # advisory locks mark live temporaries (POSIX); elsewhere only age counts
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

# A temporary this old whose writer holds no lock is a killed writer's leftover.  The grace
# covers the instant between creating a temporary and locking it.
DEAD_TEMPORARY_AGE = 600.0
# Without locks (no fcntl, or a filesystem that refuses them) only age tells.
UNLOCKABLE_TEMPORARY_AGE = 24 * 3600.0

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)


def describe_os_error(e: OSError) -> str:
    """The reason of an ``OSError`` without the file name it carries (we name the file)."""
    reason = e.strerror or str(e)
    if e.errno in (errno.EACCES, errno.EPERM):
        reason += " (check the permissions)"
    elif e.errno == errno.ENOSPC:
        reason += " (free some space)"
    elif e.errno == errno.ELOOP:
        reason = "it is a symbolic link, which a store never follows (remove the link)"
    return reason


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


# ---------------------------------------------------------------------------- reading
_preadv = getattr(os, "preadv", None)


def aligned_bytes(n: int) -> np.ndarray:
    """A fresh writable uint8 array of ``n`` bytes whose data starts on a 64-byte boundary (JAX on
    the CPU then uses a tensor viewed from it in place rather than copying it again)."""
    buf = np.empty(n + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start:start + n]


class Source:
    """One opened regular file read front to back: ``read(n)`` for headers, ``map(n)`` for the
    data that follows them.  Use as a context manager."""

    def __init__(self, fd: int, name: str, size: int):
        self.fd = fd
        self.name = name
        self.size = size
        self.position = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.fd != -1:
            os.close(self.fd)
            self.fd = -1

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes from the current position (fewer only at the end of the file)."""
        n = max(0, min(n, self.size - self.position))
        parts = []
        while n:
            try:
                chunk = os.pread(self.fd, min(n, 1 << 30), self.position)
            except OSError as e:
                raise StoreError(f"{self.name}: cannot read ({describe_os_error(e)})") from None
            if not chunk:
                break
            parts.append(chunk)
            self.position += len(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def read_into(self, view) -> None:
        """Fill ``view`` (a writable byte memoryview) with the next ``len(view)`` bytes, read
        straight into it (one copy, from the kernel); ``StoreError`` if the file holds fewer,
        also when it shrank while being read."""
        n = len(view)
        if self.position + n > self.size:
            raise StoreError(f"{self.name}: truncated file ({self.size - self.position} bytes left, {n} needed)")
        got = 0
        while got < n:
            try:
                if _preadv is not None:
                    k = _preadv(self.fd, [view[got:got + min(n - got, 1 << 30)]], self.position + got)
                else:  # pragma: no cover - no preadv (not Linux/BSD)
                    chunk = os.pread(self.fd, min(n - got, 1 << 30), self.position + got)
                    view[got:got + len(chunk)] = chunk
                    k = len(chunk)
            except OSError as e:
                raise StoreError(f"{self.name}: cannot read ({describe_os_error(e)})") from None
            if not k:
                raise StoreError(f"{self.name}: the file shrank while being read (truncated meanwhile?)")
            got += k
        self.position += n

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` bytes as a fresh read-only uint8 array (a private copy: nothing that
        happens to the file later changes it); ``StoreError`` if the file holds fewer."""
        arr = aligned_bytes(n)
        self.read_into(memoryview(arr))
        arr.flags.writeable = False
        return arr

    def at_end(self) -> bool:
        return self.position >= self.size


def open_dir(path, *, follow: bool = True, name: str | None = None) -> int:
    """A file descriptor for the directory ``path``; with ``follow=False`` a symbolic link there
    is refused.  Raises ``FileNotFoundError`` when it does not exist, else ``StoreError``."""
    flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        shown = name or path
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and not follow and os.path.islink(path):
            raise StoreError(
                f"{shown} is a symbolic link; a store never follows links inside it (someone put it "
                "there: remove it)"
            ) from None
        raise StoreError(f"{shown}: cannot open the directory ({describe_os_error(e)})") from None


def open_file(path, *, dir_fd: int | None = None, follow: bool = True, name: str | None = None) -> Source:
    """Open a regular file for reading without blocking and without reading it.

    Raises ``FileNotFoundError`` when there is none (callers phrase that), ``StoreError`` for
    anything else: a FIFO, device or directory, a symbolic link when ``follow`` is false, an
    unreadable file.
    """
    shown = name or str(path)
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | _BINARY | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except ValueError as e:  # a NUL in the name
        raise StoreError(f"{shown!r}: not a usable file name ({e})") from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise StoreError(
                f"{shown} is a symbolic link; a store never follows links inside it (someone put it "
                "there: remove it, then put the tensor again)"
            ) from None
        raise StoreError(f"{shown}: cannot open ({describe_os_error(e)})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{shown} is {_kind(st.st_mode)}, not a file this library reads")
    except BaseException:
        os.close(fd)
        raise
    return Source(fd, shown, st.st_size)


def is_regular_file(name, dir_fd: int | None = None) -> bool:
    """Whether ``name`` is a regular file, not following a symbolic link to one."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise StoreError(f"{name}: cannot look at it ({describe_os_error(e)})") from None
    return stat.S_ISREG(st.st_mode)


# ---------------------------------------------------------------------------- writing
def make_dirs(path, *, shared_from: Path | None = None, name: str | None = None) -> None:
    """``mkdir -p`` that tolerates other processes creating the same directories.

    Directories are made with the process umask and no other mode change; those this call
    creates at or below ``shared_from`` (a store root asked to be shared) get group read, write
    and search.  Existing directories are never touched.
    """
    missing = []
    p = Path(path)
    try:
        while not p.is_dir():
            missing.append(p)
            if p.parent == p:
                break
            p = p.parent
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o777)
            except FileExistsError:
                if not d.is_dir():
                    raise StoreError(f"{name or path}: {d} exists and is not a directory") from None
                continue
            if shared_from is not None and (d == shared_from or shared_from in d.parents):
                st = os.stat(d)
                os.chmod(d, stat.S_IMODE(st.st_mode) | 0o070)
    except OSError as e:
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"{name or path}: cannot create the directory ({describe_os_error(e)})") from None


def temporary_name(name: str) -> str:
    return f".{name}.{secrets.token_hex(6)}.tmp"


def _is_temporary_of(entry_name: str, name: str | None) -> bool:
    if not (entry_name.startswith(".") and entry_name.endswith(".tmp")):
        return False
    return name is None or (entry_name.startswith(f".{name}.") and len(entry_name) == len(name) + 18)


def atomic_write(path, write, *, group_readable: bool = False, mode: int | None = None,
                 dir_fd: int | None = None, name: str | None = None, sweep_all: bool = False) -> None:
    """Write a file through ``write(fileobj)`` so that ``path`` holds either its old content or
    the complete new one: a temporary file in the same directory, fsync, then ``os.replace``.

    The file keeps the mode of the file it replaces; a new one gets ``mode`` if given, else the
    usual ``0o666 & ~umask`` (``group_readable`` adds group read).  If ``write`` fails the
    temporary file is removed; if the process is killed mid-write a stray
    ``.<name>.<random>.tmp`` may remain beside ``path`` (never a partial ``path``): the next
    write of the same file removes it (``remove_dead_temporaries``; with ``sweep_all`` every dead
    temporary in the directory).  With ``dir_fd`` the
    ``path`` is a name inside that directory.  Every failure is a ``StoreError`` naming
    ``name`` (default ``path``); interruptions (``KeyboardInterrupt``) pass through unchanged.
    """
    path = Path(path)
    shown = name or str(path)
    own_dir = dir_fd is None
    if own_dir:
        try:
            dir_fd = open_dir(path.parent)
        except FileNotFoundError:
            raise StoreError(f"cannot write {shown}: directory {path.parent} does not exist") from None
        target = path.name
    else:
        target = str(path)
    tmp = temporary_name(Path(target).name)
    fd = -1
    try:
        try:
            old = os.stat(target, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISREG(old.st_mode):
            new_mode = stat.S_IMODE(old.st_mode) & 0o777
        elif mode is not None:
            new_mode = mode
        else:
            umask = _umask()
            new_mode = (0o666 & ~umask) | (0o440 if group_readable else 0)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC | _BINARY | _NOFOLLOW, 0o600,
                     dir_fd=dir_fd)
        _lock(fd)
        os.fchmod(fd, new_mode)
        with os.fdopen(fd, "wb", closefd=True) as f:
            fd = -2  # owned by f now
            write(f)
            f.flush()
            os.fsync(f.fileno())
            # Renamed while still open and locked: a cleaner never sees it unlocked under its
            # temporary name.
            os.replace(tmp, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        _fsync_dir(dir_fd)
        remove_dead_temporaries(dir_fd, None if sweep_all else Path(target).name)
    except BaseException as e:
        if fd >= 0:
            os.close(fd)
        if fd != -1:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except OSError:  # pragma: no cover - reported below through the first error
                pass
        if isinstance(e, OSError) and not isinstance(e, StoreError):
            raise StoreError(f"cannot write {shown}: {describe_os_error(e)}") from None
        raise
    finally:
        if own_dir:
            os.close(dir_fd)


def _umask() -> int:
    # Linux shows the umask without changing it; elsewhere it is set and restored at once.
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _lock(fd: int) -> None:
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a filesystem without locks: age alone will tell
            pass


def _fsync_dir(dir_fd: int) -> None:
    # Makes the rename itself durable; not every filesystem allows it.
    try:
        os.fsync(dir_fd)
    except OSError:
        pass


def remove_dead_temporaries(dir_fd: int, name: str | None = None, *,
                            older_than: float = DEAD_TEMPORARY_AGE) -> int:
    """Delete the temporaries (``.<name>.<random>.tmp``; any name when ``name`` is None) in the
    directory ``dir_fd`` that killed writers left: untouched for ``older_than`` seconds and not
    locked by a live writer.  Returns how many were deleted.  Never follows links."""
    cutoff = time.time() - older_than
    removed = 0
    try:
        entries = list(os.scandir(dir_fd))
    except OSError:
        return 0
    for e in entries:
        if not _is_temporary_of(e.name, name):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime >= cutoff:
                continue
            if _dead(e.name, dir_fd, st, cutoff):
                os.unlink(e.name, dir_fd=dir_fd)
                removed += 1
        except OSError:  # gone meanwhile, or not ours to delete
            continue
    return removed


def _dead(entry: str, dir_fd: int, st, cutoff: float) -> bool:
    if fcntl is None:  # pragma: no cover - not POSIX
        return st.st_mtime < time.time() - UNLOCKABLE_TEMPORARY_AGE
    fd = os.open(entry, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    try:
        if os.fstat(fd).st_ino != st.st_ino:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live writer holds it
        except OSError:  # no locks on this filesystem: only a very old file counts as dead
            return st.st_mtime < time.time() - UNLOCKABLE_TEMPORARY_AGE
        return True  # its writer is gone, and nobody else uses its random name
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- a store's directory
class LocalDir:
    """A store's root directory on the local disk: open, write, list its files, never following a
    symbolic link below the root (the root itself may be one: the user chose it).  The same
    interface as ``remotefs.RemoteDir``."""

    read_only = False

    def __init__(self, root: Path, shared: bool | None = None):
        if "\0" in str(root):
            raise StoreError(f"{str(root)!r} contains a NUL character")
        self.root = Path(root)
        self.shared = shared

    def where(self, *parts) -> str:
        return str(self.root.joinpath(*parts))

    def _shared(self) -> bool:
        if self.shared is not None:
            return self.shared
        try:  # a root the group may write into is a shared store
            return bool(os.stat(self.root).st_mode & 0o020)
        except OSError:
            return False

    def open(self, *parts) -> Source:
        *dirs, name = parts
        dir_fd = self._open_dir(dirs)
        try:
            return open_file(name, dir_fd=dir_fd, follow=False, name=self.where(*parts))
        finally:
            os.close(dir_fd)

    def _open_dir(self, dirs) -> int:
        """The directory ``root/dirs...`` opened without following links below the root."""
        try:
            fd = open_dir(self.root, name=str(self.root))
        except FileNotFoundError:
            raise
        for i, d in enumerate(dirs):
            try:
                fd2 = os.open(d, os.O_RDONLY | _DIRECTORY | _CLOEXEC | _NOFOLLOW, dir_fd=fd)
            except OSError as e:
                where = self.where(*dirs[: i + 1])
                if isinstance(e, FileNotFoundError):
                    raise
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    st = os.stat(d, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        raise StoreError(
                            f"{where} is a symbolic link; a store never follows links inside it "
                            "(someone put it there: remove it)"
                        ) from None
                    raise StoreError(f"{where} is {_kind(st.st_mode)}, where the store keeps a directory") from None
                raise StoreError(f"{where}: cannot open the directory ({describe_os_error(e)})") from None
            finally:
                os.close(fd)
            fd = fd2
        return fd

    def isfile(self, *parts) -> bool:
        *dirs, name = parts
        try:
            dir_fd = self._open_dir(dirs)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            return is_regular_file(name, dir_fd)
        finally:
            os.close(dir_fd)

    def list(self, *parts, dirs: bool = False) -> list:
        """Names of the regular files (or with ``dirs`` the real directories) in a directory;
        [] if there is none.  Links are neither."""
        try:
            dir_fd = self._open_dir(parts)
        except (FileNotFoundError, NotADirectoryError):
            return []
        try:
            with os.scandir(dir_fd) as entries:
                return [e.name for e in entries
                        if (e.is_dir(follow_symlinks=False) if dirs else e.is_file(follow_symlinks=False))]
        except OSError as e:
            raise StoreError(f"{self.where(*parts)}: cannot list it ({describe_os_error(e)})") from None
        finally:
            os.close(dir_fd)

    def write(self, write, *parts) -> None:
        """Atomically write ``root/parts...`` through ``write(fileobj)``, creating directories
        below the root as needed (group-writable in a shared store).  Files are read-only for
        everyone but the owner; group-readable in a shared store."""
        *dirs, name = parts
        shared = self._shared()
        make_dirs(self.root.joinpath(*dirs), shared_from=self.root if shared else None, name=self.where(*parts))
        try:
            dir_fd = self._open_dir(dirs)
        except FileNotFoundError:
            raise StoreError(f"cannot write {self.where(*parts)}: its directory vanished meanwhile") from None
        try:
            mode = (0o666 & ~_umask() & 0o644) | (0o440 if shared else 0)
            atomic_write(name, write, mode=mode, dir_fd=dir_fd, name=self.where(*parts), sweep_all=True)
        finally:
            os.close(dir_fd)

    def remove_dead_temporaries(self, shard: str, older_than: float) -> int:
        try:
            dir_fd = self._open_dir([shard])
        except (FileNotFoundError, StoreError):
            return 0
        try:
            return remove_dead_temporaries(dir_fd, older_than=older_than)
        finally:
            os.close(dir_fd)
