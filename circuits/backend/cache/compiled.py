"""The one compile cache every evaluation path shares, with its counters: compiled functions of
programs keyed by the program's name- and value-blind key plus what the caller adds (``'run'``,
``'vmap'`` and its batch axes, ``'grad'`` and its slots), so every path reuses compiled code for
patched circuits alike.  Whether a program is compiled at all is the jit policy's business
(``circuits.backend.tiers.maybe_jit``).

>>> import numpy as np
>>> from circuits import Symbol, Add
>>> from circuits.backend.lower.binding import bind_arguments
>>> from circuits.backend.lower.program import Program
>>> x = Symbol((2,), name='x')
>>> program = Program([Add(x, x)], 'float32')
>>> args = bind_arguments(program, {'x': [1, 2]}, 'float32')
>>> run = cached_jit((program.key, 'run'), lambda: program.skeleton().run)
>>> run(args)
[Array([2., 4.], dtype=float32)]
>>> is_cached((program.key, 'run'))
True
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...errors import EvaluationError
from .bounded import BoundedCache
from .compiling import compile_counts, counted_jit
from .executables import kept

__all__ = ["cached_jit", "stable_name", "is_cached", "is_compiled", "is_compiled_any", "compile_cache_stats",
           "clear_compile_cache", "set_compile_cache_size"]


# ---------------------------------------------------------------------------- the compile cache
_functions = BoundedCache("compiled", "compiled", max_entries=128)  # key -> compiled function


def cached_jit(key, make: Callable[[], Callable], kept_as: bytes | None = None) -> Callable:
    """``jax.jit`` of the function ``make()`` builds, cached under ``key``: made on a miss (the
    least recently used entry is evicted beyond the cache size), every trace counted as a
    compilation.  ``kept_as``: bytes naming the function the same way in every process (a
    circuit's hash and options); its executable is then kept on disk and a later process loads
    it without tracing or lowering (``circuits.backend.cache.executables``)."""
    fn = _functions.get(key)
    if fn is not None:
        return fn
    made = make()
    fn = counted_jit(made, "compilations")
    if kept_as is not None:
        fn = kept(("program", kept_as), made, fn, counter="compilations")
    return _functions.setdefault(key, fn)


def stable_name(circuit, suffix: bytes) -> bytes | None:
    """Bytes naming a compiled function of ``circuit`` (or of a sequence of roots) the same way in
    every process (its content hash, or a digest of the roots' in order, then ``suffix``: the
    options), for ``cached_jit``'s ``kept_as``; None where the circuit computes a function a user
    registered: its code may differ in the next process, under the same name and so the same hash.

    >>> from circuits import GeneralFunction, Symbol
    >>> x = Symbol((2,), name='x')
    >>> stable_name(GeneralFunction('exp', x), b'float32') == stable_name(GeneralFunction('exp', x), b'float32')
    True
    >>> stable_name([x, GeneralFunction('exp', x)], b'') != stable_name([GeneralFunction('exp', x), x], b'')
    True
    """
    from ...functions.registry import is_library_function
    from ...nodes import GeneralFunction
    from ...traversal import toposort

    roots = list(circuit) if isinstance(circuit, (list, tuple)) else [circuit]
    for node in toposort(roots):
        if type(node) is GeneralFunction and not is_library_function(node.function):
            return None
    if len(roots) == 1:
        return roots[0].hash + suffix
    import blake3

    return b"roots:" + blake3.blake3(b"".join(r.hash for r in roots)).digest(16) + suffix


def is_cached(key) -> bool:
    return key in _functions


def is_compiled(key) -> bool:
    """Whether the compile cache holds a function under ``key`` (e.g. ``(program.key, 'run')``)."""
    return is_cached(key)


def is_compiled_any(prefix: tuple) -> bool:
    """Whether the compile cache holds a function whose key starts with ``prefix`` (e.g. a
    program's ``vmap`` over any batch axes)."""
    n = len(prefix)
    return any(type(k) is tuple and k[:n] == prefix for k in _functions.keys())


def compile_cache_stats() -> dict:
    """Counters of the compile cache: ``compilations`` (whole programs traced for XLA),
    ``kernel_compilations`` (per-operation kernels traced), ``hits``, ``misses``, ``evictions``,
    and its ``size`` and ``max_size`` (``circuits.backend.cache_stats`` adds the value cache).

    >>> sorted(compile_cache_stats())
    ['compilations', 'evictions', 'hits', 'kernel_compilations', 'max_size', 'misses', 'size']
    """
    info = _functions.info()
    counts = compile_counts()
    out = {k: counts[k] for k in ("compilations", "kernel_compilations")}
    out.update(hits=info["hits"], misses=info["misses"], evictions=info["evictions"], size=info["entries"],
               max_size=info["max_entries"])
    return out


def clear_compile_cache():
    """Drop every cached compiled function (the counters keep counting).

    >>> clear_compile_cache(); compile_cache_stats()['size']
    0
    """
    _functions.clear()


def set_compile_cache_size(n: int):
    """Bound the compile cache to ``n`` functions (least recently used ones go first).

    >>> set_compile_cache_size(256); compile_cache_stats()['max_size']
    256
    >>> set_compile_cache_size(128)
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise EvaluationError(f"compile cache size must be an int number of functions, got {n!r}")
    if int(n) < 1:
        raise EvaluationError(f"compile cache size must be at least 1 function, got {n}")
    _functions.set_bounds(max_entries=int(n))
