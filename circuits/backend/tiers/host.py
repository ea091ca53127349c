"""The first run of a node on the CPU with numpy, its JAX kernel made in the background.

A machine that has compiled nothing yet (a new install, a new library version, a new cluster
node) would otherwise wait for XLA to compile every kernel a first evaluation meets (about 40 on
the shipped model, 3 s; and JAX's own import, 1.5-2.5 s).  In ``mode='auto'`` the op-by-op tier
computes a node whose JAX kernel is not in memory with numpy instead
(``circuits.backend.lower.numpy_ops``: no trace, no XLA compilation, and no ``import jax`` for a
circuit whose every node has a numpy path), and queues the kernel: one background thread, below
the caller's priority, makes the queued kernels in pauses between evaluations (compiling them, or
loading them from the disk cache where an earlier process kept them), so that a later call runs
them.  A kernel on disk is not loaded in the call either: loading needs JAX imported, which costs
a fresh process more than numpy's first run.  A node without a numpy path (a function a user
registered with JAX alone) runs its JAX kernel as before.

Gradients do the same for their backward steps: a vector-Jacobian product whose kernel is not
made yet runs with numpy (``circuits.backend.lower.numpy_vjp``), its kernel queued
(``queue_call``), so a first attribution or EAP compiles nothing either.

Values computed by numpy go into the same value cache, in the dtype JAX computes them in, and
later JAX kernels read them.  The tiers agree to float rounding (numpy float32 against XLA
float32); ``mode='numpy'`` pins numpy for every node that has a numpy path (for comparing the
tiers), ``'ops'`` pins JAX's kernels, and ``last_run()['numpy']`` says how many nodes a call
computed with numpy.  ``tiers.configure(host=False)`` switches the numpy first run off.

>>> import numpy as np
>>> from circuits import Symbol, GeneralFunction
>>> from circuits.backend import evaluate
>>> from circuits.backend.tiers import last_run
>>> y = GeneralFunction('tanh', Symbol((2,), name='x_host'))
>>> evaluate(y, {'x_host': np.zeros(2)}, mode='numpy'), last_run()['numpy']
(array([0., 0.], dtype=float32), 1)
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import sys
import threading
import time

import numpy as np

from ...nodes import Scalar, SetSymbolicShape, Tag
from ..cache.background import AGAIN, in_background
from ..cache.bounded import current_epoch, working_for
from ..lower.numpy_ops import canonical, host_dtypes, numpy_op

__all__ = ["host_mode", "steps_as", "leaf_on_host", "queue_kernel", "queue_call", "being_made", "wait_for_kernels", "host_info", "QUEUE_SIZE"]

_IDENTITY = (Tag, SetSymbolicShape)


def host_mode(mode: str, fdt: str, inputs=None, return_jax: bool = False) -> str | None:
    """How an op-by-op run in ``mode`` uses numpy: ``'pin'`` (``mode='numpy'``: every node that
    has a numpy path), ``'auto'`` (a node whose kernel is not made yet), or None (never).
    ``'auto'`` is None where a JAX accelerator is in use (its kernels are worth the wait), and
    where the caller works on the device: inputs that are JAX arrays, or ``return_jax=True``
    (nothing crosses between host and device that the caller did not ask for)."""
    from .policy import on_accelerator, settings

    if not host_dtypes(fdt):
        return None
    if mode == "ops":  # a library call's own op-by-op step, within a caller's tier (``steps_as``)
        mode = getattr(_steps, "mode", None) or mode
    if mode == "numpy":
        return "pin"
    if mode != "auto" or return_jax or not settings().host or on_accelerator() or _on_device(inputs):
        return None
    return "auto"


_steps = threading.local()


@contextlib.contextmanager
def steps_as(mode: str):
    """Within the block, a ``mode='ops'`` call on this thread computes with numpy where ``mode``
    would (``'auto'``: a node whose kernel is not made yet; ``'numpy'``: every node that can):
    for a method that runs its steps op by op (``'ops'``: no whole program tracked for them) on
    behalf of a caller's ``mode``.

    >>> from circuits import Symbol, GeneralFunction
    >>> from circuits.backend import evaluate
    >>> from circuits.backend.tiers import last_run
    >>> with steps_as('numpy'):
    ...     _ = evaluate(GeneralFunction('sin', Symbol((2,), name='x_steps')), {'x_steps': np.ones(2)}, mode='ops')
    >>> last_run()['numpy']
    1
    """
    before = getattr(_steps, "mode", None)
    _steps.mode = mode if mode in ("auto", "numpy") else None
    try:
        yield
    finally:
        _steps.mode = before


def _on_device(inputs) -> bool:
    """Whether a value of ``inputs`` is a JAX array."""
    jax = sys.modules.get("jax")
    if not inputs or jax is None or not hasattr(jax, "Array"):
        return False
    try:
        return any(isinstance(v, jax.Array) for v in inputs.values())
    except AttributeError:  # not a mapping: binding reports it
        return False


def leaf_on_host(node, fdt: str, problems: list):
    """An Array's or Scalar's value as numpy, in the dtype JAX computes it in (read-only)."""
    target = canonical(node.dtype, fdt)
    if type(node) is Scalar:
        value = np.broadcast_to(np.asarray(node.value, dtype=target), node.shape)
    else:
        host = node.value
        if host is None:
            problems.append(
                f"placeholder Array {node.line()} has no value: give it one with "
                "circuits.bind(circuit, {name: array}) or circuits.fill_random(circuit, seed)")
            return None
        value = np.asarray(host)
        if value.dtype != target:
            value = value.astype(target)
    if value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def host_op(node, fdt: str, axes):
    """The numpy op of ``node`` (None: it has none)."""
    if type(node) in _IDENTITY:
        return None
    return numpy_op(node, fdt, axes)


# ---------------------------------------------------------------------------- kernels made aside
_lock = threading.Lock()
_queue: collections.deque = collections.deque()
_queued: set = set()  # kernel keys queued or being made
_worker: list = [None]
_counts = collections.Counter()
_closing = [False, False]
#: Nodes waiting for their kernels, at most (each holds its node until its kernel is made).
QUEUE_SIZE = 1024


def queue_kernel(node, fdt: str, run, kernel_keys: list, specs: list) -> None:
    """Queue the making of ``node``'s kernels (``kernel_keys``, as ``tiers.kernels`` names them)
    for its children's values of ``specs`` (``[(shape, dtype)]``), in the caller's precision:
    ``run(env)`` computes ``node`` through them from its children's values in ``env``."""

    def job():
        env = {c.hash: np.zeros(shape, dtype) for c, (shape, dtype) in zip(node.children, specs)}
        run(env)
        return env[node.hash]

    queue_call(kernel_keys, fdt, job)


