"""XLA compilations: ``counted_jit`` is ``jax.jit`` with every trace counted (a trace is a
compilation for XLA), JAX's persistent cache switched on first (``circuits.backend.cache.persistent``).

The counts are ``cache_stats()``'s ``compilations`` (whole programs), ``kernel_compilations``
(the op-by-op tier's kernels), and the background's own (``group_compilations``,
``kept_compilations``).

>>> double = counted_jit(lambda x: x * 2, 'doc_compilations')
>>> before = compile_counts()['doc_compilations']
>>> float(double(1.0)), compile_counts()['doc_compilations'] - before
(2.0, 1)
"""

from __future__ import annotations

import collections
import threading
from typing import Callable

from .persistent import ensure_persistent_cache

__all__ = ["counted_jit", "compile_counts"]

_lock = threading.Lock()
_counts = collections.Counter()  # traces, by counter name


def counted_jit(fn: Callable, counter: str, name: str | None = None) -> Callable:
    """``jax.jit(fn)``, every trace counted under ``counter``; ``name``: the compiled module's
    (``circuits.backend.cache.executables`` names each kept kernel's own)."""
    import jax

    ensure_persistent_cache()

    def traced(*args):
        with _lock:
            _counts[counter] += 1
        return fn(*args)

    if name is not None:
        traced.__name__ = traced.__qualname__ = name
    return jax.jit(traced)


def compile_counts() -> collections.Counter:
    """The traces counted so far, by counter name (a copy)."""
    with _lock:
        return collections.Counter(_counts)
