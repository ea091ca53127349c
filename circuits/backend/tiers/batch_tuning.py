"""Measured chunk sizes for ``evaluate_batched``: the rows a chunk holds are chosen by timing the
compiled program on the dataset's own rows, not guessed from a cost model.

Why: how many rows one ``vmap`` call should hold depends on the machine (caches, cores, a GPU's
width) as much as on the program: on the project's 2-core CPU the seed's loss ran 32 rows in
chunks of 1-4 rows up to twice as fast as in chunks of 2 picked by the memory model
(BENCHMARKS.md, issue 24), and the best size changes when the backend fuses the loss.

How: when ``evaluate_batched`` gets neither ``batch_size`` nor ``memory_budget``, the candidate
sizes are 1, 2, 4, ... up to the memory plan's chunk (the cost model's bound stays the cap, so
a measured size never runs out of memory) and the dataset's size.  Each is called once at its
size to compile (those rows are real work, kept), then timed on the next rows; the search stops
at the first size more than ``WORSE`` slower per row than the best so far, or at the cap.  (A
chunk run as a map of small vmaps on the CPU is not measured: ``evaluate_batched`` runs the
cap.)  What
was measured is kept per program, batch axes, cap and backend, so later calls go on where the
last one stopped (a 16-row dataset measures sizes 1-4 in its first call, 8 in its second, ...)
and then use the best size at once.  Small work (``TUNE_FROM_BYTES``) runs as the plan says.

>>> candidates(16), candidates(12), candidates(1)
([1, 2, 4, 8, 16], [1, 2, 4, 8, 12], [1])
"""

from __future__ import annotations

import time
from typing import Callable

from ..cache.bounded import BoundedCache

__all__ = ["tune_chunk", "tail_sizes", "candidates", "tuned_chunks", "forget_tuning", "WORSE", "TUNE_FROM_BYTES"]

#: A chunk size more than this factor slower per row than the best one measured ends the search.
WORSE = 1.10
#: Datasets whose rows' temporaries (cost model) total less than this run as the plan says.
TUNE_FROM_BYTES = 64 << 20

# key -> {"per_row": {size: seconds}, "warm": set(sizes), "done": bool}
_state = BoundedCache("chunk tuning", "compiled", max_entries=256, lru=False)


def candidates(cap: int) -> list[int]:
    """Powers of two below ``cap``, then ``cap``."""
    out, c = [], 1
    while c < cap:
        out.append(c)
        c *= 2
    return out + [max(1, cap)]


def tuned_chunks() -> dict:
    """What has been measured: ``{key: {size: seconds per row}}`` (a copy)."""
    return {k: dict(_state.peek(k, {"per_row": {}})["per_row"]) for k in _state.keys()}


def forget_tuning() -> None:
    """Drop every measurement (the next batched evaluations measure again)."""
    _state.clear()


def _block(piece) -> None:
    import jax

    jax.block_until_ready(piece)


def tune_chunk(key, total: int, cap: int, row_bytes: int,
               run_chunk: Callable[[int, int], list]) -> tuple[int, int, str | None, set]:
    """``(start, chunk, reason, compiled)``: rows ``[0, start)`` are already evaluated (``run_chunk(start,
    size)`` evaluates ``size`` rows from ``start`` and returns the chunk's outputs), the rest
    should run ``chunk`` rows at a time; ``reason`` says why in words (None: the plan's ``cap``
    stands, nothing was measured), ``compiled`` the sizes already compiled (for the tail: see
    ``tail_sizes``).  ``key`` names the program, batch axes and backend."""
    cap = max(1, min(cap, total))
    if cap == 1 or row_bytes * total < TUNE_FROM_BYTES:
        return 0, cap, None, set()
    key = (key, cap)
    state = _state.get(key)
    if state is None:
        state = _state.setdefault(key, {"per_row": {}, "warm": set(), "done": False})
    per_row, warm = state["per_row"], state["warm"]
    start = 0
    for size in candidates(cap):
        if state["done"] or start >= total:
            break
        if size in per_row:
            continue
        if size > total - start:
            break
        if size not in warm:  # its first call compiles: real rows, not timed
            _block(run_chunk(start, size))
            warm.add(size)
            start += size
            if size > total - start:
                break
        t = time.perf_counter()
        _block(run_chunk(start, size))
        per_row[size] = (time.perf_counter() - t) / size
        start += size
        if per_row[size] > WORSE * min(per_row.values()):
            state["done"] = True
    else:
        state["done"] = True
    if not per_row:
        chunk = min(warm, default=1)
        return start, chunk, f"{chunk} rows a chunk while measuring (memory cap {cap})", set(warm)
    chunk = min(per_row, key=per_row.get)
    shown = ", ".join(f"{s}: {t * 1e3:.1f} ms" for s, t in sorted(per_row.items()))
    more = "" if state["done"] else " (more sizes to measure on later calls)"
    return start, chunk, f"{chunk} rows a chunk, measured per row {shown}{more}; memory cap {cap} rows", set(warm)


def tail_sizes(remaining: int, chunk: int, warm_sizes) -> list[int]:
    """Chunk sizes covering ``remaining`` rows: ``chunk`` while it fits, then compiled sizes
    that fit (so the tail is not padded to a whole chunk), padding only the last.

    >>> tail_sizes(10, 4, {1, 2, 4})
    [4, 4, 2]
    >>> tail_sizes(3, 4, {4})
    [4]
    """
    out = []
    while remaining > 0:
        if remaining >= chunk:
            out.append(chunk)
            remaining -= chunk
            continue
        fit = [s for s in warm_sizes if s <= remaining]
        size = max(fit) if fit else chunk
        out.append(size)
        remaining -= size
    return out

