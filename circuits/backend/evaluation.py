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

The entry points:

- ``evaluate(circuit, inputs=None, *, dtype='float32', also=None, mode='auto')``
- ``compile(circuit, *, dtype='float32', also=None)`` -> ``Compiled``; ``f(inputs=None)``
- ``evaluate_batched(circuit, inputs, *, batch_size=None, devices=None, ...)`` (``eval_batch``)
- ``grad`` / ``value_and_grad(circuit, wrt, inputs=None, ...)`` (``gradients``)
- ``Eager(inputs=None, *, dtype='float32', max_bytes=...)`` per-node values, cached (``eager``)
- ``cache_stats()``, ``clear_cache()``, ``set_cache_size(n)``, ``make_jaxpr(circuit, inputs)``
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import EvaluationError
from .runtime import (
    bind_arguments,
    cache_stats,
    cached_function,
    clear_cache,
    count_trace,
    float_dtype,
    is_cached,
    precision,
    resolve_nodes,
    set_cache_size,
)
from .program import Program
from ..nodes import Circuit

__all__ = [
    "evaluate", "compile", "Compiled", "evaluate_batched", "grad", "value_and_grad", "Eager",
    "cache_stats", "clear_cache", "set_cache_size", "make_jaxpr", "JIT_MAX_OPS",
]

# Above this many distinct nodes ``mode='auto'`` runs op by op: XLA's compile time grows with
# program size (a 50,000-op chain takes ~15 s to compile on CPU, ~0.6 s to run eagerly), and a
# program already in the compile cache is jitted whatever its size.
JIT_MAX_OPS = 5000

MODES = ("auto", "jit", "eager")


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise EvaluationError(f"mode={mode!r}: use one of {', '.join(MODES)}")
    return mode


def as_items(also) -> list:
    """The ``also=`` (or ``wrt=``) option as a list: one node or name, or a sequence of them."""
    if also is None:
        return []
    return [also] if isinstance(also, (str, Circuit)) else list(also)


def program_with_also(circuit: Circuit, fdt: str, also) -> tuple[Program, list]:
    """A program computing ``circuit`` then the nodes ``also`` names; and the items as given."""
    items = as_items(also)
    program = Program([circuit], fdt)
    if items:
        program = program.with_outputs([circuit, *resolve_nodes(program, items, "also")])
    return program, items


def jitted(program: Program):
    """The jitted ``args -> outputs`` function of ``program`` (from the compile cache)."""

    def make():
        import jax

        skeleton = program.skeleton()

        def run(args):
            count_trace()
            return skeleton.run(args)

        return jax.jit(run)

    return cached_function((program.key, "run"), make)


def _use_jit(program: Program, mode: str) -> bool:
    if mode == "auto":
        return len(program) <= JIT_MAX_OPS or is_cached((program.key, "run"))
    return mode == "jit"


def run_program(program: Program, args: list, mode: str) -> list:
    """Output values (jax arrays) of ``program`` on checked arguments."""
    if _use_jit(program, mode):
        return jitted(program)(args)
    return program.skeleton().run(args)


def _package(outs, items):
    value = np.asarray(outs[0])
    if not items:
        return value
    return value, {item: np.asarray(v) for item, v in zip(items, outs[1:])}


def evaluate(circuit: Circuit, inputs: Mapping | None = None, *, dtype="float32", also=None,
             mode: str = "auto"):
    """Evaluate ``circuit`` and return a numpy array.

    - ``inputs`` binds Symbols: ``{symbol_or_name: value}``.
    - ``dtype``: float values are computed in float32 by default; ``'float64'`` on request.
    - ``also``: nodes (or names of nodes) of the circuit whose values come back from the same
      pass: the result is then ``(value, {item: value})`` keyed by the items as given.
    - ``mode``: ``'jit'`` (one compiled function, cached), ``'eager'`` (op by op, each value freed
      after its last use) or ``'auto'`` (jit up to ``JIT_MAX_OPS`` distinct nodes).

    Every input is checked before anything runs; problems raise one ``EvaluationError``.

    >>> from circuits import Symbol, GeneralFunction, Add
    >>> x = Symbol((2,), name='x')
    >>> y = GeneralFunction('exp', x, name='y')
    >>> evaluate(Add(y, x), {'x': np.zeros(2)}, also=['y'])
    (array([1., 1.], dtype=float32), {'y': array([1., 1.], dtype=float32)})
    """
    fdt = float_dtype(dtype)
    _check_mode(mode)
    program, items = program_with_also(circuit, fdt, also)
    with precision(fdt):
        args = bind_arguments(program, inputs, fdt)
        outs = run_program(program, args, mode)
        return _package(outs, items)


class Compiled:
    """A circuit lowered once: call it with ``inputs`` (a dict keyed by Symbol or name).

    Array and Scalar values are read (and cast) on the first call and kept on the device.

    >>> from circuits import Symbol, GeneralFunction
    >>> x = Symbol((3,), name='x')
    >>> f = compile(GeneralFunction('exp', x))
    >>> f({'x': np.zeros(3)})
    array([1., 1., 1.], dtype=float32)
    """

    def __init__(self, circuit: Circuit, *, dtype="float32", also=None):
        self.circuit = circuit
        self.float_dtype = float_dtype(dtype)
        self.program, self._items = program_with_also(circuit, self.float_dtype, also)
        self._constants: list | None = None

    def _constant_values(self):
        """Array and Scalar values on the device, read once (None while any is missing)."""
        if self._constants is None:
            import jax

            from .runtime import leaf_value
            from ..nodes import Symbol

            problems: list[str] = []
            values = [leaf_value(n, self.float_dtype, problems) for n in self.program.arg_nodes()
                      if type(n) is not Symbol]
            if problems:
                return None  # bind_arguments reports them, with any input problems
            self._constants = [jax.device_put(v) for v in values]
        return self._constants

    def __call__(self, inputs: Mapping | None = None):
        with precision(self.float_dtype):
            args = bind_arguments(self.program, inputs, self.float_dtype, constants=self._constant_values())
            return _package(jitted(self.program)(args), self._items)

    def __repr__(self):
        return f"<Compiled {len(self.program)} nodes, {self.float_dtype}: {self.circuit.line()}>"


def compile(circuit: Circuit, *, dtype="float32", also=None) -> Compiled:  # noqa: A001 - public name
    """Lower ``circuit`` to a jitted JAX function; ``compile(c)(inputs)`` evaluates it."""
    return Compiled(circuit, dtype=dtype, also=also)


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
