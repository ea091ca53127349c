"""Work the backend does in background threads: whole programs compiling, fused groups, kernels
kept on disk, the warm-up after a new process's first evaluation.

``in_background(fn, name)`` runs ``fn()`` in a daemon thread that works for the cache epoch it
was started in (``circuits.backend.cache.bounded``: what it computes after a ``clear_cache`` is not
put back), below the caller's priority where the system allows it (``os.setpriority``: the
caller's kernels do not wait behind it); ``wait_for_background()`` waits for every such thread
(tests, benchmarks), ``wait_for(name)`` for those of one name (an op-by-op run waits for the
warm-up instead of computing the same values beside it).

At the interpreter's exit nothing new starts (``exiting()``: queues of background work stop
between jobs) and only the work in flight is waited for: a compilation torn down inside XLA
aborts the process, but a process never waits for queued work nobody will read.

>>> results = []
>>> _ = in_background(lambda: results.append(1), name='circuits-doc')
>>> wait_for('circuits-doc'); results
[1]
"""

from __future__ import annotations

import atexit
import os
import threading

from .bounded import current_epoch, working_for

__all__ = ["in_background", "wait_for_background", "wait_for", "WARM", "exiting"]

#: The name of the thread warming the op-by-op tier after a new process's first evaluation.
WARM = "circuits-warm"

_lock = threading.Lock()
_threads: list = []
_exiting = [False]


def exiting() -> bool:
    """Whether the interpreter is exiting (background work must start nothing more)."""
    return _exiting[0]


def _lower_priority() -> None:
    """This thread below the others of the process (Linux: a thread's own nice value)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def in_background(fn, name: str) -> threading.Thread:
    """Call ``fn()`` in a daemon thread that ``wait_for_background`` waits for; an error in it is
    dropped, since nothing waits for its result: what it does must be work that a later call
    redoes where it is needed (compiling, warming caches).  At exit it starts nothing: the thread
    returned has nothing to do."""
    epoch = current_epoch()
    if _exiting[0]:
        thread = threading.Thread(target=lambda: None, name=name, daemon=True)
        thread.start()
        return thread

    def guarded():
        _lower_priority()
        try:
            with working_for(epoch):
                fn()
        except Exception:  # noqa: BLE001 - a warm-up that fails leaves the caches cold; the
            pass  # evaluation that needs them computes (and raises) in the caller's thread

    thread = threading.Thread(target=guarded, name=name, daemon=True)
    with _lock:
        _threads[:] = [t for t in _threads if t.is_alive()]
        _threads.append(thread)
    thread.start()
    return thread


def _others(name: str | None = None) -> list:
    me = threading.current_thread()
    with _lock:
        return [t for t in _threads if t.is_alive() and t is not me and (name is None or t.name == name)]


def wait_for(name: str) -> None:
    """Wait for the background threads called ``name`` (other than this one)."""
    for thread in _others(name):
        thread.join()


def wait_for_background(timeout: float | None = None) -> None:
    """Wait for the work started in the background, including what that work starts meanwhile
    (``timeout``: seconds per thread, one round only)."""
    while True:
        threads = _others()
        if not threads:
            return
        for thread in threads:
            thread.join(timeout)
        if timeout is not None:
            return


def _at_exit() -> None:
    """Start nothing more, and let what runs finish: a compilation still running when the
    interpreter exits would be torn down inside XLA (an abort, not an exception)."""
    _exiting[0] = True
    wait_for_background()


atexit.register(_at_exit)
