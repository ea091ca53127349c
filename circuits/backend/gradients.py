"""Gradients of a circuit's output with respect to any of its nodes (attribution), from JAX.

A node's value is made a differentiable input by adding a zero at its slot (``Skeleton.run``'s
``deltas``): the gradient with respect to that zero is the gradient with respect to the node's
value, every use of the node included, and the output comes from the same pass.

>>> import numpy as np
>>> from circuits import Array, Einsum
>>> x = Array(np.array([1.0, 2.0, 3.0], np.float32), name='x')
>>> sq = Einsum.from_spec('a,a->a', x, x, name='sq')
>>> grad(sq, 'x')          # d sum(x*x) / dx = 2x
array([2., 4., 6.], dtype=float32)
>>> grad(sq, sq)           # the output with respect to itself
array([1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..dtypes import is_float
from ..errors import EvaluationError
from ..nodes import Circuit
from .lower.binding import float_dtype, precision
from .lower.calling import bind_once
from .lower.lowering import as_items, resolve_nodes
from .lower.program import Program
from .tiers.backward import grads_ops
from .tiers.host import host_mode
from .tiers.lowered import grad_function, grad_vmap_function
from .tiers.op_by_op import OverBudget, RunInfo
from .tiers.policy import Route, check_mode, run, worth_compiling
from .tiers.symbols import has_batch_axis
from .tiers.values import Binding

__all__ = ["grad", "value_and_grad"]


def value_and_grad(circuit: Circuit, wrt, inputs: Mapping | None = None, *, cotangent=None,
                   dtype="float32", mode: str = "auto", cache: bool = True):
    """``(value, gradient)``: the circuit's value and d(sum of output)/d(value of ``wrt``).

    ``wrt`` is a node of the circuit or a node name (then the gradient is one array), or a list of
    them (then a dict keyed by the items as given).  ``cotangent`` (the output's shape) weights
    the output: the gradient is then of ``sum(cotangent * output)``.  ``inputs``, ``dtype``,
    ``mode`` and ``cache`` as for ``evaluate``.  Inputs with a leading batch axis give per-example
    values and gradients (batch axis first); ``cotangent`` may then carry the batch axis too:
    op by op as for one row (the vector-Jacobian products mapped over the rows, in chunks of
    rows when the batch's values would not fit the memory budget), then, repeated, from one
    compiled program.  Op by op (``'ops'``, and ``'auto'`` until the
    same gradient has been asked for ``JIT_AFTER`` times) the forward values come from the value
    cache where known and the backward pass runs vector-Jacobian products through kernels cached
    per operation, so a fresh structure compiles nothing whole.

    >>> from circuits import Symbol, GeneralFunction
    >>> x = Symbol((2,), name='x')
    >>> value_and_grad(GeneralFunction('exp', x), 'x', {'x': np.zeros(2)}, cotangent=[1.0, 3.0])
    (array([1., 1.], dtype=float32), array([1., 3.], dtype=float32))
    """
    fdt = float_dtype(dtype)
    mode = check_mode(mode)
    single = isinstance(wrt, (str, Circuit))
    items = as_items(wrt)
    if not items:
        raise EvaluationError("wrt: give a node, a node name, or a list of them")
    lowered: list = []

    def program_of() -> Program:  # the whole program, built only where it is needed
        if not lowered:
            lowered.append(Program([circuit], fdt))
        return lowered[0]

    by_node = all(isinstance(i, Circuit) for i in items)
    nodes = list(items) if by_node else resolve_nodes(program_of(), items, "wrt")
    if not is_float(circuit.dtype):
        raise EvaluationError(f"cannot differentiate {circuit.line()}: its dtype {circuit.dtype} is not a float")
    for node in nodes:
        if not is_float(node.dtype):
            raise EvaluationError(
                f"cannot differentiate with respect to {node.line()}: its dtype {node.dtype} is not a float"
            )
    weights = None
    if cotangent is not None:
        weights = np.asarray(cotangent)
        batched_weights = inputs and isinstance(inputs, Mapping) and weights.ndim == len(circuit.shape) + 1 \
            and weights.shape[1:] == circuit.shape
        if weights.shape != circuit.shape and not batched_weights:
            raise EvaluationError(
                f"cotangent has shape {list(weights.shape)}; expected the output's shape "
                f"{list(circuit.shape)} ({circuit.line()})"
            )
        weights = weights.astype(np.float64 if fdt == "float64" else np.float32)
    route = _Gradient(circuit, items, nodes, by_node, single, inputs, weights, fdt, mode, cache, program_of)
    with precision(fdt):
        return run(route)


class _Gradient(Route):
    """``value_and_grad``'s ways: op by op (forward values from the value cache, the reverse
    sweep through cached kernels), or the whole gradient program (see ``tiers.run`` for which)."""

    def __init__(self, circuit, items, nodes, by_node, single, inputs, weights, fdt, mode, cache, program_of):
        self.circuit, self.items, self.nodes, self.by_node, self.single = circuit, items, nodes, by_node, single
        self.inputs, self.weights, self.fdt, self.mode, self.cache = inputs, weights, fdt, mode, cache
        self.program_of = program_of
        self.batched = has_batch_axis(circuit, inputs)
        self.key = ("grad", circuit.hash, fdt, tuple(n.hash for n in nodes), weights is not None, self.batched)
        self.whole_tier = "ops" if mode in ("ops", "numpy") and not self.batched else "jit"

    def by_ops(self, groups: bool):
        nodes, items = self.nodes, self.items
        distinct = list({n.hash: n for n in nodes}.values())
        info = RunInfo()
        host = host_mode(self.mode, self.fdt, self.inputs)
        if self.batched:
            found = _grads_over_rows(self.circuit, distinct, self.inputs, self.fdt, self.weights, self.cache, info,
                                     host)
        else:
            found = grads_ops(self.circuit, distinct, self.inputs, self.fdt, self.weights, cache=self.cache, info=info,
                              host=host)
        if found is None:  # a node to differentiate is not in the circuit as evaluated
            return None
        out, grads = found
        value = np.asarray(out)
        by_hash = {n.hash: np.asarray(g) for n, g in zip(distinct, grads)}
        tier = "numpy" if host == "pin" else "ops"
        if self.single:
            return (value, by_hash[nodes[0].hash]), tier, info.computed, info.reused, info.numpy
        return (value, {item: by_hash[n.hash] for item, n in zip(items, nodes)}), tier, info.computed, info.reused, \
            info.numpy

    def compile_whole(self, keep: bool = False):
        if self.batched:  # the per-example program, compiled by running it once
            program = self.program_of()
            if not worth_compiling(program, (program.key, "grad-vmap")):
                return None
            self.whole()
            return True
        return _compile_gradient(self.program_of(), self.nodes, self.weights, self.inputs)

    def whole(self, kept: bool = False):
        program, items, single, weights = self.program_of(), self.items, self.single, self.weights
        nodes = resolve_nodes(program, items, "wrt") if self.by_node else self.nodes
        slots = tuple(dict.fromkeys(program.slot_of[n.hash] for n in nodes))
        shapes = tuple(program.nodes[s].shape for s in slots)
        if self.batched:
            return _batched_value_and_grad(program, nodes, items, single, slots, shapes, self.inputs, weights)
        args = bind_once(program, self.inputs, self.fdt)
        how = "uncompiled" if self.mode in ("ops", "numpy") else "jit"
        out, grads = grad_function(program, slots, shapes, weights is not None, how)(args, weights)
        value = np.asarray(out)
        by_slot = {s: np.asarray(g) for s, g in zip(slots, grads)}
        if single:
            return value, by_slot[program.slot_of[nodes[0].hash]]
        return value, {item: by_slot[program.slot_of[n.hash]] for item, n in zip(items, nodes)}


def _grads_over_rows(circuit, nodes, inputs, fdt, weights, cache, info, host=None):
    """``grads_ops`` over inputs with a leading batch axis: ``(value, gradients)``, rows first, op
    by op.  All the rows at once where one row's new forward values and cotangents times the rows
    fit ``batched.ops_memory_budget()``, else in chunks of rows (a power of two, as many as fit;
    the chunks this dataset ran in before, when a patch or the clean run over it chunked: their
    values are in the value cache).  None as for ``grads_ops``, or when the inputs do not bind
    (the whole program says what is wrong)."""
    from .batched import known_chunk, ops_memory_budget, remember_chunk, take_rows

    binding = Binding([circuit], inputs, fdt, batched=True)
    total = binding.rows
    if binding.problems or not total:
        return None
    per_row = weights is not None and weights.ndim == len(circuit.shape) + 1

    def run_part(start, chunk):
        part = {s: take_rows(binding.values[s.hash], start, chunk) if s.hash in binding.keys.batched
                else binding.values[s.hash] for s in binding.free}
        w = take_rows(weights, start, chunk) if per_row else weights
        return grads_ops(circuit, nodes, part, fdt, w, cache=cache, info=info, batched=True, host=host)

    known = known_chunk(binding)
    budget = ops_memory_budget()
    if known is None or known >= total:
        try:
            found = grads_ops(circuit, nodes, inputs, fdt, weights, cache=cache, info=info, batched=True,
                              max_bytes=budget, host=host)
        except OverBudget as over:
            fit = max(1, min(total, budget // max(1, over.row_bytes)))
            known = 1 << (fit.bit_length() - 1)  # a power of two
            remember_chunk(binding, known)
        else:
            return found
    pieces = []
    for start in range(0, total, known):
        found = run_part(start, known)
        if found is None:
            return None
        real = min(known, total - start)
        pieces.append([np.asarray(v)[:real] for v in (found[0], *found[1])])
    joined = [np.concatenate([p[k] for p in pieces]) for k in range(len(pieces[0]))]
    return joined[0], joined[1:]


def _batched_value_and_grad(program, nodes, items, single, slots, shapes, inputs, weights):
    """Per-example values and gradients over inputs with a leading batch axis: one compiled
    program (the gradient program ``vmap``-ed over the batched arguments), batch axis first."""
    fdt = program.float_dtype
    with precision(fdt):
        args, axes = bind_once(program, inputs, fdt, batched=True)
        cot_axis = None if weights is None or weights.ndim == len(program.nodes[program.outputs[0]].shape) else 0
        out, grads = grad_vmap_function(program, slots, shapes, weights is not None, axes, cot_axis)(args, weights)
        value = np.asarray(out)
        found = {program.nodes[s].hash: np.asarray(g) for s, g in zip(slots, grads)}
    by_item = [found[program.nodes[program.slot_of[n.hash]].hash] for n in nodes]
    if single:
        return value, by_item[0]
    return value, dict(zip(items, by_item))


def _compile_gradient(program, nodes, weights, inputs) -> bool | None:
    fdt = program.float_dtype
    slots = tuple(dict.fromkeys(program.slot_of[n.hash] for n in nodes))
    shapes = tuple(program.nodes[s].shape for s in slots)
    if not worth_compiling(program, (program.key, "grad", slots, weights is not None)):
        return None  # too large to compile whole (see circuits.backend.tiers.JIT_MAX_OPS)
    with precision(fdt):
        args = bind_once(program, inputs, fdt)
        out, _ = grad_function(program, slots, shapes, weights is not None, "jit")(args, weights)
        out.block_until_ready()
    return True


def grad(circuit: Circuit, wrt, inputs: Mapping | None = None, *, cotangent=None, dtype="float32",
         mode: str = "auto", cache: bool = True):
    """d(sum of ``circuit``'s output)/d(value of ``wrt``): see ``value_and_grad``."""
    return value_and_grad(circuit, wrt, inputs, cotangent=cotangent, dtype=dtype, mode=mode, cache=cache)[1]