def queue_call(kernel_keys: list, fdt: str, job) -> None:
    """Queue the making of the kernels ``kernel_keys`` (as ``tiers.kernels`` names them), in the
    caller's precision: ``job()`` runs them once (on zeros) and returns a value to wait for."""
    with _lock:
        if _closing[0] or all(k in _queued for k in kernel_keys):
            return
        _queued.update(kernel_keys)
        jax = sys.modules.get("jax")
        matmul = jax.config.jax_default_matmul_precision if jax is not None and hasattr(jax, "config") else None
        _queue.append((job, fdt, tuple(kernel_keys), matmul, current_epoch()))
        _counts["queued"] += 1
        while len(_queue) > QUEUE_SIZE:
            dropped = _queue.popleft()
            _queued.difference_update(dropped[2])
        if _worker[0] is None or not _worker[0].is_alive():
            if not _closing[1]:
                atexit.register(_close)  # after background's own: runs before it waits for the threads
                _closing[1] = True
            _worker[0] = in_background(_work, name="circuits-kernels")


def being_made(key) -> bool:
    """Whether the kernel ``key`` is queued or being made in the background (a call that ran it
    now would compile it a second time, on its own thread)."""
    return key in _queued


def _close() -> None:
    """At exit: make nothing more (what is queued is for this process's later calls)."""
    with _lock:
        _closing[0] = True
        _queue.clear()


def _work():
    """Make one queued kernel in a pause between evaluations (the background thread, below the
    caller's priority: ``in_background``); ``AGAIN`` while more are queued, so the thread takes
    its other jobs in between."""
    from . import groups

    with _lock:
        if not _queue or _closing[0]:
            _worker[0] = None
            return None
        job = None if groups.busy() else _queue.popleft()
    if job is None:
        time.sleep(min(groups.IDLE / 5, 0.05))
        return AGAIN
    try:
        _make(*job)
    finally:
        with _lock:
            _queued.difference_update(job[2])
    return AGAIN


def _make(job, fdt, kernel_keys, matmul, epoch) -> None:
    """Make (compile, or load from disk) the kernels ``kernel_keys`` by running ``job`` (them, once, on zeros)."""
    import jax

    from ..lower.binding import precision
    from .kernels import made

    if all(made(k) for k in kernel_keys):
        return
    try:
        with working_for(epoch), precision(fdt), jax.default_matmul_precision(matmul):
            value = job()
            for leaf in jax.tree_util.tree_leaves(value):
                if hasattr(leaf, "block_until_ready"):
                    leaf.block_until_ready()
        _counts["made"] += 1
    except Exception:  # noqa: BLE001 - a kernel that does not compile is compiled (and its error
        _counts["failed"] += 1  # raised) by the call that needs it, on its own thread


def wait_for_kernels() -> None:
    """Wait until the queued kernels are made (tests, benchmarks): every pause is taken."""
    while True:
        w = _worker[0]
        if w is None or w is threading.current_thread():
            return
        w.join()


def host_info() -> dict:
    """``queued`` kernels so far, ``made`` and ``failed`` in the background, ``waiting`` now."""
    with _lock:
        waiting = len(_queue)
    return {"queued": _counts["queued"], "made": _counts["made"], "failed": _counts["failed"], "waiting": waiting}
