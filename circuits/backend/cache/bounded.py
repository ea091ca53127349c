"""Every cache the backend keeps in memory: one bounded class, and the registry each cache joins
where it is created, so that ``cache_stats()`` and ``clear_cache()`` reach all of them.

A ``BoundedCache`` holds values by key under a lock, with hit, miss, store and eviction counters,
at most ``max_entries`` entries and ``max_bytes`` bytes (either bound optional), the least
recently used going first (``lru=False``: the oldest stored, for caches read on a hot path).
Creating one registers it under its ``name`` with a ``kind`` (``'compiled'``, ``'values'`` or
``'kernels'``: what ``clear_cache(what=...)`` forgets with it).  Anything else with ``info()``
and ``clear()`` joins with ``register`` (a weak set of per-object caches, a ``functools`` cache).

A clear must stick: work running in the background when the cache is cleared (a whole program
compiling, a fused group, the warm-up of a new process) must not put back what it computed
from before the clear.  ``clear`` moves the cache's ``cleared_at`` to a new *epoch*; a thread
started by ``circuits.backend.cache.background`` works for the epoch it was started in
(``working_for``), and a store from a thread working for an epoch older than the cache's clear
is dropped (the caller still gets its value).

>>> cache = BoundedCache('doc-demo', 'values', max_bytes=100)
>>> cache.put('a', 'A', size=60); cache.put('b', 'B', size=60)   # 'a' goes to make room
>>> cache.get('a'), cache.get('b'), cache.info()['evictions']
(None, 'B', 1)
>>> cache.clear(); len(cache)
0
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import weakref

__all__ = ["BoundedCache", "register", "registered", "WeakCaches", "FunctionCache", "KINDS", "current_epoch",
           "working_for"]

KINDS = ("compiled", "values", "kernels")

_registry: dict = {}  # name -> the cache (anything with info() and clear())
_epochs = itertools.count(1)
_epoch = [0]  # the latest epoch: moved on by every clear
_epoch_lock = threading.Lock()
_local = threading.local()  # .epoch: the epoch a background thread works for


def register(name: str, kind: str, cache) -> None:
    """Add ``cache`` (``info() -> dict`` with ``entries``, and ``clear()``) to the registry."""
    if kind not in KINDS:
        raise ValueError(f"cache kind {kind!r}: use one of {KINDS}")
    unique, n = name, 1
    while unique in _registry:  # a module executed again (a doctest importing it by path) keeps both
        n += 1
        unique = f"{name} ({n})"
    cache.kind = kind
    _registry[unique] = cache


def registered() -> dict:
    """``{name: cache}`` of every registered cache (a copy), in the order they were created."""
    return dict(_registry)


def current_epoch() -> int:
    """The epoch this thread works for: the one it was started in (a background thread), else
    the latest."""
    found = getattr(_local, "epoch", None)
    return _epoch[0] if found is None else found


@contextlib.contextmanager
def working_for(epoch: int):
    """Within the block, this thread's stores are for ``epoch``: dropped by a cache cleared since."""
    before = getattr(_local, "epoch", None)
    _local.epoch = epoch
    try:
        yield
    finally:
        _local.epoch = before


def _new_epoch() -> int:
    with _epoch_lock:
        _epoch[0] = next(_epochs)
        return _epoch[0]


def _stale(cleared_at: int) -> bool:
    """Whether a store now would put back what a clear at ``cleared_at`` forgot."""
    found = getattr(_local, "epoch", None)
    return found is not None and found < cleared_at


