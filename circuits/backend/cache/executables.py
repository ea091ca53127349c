"""Per-operation kernels kept compiled across processes, loaded without tracing them.

JAX's persistent cache (``circuits.backend.cache.persistent``) keys a compilation by the module JAX
lowers, so a new process still traces and lowers each kernel before it finds the compilation on
disk: tens of milliseconds a kernel, most of a first call's time (a GPT-2 gradient uses dozens).
A kernel of ``tiers.kernels.cached_kernel`` is described by its own key (operation, shapes, float
precision: what the in-process kernel cache already relies on), so its executable is kept beside
JAX's cache (the folder ``circuits-kernels``, under the same controls: ``CIRCUITS_COMPILATION_CACHE``
moves it or turns it off) under that key and:

- the arguments' structure, shapes, dtypes and weak types;
- JAX's trace context (every setting tracing reads: matmul precision, x64, ...);
- the versions of jax, jaxlib and the library's own source (a digest of its files), the backend's
  platform and version, its device kind and count, the device's compute capability and the
  accelerator driver's version (``device_identity``: a cache folder shared by machines with other
  cards or drivers never loads their entries).

A later process loads the executable (``jax.experimental.serialize_executable``) and calls it:
no trace, no lowering.  That payload is a pickle (JAX's own, of XLA's executable), so nothing in it
is read before it is authenticated: an entry holds a keyed digest (blake3) of all it holds, made
with this user's key (``cachedir.mac_key``: a 0600 file in the user's data folder, outside every
cache folder), and the trees of arguments and results are stored as plain data.  An entry whose
digest does not match (a flipped bit, a truncated file, a file someone else wrote) is removed
before anything is deserialized.  The entry's file and every folder above it are checked as it is
read (``circuits.backend.cache.cachedir``).  A process marks an entry while it loads it and runs it the
first time (a file naming the process and when it started): a mark whose process is gone means
that loading it crashed, and the next process removes the entry instead of crashing the same way
(a live process's mark is a concurrent load, not a crash).

A new process's first whole program (``evaluation._compile_whole`` and the next process's first
evaluation, ``persistent.compiled_before``) is kept the same way, under the circuit's hash and
options (``cache.compiled.cached_jit``'s ``kept_as``).  A kernel whose key names a function a user registered is not kept (its
code is the user's, which may change between processes); nor is one called inside a JAX trace,
under a trace context that is not plain data, or whose executable cannot be serialized.

An entry never fails an evaluation: a missing, truncated, corrupt or incompatible one is compiled
afresh and rewritten; a call whose arguments the loaded executable does not take (other dtypes,
tracers, another device) goes through the jitted kernel, as without this cache.

>>> import numpy as np
>>> double = lambda x: x * 2
>>> k = kept(('exec-demo', (3,)), double, counted_jit(double, 'kernel_compilations'))
>>> [float(v) for v in k(np.ones(3, np.float32))]
[2.0, 2.0, 2.0]
"""

from __future__ import annotations

import collections
import hmac
import json
import os
import struct
import threading

import blake3
import numpy as np

from ...dtypes import dtype_str
from . import cachedir
from .background import AGAIN, exiting, in_background
from .cachedir import Untrusted
from .compiling import counted_jit, note_loaded
from .persistent import FOLDER, KEPT_MAGIC, KEPT_NAME, distrust, ensure_persistent_cache, open_folder

__all__ = ["kept", "stable_key", "executable_info"]

_LOADING = "loading"  # the loading marks, a folder in FOLDER
_DIGEST = 32
_GF = b"GeneralFunction\0"
_counts = collections.Counter()
_trace_context: list = []  # [jax's trace_context], imported with the first kept kernel
_env: list = []  # [environment digest], computed once


def executable_info() -> dict:
    """``loads`` (executables read from disk), ``stores`` (written), ``rejected`` (entries that
    could not be used: removed, compiled afresh), ``quarantined`` (entries removed because a process
    died loading them) and ``fallbacks`` (calls the jitted kernel took)."""
    return {k: _counts[k] for k in ("loads", "stores", "rejected", "quarantined", "fallbacks")}


