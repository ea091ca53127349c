"""One set of controls for everything evaluation keeps: compiled whole programs, per-operation
kernels, the value cache of incremental evaluation, and the caches of ``Eager`` evaluators.

- ``cache_stats()``: counters (flat, for the compile cache as before; ``'values'``,
  ``'kernels'``, ``'eager'`` and ``'tiers'`` sub-dicts for the rest);
- ``clear_cache(what='all')``: forget what is kept (``'compiled'``, ``'values'``, ``'kernels'``);
- ``set_cache_size(functions=None, *, values_bytes=None, disk_bytes=None)``: bound the compile
  cache (whole programs), the value cache (bytes on the device) and the compilation cache's
  directory on disk.

Persistent compilation across processes is JAX's own cache (``circuits.backend.persistent``),
with the executables this library keeps beside it; ``cache_stats()['disk']`` says where it is,
its budget and what the last trim found.

>>> stats = cache_stats()
>>> sorted(stats['values'])
['bytes', 'entries', 'evictions', 'hits', 'max_bytes', 'misses', 'stores']
>>> set_cache_size(values_bytes=1 << 20); cache_stats()['values']['max_bytes']
1048576
>>> set_cache_size(values_bytes=DEFAULT_VALUE_BYTES)
"""

from __future__ import annotations

import weakref

from ..errors import EvaluationError
from .groups import clear_groups, group_info
from .incremental import DEFAULT_VALUE_BYTES, VALUES, clear_kernels, kernel_info
from .persistent import disk_info, set_disk_budget
from .runtime import clear_compile_cache, compile_cache_stats, set_compile_cache_size
from .tiers import clear_tiers, tier_info

__all__ = ["cache_stats", "clear_cache", "set_cache_size", "register_eager", "DEFAULT_VALUE_BYTES"]

_EAGERS: "weakref.WeakSet" = weakref.WeakSet()
_WHAT = ("all", "compiled", "values", "kernels")


def register_eager(evaluator) -> None:
    """Fold an ``Eager`` evaluator's cache into ``cache_stats`` and ``clear_cache``."""
    _EAGERS.add(evaluator)


def cache_stats() -> dict:
    """Counters of every evaluation cache.

    Flat keys (the compile cache of whole programs): ``compilations``, ``hits``, ``misses``,
    ``evictions``, ``size``, ``max_size``; ``kernel_compilations`` (per-operation kernels traced).
    ``values``: the value cache (``hits``, ``misses``, ``stores``, ``evictions``, ``entries``,
    ``bytes``, ``max_bytes``); ``kernels``: per-operation kernels held; ``eager``: the live
    ``Eager`` evaluators' ``entries`` and ``bytes``; ``tiers``: circuits tracked for
    whole-program compilation; ``groups``: the op-by-op tier's fused groups
    (``circuits.backend.groups``).
    """
    out = compile_cache_stats()
    out["values"] = VALUES.info()
    out["kernels"] = kernel_info()
    eagers = [e.cache_info() for e in list(_EAGERS)]
    out["eager"] = {"evaluators": len(eagers), "entries": sum(i["entries"] for i in eagers),
                    "bytes": sum(i["bytes"] for i in eagers)}
    out["tiers"] = tier_info()
    out["groups"] = group_info()
    out["disk"] = disk_info()
    return out


def clear_cache(what: str = "all") -> None:
    """Forget kept results: ``'compiled'`` whole programs, ``'values'`` (the value cache and every
    ``Eager`` evaluator's), ``'kernels'``, or ``'all'`` of them (counters keep counting).

    >>> clear_cache('values'); cache_stats()['values']['entries']
    0
    """
    if what not in _WHAT:
        raise EvaluationError(f"clear_cache(what={what!r}): use one of {', '.join(map(repr, _WHAT))}")
    if what in ("all", "compiled"):
        from .batched import clear_row_costs

        clear_compile_cache()
        clear_tiers()
        clear_row_costs()
    if what in ("all", "values"):
        VALUES.clear()
        for evaluator in list(_EAGERS):
            evaluator.clear()
    if what in ("all", "kernels"):
        clear_kernels()
        clear_groups()


def set_cache_size(functions: int | None = None, *, values_bytes: int | None = None,
                   disk_bytes: int | None = None) -> None:
    """Bound the compile cache to ``functions`` whole programs, the value cache to
    ``values_bytes`` bytes (0 keeps no value) and the compilation cache's directory on disk to
    ``disk_bytes`` (trimmed at once, and daily: ``circuits.backend.persistent``); least recently
    used entries go first.

    >>> set_cache_size(256); cache_stats()['max_size']
    256
    >>> set_cache_size(128)
    """
    if functions is None and values_bytes is None and disk_bytes is None:
        raise EvaluationError("set_cache_size: give functions= (compiled programs), values_bytes= or disk_bytes=")
    if functions is not None:
        set_compile_cache_size(functions)
    if values_bytes is not None:
        VALUES.set_max_bytes(values_bytes)
    if disk_bytes is not None:
        set_disk_budget(disk_bytes)
