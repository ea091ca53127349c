"""How a program runs: the pipeline's third stage (it imports from ``cache`` and ``lower``).

- ``policy``: the tier policy, one function (``run``) deciding for every entry point which way a
  call runs (a known value, op by op, the whole program, a cold start), its one ``Settings``
  object (``configure``, ``pinned``), the jit policy (``maybe_jit``) and ``last_run``;
- ``symbols``, ``values``, ``kernels``, ``op_by_op``: the op-by-op tier (which Symbols a node
  depends on; the value cache and its keys; kernels per operation; ``run_ops``), ``groups``: its
  fused groups compiled aside; ``variants``: a sweep's variants as rows of one kernel per node;
  ``backward``: gradients op by op;
- ``lowered``: ``Lowered``, and the recipes of the functions a program runs as whole (run, vmap,
  gradient); ``batch_tuning``: chunk sizes measured for ``evaluate_batched``.

This package's face is the policy (``circuits.backend.tiers.pinned('jit')``,
``tiers.configure(groups=False)``, ``tiers.last_run()``):

>>> from circuits.backend import tiers
>>> tiers.settings().jit_after == tiers.JIT_AFTER
True
"""

from .policy import (
    CALLER_MAX_OPS,
    JIT_AFTER,
    JIT_MAX_OPS,
    MODES,
    Route,
    Settings,
    caller_max_ops,
    check_mode,
    configure,
    last_run,
    mark_ready,
    maybe_jit,
    note_op_run,
    on_accelerator,
    op_tier,
    pinned,
    record,
    run,
    settings,
    tier_info,
    use_jit,
    whole_program_ready,
    worth_compiling,
)

__all__ = ["Settings", "settings", "configure", "pinned", "MODES", "check_mode", "JIT_AFTER", "JIT_MAX_OPS",
           "CALLER_MAX_OPS", "caller_max_ops", "on_accelerator", "use_jit", "worth_compiling", "maybe_jit", "Route", "run", "op_tier", "last_run", "record",
           "whole_program_ready", "mark_ready", "note_op_run", "tier_info"]
