"""Work the backend does in the background: whole programs compiling, fused groups, kernels kept
on disk, the warm-up after a new process's first evaluation -- all of it in one thread.

``in_background(fn, name)`` queues ``fn()`` for the one background thread, which runs the jobs
one at a time in the order they were asked for, each for the cache epoch it was asked in
(``circuits.backend.cache.bounded``: what it computes after a ``clear_cache`` is not put back),
below the caller's priority where the system allows it (``os.setpriority``): a caller's kernels
wait behind at most one background compilation, never behind several side by side (on a
2-core machine under load they did: a new ablation took 15x a torch forward).  A job that
returns ``AGAIN`` is queued again at the back (long work done in steps: the fused groups'
compilations, the kernels kept on disk), so no kind of work holds the thread while another
waits.  ``wait_for_background()`` waits until the queue is empty (tests, benchmarks),
``wait_for(name)`` for the jobs of one name, moving them to the front of the queue (an
op-by-op run waits for the warm-up instead of computing the same values beside it).

At the interpreter's exit nothing new starts (``exiting()``), queued jobs are dropped, and only
the job in flight is waited for: a compilation torn down inside XLA aborts the process, but a
process never waits for queued work nobody will read.

>>> results = []
>>> job = in_background(lambda: results.append(1), name='circuits-doc')
>>> wait_for('circuits-doc'); results, job.is_alive()
([1], False)
"""

from __future__ import annotations

import atexit
import collections
import os
import threading

from .bounded import current_epoch, working_for

__all__ = ["in_background", "wait_for_background", "wait_for", "WARM", "AGAIN", "THREAD", "Job", "exiting"]

#: The name of the jobs warming the op-by-op tier after a new process's first evaluation.
WARM = "circuits-warm"

#: The name of the one background thread.
THREAD = "circuits-background"

#: What a job returns to be queued again, at the back (work done in steps).
AGAIN = object()

_cond = threading.Condition()
_queue: collections.deque = collections.deque()  # jobs waiting for the thread
_state = {"thread": None, "running": None}  # the thread (None when idle: started again on demand), its job
_exiting = [False]


def exiting() -> bool:
    """Whether the interpreter is exiting (background work must start nothing more)."""
    return _exiting[0]


class Job:
    """One piece of background work: ``is_alive()`` while queued or running, ``join(timeout)``
    waits for it (at once from the background thread itself, where waiting would never end)."""

    __slots__ = ("fn", "name", "epoch", "_done")

    def __init__(self, fn, name: str, epoch):
        self.fn, self.name, self.epoch = fn, name, epoch
        self._done = threading.Event()

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> None:
        if not _on_thread():
            self._done.wait(timeout)

    def __repr__(self):
        return f"Job({self.name!r}, {'alive' if self.is_alive() else 'done'})"


def _on_thread() -> bool:
    return threading.current_thread() is _state["thread"]


def _lower_priority() -> None:
    """This thread below the others of the process (Linux: a thread's own nice value)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def _serve() -> None:
    """The background thread: the queued jobs one at a time until none is left (or the
    interpreter exits: the rest are dropped)."""
    _lower_priority()
    while True:
        with _cond:
            if not _queue or _exiting[0]:
                for job in _queue:
                    job._done.set()
                _queue.clear()
                _state["thread"] = None
                _cond.notify_all()
                return
            job = _queue.popleft()
            _state["running"] = job
        again = None
        try:
            with working_for(job.epoch):
                again = job.fn()
        except Exception:  # noqa: BLE001 - a warm-up that fails leaves the caches cold; the
            pass  # evaluation that needs them computes (and raises) in the caller's thread
        with _cond:
            _state["running"] = None
            if again is AGAIN and not _exiting[0]:
                _queue.append(job)
            else:
                job._done.set()
            _cond.notify_all()


def in_background(fn, name: str) -> Job:
    """Queue ``fn()`` for the background thread (started when idle); an error in it is dropped,
    since nothing waits for its result: what it does must be work that a later call redoes
    where it is needed (compiling, warming caches).  ``fn`` may return ``AGAIN`` to run again
    later.  At exit it queues nothing: the job returned is done already."""
    job = Job(fn, name, current_epoch())
    with _cond:
        if _exiting[0]:
            job._done.set()
            return job
        _queue.append(job)
        if _state["thread"] is None:
            thread = threading.Thread(target=_serve, name=THREAD, daemon=True)
            _state["thread"] = thread
            thread.start()
    return job


def _pending(name: str | None = None) -> list:
    """The jobs (of ``name``) queued or running, the running one first."""
    with _cond:
        jobs = ([_state["running"]] if _state["running"] is not None else []) + list(_queue)
    return [j for j in jobs if name is None or j.name == name]


def wait_for(name: str) -> None:
    """Wait for the background jobs called ``name``, moved to the front of the queue (from the
    background thread itself: at once, they run after it)."""
    if _on_thread():
        return
    with _cond:
        mine = [j for j in _queue if j.name == name]
        if mine:
            others = [j for j in _queue if j.name != name]
            _queue.clear()
            _queue.extend(mine + others)
    for job in _pending(name):
        job.join()


def wait_for_background(timeout: float | None = None) -> None:
    """Wait until the background queue is empty, including the work that work queues meanwhile
    (``timeout``: seconds in all)."""
    if _on_thread():
        return
    with _cond:
        _cond.wait_for(lambda: _state["thread"] is None or (not _queue and _state["running"] is None), timeout)


def _at_exit() -> None:
    """Start nothing more, and let what runs finish: a compilation still running when the
    interpreter exits would be torn down inside XLA (an abort, not an exception)."""
    with _cond:
        _exiting[0] = True
        running = _state["running"]
    if running is not None:
        running.join()


atexit.register(_at_exit)