# ---------------------------------------------------------------------------- keys
def stable_key(key) -> bytes | None:
    """``key`` (a kernel cache key: tuples of bytes, str, int, float, bool, None) as bytes that
    mean the same in every process, or None when it holds something else or names a function a
    user registered (a GeneralFunction's part holds its spec's identity; a library function's
    name identifies it, given the library's source).

    >>> stable_key(('add', (2, 3), 'float32')) == stable_key(('add', (2, 3), 'float32'))
    True
    >>> stable_key(('add', object())) is None
    True
    """
    out = []
    stack = [key]
    while stack:
        item = stack.pop()
        t = type(item)
        if t is tuple or t is list:
            out.append(b"(%d" % len(item))
            stack.extend(reversed(item))
        elif t is bytes:
            if item.startswith(_GF):
                item = _stable_function_part(item)
                if item is None:
                    return None
            out.append(b"b%d:" % len(item) + item)
        elif t is str:
            data = item.encode()
            out.append(b"s%d:" % len(data) + data)
        elif t is bool or item is None:
            out.append(repr(item).encode())
        elif t is int or isinstance(item, np.integer):
            out.append(b"i%d" % int(item))
        elif t is float:
            out.append(b"f" + repr(item).encode())
        else:
            return None
    return b"|".join(out)


def _stable_function_part(part: bytes) -> bytes | None:
    """A GeneralFunction's key part (``program.node_key_part``: name, then its spec's identity)
    without the identity, when that spec is the library's own function of that name."""
    from ...errors import CircuitError
    from ...functions.registry import is_library_function, lookup

    if len(part) < len(_GF) + 9 or part[-9:-8] != b"\0":
        return None
    name = part[len(_GF):-9].decode(errors="replace")
    try:
        spec = lookup(name)
    except CircuitError:
        return None
    if struct.unpack("<q", part[-8:])[0] != id(spec) or not is_library_function(spec):
        return None
    return part[:-8]


def library_sources() -> tuple:
    """``(package folder, [its .py files, sorted])``: the whole ``circuits`` package, whose source
    a kept executable depends on (a function's lowering lives in ``circuits.functions``, an
    operation's in ``circuits.backend.lower``, a node's payload in ``circuits.nodes``)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        files.extend(os.path.join(folder, n) for n in names if n.endswith(".py"))
    return root, sorted(files)


def _environment() -> bytes:
    """What every kept executable depends on besides its key: versions, backend, the library's
    source (computed once)."""
    if _env:
        return _env[0]
    import jax
    import jaxlib

    h = blake3.blake3()
    h.update(repr((jax.__version__, jaxlib.__version__, device_identity())).encode())
    root, files = library_sources()
    for path in files:
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    _env[:] = [h.digest(16)]
    return _env[0]


def device_identity() -> tuple:
    """What an executable compiled here is specific to, besides the versions of jax and jaxlib:
    the backend's platform and version, the device kind and count, the device's compute capability
    (where the backend tells it) and the accelerator driver's version (NVIDIA's, read from
    ``/proc/driver/nvidia/version`` where it exists).  A cache folder shared between machines (a home
    folder on a cluster mixes cards and drivers) keeps each one's entries under keys of its own:
    an entry written for another card or driver is never loaded here.

    >>> platform, version, kind, count, capability, driver = device_identity()
    >>> count >= 1
    True
    """
    import jax

    device = jax.devices()[0]
    client = device.client
    return (client.platform, client.platform_version, device.device_kind, jax.device_count(),
            str(getattr(device, "compute_capability", "")), _driver_version())


def _driver_version() -> str:
    """The first line of the NVIDIA driver's version file, or '' where there is none (a CPU, a
    sandbox that hides it)."""
    try:
        with open("/proc/driver/nvidia/version", "rb") as f:
            return f.readline().decode(errors="replace").strip()
    except OSError:
        return ""


def _plain_context(context) -> bytes | None:
    """JAX's trace context as bytes, when it is plain data (else None: not kept)."""
    import enum

    from jax._src import core

    parts = []
    for item in context:
        if isinstance(item, core.AxisEnv):
            if getattr(item, "axis_sizes", True):  # inside a named-axis trace
                return None
            continue
        if item is None or type(item) in (bool, int, str, float) or isinstance(item, enum.Enum):
            parts.append(repr(item))
        elif type(item) is tuple and not item:
            parts.append("()")
        else:
            return None
    return "|".join(parts).encode()


