"""XLA compilations: ``counted_jit`` is ``jax.jit`` with every trace counted (a trace is a
compilation for XLA), JAX's persistent cache switched on first (``circuits.backend.cache.persistent``).

The counts are ``cache_stats()``'s ``compilations`` (whole programs), ``kernel_compilations``
(the op-by-op tier's kernels), and the background's own (``group_compilations``,
``kept_compilations``).

``work_here()`` counts, for the calling thread alone, what JAX reported doing (``jax.monitoring``):
XLA compilations and their seconds (tracing and lowering included), executables read from a
disk cache (JAX's, or a kept kernel's: ``note_loaded``), and kernels found made already
(``note_reused``): what ``last_run()`` reports of one call.

>>> double = counted_jit(lambda x: x * 2, 'doc_compilations')
>>> before = compile_counts()['doc_compilations']
>>> float(double(1.0)), compile_counts()['doc_compilations'] - before
(2.0, 1)
"""

from __future__ import annotations

import collections
import sys
import threading
from typing import Callable

from .persistent import ensure_persistent_cache

__all__ = ["counted_jit", "compile_counts", "work_here", "compile_seconds", "note_loaded", "note_reused", "Work",
           "calling"]

_lock = threading.Lock()
_counts = collections.Counter()  # traces, by counter name


class Work:
    """What one thread had JAX do so far: ``compiled`` (XLA compilations), ``loaded`` (executables
    read from disk), ``reused`` (kernels found made), ``seconds`` (tracing, lowering, compiling)."""

    __slots__ = ("compiled", "loaded", "reused", "seconds", "call")

    def __init__(self):
        self.compiled = self.loaded = self.reused = 0
        self.seconds = 0.0
        self.call = None  # the notices of the call running in this thread (``calling``)

    def snapshot(self) -> tuple:
        return self.compiled, self.loaded, self.reused, self.seconds


_here = threading.local()
_listening: list = []
_COMPILE = "/jax/core/compile/backend_compile_duration"
_PARTS = frozenset({_COMPILE, "/jax/core/compile/jaxpr_trace_duration",
                    "/jax/core/compile/jaxpr_to_mlir_module_duration"})
_HIT = "/jax/compilation_cache/cache_hits"


def _work() -> Work:
    work = getattr(_here, "work", None)
    if work is None:
        work = _here.work = Work()
    return work


def _on_duration(event, duration, **_):
    if event in _PARTS:
        work = _work()
        work.seconds += duration
        if event == _COMPILE:
            work.compiled += 1


def _on_event(event, **_):
    if event == _HIT:
        _work().loaded += 1


def _listen() -> None:
    """Register the listeners once (JAX keeps them for the process)."""
    if not _listening:
        with _lock:
            if not _listening:
                import jax

                jax.monitoring.register_event_duration_secs_listener(_on_duration)
                jax.monitoring.register_event_listener(_on_event)
                _listening.append(True)


# A call (``tiers.run``) in this thread that compiles a whole program for long says so once.
NOTICE_AFTER = 1.0


class calling:
    """Marks a call running in this thread (``tiers.run``): a whole program it compiles says so
    after ``NOTICE_AFTER`` seconds (``progress.notice_after``, where progress bars are shown),
    once per call; the notice is cancelled when the call ends."""

    def __enter__(self):
        work = _work()
        self.outer, work.call = work.call, []
        return self

    def __exit__(self, *exc):
        work = _work()
        for notice in work.call:
            notice.cancel()
        work.call = self.outer


def _announce(message: str) -> None:
    work = _work()
    call = getattr(work, "call", None)
    if call is not None and not call:
        from ...progress import notice_after

        call.append(notice_after(NOTICE_AFTER, message))


def work_here() -> tuple:
    """``(compiled, loaded, reused, seconds)`` of the calling thread so far (see ``Work``).

    >>> before = work_here()
    >>> _ = counted_jit(lambda x: x - 3, 'doc_compilations')(1.0)
    >>> work_here()[0] - before[0]
    1
    """
    if "jax" in sys.modules:  # a process that has not imported JAX has compiled nothing yet
        _listen()              # (counted_jit listens before its first compilation)
    return _work().snapshot()


def compile_seconds() -> float:
    """Seconds the calling thread has spent tracing, lowering and compiling for XLA so far: the
    one-off part of a step, which a progress bar leaves out of its estimate.

    >>> compile_seconds() >= 0.0
    True
    """
    return work_here()[3]


def note_loaded() -> None:
    """Count an executable this thread read from the kept kernels' disk cache."""
    _work().loaded += 1


def note_reused() -> None:
    """Count a kernel this thread found made already."""
    _work().reused += 1


def counted_jit(fn: Callable, counter: str, name: str | None = None) -> Callable:
    """``jax.jit(fn)``, every trace counted under ``counter``; ``name``: the compiled module's
    (``circuits.backend.cache.executables`` names each kept kernel's own)."""
    import jax

    ensure_persistent_cache()
    _listen()

    def traced(*args):
        with _lock:
            _counts[counter] += 1
        if counter == "compilations":
            _announce("circuits: compiling the whole program…")
        return fn(*args)

    if name is not None:
        traced.__name__ = traced.__qualname__ = name
    return jax.jit(traced)


def compile_counts() -> collections.Counter:
    """The traces counted so far, by counter name (a copy)."""
    with _lock:
        return collections.Counter(_counts)
