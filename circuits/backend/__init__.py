"""The JAX backend: circuits lowered to one JAX function, evaluated, batched, differentiated.

Modules, in dependency order:

- ``bounded``: the one bounded-cache class, and the registry every in-memory cache joins where it
  is created (what ``cache_stats`` and ``clear_cache`` reach); ``background``: the background
  threads (whole programs compiling, fused groups, warm-ups), each working for the cache epoch it
  was started in;
- ``einsum``: einsum planning (a contraction plan made once per Einsum node, with its reason);
- ``ops``: per-node-type op builders (``build_op``): functions of the children's values that hold
  no node and no tensor;
- ``program``: the value-free ``Skeleton`` (ops, wiring, one interpreter loop, traceable) and the
  ``Program`` (a circuit in toposort order with its Arrays and Scalars as arguments, keyed by
  name- and value-blind structure);
- ``binding``: precision, checking and binding argument values (``bind_arguments``), and the
  values on the device that every path shares;
- ``lowering``: a circuit to the program ``evaluate`` runs (``also=`` nodes, per-head sums
  batched), the programs of live circuits cached;
- ``calling``: arguments bound once per program (``ArgumentBinder``), the per-call fast path of
  ``Compiled``, ``evaluate_batched`` and ``evaluate``'s whole-program tier;
- ``cachedir``: the compilation cache's folders and files, checked at each use (ours, private, no
  link); ``persistent``: JAX's compilation cache on disk, across processes, and its budget;
  ``compiling``: ``counted_jit``, every XLA compilation counted; ``executables``: the op kernels'
  executables kept on disk, loaded without tracing; ``runtime``: the one compile cache
  (``cached_jit``);
- ``groups``: fused groups of the op-by-op tier, compiled aside; ``incremental``: op-by-op
  evaluation through kernels cached per operation, over a process-wide value cache keyed by
  node identity and bound values;
- ``variants``: ``run_variants``, a sweep's variants op by op, their changed nodes as rows of one
  kernel per base node; ``backward``: gradients op by op (``grads_ops``), the reverse sweep
  through cached kernels;
- ``tiers``: the tier policy, one function (``run``) deciding for every entry point which way a
  call runs (a known value, op by op, the whole program, a cold start), its one ``Settings``
  object (``configure``), the jit policy (``maybe_jit``) and ``last_run``;
- ``caches``: one set of controls for every cache (``cache_stats``, ``clear_cache``,
  ``set_cache_size``);
- ``lowered``: ``Lowered``, a circuit lowered to one program (bind, run, vmap, traceable), and the
  recipes of the functions a program runs as (run, vmap, gradient);
- ``batched``: ``evaluate_batched`` (vmap, chunks, sharding over devices);
- ``evaluation``: ``evaluate``, ``compile``/``Compiled`` (a ``Lowered``), ``make_jaxpr``;
- ``eager``: ``Eager``, a view for exploring intermediate values over the op-by-op tier;
- ``gradients``: ``grad`` and ``value_and_grad`` with respect to any node;
- ``symbolic``: the sympy interpreter behind ``symbolic_equal``.

This package is the backend's one door: the layers above it (models, analysis, rewrites,
interp, importers) import what they need from ``circuits.backend``, never from its submodules
(``tests/test_layers.py`` checks it).  Besides the evaluation entry points they get ``Lowered``
(profile's segments, sweep's programs, the attribution graph's traced function), the op-by-op
tier (``run_variants``, ``RunInfo``, ``has_batch_axis``), the cost model ``circuits.cost`` counts
with (``einsum_steps``, ``value_bytes``, ``einsum_temp_bytes``, ``live_bytes``), a caller's own
op-by-op tier (``op_tier``, ``values_and_grads_ops``, ``record``: discovery's edge scores), the
compilation cache switched on early (``ensure_persistent_cache``: tracr's compiler), the lowerings
that ``rewrites`` also offers as rewrites (``batch_heads``, ``gathered_minus_logsumexp``) and
``float_dtype`` (the ``dtype=`` option, checked) with ``precision`` (the context JAX computes in
for it).

The package is not named ``evaluate``: that is the public function ``circuits.evaluate``.

>>> import numpy as np, circuits as C
>>> from circuits.backend import evaluate
>>> float(evaluate(C.Einsum.from_spec('a->', C.Array(np.ones(3, np.float32)))))
3.0
"""

from .backward import values_and_grads_ops
from .batched import evaluate_batched
from .binding import float_dtype, precision
from .caches import cache_stats, clear_cache, set_cache_size
from .eager import Eager
from .einsum import einsum_steps
from .evaluation import Compiled, compile, evaluate, make_jaxpr
from .fusion import gathered_minus_logsumexp
from .gradients import grad, value_and_grad
from .head_batching import batch_heads
from .incremental import RunInfo, has_batch_axis
from .lowered import Lowered
from .memory import einsum_temp_bytes, live_bytes, value_bytes
from .persistent import ensure_persistent_cache
from .program import Program
from .symbolic import SymbolTable, symbolic_equal, symbolic_evaluate
from .tiers import JIT_MAX_OPS, check_mode, last_run, op_tier, record
from .variants import run_variants

__all__ = [
    "evaluate", "compile", "Compiled", "make_jaxpr", "evaluate_batched", "Eager", "grad",
    "value_and_grad", "cache_stats", "clear_cache", "set_cache_size", "Program", "JIT_MAX_OPS", "last_run",
    "symbolic_equal", "symbolic_evaluate", "SymbolTable",
    # the door for the layers above (see the module docstring)
    "Lowered", "float_dtype", "precision", "run_variants", "RunInfo", "has_batch_axis", "einsum_steps", "value_bytes",
    "einsum_temp_bytes", "live_bytes", "batch_heads", "gathered_minus_logsumexp", "check_mode",
    "values_and_grads_ops", "op_tier", "record", "ensure_persistent_cache",
]