# ---------------------------------------------------------------------------- kept kernels
def kept(key, op, jitted, counter: str = "kernel_compilations"):
    """``jitted`` (``op``'s ``counted_jit`` kernel) with its executables kept on disk under ``key``
    (see the module docstring); ``jitted`` itself when the key is not stable or the cache is off.
    A compilation here is counted under ``counter`` in ``cache_stats()``."""
    directory = ensure_persistent_cache()
    if directory is None:
        return jitted
    stable = stable_key(key)
    if stable is None or not _setup() or _mac_key() is None:
        return jitted
    return KeptKernel(op, jitted, stable, directory, counter)


_keys: list = []  # [this user's key, or None when it cannot be used], read once


def _mac_key() -> bytes | None:
    """This user's key for the entries' digests (``cachedir.mac_key``); None, after one warning,
    when its file cannot be trusted (kernels are then not kept)."""
    if not _keys:
        try:
            key = cachedir.mac_key()
        except Untrusted as e:
            import warnings

            key = None
            warnings.warn(f"circuits: the key file {e.path!r} cannot be used: {e.problem}; kernels are not kept "
                          f"across processes ({e.fix or 'remove it'})", RuntimeWarning, stacklevel=4)
        _keys[:] = [key]
    return _keys[0]


class KeptKernel:
    """A kernel that runs the executable it loaded (or compiled and stored) for the arguments'
    signature, and falls back to the jitted kernel for calls that executable does not take.
    ``root``: the cache folder (its entries are in ``root/circuits-kernels``)."""

    __slots__ = ("op", "jitted", "key", "root", "counter", "exe", "context", "by_signature")

    def __init__(self, op, jitted, key: bytes, root: str, counter: str = "kernel_compilations"):
        _setup()  # kept() makes one only where this jax can keep kernels
        self.op, self.jitted, self.key, self.root, self.counter = op, jitted, key, root, counter
        self.exe = None
        self.context = None
        self.by_signature: dict = {}

    def __call__(self, *args):
        exe = self.exe
        if exe is not None and _trace_context[0]() == self.context:
            try:
                return exe(*args)
            except (TypeError, ValueError):  # arguments it was not compiled for (checked before
                pass  # it runs): find or make the executable for them
        return self._dispatch(args)

    def _dispatch(self, args):
        import jax

        flat, tree = jax.tree_util.tree_flatten(args)
        if any(isinstance(x, jax.core.Tracer) for x in flat):
            return self._fallback(args)
        context = _trace_context[0]()
        avals = tuple(jax.typeof(x) for x in flat)
        signature = (tree, tuple((a.shape, dtype_str(a.dtype), a.weak_type) for a in avals), context)
        exe = self.by_signature.get(signature)
        if exe is None:
            exe, loaded = self._load_or_compile(args, signature)
            self.by_signature[signature] = exe or False
            if loaded is not None:  # read from disk: its first run (still marked as loading)
                try:  # tells whether it works here
                    out = exe(*args)
                except jax.errors.JaxRuntimeError:
                    loaded.reject()
                    self.by_signature[signature] = False
                    return self._fallback(args)
                except (TypeError, ValueError):  # arguments on a device it was not loaded for
                    return self._fallback(args)
                finally:
                    loaded.done()
                self.exe, self.context = exe, context
                return out
        if exe is None or exe is False:
            return self._fallback(args)
        try:
            out = exe(*args)
        except (TypeError, ValueError):
            return self._fallback(args)
        self.exe, self.context = exe, context
        return out

    def _fallback(self, args):
        _counts["fallbacks"] += 1
        return self.jitted(*args)

    def _load_or_compile(self, args, signature) -> tuple:
        """``(executable, _Loading when it was read from disk, else None)`` for ``args``: read
        from its entry when one is there and loads, else compiled (traced and lowered through the
        jitted kernel) and written; ``(None, None)`` when it cannot be kept (the caller uses the
        jitted kernel)."""
        tree, avals, context = signature
        plain = _plain_context(context)
        if plain is None:
            return None, None
        full = b"\n".join([self.key, repr(tree).encode(), repr(avals).encode(), plain, _environment()])
        name = blake3.blake3(full).hexdigest(32)
        root = self.root
        exe, loaded = _load(root, name, full)
        if exe is not None:
            _counts["loads"] += 1
            note_loaded()
            return exe, loaded
        # The module's name: the key without the library's source, so that a new version of the
        # library finds in JAX's cache what it lowers the same way.
        stem = blake3.blake3(full[:-len(_environment())]).hexdigest(24)
        compiled, fresh = _compile(self.op, args, "circuits_kernel_" + stem, self.counter)
        if fresh:
            _store(root, name, full, compiled)
        else:  # from JAX's cache: XLA cannot serialize such an executable again whole (a kept
            # copy would not run); it serves this process, and a fresh compilation under a name
            # of its own is kept in the background
            import jax

            op, shapes = self.op, _stand_ins(args)
            settings = (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)
            _keep_later(lambda: _keep_fresh(op, shapes, root, name, full, plain, settings))
        return compiled, None


