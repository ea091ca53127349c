"""Per-operation kernels kept compiled across processes, loaded without tracing them.

JAX's persistent cache (``circuits.backend.persistent``) keys a compilation by the module JAX
lowers, so a new process still traces and lowers each kernel before it finds the compilation on
disk: tens of milliseconds a kernel, most of a first call's time (a GPT-2 gradient uses dozens).
A kernel of ``incremental.cached_kernel`` is described by its own key (operation, shapes, float
precision: what the in-process kernel cache already relies on), so its executable is kept beside
JAX's cache (the folder ``circuits-kernels``, under the same controls: ``CIRCUITS_COMPILATION_CACHE``
moves it or turns it off) under that key and:

- the arguments' structure, shapes, dtypes and weak types;
- JAX's trace context (every setting tracing reads: matmul precision, x64, ...);
- the versions of jax, jaxlib and the library's own source (a digest of its files), the backend's
  platform and version, its device kind and count.

A later process loads the executable (``jax.experimental.serialize_executable``) and calls it:
no trace, no lowering.  A new process's first whole program (``evaluation._compile_whole`` and the
next process's first evaluation, ``persistent.compiled_before``) is kept the same way, under the
circuit's hash and options (``runtime.cached_jit``'s ``kept_as``).  A kernel whose key names a function a user registered is not kept (its
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
import os
import pickle
import struct
import tempfile
import threading

import blake3
import numpy as np

from ..dtypes import dtype_str
from .persistent import ensure_persistent_cache
from .runtime import counted_jit

__all__ = ["kept", "stable_key", "executable_info", "FOLDER"]

FOLDER = "circuits-kernels"
_MAGIC = b"circuits-kernel 1\n"
_GF = b"GeneralFunction\0"
_counts = collections.Counter()
_trace_context: list = []  # [jax's trace_context], imported with the first kept kernel
_env: list = []  # [environment digest], computed once


def executable_info() -> dict:
    """``loads`` (executables read from disk), ``stores`` (written), ``rejected`` (entries that
    could not be used: compiled afresh) and ``fallbacks`` (calls the jitted kernel took)."""
    return {k: _counts[k] for k in ("loads", "stores", "rejected", "fallbacks")}


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
    from ..errors import CircuitError
    from ..functions.registry import is_library_function, lookup

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


def _environment() -> bytes:
    """What every kept executable depends on besides its key: versions, backend, the library's
    source (computed once)."""
    if _env:
        return _env[0]
    import jax
    import jaxlib

    h = blake3.blake3()
    device = jax.devices()[0]
    client = device.client
    h.update(repr((jax.__version__, jaxlib.__version__, client.platform, client.platform_version,
                   device.device_kind, jax.device_count())).encode())
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        files.extend(os.path.join(folder, n) for n in names if n.endswith(".py"))
    for path in sorted(files):
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    _env[:] = [h.digest(16)]
    return _env[0]


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
    if stable is None or not _setup():
        return jitted
    return KeptKernel(op, jitted, stable, os.path.join(directory, FOLDER), counter)


class KeptKernel:
    """A kernel that runs the executable it loaded (or compiled and stored) for the arguments'
    signature, and falls back to the jitted kernel for calls that executable does not take."""

    __slots__ = ("op", "jitted", "key", "folder", "counter", "exe", "context", "by_signature")

    def __init__(self, op, jitted, key: bytes, folder: str, counter: str = "kernel_compilations"):
        _setup()  # kept() makes one only where this jax can keep kernels
        self.op, self.jitted, self.key, self.folder, self.counter = op, jitted, key, folder, counter
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
            exe, path = self._load_or_compile(args, signature)
            self.by_signature[signature] = exe or False
            if path is not None:  # read from disk: its first run tells whether it works here
                try:
                    out = exe(*args)
                except jax.errors.JaxRuntimeError:
                    _reject(path)
                    self.by_signature[signature] = False
                    return self._fallback(args)
                except (TypeError, ValueError):  # arguments on a device it was not loaded for
                    return self._fallback(args)
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
        """``(executable, path it was read from or None)`` for ``args``: read from its file when
        one is there and loads, else compiled (traced and lowered through the jitted kernel) and
        written; ``(None, None)`` when it cannot be kept (the caller uses the jitted kernel)."""
        tree, avals, context = signature
        plain = _plain_context(context)
        if plain is None:
            return None, None
        full = b"\n".join([self.key, repr(tree).encode(), repr(avals).encode(), plain, _environment()])
        name = blake3.blake3(full).hexdigest(32)
        path = os.path.join(self.folder, name)
        exe = _load(path, full)
        if exe is not None:
            _counts["loads"] += 1
            return exe, path
        # The module's name: the key without the library's source, so that a new version of the
        # library finds in JAX's cache what it lowers the same way.
        stem = blake3.blake3(full[:-len(_environment())]).hexdigest(24)
        compiled, fresh = _compile(self.op, args, "circuits_kernel_" + stem, self.counter)
        if fresh:
            _store(path, full, compiled)
        else:  # from JAX's cache: XLA cannot serialize such an executable again whole (a kept
            # copy would not run); it serves this process, and a fresh compilation under a name
            # of its own is kept in the background
            import jax

            op, shapes = self.op, _stand_ins(args)
            settings = (jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)
            _keep_later(lambda: _keep_fresh(op, shapes, path, full, plain, settings))
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
    """Run ``job`` in the one background thread that keeps kernels (started when none runs)."""
    from .tiers import in_background

    _pending.append(job)
    with _worker_lock:
        if not (_worker and _worker[0].is_alive()):
            _worker[:] = [in_background(_drain, name="circuits-keep")]


def _drain() -> None:
    while True:
        try:
            job = _pending.popleft()
        except IndexError:
            return
        try:
            job()
        except Exception:  # noqa: BLE001 - a kernel not kept is compiled again by a later
            pass  # process; the next job still runs


def _keep_fresh(op, shapes, path: str, full: bytes, plain: bytes, settings: tuple) -> None:
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
        _store(path, full, compiled)


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


def _reject(path: str) -> None:
    """An entry that loaded but cannot run here: counted and removed (the next miss rewrites it)."""
    _counts["rejected"] += 1
    try:
        os.unlink(path)
    except OSError:
        pass


def _header(full: bytes) -> bytes:
    """What an entry for key ``full`` starts with: the format's mark and the key itself."""
    return _MAGIC + struct.pack("<q", len(full)) + full


def _load(path: str, full: bytes):
    """The executable stored at ``path`` for key ``full``; None when there is none or it cannot
    be used (truncated, corrupt, another key, another jax)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        head = _header(full)
        if not data.startswith(head):
            raise ValueError("another key")
        blob, in_tree, out_tree = pickle.loads(data[len(head):])
        from jax.experimental.serialize_executable import deserialize_and_load

        return deserialize_and_load(blob, in_tree, out_tree)
    except Exception:  # noqa: BLE001 - a bad entry of any kind (unpickling, XLA's loader) is a
        _counts["rejected"] += 1  # miss: the kernel is compiled afresh and the entry rewritten
        return None


def _store(path: str, full: bytes, compiled) -> None:
    """Write ``compiled``'s executable for key ``full`` at ``path`` (atomically; nothing when it
    cannot be serialized or written)."""
    try:
        from jax.experimental.serialize_executable import serialize

        blob, in_tree, out_tree = serialize(compiled)
        data = _header(full) + pickle.dumps((blob, in_tree, out_tree))
    except Exception:  # noqa: BLE001 - not serializable (constants, a backend without it): the
        return  # kernel is compiled in each process, as without this cache
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)
            raise
    except OSError:
        return
    _counts["stores"] += 1
