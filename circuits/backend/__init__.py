"""The JAX backend: circuits lowered to one JAX function, evaluated, batched, differentiated.

The folder shows the pipeline, each stage importing only from those before it
(``tests/backend/test_pipeline.py`` checks it, imports inside functions counted):

- ``cache/``: what is kept, in memory (one bounded-cache class, the registry of every cache, the
  compile cache) and on disk (JAX's compilation cache, the kept executables), and the background
  threads;
- ``lower/``: a circuit to a program (einsum plans, op builders, ``Program``/``Skeleton``, heads
  batched, the program ``evaluate`` runs) and values to its arguments (binding, the binder);
- ``tiers/``: how a program runs: the tier policy (``tiers.run``, ``Settings``), the op-by-op tier
  (values, kernels, fused groups, variants, gradients), ``Lowered`` and the whole-program recipes;
- the entry points, each its options checked and one call of the policy: ``evaluation``
  (``evaluate``, ``compile``/``Compiled``, ``make_jaxpr``), ``batched`` (``evaluate_batched``),
  ``gradients`` (``grad``, ``value_and_grad``), ``eager`` (``Eager``); ``caches`` (one set of
  controls for every cache: ``cache_stats``, ``clear_cache``, ``set_cache_size``);
  ``symbolic`` (the sympy interpreter behind ``symbolic_equal``).

This package is the backend's one door: the layers above it (models, analysis, rewrites,
interp, importers) import what they need from ``circuits.backend``, never from its submodules
(``tests/test_layers.py`` checks it).  Besides the evaluation entry points they get ``Lowered``
(profile's segments, sweep's programs, the attribution graph's traced function), the op-by-op
tier (``run_variants``, ``RunInfo``, ``has_batch_axis``), the cost model ``circuits.cost`` counts
with (``einsum_steps``, ``value_bytes``, ``einsum_temp_bytes``, ``live_bytes``), a caller's own
op-by-op tier (``op_tier``, ``values_and_grads_ops``, ``record``: discovery's edge scores;
``steps_as``: its op-by-op steps computed with numpy where the caller's mode would), the
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

from .batched import evaluate_batched, variants_over_batch
from .cache.compiling import compile_seconds
from .cache.persistent import ensure_persistent_cache
from .caches import cache_stats, clear_cache, set_cache_size
from .eager import Eager
from .evaluation import Compiled, compile, evaluate, make_jaxpr
from .gradients import grad, value_and_grad
from .lower.binding import float_dtype, precision
from .lower.einsum import einsum_steps
from .lower.fusion import gathered_minus_logsumexp
from .lower.head_batching import batch_heads
from .lower.memory import einsum_temp_bytes, live_bytes, value_bytes
from .lower.program import Program
from .symbolic import SymbolTable, symbolic_equal, symbolic_evaluate
from .tiers.backward import values_and_grads_ops
from .tiers.host import steps_as
from .tiers.lowered import Lowered
from .tiers.op_by_op import RunInfo
from .tiers.policy import JIT_MAX_OPS, check_mode, last_run, op_tier, record
from .tiers.symbols import has_batch_axis
from .tiers.variants import run_variants

__all__ = [
    "evaluate", "compile", "Compiled", "make_jaxpr", "evaluate_batched", "Eager", "grad",
    "value_and_grad", "cache_stats", "clear_cache", "set_cache_size", "Program", "JIT_MAX_OPS", "last_run",
    "symbolic_equal", "symbolic_evaluate", "SymbolTable",
    # the door for the layers above (see the module docstring)
    "Lowered", "float_dtype", "precision", "run_variants", "variants_over_batch", "RunInfo", "has_batch_axis", "einsum_steps", "value_bytes",
    "einsum_temp_bytes", "live_bytes", "batch_heads", "gathered_minus_logsumexp", "check_mode",
    "values_and_grads_ops", "op_tier", "record", "steps_as", "ensure_persistent_cache", "compile_seconds",
]