def _stand_ins(args):
    """Stand-ins of ``args`` for lowering (shapes, dtypes, weak types): no value is held."""
    import jax

    def stand_in(value):
        aval = jax.typeof(value)
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)

    return jax.tree_util.tree_map(stand_in, args)


_pending: collections.deque = collections.deque()  # kernels to compile afresh and keep
_worker: list = []  # [the thread keeping them, one at a time]
_worker_lock = threading.Lock()


def _keep_later(job) -> None:
    """Run ``job`` in the background thread, after the kernels queued to be kept before it."""
    if exiting():
        return
    _pending.append(job)
    with _worker_lock:
        if not (_worker and _worker[0].is_alive()):
            _worker[:] = [in_background(_drain, name="circuits-keep")]


def _drain():
    """Keep one queued kernel; ``AGAIN`` while more wait (the background thread takes its other
    jobs in between).  At exit, the kernels not kept yet are compiled again by a later process."""
    try:
        job = _pending.popleft()
    except IndexError:
        return None
    try:
        job()
    except Exception:  # noqa: BLE001 - a kernel not kept is compiled again by a later
        pass  # process; the next job still runs
    return AGAIN if _pending else None


def _keep_fresh(op, shapes, root: str, name: str, full: bytes, plain: bytes, settings: tuple) -> None:
    """Compile ``op`` afresh (a module name of its own) and keep it (a background thread: its
    traces are not counted as the kernels' compilations, which a caller may be measuring).  The
    thread traces in the caller's x64 mode and matmul precision (``settings``: they are per
    thread), and keeps nothing when its trace context is not the caller's (``plain``)."""
    import jax

    x64, matmul = settings
    with jax.enable_x64(x64), jax.default_matmul_precision(matmul):
        if _plain_context(_trace_context[0]()) != plain:
            return
        compiled, fresh = _compile(op, shapes, "circuits_kernel_" + os.urandom(12).hex(), "kept_compilations")
    if fresh:
        _store(root, name, full, compiled)


