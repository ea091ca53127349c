"""Evaluation with JAX.

A circuit is lowered in toposort order to one JAX function (``circuits.backend.program``): each distinct
node is computed once, Arrays and Scalars are **arguments** of that function, not baked-in
constants, and the compile cache is keyed by the name-blind, value-blind structure plus shapes and
dtypes, so a patched circuit (same structure, other arrays) reuses compiled code.

>>> import numpy as np
>>> from circuits import Array, Einsum
>>> x = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name='x')
>>> evaluate(Einsum.from_spec('ab->a', x))
array([ 3., 12.], dtype=float32)

The entry points here: ``evaluate(circuit, inputs=None, *, dtype='float32', also=None,
mode='auto')``, ``compile(circuit, *, dtype='float32', also=None)`` -> ``Compiled`` (call it with
the inputs), and ``make_jaxpr(circuit, inputs)``.  Whether ``evaluate`` compiles is the one jit
policy of ``circuits.backend.runtime``, shared with ``evaluate_batched`` and the gradients.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import EvaluationError
from ..nodes import Circuit
from .program import Program
from .runtime import (
    bind_arguments,
    cached_program,
    check_mode,
    float_dtype,
    maybe_jit,
    package_outputs,
    precision,
    program_with_also,
)

__all__ = ["evaluate", "compile", "Compiled", "make_jaxpr", "program_function"]


def program_function(program: Program, mode: str):
    """``args -> outputs`` of ``program``: compiled (from the compile cache) or op by op, as the
    jit policy decides for ``mode``."""
    return maybe_jit((program.key, "run"), len(program), mode, lambda: program.skeleton().run)


def _numpy_outputs(outs, items):
    return package_outputs([np.asarray(o) for o in outs], items)


def evaluate(circuit: Circuit, inputs: Mapping | None = None, *, dtype="float32", also=None,
             mode: str = "auto", batch_heads: bool = True):
    """Evaluate ``circuit`` and return a numpy array.

    - ``inputs`` binds Symbols: ``{symbol_or_name: value}``.
    - ``dtype``: float values are computed in float32 by default; ``'float64'`` on request.
    - ``also``: nodes (or names of nodes) of the circuit whose values come back from the same
      pass: the result is then ``(value, {item: value})`` keyed by the items as given.
    - ``mode``: ``'jit'`` (one compiled function, cached), ``'eager'`` (op by op, each value freed
      after its last use) or ``'auto'`` (jit up to ``JIT_MAX_OPS`` distinct nodes).
    - ``batch_heads``: compute a sum of per-head subcircuits (the seed's attention heads) as one
      computation over a head axis (``circuits.backend.head_batching``; the same value, fewer
      and larger einsums); ``False`` runs the circuit node by node as printed.

    Every input is checked before anything runs; problems raise one ``EvaluationError``.

    >>> from circuits import Symbol, GeneralFunction, Add
    >>> x = Symbol((2,), name='x')
    >>> y = GeneralFunction('exp', x, name='y')
    >>> evaluate(Add(y, x), {'x': np.zeros(2)}, also=['y'])
    (array([1., 1.], dtype=float32), {'y': array([1., 1.], dtype=float32)})
    """
    fdt = float_dtype(dtype)
    check_mode(mode)
    program, items = cached_program(circuit, fdt, also, batch_heads and mode != "eager")
    with precision(fdt):
        args = bind_arguments(program, inputs, fdt)
        return _numpy_outputs(program_function(program, mode)(args), items)


class Compiled:
    """A circuit lowered once: call it with ``inputs`` (a dict keyed by Symbol or name).

    Array and Scalar values are uploaded to the device on first use and kept there, shared with
    every other evaluation of the same tensors (``circuits.backend.runtime``'s device values).

    >>> from circuits import Symbol, GeneralFunction
    >>> x = Symbol((3,), name='x')
    >>> f = compile(GeneralFunction('exp', x))
    >>> f({'x': np.zeros(3)})
    array([1., 1., 1.], dtype=float32)
    """

    def __init__(self, circuit: Circuit, *, dtype="float32", also=None, batch_heads: bool = True, mesh=None,
                 shard=None):
        self.circuit = circuit
        self.float_dtype = float_dtype(dtype)
        self.program, self._items = program_with_also(circuit, self.float_dtype, also, batch_heads)
        self.placement = None
        if mesh is not None:
            from .sharding import Placement, mesh_of

            self.placement = Placement(mesh_of(mesh), self.program, shard)
        elif shard:
            raise EvaluationError("compile: shard= needs mesh= (a jax.sharding.Mesh or a list of devices)")

    def arguments(self, inputs: Mapping | None = None) -> list:
        """The argument values the compiled function gets (in ``program.arg_slots`` order): checked,
        on the device, and placed on the mesh when there is one (``value.sharding`` shows how)."""
        with precision(self.float_dtype):
            args = bind_arguments(self.program, inputs, self.float_dtype)
            return args if self.placement is None else self.placement.place(args)

    def __call__(self, inputs: Mapping | None = None, *, return_jax: bool = False):
        with precision(self.float_dtype):
            args = self.arguments(inputs)
            outs = program_function(self.program, "jit")(args)
            if return_jax:
                return package_outputs(outs, self._items)
            return _numpy_outputs(outs, self._items)

    def __repr__(self):
        return f"<Compiled {len(self.program)} nodes, {self.float_dtype}: {self.circuit.line()}>"


def compile(circuit: Circuit, *, dtype="float32", also=None, batch_heads: bool = True, mesh=None,  # noqa: A001
            shard=None) -> Compiled:
    """Lower ``circuit`` to a jitted JAX function; ``compile(c)(inputs)`` evaluates it
    (``batch_heads`` as for ``evaluate``; ``return_jax=True`` leaves the result on the device).

    ``mesh`` (a ``jax.sharding.Mesh`` or a list of devices) and ``shard`` (``{matcher:
    PartitionSpec}``) split the matched Arrays and Symbols over the devices, the rest replicated,
    and XLA partitions the computation to match (``circuits.backend.sharding``):

    >>> import jax
    >>> from jax.sharding import PartitionSpec as P
    >>> from circuits import Array, Einsum
    >>> w = Array(np.ones((4, 2), np.float32), name='w')
    >>> f = compile(Einsum.from_spec('ab->b', w), mesh=jax.devices()[:1], shard={'w': P('model')})
    >>> f(), f.arguments()[0].sharding.spec
    (array([4., 4.], dtype=float32), P('model',))
    """
    return Compiled(circuit, dtype=dtype, also=also, batch_heads=batch_heads, mesh=mesh, shard=shard)


def make_jaxpr(circuit: Circuit, inputs: Mapping | None = None, *, dtype="float32"):
    """The jaxpr of ``circuit``'s lowered function (what XLA would compile), for inspection.

    >>> from circuits import Scalar, GeneralFunction
    >>> print(make_jaxpr(GeneralFunction('exp', Scalar(0.0))))
    { lambda ; a:f32[]. let b:f32[] = exp a in (b,) }
    """
    import jax

    fdt = float_dtype(dtype)
    program = Program([circuit], fdt)
    with precision(fdt):
        args = bind_arguments(program, inputs, fdt)
        return jax.make_jaxpr(program.skeleton().run)(args)