class BoundedCache:
    """Values by key, bounded by entries and bytes, thread-safe, with counters (see the module
    docstring).  ``reentrant``: its lock may be taken again by the thread holding it (a weak
    reference's callback that runs during a store)."""

    __slots__ = ("name", "kind", "max_entries", "max_bytes", "lru", "_data", "_sizes", "_bytes", "_lock",
                 "cleared_at", "hits", "misses", "stores", "evictions", "peek", "__weakref__")

    def __init__(self, name: str, kind: str, *, max_entries: int | None = None, max_bytes: int | None = None,
                 lru: bool = True, reentrant: bool = False):
        self.name = name
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.lru = lru
        self._data: collections.OrderedDict = collections.OrderedDict()
        self._sizes: dict = {}
        self._bytes = 0
        self._lock = threading.RLock() if reentrant else threading.Lock()
        self.cleared_at = 0
        self.hits = self.misses = self.stores = self.evictions = 0
        # ``peek(key, default=None)``: the value without counting or reordering (a plain dict read,
        # for the hot loops that look a node up many times a call)
        self.peek = self._data.get
        register(name, kind, self)

    # ------------------------------------------------------------------ reading
    def get(self, key, default=None):
        """The value under ``key`` (counted as a hit, and made the most recently used), else
        ``default`` (a miss)."""
        if not self.lru:  # no reordering: a plain read (a dict read is atomic)
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                self.misses += 1
                return default
            self.hits += 1
            return value
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                self.misses += 1
                return default
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def __contains__(self, key) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> list:
        with self._lock:
            return list(self._data)

    def values(self) -> list:
        with self._lock:
            return list(self._data.values())

    # ------------------------------------------------------------------ writing
    def put(self, key, value, size: int | None = None) -> None:
        """Keep ``value`` under ``key`` (``size``: its bytes, by default its ``nbytes``); the oldest
        entries go beyond the bounds."""
        if size is None:
            size = int(getattr(value, "nbytes", 0))
        with self._lock:  # ``put_many`` of one entry, spelled out: a store per node computed op by op
            if _stale(self.cleared_at):
                return
            self._store(key, value, size)
            if ((self.max_entries is not None and len(self._data) > self.max_entries)
                    or (self.max_bytes is not None and self._bytes > self.max_bytes)):
                self._shrink()

    def put_many(self, entries) -> None:
        """Keep each ``(key, value, size)`` of ``entries``, in order, under one lock."""
        with self._lock:
            if _stale(self.cleared_at):
                return
            for key, value, size in entries:
                self._store(key, value, size)
            self._shrink()

    def setdefault(self, key, value, size: int = 0):
        """The value under ``key`` when there is one, else ``value``, stored (of threads racing
        on a miss, the first stored wins)."""
        with self._lock:
            found = self._data.get(key, _MISSING)
            if found is not _MISSING:
                if self.lru:
                    self._data.move_to_end(key)
                return found
            if _stale(self.cleared_at):
                return value
            self._store(key, value, size)
            self._shrink()
            return value

    def replace(self, key, value, size: int = 0) -> bool:
        """Store ``value`` under ``key`` only where ``key`` is still held (a pending entry made
        ready); whether it was."""
        with self._lock:
            if key not in self._data or _stale(self.cleared_at):
                return False
            self._store(key, value, size)
            return True

    def pop(self, key, default=None):
        with self._lock:
            self._bytes -= self._sizes.pop(key, 0)
            return self._data.pop(key, default)

    def pop_if(self, key, test) -> None:
        """Remove the entry under ``key`` when ``test(value)`` holds."""
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is not _MISSING and test(value):
                self._bytes -= self._sizes.pop(key, 0)
                del self._data[key]

    def _store(self, key, value, size: int) -> None:
        if self.max_bytes is not None and size > self.max_bytes:
            return  # larger than the whole budget: not kept
        data = self._data
        old = self._sizes.pop(key, None)
        if old is not None:
            self._bytes -= old
        if key in data:
            data.move_to_end(key)
        data[key] = value
        if size:
            self._sizes[key] = size
            self._bytes += size
        self.stores += 1

    def _shrink(self) -> None:
        data, sizes = self._data, self._sizes
        most_entries, most_bytes = self.max_entries, self.max_bytes
        while data and ((most_entries is not None and len(data) > most_entries)
                        or (most_bytes is not None and self._bytes > most_bytes)):
            old, _ = data.popitem(last=False)
            self._bytes -= sizes.pop(old, 0)
            self.evictions += 1

    # ------------------------------------------------------------------ controls
    def set_bounds(self, *, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        """New bounds (None leaves one as it is); the oldest entries go at once beyond them."""
        with self._lock:
            if max_entries is not None:
                self.max_entries = max_entries
            if max_bytes is not None:
                self.max_bytes = max_bytes
            self._shrink()

    def clear(self) -> None:
        """Forget every entry (the counters keep counting); a background thread working for an
        earlier epoch stores nothing here from now on."""
        with self._lock:
            self.cleared_at = _new_epoch()
            self._data.clear()
            self._sizes.clear()
            self._bytes = 0

    def info(self) -> dict:
        with self._lock:
            return {"entries": len(self._data), "bytes": self._bytes, "hits": self.hits, "misses": self.misses,
                    "stores": self.stores, "evictions": self.evictions, "max_entries": self.max_entries,
                    "max_bytes": self.max_bytes}

    def __repr__(self):
        return f"<BoundedCache {self.name!r}: {len(self._data)} entries, {self._bytes} bytes>"


_MISSING = object()


class WeakCaches:
    """The caches of live objects of one kind (each with ``info()`` giving ``entries`` and
    ``bytes``, and ``clear()``), registered as one: ``entries`` sums theirs."""

    def __init__(self, name: str, kind: str):
        self._members: weakref.WeakSet = weakref.WeakSet()
        register(name, kind, self)

    def add(self, member) -> None:
        self._members.add(member)

    def members(self) -> list:
        return list(self._members)

    def info(self) -> dict:
        infos = [m.info() for m in self.members()]
        return {"objects": len(infos), "entries": sum(i["entries"] for i in infos),
                "bytes": sum(i.get("bytes", 0) for i in infos)}

    def clear(self) -> None:
        for member in self.members():
            member.clear()


class FunctionCache:
    """A ``functools.lru_cache``-wrapped function of pure plans (no tensor, no identity: its
    entries can be recomputed at any time), registered."""

    def __init__(self, name: str, kind: str, function):
        self.function = function
        register(name, kind, self)

    def info(self) -> dict:
        found = self.function.cache_info()
        return {"entries": found.currsize, "hits": found.hits, "misses": found.misses,
                "max_entries": found.maxsize}

    def clear(self) -> None:
        self.function.cache_clear()