def _compile(op, args, name: str, counter: str = "kernel_compilations") -> tuple:
    """``(op compiled for args as a module named name, whether XLA compiled it here)``: JAX's
    cache, keyed by the module (names included), may hand back an executable it loaded instead."""
    lowered = counted_jit(op, counter, name).lower(*args)
    hits = _local.__dict__.setdefault("hits", 0)
    compiled = lowered.compile()
    return compiled, _local.hits == hits


_local = threading.local()  # JAX cache hits in this thread (_load_or_compile: was it compiled?)
_listening: list = []


def _setup() -> bool:
    """Once per process: find JAX's trace context and count its persistent cache hits per thread;
    False when this jax lacks what keeping kernels needs (they are then only jitted)."""
    if _listening:
        return _listening[0]
    try:
        import jax
        from jax._src.config import trace_context
        from jax.experimental import serialize_executable  # noqa: F401

        jax.typeof, jax.monitoring.register_event_listener, jax.errors.JaxRuntimeError  # noqa: B018
    except (ImportError, AttributeError):
        _listening.append(False)
        return False
    _trace_context[:] = [trace_context]

    def on_event(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            _local.hits = getattr(_local, "hits", 0) + 1

    jax.monitoring.register_event_listener(on_event)
    _listening.append(True)
    return True


# ---------------------------------------------------------------------------- entries
# An entry: KEPT_MAGIC, then the keyed digest of all it holds (KEPT_MAGIC included), then the body:
# the key's length and the key (``full``), the trees' length and the trees (JSON), the payload.
_LEAF = object()


def _tree_data(treedef):
    """A tree structure of tuples, lists, dicts with str keys and None as plain data for JSON
    (ValueError for anything else: such a kernel is not kept)."""
    import jax

    def plain(node, depth):
        if depth > 64:
            raise ValueError("too deep")
        if node is _LEAF:
            return 0
        if node is None:
            return None
        if type(node) is tuple:
            return {"t": [plain(x, depth + 1) for x in node]}
        if type(node) is list:
            return {"l": [plain(x, depth + 1) for x in node]}
        if type(node) is dict and all(type(k) is str for k in node):
            return {"d": [[k, plain(v, depth + 1)] for k, v in node.items()]}
        raise ValueError(f"a {type(node).__name__} in a tree")

    return plain(jax.tree_util.tree_unflatten(treedef, [_LEAF] * treedef.num_leaves), 0)


def _tree_of(data):
    """The tree structure ``_tree_data`` described."""
    import jax

    def build(node, depth):
        if depth > 64:
            raise ValueError("too deep")
        if node is None or node == 0:
            return node
        (kind, items), = node.items()
        if kind == "d":
            return {k: build(v, depth + 1) for k, v in items}
        return (tuple if kind == "t" else list)(build(x, depth + 1) for x in items)

    return jax.tree_util.tree_structure(build(data, 0))


def _digest(key: bytes, body) -> bytes:
    """The keyed digest of an entry of body ``body`` (its KEPT_MAGIC included)."""
    h = blake3.blake3(KEPT_MAGIC, key=key)
    h.update(body)
    return h.digest(_DIGEST)


def _pack(key: bytes, full: bytes, trees: str, blob: bytes) -> bytes:
    tree_bytes = trees.encode()
    body = struct.pack("<q", len(full)) + full + struct.pack("<q", len(tree_bytes)) + tree_bytes + blob
    return KEPT_MAGIC + _digest(key, body) + body


def _unpack(data: bytes, full: bytes, key: bytes):
    """``(payload, in_tree, out_tree)`` of an entry for key ``full``, after its digest is checked;
    ValueError when it does not match (nothing is deserialized before that)."""
    start = len(KEPT_MAGIC) + _DIGEST
    if not data.startswith(KEPT_MAGIC) or len(data) < start + 16:
        raise ValueError("not an entry of this format")
    body = memoryview(data)[start:]
    if not hmac.compare_digest(_digest(key, body), data[len(KEPT_MAGIC):start]):
        raise ValueError("its digest does not match")
    (n,) = struct.unpack_from("<q", body, 0)
    if bytes(body[8:8 + n]) != full:
        raise ValueError("another key")
    (m,) = struct.unpack_from("<q", body, 8 + n)
    in_tree, out_tree = json.loads(bytes(body[16 + n:16 + n + m]).decode())
    return bytes(body[16 + n + m:]), _tree_of(in_tree), _tree_of(out_tree)


class _Loading:
    """An entry being loaded: its mark is removed by ``done`` (the first run went through);
    ``reject`` removes the entry too."""

    __slots__ = ("fd", "marks", "name", "mark")

    def __init__(self, fd: int, marks: int, name: str, mark: str):
        self.fd, self.marks, self.name, self.mark = fd, marks, name, mark

    def reject(self) -> None:
        _counts["rejected"] += 1
        cachedir.remove(self.fd, self.name)

    def done(self) -> None:
        if self.fd is None:
            return
        cachedir.remove(self.marks, self.mark)
        os.close(self.marks)
        os.close(self.fd)
        self.fd = None


def _load(root: str, name: str, full: bytes) -> tuple:
    """``(executable, _Loading)`` for the entry ``name`` of key ``full`` in the cache folder
    ``root``; ``(None, None)`` when there is none or it cannot be used (not ours, a digest that
    does not match, another key, another jax: then it is removed).  Entries whose loading crashed
    an earlier process are removed first."""
    key = _mac_key()
    fd = None if key is None else open_folder(root, FOLDER)
    if fd is None:
        return None, None
    marks = None
    try:
        try:
            marks = cachedir.open_sub(fd, _LOADING, f"{root}/{FOLDER}", create=True)
        except Untrusted as e:
            distrust(e, root)
            return None, None
        for entry in cachedir.dead_loads(marks):
            if KEPT_NAME.fullmatch(entry) and cachedir.remove(fd, entry):
                _counts["quarantined"] += 1
        try:
            data = cachedir.read_file(fd, name)
            if data is None:
                return None, None
            blob, in_tree, out_tree = _unpack(data, full, key)
        except (Untrusted, ValueError, UnicodeDecodeError, KeyError, TypeError, struct.error):
            _counts["rejected"] += 1  # compiled afresh, the entry rewritten
            cachedir.remove(fd, name)
            return None, None
        loading = _Loading(fd, marks, name, cachedir.loading(marks, name))
        fd = marks = None  # the _Loading holds them now
        try:
            from jax.experimental.serialize_executable import deserialize_and_load

            return deserialize_and_load(blob, in_tree, out_tree), loading
        except Exception:  # noqa: BLE001 - an authenticated payload this jax cannot load (another
            loading.reject()  # version's): compiled afresh, the entry rewritten
            loading.done()
            return None, None
    except OSError:
        return None, None
    finally:
        for folder in (fd, marks):
            if folder is not None:
                os.close(folder)


def _store(root: str, name: str, full: bytes, compiled) -> None:
    """Write ``compiled``'s executable for key ``full`` as the entry ``name`` in the cache folder
    ``root`` (atomically; nothing when it cannot be serialized or written, or the folder fails
    its checks)."""
    key = _mac_key()
    if key is None:
        return
    try:
        from jax.experimental.serialize_executable import serialize

        blob, in_tree, out_tree = serialize(compiled)
        trees = json.dumps([_tree_data(in_tree), _tree_data(out_tree)])
        if [_tree_of(t) for t in json.loads(trees)] != [in_tree, out_tree]:
            return
        data = _pack(key, full, trees, blob)
    except Exception:  # noqa: BLE001 - not serializable (constants, a backend without it, a tree
        return  # of other types): the kernel is compiled in each process, as without this cache
    fd = open_folder(root, FOLDER, create=True)
    if fd is None:
        return
    try:
        cachedir.write_file(fd, name, data)
    except OSError:
        return
    finally:
        os.close(fd)
    _counts["stores"] += 1
