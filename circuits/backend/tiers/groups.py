"""Fused groups in the op-by-op tier: a run of small kernels becomes one compiled call.

Op by op, each node costs a kernel call (tens of microseconds on the CPU, launches on a GPU) that
its arithmetic rarely needs: on the shipped model a whole forward compiled is 0.4 ms, op by op
10 ms.  So the nodes an evaluation computes are split into *groups*: a node whose value only one
other computed node reads joins that node's group, so each group is a tree of nodes under the one
whose value leaves it (a layer's heads with their sum, a layer norm's tail, the loss's chain).  A
group's kernel is keyed by its structure (its members' operations and shapes, and their wiring),
not by the nodes, so the groups of a clean run come back in every variant that recomputes them: a
layer-0 ablation recomputes layer 1 and the unembedding through the groups the clean run made.

A group's kernel returns every member's value (the value cache keeps them all, as op by op).  The
first time its structure is met, that run goes on op by op and the group is queued; a background
thread compiles it at a lower priority in the first pause between evaluations (``IDLE``), and once
ready it is used.  Nodes computed from weights alone and int-valued nodes are never members (see
``plan``).  The tiers agree to float rounding (a fused kernel may round
differently); ``mode='ops'`` never uses groups.  ``tiers.configure(groups=False)`` switches them
off.

>>> import numpy as np
>>> from circuits import Symbol, GeneralFunction
>>> from circuits.traversal import toposort
>>> x = Symbol((3,), name='x')
>>> y = GeneralFunction('exp', GeneralFunction('sin', GeneralFunction('tanh', x)))
>>> [len(members) for members, _, _ in plan(toposort(y)[1:], {y.hash})]
[3]
"""

from __future__ import annotations

import atexit
import collections
import threading
import time
from typing import Sequence

from ...dtypes import FLOAT_DTYPES
from ...nodes import Array, Circuit, Scalar, SetSymbolicShape, Tag
from ..cache.background import AGAIN, in_background
from ..cache.bounded import BoundedCache, current_epoch, working_for
from ..cache.compiling import counted_jit
from ..cache.executables import kept
from ..lower.binding import precision
from ..lower.ops import build_op
from ..lower.program import kernel_part

__all__ = ["plan", "group_kernel", "group_info", "wait_for_groups", "MIN_MEMBERS"]

# A group of fewer members runs op by op (one call saved is not worth a compilation).
MIN_MEMBERS = 3
# Groups larger than this are split (XLA's compile time grows with size; a tree this big is
# rarely met twice).
MAX_MEMBERS = 256

_IDENTITY = (Tag, SetSymbolicShape)
_CONSTANT_LEAVES = (Array, Scalar)  # a Symbol is an input: what it is bound to changes


