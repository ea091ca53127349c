"""One set of controls for everything evaluation keeps: compiled whole programs, per-operation
kernels and fused groups, the value cache of op-by-op evaluation, lowered programs, values on
the device, and every other cache the backend holds in memory (each registers itself where it
is created: ``circuits.backend.cache.bounded``).

- ``cache_stats()``: counters (flat, for the compile cache as before; ``'values'``,
  ``'kernels'``, ``'eager'``, ``'tiers'``, ``'groups'`` and ``'disk'`` sub-dicts for the rest, and
  ``'caches'``: every registered cache's own counters by name);
- ``clear_cache(what='all')``: forget what is kept (``'compiled'``, ``'values'``, ``'kernels'``);
- ``set_cache_size(functions=None, *, values_bytes=None, disk_bytes=None)``: bound the compile
  cache (whole programs), the value cache (bytes on the device) and the compilation cache's
  directory on disk.

Persistent compilation across processes is JAX's own cache (``circuits.backend.cache.persistent``),
with the executables this library keeps beside it; ``cache_stats()['disk']`` says where it is,
its budget and what the last trim found.  ``clear_cache`` never touches it.

>>> stats = cache_stats()
>>> sorted(stats['values'])
['bytes', 'entries', 'evictions', 'hits', 'max_bytes', 'misses', 'stores']
>>> set_cache_size(values_bytes=1 << 20); cache_stats()['values']['max_bytes']
1048576
>>> set_cache_size(values_bytes=DEFAULT_VALUE_BYTES)
"""

from __future__ import annotations

from ..errors import EvaluationError
from .cache.bounded import KINDS, registered
from .cache.compiled import compile_cache_stats, set_compile_cache_size
from .cache.persistent import disk_info, set_disk_budget
from .tiers.groups import group_info
from .tiers.kernels import kernel_info
from .tiers.policy import tier_info
from .tiers.values import DEFAULT_VALUE_BYTES, set_value_budget, value_cache_info

__all__ = ["cache_stats", "clear_cache", "set_cache_size", "DEFAULT_VALUE_BYTES"]

_WHAT = ("all", *KINDS)


def cache_stats() -> dict:
    """Counters of every evaluation cache.

    Flat keys (the compile cache of whole programs): ``compilations``, ``hits``, ``misses``,
    ``evictions``, ``size``, ``max_size``; ``kernel_compilations`` (per-operation kernels traced).
    ``values``: the value cache (``hits``, ``misses``, ``stores``, ``evictions``, ``entries``,
    ``bytes``, ``max_bytes``); ``kernels``: per-operation kernels held; ``eager``: the live
    ``Eager`` views (``evaluators``; their ``entries`` and ``bytes`` are 0: they read the value
    cache); ``tiers``: circuits tracked for
    whole-program compilation; ``groups``: the op-by-op tier's fused groups
    (``circuits.backend.tiers.groups``); ``disk``: the compilation cache's directory; ``caches``: each
    registered in-memory cache's ``entries`` and counters, by name.
    """
    caches = registered()
    out = compile_cache_stats()
    out["values"] = value_cache_info()
    out["kernels"] = kernel_info()
    eager = caches["eager"].info() if "eager" in caches else {"objects": 0, "entries": 0, "bytes": 0}
    out["eager"] = {"evaluators": eager["objects"], "entries": eager["entries"], "bytes": eager["bytes"]}
    out["tiers"] = tier_info()
    out["groups"] = group_info()
    out["disk"] = disk_info()
    out["caches"] = {name: dict(cache.info(), kind=cache.kind) for name, cache in caches.items()}
    return out


def clear_cache(what: str = "all") -> None:
    """Forget kept results: ``'compiled'`` whole programs (and what goes with them: lowered
    programs, row costs, chunk measurements, whole programs tracked), ``'values'`` (the value
    cache, which ``Eager`` views read, values on the device), ``'kernels'`` (per-operation
    kernels, fused groups, op builders), or ``'all'`` of them (counters keep counting; the
    compilation cache on disk is not touched).  A compilation running in the background puts
    nothing back into a cache cleared meanwhile.

    >>> clear_cache('values'); cache_stats()['values']['entries']
    0
    """
    if what not in _WHAT:
        raise EvaluationError(f"clear_cache(what={what!r}): use one of {', '.join(map(repr, _WHAT))}")
    for cache in registered().values():
        if what == "all" or cache.kind == what:
            cache.clear()


def set_cache_size(functions: int | None = None, *, values_bytes: int | None = None,
                   disk_bytes: int | None = None) -> None:
    """Bound the compile cache to ``functions`` whole programs, the value cache to
    ``values_bytes`` bytes (0 keeps no value) and the compilation cache's directory on disk to
    ``disk_bytes`` (trimmed at once, and daily: ``circuits.backend.cache.persistent``); least recently
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
        set_value_budget(values_bytes)
    if disk_bytes is not None:
        set_disk_budget(disk_bytes)
