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
from .program import Program
from .runtime import as_items, bind_arguments, check_mode, float_dtype, maybe_jit, precision, resolve_nodes

__all__ = ["grad", "value_and_grad"]


def _gradient_function(program: Program, slots: tuple, shapes: tuple, weighted: bool, mode: str):
    """``(args, cotangent) -> (output, gradients at slots)`` (compiled or not, as the jit policy
    decides)."""

    def make():
        import jax
        import jax.numpy as jnp

        skeleton = program.skeleton()
        fdt = program.float_dtype

        def loss(deltas, args, cotangent):
            (out,) = skeleton.run(args, deltas=dict(zip(slots, deltas)))
            total = jnp.sum(out * cotangent) if weighted else jnp.sum(out)
            return total, out

        value_and_grad = jax.value_and_grad(loss, has_aux=True)

        def run(args, cotangent):
            zeros = [jnp.zeros(shape, dtype=fdt) for shape in shapes]
            (_, out), grads = value_and_grad(zeros, args, cotangent)
            return out, grads

        return run

    return maybe_jit((program.key, "grad", slots, weighted), len(program), mode, make)


def value_and_grad(circuit: Circuit, wrt, inputs: Mapping | None = None, *, cotangent=None,
                   dtype="float32", mode: str = "auto"):
    """``(value, gradient)``: the circuit's value and d(sum of output)/d(value of ``wrt``).

    ``wrt`` is a node of the circuit or a node name (then the gradient is one array), or a list of
    them (then a dict keyed by the items as given).  ``cotangent`` (the output's shape) weights
    the output: the gradient is then of ``sum(cotangent * output)``.  ``inputs``, ``dtype`` and
    ``mode`` as for ``evaluate``.

    >>> from circuits import Symbol, GeneralFunction
    >>> x = Symbol((2,), name='x')
    >>> value_and_grad(GeneralFunction('exp', x), 'x', {'x': np.zeros(2)}, cotangent=[1.0, 3.0])
    (array([1., 1.], dtype=float32), array([1., 3.], dtype=float32))
    """
    fdt = float_dtype(dtype)
    check_mode(mode)
    single = isinstance(wrt, (str, Circuit))
    items = as_items(wrt)
    if not items:
        raise EvaluationError("wrt: give a node, a node name, or a list of them")
    program = Program([circuit], fdt)
    nodes = resolve_nodes(program, items, "wrt")
    if not is_float(circuit.dtype):
        raise EvaluationError(f"cannot differentiate {circuit.line()}: its dtype {circuit.dtype} is not a float")
    for node in nodes:
        if not is_float(node.dtype):
            raise EvaluationError(
                f"cannot differentiate with respect to {node.line()}: its dtype {node.dtype} is not a float"
            )
    slots = tuple(dict.fromkeys(program.slot_of[n.hash] for n in nodes))
    shapes = tuple(program.nodes[s].shape for s in slots)
    with precision(fdt):
        args = bind_arguments(program, inputs, fdt)
        weights = None
        if cotangent is not None:
            weights = np.asarray(cotangent)
            if weights.shape != circuit.shape:
                raise EvaluationError(
                    f"cotangent has shape {list(weights.shape)}; expected the output's shape "
                    f"{list(circuit.shape)} ({circuit.line()})"
                )
            weights = weights.astype(np.float64 if fdt == "float64" else np.float32)
        fn = _gradient_function(program, slots, shapes, weights is not None, mode)
        out, grads = fn(args, weights)
        value = np.asarray(out)
        by_slot = {s: np.asarray(g) for s, g in zip(slots, grads)}
    if single:
        return value, by_slot[slots[0]]
    return value, {item: by_slot[program.slot_of[n.hash]] for item, n in zip(items, nodes)}


def grad(circuit: Circuit, wrt, inputs: Mapping | None = None, *, cotangent=None, dtype="float32",
         mode: str = "auto"):
    """d(sum of ``circuit``'s output)/d(value of ``wrt``): see ``value_and_grad``."""
    return value_and_grad(circuit, wrt, inputs, cotangent=cotangent, dtype=dtype, mode=mode)[1]
