"""The tier policy: which way a call runs a circuit, decided in one place (``run``), and what it
reports having done (``last_run``).

- **cache**: the value asked for is already known (same circuit, same bound values).
- **op by op** (``mode='ops'``, and ``'auto'`` for a structure seen for the first time): through
  kernels cached per (operation, shapes, precision) and over the values already known
  (``circuits.backend.tiers.op_by_op``): a new variant of a known model compiles nothing in the call
  and computes only what its intervention reaches -- over a batch too (``evaluate_batched``,
  ``evaluate`` with batched inputs: each kernel mapped over the rows, chunks of rows by the
  memory budget).  In ``'auto'`` the nodes that one other node
  alone reads run with it as one fused kernel per structure, compiled in the background in a pause
  the first time it is met (``circuits.backend.tiers.groups``; ``settings().groups``).
- **whole program** (``mode='jit'``, ``compile``, ``sweep``; and ``'auto'``
  for a circuit evaluated op by op ``jit_after`` times already): one XLA program (heads batched,
  everything fused), compiled in a background thread (``settings().background``) while the calls
  go on op by op, and taken as soon as it is ready.  It does not export intermediates to the
  value cache.
- **cold start**: a new process's first evaluation (``settings().cold_start``) runs whole at once
  when an earlier process compiled its program (``circuits.backend.cache.persistent``), then warms the
  op-by-op tier in the background; else it runs op by op and compiles its program whole in the
  background for the next process.

Each entry point (``evaluate``, ``value_and_grad``, ``evaluate_batched``, ``op_tier``) describes
what it can compute as a ``Route``; ``run`` picks the way.  The switches are one ``Settings``
object, changed through ``configure`` (the test suite uses it too).  The jit policy of a program
run whole is here as well (``maybe_jit``: compile it, or run its skeleton uncompiled).

The tiers agree to float rounding, not bit for bit: pin one with ``mode=`` for bitwise
reproducibility.  ``last_run()`` says what the latest evaluation in this thread did (its tier,
the kernels it compiled, loaded and reused, the seconds it spent compiling); a call that compiles
for more than a second says so once (``circuits: compiling 14 kernels…``, shown where progress
bars are: ``CIRCUITS_PROGRESS``).

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

import collections
import dataclasses
import os
import sys
import threading
import time
from typing import Callable

from ...errors import EvaluationError
from ..cache.background import in_background
from ..cache.bounded import BoundedCache
from ..cache.compiled import cached_jit, is_cached, stable_name
from ..cache.compiling import calling, work_here
from ..cache.persistent import compiled_earlier, note_compiled
from ..lower.program import Program

__all__ = ["Settings", "settings", "configure", "pinned", "MODES", "check_mode", "JIT_AFTER", "JIT_MAX_OPS",
           "CALLER_MAX_OPS", "caller_max_ops", "on_accelerator", "use_jit", "worth_compiling", "maybe_jit", "Route", "run", "op_tier", "last_run", "record",
           "whole_program_ready", "mark_ready", "note_op_run", "tier_info"]

MODES = ("auto", "jit", "ops", "numpy")
# Names a mode had before (kept one release): ``'eager'`` is the op-by-op tier, ``'ops'``.
MODE_ALIASES = {"eager": "ops"}

# A circuit evaluated op by op this many times (with other inputs each time) gets its whole
# program compiled; from then on ``mode='auto'`` runs that.
JIT_AFTER = 2

# A new process's first op-by-op evaluation of a program of at most this many nodes compiles it
# whole in the background (once per process) and marks it on disk, so that the next process's
# first evaluation of it runs whole at once (the cold start; ``circuits.backend.cache.persistent``).
COLD_COMPILE_MAX_OPS = 1000

# Above this many distinct nodes ``mode='auto'`` runs op by op: XLA's compile time grows with
# program size (a 50,000-op chain takes ~15 s to compile on CPU, ~0.6 s to run eagerly), and a
# program already in the compile cache is jitted whatever its size.
JIT_MAX_OPS = 5000
# A caller's repeated computation (``op_tier``: discover's gradient methods, called once per
# example) is compiled whole in the background up to this size where that compilation does not
# take the cores the calls run on: on an accelerator (whose op-by-op tier dispatches one kernel per
# node: thousands a GPT-2 EAP call) or a CPU with at least SPARE_CORES cores.  GPT-2 small's EAP
# program has 9,400 nodes; it compiles in half a minute on one core.
CALLER_MAX_OPS = 100_000
SPARE_CORES = 8


@dataclasses.dataclass(frozen=True)
class Settings:
    """The tier policy's switches (process-wide; change them with ``configure``).

    - ``cold_start``: a new process's first evaluation is special (see the module docstring);
    - ``background``: whole programs compile in a background thread (False: in the call that
      reaches ``jit_after``);
    - ``groups``: op by op, ``'auto'`` runs fused groups (``circuits.backend.tiers.groups``);
    - ``host``: op by op, ``'auto'`` computes a node whose kernel is not made yet with numpy, the
      kernel made in the background (``circuits.backend.tiers.host``);
    - ``pinned``: the tier every ``mode='auto'`` call takes instead (``'ops'`` or ``'jit'``; see
      ``pinned``), None for none;
    - ``jit_after``: op-by-op runs of one circuit before its whole program compiles;
    - ``jit_max_ops``: the size above which ``'auto'`` never compiles a program whole;
    - ``caller_max_ops``: the same for a caller's repeated computation (``op_tier``); None: by
      the machine (``caller_max_ops()``).
    """

    cold_start: bool = True
    background: bool = True
    groups: bool = True
    host: bool = True
    pinned: str | None = None
    jit_after: int = JIT_AFTER
    jit_max_ops: int = JIT_MAX_OPS
    caller_max_ops: int | None = None


_settings = [Settings()]
_cold = [True]  # no evaluation has taken the cold-start route yet in this process


def settings() -> Settings:
    """The tier settings in force.

    >>> settings().jit_after
    2
    """
    return _settings[0]


class configure:
    """Change the tier settings process-wide (``Settings``' fields by keyword); used in a ``with``
    block, the settings before are restored at its end.  ``configure().before`` holds them.

    >>> with configure(jit_after=5):
    ...     settings().jit_after
    5
    >>> settings().jit_after
    2
    """

    def __init__(self, **changes):
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(Settings)})
        if unknown:
            raise EvaluationError(f"configure: no tier setting {', '.join(map(repr, unknown))}; the settings are "
                                  f"{', '.join(f.name for f in dataclasses.fields(Settings))}")
        if "pinned" in changes:
            changes["pinned"] = _pinned_tier(changes["pinned"])
        self.before = _settings[0]
        _settings[0] = dataclasses.replace(self.before, **changes)

    def __enter__(self):
        return _settings[0]

    def __exit__(self, *exc):
        _settings[0] = self.before


def pinned(mode: str) -> configure:
    """Within the block, every ``mode='auto'`` call (``evaluate``, ``grad``, ``evaluate_batched``,
    ``sweep`` and what calls them: ``attribute``, ``patch``...) runs in tier ``mode``
    (``'ops'``: op by op; ``'jit'``: whole programs; ``'numpy'``: op by op with numpy wherever a
    node has a numpy op): for bitwise reproducibility across a block of code, and for running a
    test suite in each tier.

    >>> import numpy as np
    >>> from circuits import Symbol, GeneralFunction
    >>> from circuits.backend import evaluate
    >>> y = GeneralFunction('cos', Symbol((2,), name='x_pinned'))
    >>> with pinned('jit'):
    ...     _ = evaluate(y, {'x_pinned': np.ones(2)})
    >>> last_run()['tier']
    'jit'
    """
    if mode is None:
        raise EvaluationError(f"pinned(mode={mode!r}): use 'ops', 'jit' or 'numpy'")
    return configure(pinned=_pinned_tier(mode))


def _pinned_tier(mode):
    """``mode`` as a pinned tier (None: none pinned), checked."""
    if mode is None:
        return None
    found = MODE_ALIASES.get(mode, mode) if isinstance(mode, str) else mode
    if found not in ("ops", "jit", "numpy"):
        raise EvaluationError(f"pinned(mode={mode!r}): use 'ops', 'jit' or 'numpy'")
    return found


def check_mode(mode: str) -> str:
    """The ``mode=`` option, checked and by its current name (``'eager'`` is ``'ops'``);
    ``'auto'`` is the pinned tier while one is pinned.

    >>> check_mode('eager'), check_mode('jit')
    ('ops', 'jit')
    """
    found = MODE_ALIASES.get(mode, mode) if isinstance(mode, str) else mode
    if found not in MODES:
        raise EvaluationError(f"mode={mode!r}: use one of {', '.join(MODES)}")
    if found == "auto":
        return _settings[0].pinned or found
    return found


# ---------------------------------------------------------------------------- the jit policy
def use_jit(mode: str, size: int, key, most: int | None = None) -> bool:
    """Compile a program of ``size`` distinct nodes whose function is cached under ``key``?
    ``'jit'`` always, ``'auto'`` when it is small enough (``most``, by default ``jit_max_ops``) or
    compiled already, ``'uncompiled'`` never (the program's skeleton then runs as it is, each
    operation dispatched by JAX)."""
    if mode == "auto":
        return size <= (_settings[0].jit_max_ops if most is None else most) or is_cached(key)
    return mode == "jit"


def worth_compiling(program: Program, key, most: int | None = None) -> bool:
    """Whether ``'auto'`` should compile ``program`` whole (under ``key``; ``most``: the size
    bound, by default ``jit_max_ops``)."""
    return use_jit("auto", len(program), key, most)


def on_accelerator() -> bool:
    """Whether JAX computes on an accelerator (a GPU, a TPU) in this process: asked only once JAX
    is imported and its backends are up (a process that has not imported it computes on the CPU
    so far), then remembered.

    >>> isinstance(on_accelerator(), bool)
    True
    """
    if "jax" not in sys.modules:
        return False
    found = _accelerator[0]
    if found is None:
        try:
            from jax._src import xla_bridge

            if not xla_bridge.backends_are_initialized():
                return False
            import jax

            found = _accelerator[0] = jax.default_backend() != "cpu"
        except (ImportError, AttributeError, RuntimeError):
            return False
    return found


_accelerator: list = [None]  # [whether JAX's default backend is an accelerator], once known


def caller_max_ops() -> int:
    """The size above which ``'auto'`` never compiles a caller's repeated computation whole
    (``op_tier``): ``settings().caller_max_ops`` where set, else ``CALLER_MAX_OPS`` on an
    accelerator or a CPU of at least ``SPARE_CORES`` cores (the background compilation leaves the
    calls their cores), else ``jit_max_ops``.

    >>> with configure(caller_max_ops=7):
    ...     caller_max_ops()
    7
    """
    current = _settings[0]
    if current.caller_max_ops is not None:
        return current.caller_max_ops
    if on_accelerator() or (os.cpu_count() or 1) >= SPARE_CORES:
        return max(CALLER_MAX_OPS, current.jit_max_ops)
    return current.jit_max_ops


def maybe_jit(key, size: int, mode: str, make: Callable[[], Callable], kept_as: bytes | None = None) -> Callable:
    """The function ``make()`` builds: compiled, from the compile cache under ``key``
    (``cache.compiled.cached_jit``; ``kept_as``: its executable kept across processes), when the jit
    policy says so; else as it is (its skeleton then runs uncompiled).

    ``make`` must build a function that holds no node and no tensor (a ``Skeleton``'s ops):
    the cache outlives the circuit."""
    if use_jit(mode, size, key):
        return cached_jit(key, make, kept_as)
    return make()


# ---------------------------------------------------------------------------- what ran
_local = threading.local()


def record(tier: str, computed: int = 0, reused: int = 0, numpy: int = 0) -> None:
    """Note what the latest evaluation in this thread did (``last_run``)."""
    _local.last = {"tier": tier, "computed": computed, "reused": reused, "numpy": numpy}


def last_run() -> dict:
    """What the latest ``evaluate`` (or gradient, or ``evaluate_batched``) in this thread did:
    ``tier`` (``'ops'``: op by op through cached kernels, ``'jit'``: the whole compiled program,
    ``'cache'``: the value was known, ``'numpy'``: op by op with numpy, pinned), ``computed``
    (nodes computed op by op), ``numpy`` (of them, those computed with numpy while their kernels
    are made in the background: ``circuits.backend.tiers.host``) and ``reused`` (cached values
    read); ``kernels``: how many XLA compilations the call made on its thread
    (``compiled``: kernels or whole programs), executables it read from a disk cache
    (``loaded``), kernels it found made already (``reused``); ``seconds``: its ``total`` time, of
    which ``compiling`` (tracing, lowering and XLA's compilation) and the rest, ``running``.
    Background compilations are not the call's."""
    found = getattr(_local, "last", None)
    if found is None:
        return {"tier": None, "computed": 0, "reused": 0, "numpy": 0, "kernels": {"compiled": 0, "loaded": 0, "reused": 0},
                "seconds": {"compiling": 0.0, "running": 0.0, "total": 0.0}}
    return {k: dict(v) if isinstance(v, dict) else v for k, v in found.items()}


# ---------------------------------------------------------------------------- whole programs, tracked
class _Tracked:
    __slots__ = ("runs", "state", "result")

    def __init__(self):
        self.runs = 0
        self.state = "counting"  # -> 'compiling' -> 'ready' | 'declined' | 'failed'
        self.result = None


_tracked = BoundedCache("tiers", "compiled", max_entries=256)  # tier key -> _Tracked


def whole_program_ready(key):
    """What the whole-program compilation for ``key`` (a circuit's hash and the options that
    shape its program) returned, once it is ready; else None."""
    entry = _tracked.peek(key)
    if entry is None or entry.state != "ready":
        return None
    return entry.result


def mark_ready(key, result=True) -> None:
    """Note that the whole program for ``key`` is compiled (it ran whole at once)."""
    entry = _tracked.setdefault(key, _Tracked())
    entry.state, entry.result = "ready", result


def note_op_run(key, compile_whole, *, now: bool = False) -> None:
    """Count an op-by-op run of the circuit ``key`` names; at ``jit_after`` runs call
    ``compile_whole()`` (in a background thread when ``settings().background``), which compiles
    its whole program and returns what ``whole_program_ready`` hands out afterwards (None: not
    compiled); ``now=True`` calls it at this run."""
    current = _settings[0]
    entry = _tracked.setdefault(key, _Tracked())
    with _counting:
        entry.runs += 1
        if (entry.runs < current.jit_after and not now) or entry.state != "counting":
            return
        entry.state = "compiling"
    if current.background:
        in_background(lambda: _compile(entry, compile_whole, pause=True), name="circuits-compile")
    else:
        _compile(entry, compile_whole)


_counting = threading.Lock()


def _compile(entry: _Tracked, compile_whole, pause: bool = False) -> None:
    if pause:  # in a pause between evaluations: the caller's next call does not share the GIL with it
        from .groups import wait_for_pause

        wait_for_pause()
    try:
        result = compile_whole()
        # None: the program is too large to be worth compiling whole (it stays op by op)
        entry.result, entry.state = result, "ready" if result is not None else "declined"
    except Exception:  # noqa: BLE001 - a compilation that fails leaves the circuit op by op, where
        entry.state = "failed"  # the same error (if it is one of the circuit's) reaches the caller


def tier_info() -> dict:
    """``tracked`` circuits, and how many have a ``ready`` or ``compiling`` whole program."""
    states = collections.Counter(e.state for e in _tracked.values())
    return {"tracked": len(_tracked), "ready": states["ready"], "compiling": states["compiling"]}


# ---------------------------------------------------------------------------- the policy
class Route:
    """What one call can compute, each way (an entry point's subclass fills these in); ``run``
    picks the way.

    - ``mode``: the checked ``mode=`` option; ``key``: what the whole program is tracked under
      (None: untracked, it never moves to the whole program by itself);
    - ``cold_start``: whether this call may take the cold-start route at all;
    - ``whole_tier``: what ``last_run`` says after ``whole()`` (``'jit'``, or ``'ops'`` where the
      program's skeleton runs uncompiled);
    - ``by_ops`` is None where there is no op-by-op way (a batch), else a method returning
      ``(value, tier, computed, reused)`` or ``(value, tier, computed, reused, numpy)``.
    """

    mode: str = "auto"
    key = None
    cold_start = False
    start_now = False  # an op-by-op run starts the whole program's compilation at once
    whole_tier = "jit"
    by_ops: Callable | None = None  # (groups: bool) -> (value, tier, computed, reused), or None: go whole

    def from_earlier_process(self) -> bool:
        """Whether an earlier process compiled this program whole (and the value is not known)."""
        return False

    def cached(self):
        """The value, when it is known already (None: compute it).  Asked first, but in ``'jit'``."""
        return None

    def whole(self, kept: bool = False):
        """The value from the whole program (``kept``: its executable from the cold start's disk)."""
        raise NotImplementedError

    def compile_whole(self, keep: bool = False):
        """Compile (and run once) the whole program: what ``whole_program_ready`` returns (None:
        declined); ``keep``: keep its executable for the next process."""
        return None

    def warm(self) -> None:
        """After a cold start ran whole: warm the op-by-op tier in the background."""


def run(route: Route):
    """The value ``route`` computes, by the way the policy picks; recorded for ``last_run``, with
    the compilations and the time the call took."""
    start, before = time.perf_counter(), work_here()
    with calling():
        value = _run(route)
    compiled, loaded, reused, seconds = (a - b for a, b in zip(work_here(), before))
    total = time.perf_counter() - start
    last = getattr(_local, "last", None)
    if last is not None:
        last["kernels"] = {"compiled": compiled, "loaded": loaded, "reused": reused}
        last["seconds"] = {"compiling": seconds, "running": max(0.0, total - seconds), "total": total}
    return value


def _run(route: Route):
    current = _settings[0]
    auto = route.mode == "auto"
    cold = auto and current.cold_start and _cold[0] and route.cold_start
    # with JAX not imported yet, numpy's first run (circuits.backend.tiers.host) costs less than
    # importing JAX to load the earlier process's program
    if cold and not (current.host and "jax" not in sys.modules) and route.from_earlier_process():
        # A new process's first evaluation of a program an earlier process compiled: run it whole
        # at once (its executable kept, or JAX's persistent cache holding its compilation).
        mark_ready(route.key)
        _cold[0] = False
        record("jit")
        value = route.whole(kept=True)
        if current.background:
            route.warm()
        return value
    if route.mode != "jit":
        # A value known for these inputs is returned as it is, whichever tier computed it: the
        # same call gives the same bits before and after the compiled program is ready.
        known = route.cached()
        if known is not None:
            record("cache", 0, 1)
            return known
    found = None
    if not (route.mode == "jit" or route.by_ops is None
            or (auto and route.key is not None and whole_program_ready(route.key))):
        found = route.by_ops(auto and current.groups)
    if found is None:  # the whole program: compiled ('jit', 'auto' once ready), or a batch
        record(route.whole_tier)
        return route.whole()
    value, tier, computed, reused, *numpy = found
    record(tier, computed, reused, numpy[0] if numpy else 0)
    if auto and tier == "ops" and route.key is not None:
        # A new process's first op-by-op evaluation of a small program compiles it whole in the
        # background, for the next process (see circuits.backend.cache.persistent).
        now = cold and computed <= COLD_COMPILE_MAX_OPS
        if cold:
            _cold[0] = False
        note_op_run(route.key, lambda: route.compile_whole(keep=now), now=now or route.start_now)
    return value


class _CallerRoute(Route):
    """``op_tier``'s route: a caller's own computation by ops, and its own whole program
    (``mark``: its name across processes, noted once compiled; ``earlier``: another process
    compiled it, so the first run starts loading it)."""

    def __init__(self, key, mode, program, by_ops, compile_whole, mark: bytes | None = None, earlier: bool = False):
        self.key, self.mode, self.program = key, mode, program
        self._by_ops, self._compile_whole = by_ops, compile_whole
        self.mark, self.start_now = mark, earlier

    def by_ops(self, groups: bool):
        result = self._by_ops()
        return None if result is None else (result, "ops", 0, 0)

    def whole(self, kept: bool = False):
        return None  # the caller runs its whole program

    def compile_whole(self, keep: bool = False):
        worth = self.start_now or worth_compiling(self.program, self.key, caller_max_ops())
        result = self._compile_whole() if worth else None
        if result is not None and self.mark is not None:
            note_compiled(self.mark)
        return result


def op_tier(key, mode: str, program, by_ops, compile_whole, *, keep=None):
    """A caller's own tiered computation (``interp.discover``'s edge scores): ``by_ops()``'s
    result where ``mode`` asks for the op-by-op tier (``'ops'``, or ``'auto'`` until the whole
    program for ``key`` is ready), counting the run so that ``'auto'``'s ``jit_after``-th one calls
    ``compile_whole()`` in the background when ``program`` is small enough (``caller_max_ops()``:
    larger than ``evaluate``'s bound on an accelerator or a CPU with cores to spare); None where
    the caller should run its whole program (``'jit'``, ready, or ``by_ops()`` gave None).
    ``keep``: the roots of the circuit the whole program computes (kept on disk under their
    content hashes, ``Lowered.cached``), which name it across processes: a program too large to
    compile whole in a call's time (over ``jit_max_ops``: GPT-2 small's EAP) that another process
    compiled whole is loaded instead (the cold start's rule, ``settings().cold_start``).  On an
    accelerator, whose op-by-op tier dispatches one kernel a node, it is loaded and run at once
    (None: the caller runs it); on a CPU, where loading GPT-2's takes seconds and numpy runs the
    first calls, in the background from the first run on, in the pauses between calls.

    >>> op_tier(('doc-op-tier',), 'jit', None, lambda: 1, lambda: True) is None
    True
    """
    mode = check_mode(mode)
    mark = None if keep is None else _mark(key, keep, program.float_dtype)
    current = _settings[0]
    earlier = (mode == "auto" and mark is not None and current.cold_start and len(program) > current.jit_max_ops
               and not whole_program_ready(key) and compiled_earlier(mark))
    if earlier and on_accelerator():
        mark_ready(key)  # this call and the next run it whole
        earlier = False
    found = run(_CallerRoute(key, mode, program, by_ops, compile_whole, mark, earlier))
    if found is None and mark is not None:
        note_compiled(mark)  # the caller runs the whole program now
    return found


_marks = BoundedCache("caller marks", "compiled", max_entries=64)  # (op_tier's key, roots) -> the mark


def _mark(key, keep, fdt: str) -> bytes | None:
    """The name under which a process notes that it compiled ``key``'s whole program: a digest
    of ``keep``'s content hashes, the float dtype and ``key`` past its first part (the program's
    structural key, which holds process-local parts); None where it computes a function a user
    registered.  Remembered by ``key`` and the roots' hashes: ``key`` is value-blind, and two
    circuits of one structure (other weights, other clean tokens) are two programs on disk."""
    memo = (key, tuple(r.hash for r in keep))
    found = _marks.get(memo)
    if found is None:
        import blake3

        name = stable_name(keep, repr((fdt, key[1:])).encode())
        found = b"" if name is None else blake3.blake3(b"caller:" + name).digest(16)
        _marks.put(memo, found)
    return found or None