def plan(todo: Sequence[Circuit], roots: set) -> list:
    """The groups of ``todo`` (the nodes an evaluation computes, children before parents):
    ``[(members, inputs, key)]`` in an order that runs (each group after those it reads), members
    in ``todo`` order, ``inputs`` the nodes outside the group its members read (in the order first
    read), ``key`` its structure (``None`` for a group under ``MIN_MEMBERS``, which runs op by op).

    A node joins the group of the one computed node that reads it; a node read by several, or by
    none, or in ``roots``, closes a group.  Nodes computed from weights alone (float Arrays and
    Scalars: a weight's slice for one head, a head-size constant, a mask) and int-valued nodes
    (the true tokens' index) stay on their own: a variant finds them cached, so in a group they
    would make the clean run's group another structure than the variant's.  Int Arrays (tokens)
    and Symbols are inputs, not weights."""
    n = len(todo)
    pos = {node.hash: i for i, node in enumerate(todo)}
    consumer = [None] * n  # the index of the one node reading it; -1: several
    constant = [False] * n
    alone = [False] * n
    kid_pos = []
    floats = FLOAT_DTYPES
    for i, node in enumerate(todo):
        kids = node.children
        ks = [pos.get(c.hash) for c in kids]
        kid_pos.append(ks)
        for p in ks:
            if p is not None:
                prev = consumer[p]
                if prev is None:
                    consumer[p] = i
                elif prev != i:
                    consumer[p] = -1
        if node.dtype not in floats:
            alone[i] = True
            continue
        for c, p in zip(kids, ks):
            if not (constant[p] if p is not None else
                    not c.children and type(c) in _CONSTANT_LEAVES and c.dtype in floats):
                break
        else:
            constant[i] = alone[i] = True
    group = list(range(n))
    size = [1] * n
    for i in range(n - 1, -1, -1):
        c = consumer[i]
        if c is not None and c >= 0 and not alone[i] and size[group[c]] < MAX_MEMBERS \
                and todo[i].hash not in roots:
            g = group[i] = group[c]
            size[g] += 1
    members: dict = {}
    for i in range(n):
        g = group[i]
        found = members.get(g)
        if found is None:
            members[g] = [i]
        else:
            found.append(i)
    out = []
    for root in sorted(members):
        idx = members[root]
        nodes = [todo[i] for i in idx]
        if len(idx) < MIN_MEMBERS:
            out.append((nodes, None, None))
            continue
        slot: dict = {}  # todo index -> member slot
        inputs: list = []
        in_slot: dict = {}
        parts = []
        for j, i in enumerate(idx):
            node = todo[i]
            wires = []
            for c, p in zip(node.children, kid_pos[i]):
                if p is not None and group[p] == root:
                    wires.append(slot[p])
                else:
                    s = in_slot.get(c.hash)
                    if s is None:
                        s = in_slot[c.hash] = -1 - len(inputs)
                        inputs.append(c)
                    wires.append(s)
            slot[i] = j
            parts.append((_part(node), tuple(wires)))
        out.append((nodes, inputs, (tuple(parts), tuple(c.dtype for c in inputs))))
    return out


def _part(node: Circuit):
    """A member's operation and shapes: its op kernel's key part (``program.kernel_part``)."""
    if type(node) in _IDENTITY:
        return ("identity", node.shape)
    return kernel_part(node)


def _group_op(members: Sequence[Circuit], wiring: Sequence[tuple], fdt: str):
    """The function computing every member's value from the inputs' (traceable)."""
    ops = [(lambda v: v) if type(m) in _IDENTITY else build_op(m, fdt) for m in members]
    steps = list(zip(ops, wiring))

    def run(*inputs):
        values = []
        for op, wires in steps:
            values.append(op(*[values[w] if w >= 0 else inputs[-1 - w] for w in wires]))
        return tuple(values)

    return run


# ---------------------------------------------------------------------------- kernels, compiled aside
_lock = threading.Lock()  # the queue, the worker and the counts
# (key, context) -> its compiled kernel | "pending" | False (failed); the oldest first out
_kernels = BoundedCache("fused groups", "kernels", max_entries=4096, lru=False)
_queue: collections.deque = collections.deque()
_worker: list = [None]
_counts = collections.Counter()
QUEUE_SIZE = 64  # groups waiting to be compiled, at most (each holds its inputs' values)


class _Pending:
    """A group queued for compilation (one marker per queuing: of threads meeting a group at once,
    the one whose marker is stored queues it)."""

    __slots__ = ()

    def __str__(self):
        return "pending"


_closing = [False, False]  # the process is exiting; the exit handler is registered


