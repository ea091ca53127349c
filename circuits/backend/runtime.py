"""The one jit policy and the one bounded compile cache every evaluation path shares, with its
counters; argument binding (``circuits.backend.binding``) and the lowering of a circuit to the
program ``evaluate`` runs (``circuits.backend.lowering``) are re-exported here for the modules
that import them from ``runtime``.

Whether a program is compiled is decided in one place, ``maybe_jit``: ``mode='jit'`` always
compiles, ``'eager'`` never does, ``'auto'`` compiles programs of up to ``JIT_MAX_OPS`` distinct
nodes and any program whose compiled function is already cached.  Compiled functions live in
one cache keyed by the program's name- and value-blind key plus what the caller adds (``'run'``,
``'vmap'`` and its batch axes, ``'grad'`` and its slots), so every path reuses compiled code for
patched circuits alike.

>>> import numpy as np
>>> from circuits import Symbol, Add
>>> from circuits.backend.program import Program
>>> x = Symbol((2,), name='x')
>>> program = Program([Add(x, x)], 'float32')
>>> args = bind_arguments(program, {'x': [1, 2]}, 'float32')
>>> run = maybe_jit((program.key, 'run'), len(program), 'auto', lambda: program.skeleton().run)
>>> run(args)
[Array([2., 4.], dtype=float32)]
>>> is_cached((program.key, 'run'))
True
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import numpy as np

from ..errors import EvaluationError
from .binding import (
    bind_arguments,
    check_index_values,
    check_symbol_value,
    device_cache_info,
    float_dtype,
    leaf_value,
    precision,
    raise_problems,
    symbol_values,
)
from .lowering import (
    as_items,
    cached_program,
    items_key_of,
    package_outputs,
    program_cache_info,
    program_with_also,
    resolve_nodes,
)
from .program import Program

__all__ = [
    "float_dtype", "precision", "bind_arguments", "symbol_values", "check_symbol_value", "leaf_value",
    "check_index_values", "device_cache_info", "raise_problems", "MODES", "JIT_MAX_OPS", "check_mode", "use_jit", "maybe_jit", "cached_jit", "is_cached",
    "compile_cache_stats", "clear_compile_cache", "set_compile_cache_size", "resolve_nodes", "as_items", "program_with_also",
    "cached_program", "program_cache_info", "package_outputs", "counted_jit", "items_key_of", "worth_compiling", "is_compiled", "is_compiled_any",
]


# ---------------------------------------------------------------------------- jit policy and compile cache
MODES = ("auto", "jit", "eager")

# Above this many distinct nodes ``mode='auto'`` runs op by op: XLA's compile time grows with
# program size (a 50,000-op chain takes ~15 s to compile on CPU, ~0.6 s to run eagerly), and a
# program already in the compile cache is jitted whatever its size.
JIT_MAX_OPS = 5000

_cache: "collections.OrderedDict[Any, Callable]" = collections.OrderedDict()
_cache_lock = threading.Lock()
_cache_size = 128
_stats = collections.Counter()


# The tier every mode='auto' call takes instead while ``circuits.backend.tiers.pinned`` is in
# force (a list: one slot shared by every module and thread).
PINNED_TIER: list = [None]


def check_mode(mode: str) -> str:
    """The ``mode=`` option, checked; ``'auto'`` is the pinned tier while one is pinned."""
    if mode not in MODES:
        raise EvaluationError(f"mode={mode!r}: use one of {', '.join(MODES)}")
    if mode == "auto" and PINNED_TIER[0] is not None:
        return PINNED_TIER[0]
    return mode


def use_jit(mode: str, size: int, key) -> bool:
    """The jit policy: compile a program of ``size`` distinct nodes whose function is cached
    under ``key``?"""
    if mode == "auto":
        return size <= JIT_MAX_OPS or is_cached(key)
    return mode == "jit"


def worth_compiling(program: Program, key) -> bool:
    """Whether the tiered ``'auto'`` mode should compile ``program`` whole (under ``key``): when it
    is small enough (``JIT_MAX_OPS``) or already compiled."""
    return use_jit("auto", len(program), key)


def maybe_jit(key, size: int, mode: str, make: Callable[[], Callable], kept_as: bytes | None = None) -> Callable:
    """The function ``make()`` builds: jitted and from the compile cache (under ``key``) when
    the jit policy says so, else as it is (it then runs op by op).  ``kept_as``: see
    ``cached_jit``.

    ``make`` must build a function that holds no node and no tensor (a ``Skeleton``'s ops):
    the cache outlives the circuit."""
    if use_jit(mode, size, key):
        return cached_jit(key, make, kept_as)
    return make()


def cached_jit(key, make: Callable[[], Callable], kept_as: bytes | None = None) -> Callable:
    """``jax.jit`` of the function ``make()`` builds, cached under ``key``: made on a miss (the
    least recently used entry is evicted beyond the cache size), every trace counted as a
    compilation.  ``kept_as``: bytes naming the function the same way in every process (a
    circuit's hash and options); its executable is then kept on disk and a later process loads
    it without tracing or lowering (``circuits.backend.executables``)."""
    with _cache_lock:
        fn = _cache.get(key)
        if fn is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return fn
        _stats["misses"] += 1
    made = make()
    fn = _counted_jit(made)
    if kept_as is not None:
        from .executables import kept

        fn = kept(("program", kept_as), made, fn, counter="compilations")
    with _cache_lock:
        _cache[key] = fn
        while len(_cache) > _cache_size:
            _cache.popitem(last=False)
            _stats["evictions"] += 1
    return fn


def _counted_jit(fn: Callable) -> Callable:
    return counted_jit(fn, "compilations")


def counted_jit(fn: Callable, counter: str, name: str | None = None) -> Callable:
    """``jax.jit(fn)``, every trace (a compilation for XLA) counted under ``counter`` in
    ``cache_stats()`` (``'compilations'`` for whole programs, ``'kernel_compilations'`` for the
    per-operation kernels of ``circuits.backend.incremental``); ``name``: the compiled module's
    (``circuits.backend.executables`` names each kept kernel's own)."""
    import jax

    from .persistent import ensure_persistent_cache, recheck

    ensure_persistent_cache()

    def traced(*args):
        with _cache_lock:
            _stats[counter] += 1
        recheck()  # the cache folder, again before this compilation reads or writes JAX's entries
        return fn(*args)

    if name is not None:
        traced.__name__ = traced.__qualname__ = name
    return jax.jit(traced)


def is_cached(key) -> bool:
    with _cache_lock:
        return key in _cache


def is_compiled(key) -> bool:
    """Whether the compile cache holds a function under ``key`` (e.g. ``(program.key, 'run')``)."""
    return is_cached(key)


def is_compiled_any(prefix: tuple) -> bool:
    """Whether the compile cache holds a function whose key starts with ``prefix`` (e.g. a
    program's ``vmap`` over any batch axes)."""
    n = len(prefix)
    with _cache_lock:
        return any(type(k) is tuple and k[:n] == prefix for k in _cache)


def compile_cache_stats() -> dict:
    """Counters of the compile cache: ``compilations`` (whole programs traced for XLA),
    ``kernel_compilations`` (per-operation kernels traced), ``hits``, ``misses``, ``evictions``,
    and its ``size`` and ``max_size`` (``circuits.backend.cache_stats`` adds the value cache).

    >>> sorted(compile_cache_stats())
    ['compilations', 'evictions', 'hits', 'kernel_compilations', 'max_size', 'misses', 'size']
    """
    with _cache_lock:
        out = {k: _stats[k] for k in ("compilations", "kernel_compilations", "hits", "misses", "evictions")}
        out.update(size=len(_cache), max_size=_cache_size)
    return out


def clear_compile_cache():
    """Drop every cached compiled function (the counters keep counting).

    >>> clear_compile_cache(); compile_cache_stats()['size']
    0
    """
    with _cache_lock:
        _cache.clear()


def set_compile_cache_size(n: int):
    """Bound the compile cache to ``n`` functions (least recently used ones go first).

    >>> set_compile_cache_size(256); compile_cache_stats()['max_size']
    256
    >>> set_compile_cache_size(128)
    """
    global _cache_size
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise EvaluationError(f"compile cache size must be an int number of functions, got {n!r}")
    if int(n) < 1:
        raise EvaluationError(f"compile cache size must be at least 1 function, got {n}")
    with _cache_lock:
        _cache_size = int(n)
        while len(_cache) > _cache_size:
            _cache.popitem(last=False)
            _stats["evictions"] += 1
