"""Tiered execution: which way ``evaluate`` runs a circuit, and what it reports having done.

- **op by op** (``mode='eager'``, and ``'auto'`` for a structure seen for the first time): through
  kernels cached per (operation, shapes, precision) and over the values already known
  (``circuits.backend.incremental``): a new variant of a known model compiles nothing in the call
  and computes only what its intervention reaches.  In ``'auto'`` the nodes that one other node
  alone reads run with it as one fused kernel per structure, compiled in the background in a pause
  the first time it is met (``circuits.backend.groups``, ``GROUPS``).
- **whole program** (``mode='jit'``, ``compile``, ``evaluate_batched``, ``sweep``; and ``'auto'``
  for a circuit evaluated op by op ``JIT_AFTER`` times already): one XLA program (heads batched,
  everything fused), compiled in a background thread (``BACKGROUND``) while the calls go on op
  by op, and taken as soon as it is ready.  It does not export intermediates to the value cache.
- **cache**: the value asked for is already known (same circuit, same bound values).

The tiers agree to float rounding, not bit for bit: pin one with ``mode=`` for bitwise
reproducibility.  ``last_run()`` says what the latest evaluation in this thread did.

>>> import numpy as np
>>> from circuits import Symbol, GeneralFunction
>>> from circuits.backend import evaluate
>>> y = GeneralFunction('sin', Symbol((2,), name='x_tiers'))
>>> _ = evaluate(y, {'x_tiers': np.ones(2)}); last_run()['tier']
'ops'
>>> _ = evaluate(y, {'x_tiers': np.ones(2)}); last_run()['tier']
'cache'
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import threading

from .runtime import MODES, PINNED_TIER

__all__ = ["JIT_AFTER", "BACKGROUND", "last_run", "record", "whole_program_ready", "note_op_run",
           "in_background", "wait_for_background", "tier_info", "clear_tiers", "pinned", "mark_ready"]

# A circuit evaluated op by op this many times (with other inputs each time) gets its whole
# program compiled; from then on ``mode='auto'`` runs that.
JIT_AFTER = 2
# Compile whole programs in a background thread (the calls go on op by op meanwhile); False
# compiles in the call that reaches ``JIT_AFTER``.
BACKGROUND = True

# Op by op, run the fused groups of ``circuits.backend.groups`` (compiled in the background the
# first time each is met).  The test suite turns this off (a group's compilation would land in
# another test's counts); tests/backend/test_groups.py turns it on.
GROUPS = True

# True until this process's first evaluation ran: that one takes the whole program at once when
# an earlier process compiled it, else runs op by op and compiles it in the background for the
# next process (``circuits.backend.persistent``).  False turns this off (the test suite does, so
# that no test depends on running first in its worker).
COLD_START = True

_ROOTS_SIZE = 256
_roots: collections.OrderedDict = collections.OrderedDict()  # root key -> _Root
_lock = threading.Lock()
_threads: list = []
_local = threading.local()


class _Root:
    __slots__ = ("runs", "state", "result")

    def __init__(self):
        self.runs = 0
        self.state = "counting"  # -> 'compiling' -> 'ready' | 'failed'
        self.result = None


def record(tier: str, computed: int = 0, reused: int = 0) -> None:
    """Note what the latest evaluation in this thread did (``last_run``)."""
    _local.last = {"tier": tier, "computed": computed, "reused": reused}


def last_run() -> dict:
    """What the latest ``evaluate`` (or gradient) in this thread did: ``tier`` (``'ops'``: op by
    op through cached kernels, ``'jit'``: the whole compiled program, ``'cache'``: the value was
    known), ``computed`` (nodes computed op by op) and ``reused`` (cached values read)."""
    return dict(getattr(_local, "last", {"tier": None, "computed": 0, "reused": 0}))


def whole_program_ready(key):
    """What the whole-program compilation for ``key`` (a circuit's hash and the options that
    shape its program) returned, once it is ready; else None."""
    with _lock:
        entry = _roots.get(key)
        if entry is None or entry.state != "ready":
            return None
        return entry.result


def mark_ready(key, result=True) -> None:
    """Note that the whole program for ``key`` is compiled (it ran whole at once)."""
    with _lock:
        entry = _entry(key)
        entry.state, entry.result = "ready", result


def _entry(key) -> _Root:
    """The entry of ``key``, made (and the oldest dropped beyond ``_ROOTS_SIZE``) when there is
    none, as the most recently used; call with ``_lock`` held."""
    entry = _roots.get(key)
    if entry is None:
        entry = _roots[key] = _Root()
        while len(_roots) > _ROOTS_SIZE:
            _roots.popitem(last=False)
    _roots.move_to_end(key)
    return entry


def note_op_run(key, compile_whole, *, now: bool = False) -> None:
    """Count an op-by-op run of the circuit ``key`` names; at ``JIT_AFTER`` runs call
    ``compile_whole()`` (in a background thread when ``BACKGROUND``), which compiles its whole
    program and returns what ``whole_program_ready`` hands out afterwards (None: not compiled);
    ``now=True`` calls it at this run."""
    with _lock:
        entry = _entry(key)
        entry.runs += 1
        if (entry.runs < JIT_AFTER and not now) or entry.state != "counting":
            return
        entry.state = "compiling"
    if BACKGROUND:
        in_background(lambda: _compile(entry, compile_whole), name="circuits-compile")
    else:
        _compile(entry, compile_whole)


def op_tier(key, mode: str, program, by_ops, compile_whole):
    """A caller's own tiered computation (``interp.discover``'s edge scores): ``by_ops()``'s
    result where ``mode`` asks for the op-by-op tier (``'eager'``, or ``'auto'`` until the whole
    program for ``key`` is ready), counting the run so that ``'auto'``'s ``JIT_AFTER``-th one calls
    ``compile_whole()`` in the background when ``program`` is small enough (``JIT_MAX_OPS``, as
    for ``evaluate``); None where the caller should run its whole program (``'jit'``, ready, or
    ``by_ops()`` gave None).

    >>> op_tier(('doc-op-tier',), 'jit', None, lambda: 1, lambda: True) is None
    True
    """
    from .runtime import check_mode, worth_compiling

    mode = check_mode(mode)
    if mode == "jit" or (mode == "auto" and whole_program_ready(key)):
        return None
    result = by_ops()
    if result is None:
        return None
    record("ops")
    if mode == "auto":
        note_op_run(key, lambda: compile_whole() if worth_compiling(program, key) else None)
    return result


def in_background(fn, name: str = "circuits-warm") -> threading.Thread:
    """Call ``fn()`` in a daemon thread that ``wait_for_background`` waits for (and the
    interpreter's exit); an error in it is dropped, since nothing waits for its result: what it
    does must be work that a later call redoes where it is needed (warming caches)."""

    def guarded():
        try:
            fn()
        except Exception:  # noqa: BLE001 - a warm-up that fails leaves the caches cold; the
            pass  # evaluation that needs them computes (and raises) in the caller's thread

    thread = threading.Thread(target=guarded, name=name, daemon=True)
    with _lock:
        _threads[:] = [t for t in _threads if t.is_alive()]
        _threads.append(thread)
    thread.start()
    return thread


def _compile(entry: _Root, compile_whole):
    try:
        result = compile_whole()
        with _lock:
            # None: the program is too large to be worth compiling whole (it stays op by op)
            entry.result, entry.state = result, "ready" if result is not None else "declined"
    except Exception:  # noqa: BLE001 - a compilation that fails leaves the circuit op by op, where
        # the same error (if it is one of the circuit's) is raised to the caller with its context
        with _lock:
            entry.state = "failed"


def wait_for_background(timeout: float | None = None) -> None:
    """Wait for the work started in the background (whole-program compilations, fused groups,
    kernels kept on disk), including what that work starts meanwhile (tests, benchmarks, exit)."""
    while True:
        with _lock:
            threads = [t for t in _threads if t.is_alive() and t is not threading.current_thread()]
        if not threads:
            return
        for t in threads:
            t.join(timeout)
        if timeout is not None:
            return


# A compilation still running when the interpreter exits would be torn down inside XLA (an abort,
# not an exception): let it finish first.
atexit.register(wait_for_background)


def tier_info() -> dict:
    """``tracked`` circuits, and how many have a ``ready`` or ``compiling`` whole program."""
    with _lock:
        states = collections.Counter(e.state for e in _roots.values())
        return {"tracked": len(_roots), "ready": states["ready"], "compiling": states["compiling"]}


def clear_tiers() -> None:
    with _lock:
        _roots.clear()


@contextlib.contextmanager
def pinned(mode: str):
    """Within the block, every ``mode='auto'`` call (``evaluate``, ``grad``, ``evaluate_batched``,
    ``sweep`` and what calls them: ``attribute``, ``patch``...) runs in tier ``mode``
    (``'eager'``: op by op; ``'jit'``: whole programs): for bitwise reproducibility across a
    block of code, and for running a test suite in each tier.

    >>> import numpy as np
    >>> from circuits import Symbol, GeneralFunction
    >>> from circuits.backend import evaluate
    >>> y = GeneralFunction('cos', Symbol((2,), name='x_pinned'))
    >>> with pinned('jit'):
    ...     _ = evaluate(y, {'x_pinned': np.ones(2)})
    >>> last_run()['tier']
    'jit'
    """
    if mode not in MODES or mode == "auto":
        from ..errors import EvaluationError

        raise EvaluationError(f"pinned(mode={mode!r}): use 'eager' or 'jit'")
    before = PINNED_TIER[0]
    PINNED_TIER[0] = mode
    try:
        yield
    finally:
        PINNED_TIER[0] = before