def group_kernel(key, context, members, fdt, inputs):
    """The compiled kernel of the group ``key`` in ``context`` (the float dtype and matmul
    precision) when it is ready, else None; the first time, its compilation is queued with
    ``inputs`` (device values of the group's inputs: they shape it)."""
    k = (key, context)
    found = _kernels.get(k)
    if found is not None:
        if found is False or type(found) is _Pending:  # failed, or queued
            return None
        _counts["hits"] += 1
        return found
    marker = _Pending()
    if _kernels.setdefault(k, marker) is not marker:
        return None  # another thread met it first
    with _lock:
        wiring = [w for _, w in key[0]]
        _queue.append((k, members, wiring, fdt, context, list(inputs), current_epoch()))
        _counts["queued"] += 1
        while len(_queue) > QUEUE_SIZE:  # never a pause: the oldest waits no longer (met again, it is queued again)
            dropped = _queue.popleft()
            _kernels.pop_if(dropped[0], lambda v: type(v) is _Pending)
        if _worker[0] is None or not _worker[0].is_alive():
            if not _closing[1]:
                atexit.register(_close)  # after background's own: runs before it waits for the threads
                _closing[1] = True
            _worker[0] = in_background(_work, name="circuits-groups")
    return None


def _close() -> None:
    """At exit: compile nothing more (what is queued is for this process only)."""
    with _lock:
        _closing[0] = True
        _queue.clear()


# The worker compiles when no evaluation has run for IDLE seconds (a notebook's pauses, a model
# being loaded), so that it does not slow the evaluations it is meant to speed up.
IDLE = 0.25
_active = [0, 0.0]  # evaluations running op by op now; when the last one ended


class foreground:
    """Marks an op-by-op evaluation running (the worker waits for a pause).

    >>> with foreground():
    ...     _active[0]
    1
    """

    def __enter__(self):
        with _lock:
            _active[0] += 1

    def __exit__(self, *exc):
        with _lock:
            _active[0] -= 1
            _active[1] = time.monotonic()


def busy() -> bool:
    """Whether an op-by-op evaluation runs now or ended less than ``IDLE`` seconds ago (work
    in the background waits for a pause)."""
    return _active[0] > 0 or time.monotonic() - _active[1] < IDLE


def wait_for_pause() -> None:
    """Return once no op-by-op evaluation has run for ``IDLE`` seconds."""
    while busy():
        time.sleep(min(IDLE / 5, 0.05))


def _work():
    """Compile one queued group in a pause between evaluations (the background thread, below
    the caller's priority); ``AGAIN`` while more are queued, so the thread takes its other jobs
    in between."""
    with _lock:
        if not _queue or _closing[0]:
            _worker[0] = None
            return None
        busy = _active[0] > 0 or time.monotonic() - _active[1] < IDLE
        job = None if busy else _queue.popleft()
    if job is None:
        time.sleep(min(IDLE / 5, 0.05))
    else:
        _compile(*job)
    return AGAIN


def _compile(k, members, wiring, fdt, context, inputs, epoch) -> None:
    import jax

    if k not in _kernels:  # forgotten meanwhile (clear_cache)
        return
    try:
        op = _group_op(members, wiring, fdt)
        fn = kept(("group",) + k[0], op, counted_jit(op, "group_compilations"))
        with precision(fdt), jax.default_matmul_precision(context[1]):
            for v in fn(*inputs):
                v.block_until_ready()
        result = fn
        _counts["compiled"] += 1
    except Exception:  # noqa: BLE001 - a group that does not compile stays op by op, where
        result = False  # the same error (if it is the circuit's) reaches the caller
        _counts["failed"] += 1
    with working_for(epoch):  # not put back after a clear_cache since it was queued
        _kernels.replace(k, result)


def wait_for_groups() -> None:
    """Wait until the queued groups are compiled (tests, benchmarks)."""
    w = _worker[0]
    if w is not None and w is not threading.current_thread():
        w.join()


def group_info() -> dict:
    """``groups`` known, ``ready``, ``queued`` and ``compiled`` so far, ``hits``."""
    states = collections.Counter("ready" if callable(v) else str(v) for v in _kernels.values())
    return {"groups": len(_kernels), "ready": states["ready"], "queued": _counts["queued"],
            "compiled": _counts["compiled"], "failed": _counts["failed"], "hits": _counts["hits"]}
