"""``Lowered``: a circuit lowered to one program, and the recipes of the functions a program runs
as (each written once here, keyed once in the one compile cache).

- ``run_function(program)``: the program as ``args -> outputs`` (key ``(key, 'run')``);
- ``vmap_function(program, in_axes)``: the same over arguments with a leading batch axis, one
  vmap (``(key, 'vmap', in_axes)``) or a ``lax.map`` over groups of rows (``group=``);
- ``grad_function(program, slots, shapes, weighted)``: ``(args, cotangent) -> (output, gradients
  at slots)`` (``(key, 'grad', slots, weighted)``), and ``grad_vmap_function`` over a batch.

Each is compiled, or its skeleton run as it is, as the jit policy decides (``how``: ``'auto'``,
``'jit'``, ``'uncompiled'``: ``tiers.maybe_jit``).

``Lowered(roots, dtype, given=...)`` lays ``roots`` out as one ``Program`` (``Lowered.of(program)``
wraps one made already) and offers what a caller does with it, the backend's door for the layers
above it; ``Compiled`` (``compile``) is a ``Lowered`` that runs its compiled function when called:

- ``bind(inputs, given=...)``: the argument values, every one checked before anything runs
  (``circuits.backend.lower.binding.bind_arguments``, through the program's binder when it can:
  unbound or misshapen Symbols, placeholder Arrays, ints that would wrap, and indices outside
  the axis a gather reads);
- ``function(mode)`` / ``run(inputs)``: ``run_function``; ``vmap(in_axes)``: ``vmap_function``;
  ``traceable()``: the plain function, for a caller's own JAX transformation;
- ``is_compiled()``: whether the compile cache holds it already (plain or vmapped).

``given`` names nodes (or their hashes) whose values the caller supplies: they are arguments
too, and the program computes only what lies above them (see ``Program``).

>>> import numpy as np
>>> from circuits import Add, GeneralFunction, Symbol
>>> x = Symbol((2,), name='x')
>>> low = Lowered(Add(GeneralFunction('exp', x), x))
>>> low.args == (x,), np.asarray(low.run({'x': [0.0, 1.0]})[0]).round(4)
(True, array([1.    , 3.7183], dtype=float32))
>>> low.bind({'x': np.zeros(3)})
Traceback (most recent call last):
...
circuits.errors.EvaluationError: cannot evaluate:
  input for Symbol 'x' [2] Symbol has shape [3]; expected [2]
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence

from ...nodes import Circuit
from ..cache.compiled import cached_jit, is_compiled, is_compiled_any, stable_name
from ..lower.binding import float_dtype, precision
from ..lower.calling import bind_once
from ..lower.program import ARGUMENT_TYPES, Program
from .policy import maybe_jit

__all__ = ["Lowered", "run_key", "run_function", "vmap_function", "grad_function", "grad_vmap_function"]


# ---------------------------------------------------------------------------- the recipes
def run_key(program: Program) -> tuple:
    """What ``run_function``'s compiled function is cached under."""
    return (program.key, "run")


def run_function(program: Program, how: str = "auto", kept_as: bytes | None = None) -> Callable[[list], list]:
    """``args -> outputs`` of ``program`` (compiled or not, as the jit policy decides for ``how``);
    ``kept_as``: its executable kept across processes under these bytes (``cache.compiled.cached_jit``)."""
    return maybe_jit(run_key(program), len(program), how, lambda: program.skeleton().run, kept_as)


def vmap_function(program: Program, in_axes: Sequence[int | None], how: str = "auto",
                  group: int | None = None) -> Callable[[list], list]:
    """``args -> outputs`` of ``program`` mapped over the arguments whose ``in_axes`` entry is 0 (a
    leading batch axis): one vmap, or with ``group`` a ``lax.map`` over the rows, ``group`` rows
    vmapped at a time."""
    in_axes = tuple(in_axes)

    def make():
        import jax

        run = program.skeleton().run
        if group is None:
            return jax.vmap(run, in_axes=(list(in_axes),))
        batched = [i for i, ax in enumerate(in_axes) if ax == 0]

        def mapped(args):
            def one_row(rows):
                full = list(args)
                for i, v in zip(batched, rows):
                    full[i] = v
                return run(full)

            return jax.lax.map(one_row, [args[i] for i in batched], batch_size=group)

        return mapped

    key = (program.key, "vmap", in_axes) if group is None else (program.key, "vmap", in_axes, "map", group)
    return maybe_jit(key, len(program), how, make)


def _gradient(program: Program, slots: tuple, shapes: tuple, weighted: bool):
    """The plain ``(args, cotangent) -> (output, gradients at slots)``: a zero added at each slot
    (``Skeleton.run``'s ``deltas``) is the input the gradient is taken with respect to."""
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


def grad_function(program: Program, slots: tuple, shapes: tuple, weighted: bool, how: str = "auto"):
    """``(args, cotangent) -> (output, gradients at slots)`` (``shapes``: the slots' shapes;
    ``weighted``: the output's sum weighted by the cotangent, else its plain sum)."""
    return maybe_jit((program.key, "grad", slots, weighted), len(program), how,
                     lambda: _gradient(program, slots, shapes, weighted))


def grad_vmap_function(program: Program, slots: tuple, shapes: tuple, weighted: bool, in_axes: Sequence,
                       cotangent_axis: int | None, how: str = "jit"):
    """``grad_function`` over a batch: per-example outputs and gradients, batch axis first."""
    import jax

    in_axes = tuple(in_axes)
    key = (program.key, "grad-vmap", slots, weighted, in_axes, cotangent_axis)
    return maybe_jit(key, len(program), how, lambda: jax.vmap(_gradient(program, slots, shapes, weighted),
                                                             in_axes=(list(in_axes), cotangent_axis)))


# ---------------------------------------------------------------------------- a program, lowered
class Lowered:
    """``roots`` (a circuit or a sequence of circuits) lowered to one program at ``dtype``; see the
    module docstring.  ``program`` is the ``Program`` (its ``nodes``, ``child_slots``,
    ``arg_slots``, ``given_slots``, ``outputs``), ``key`` its name- and value-blind key, ``args``
    its argument nodes in the order ``bind`` returns their values.

    >>> from circuits import Einsum, Symbol
    >>> x = Symbol((3,), name='x')
    >>> low = Lowered([Einsum.from_spec('a->', x)], 'float64')
    >>> low.dtype, len(low), low.run({'x': [1, 2, 3]})[0].dtype
    ('float64', 2, dtype('float64'))
    """

    ARGUMENT_TYPES = ARGUMENT_TYPES  # the leaf types that are arguments (Array, Scalar, Symbol)

    def __init__(self, roots: Circuit | Sequence[Circuit], dtype="float32", *,
                 given: Collection[Circuit | bytes] = ()):
        self.dtype = float_dtype(dtype)
        roots = [roots] if isinstance(roots, Circuit) else list(roots)
        hashes = {g.hash if isinstance(g, Circuit) else g for g in given}
        self.program = Program(roots, self.dtype, given=hashes)

    @classmethod
    def of(cls, program: Program) -> "Lowered":
        """The ``Lowered`` of a program made already (its float dtype, its nodes).

        >>> from circuits import Symbol
        >>> x = Symbol((2,), name='x')
        >>> Lowered.of(Program([x], 'float64')).dtype
        'float64'
        """
        low = cls.__new__(cls)
        low.dtype, low.program = program.float_dtype, program
        return low

    @property
    def key(self) -> bytes:
        return self.program.key

    @property
    def args(self) -> tuple[Circuit, ...]:
        return self.program.arg_nodes()

    def __len__(self):
        return len(self.program)

    def bind(self, inputs: Mapping | None = None, *, given: Mapping | None = None) -> list:
        """The argument values, in ``args`` order, checked before anything runs (one
        ``EvaluationError`` names every problem).  ``inputs`` binds Symbols as for ``evaluate``;
        ``given`` maps the hash of every given node to its value (taken as it is, but a given
        Array or Symbol is still checked against the index range of a gather it feeds).

        >>> import numpy as np
        >>> from circuits import Array, GeneralFunction, Symbol
        >>> from circuits.errors import EvaluationError
        >>> tokens = Symbol((2,), name='tokens', dtype='int64')
        >>> low = Lowered(GeneralFunction('gen_index_at_0', Array(np.eye(3)), tokens), given=[tokens])
        >>> try:
        ...     low.bind(given={tokens.hash: np.array([0, 5])})
        ... except EvaluationError as e:
        ...     print(str(e).splitlines()[1].split(' of the axis')[0])
          input for Symbol 'tokens' [2] Symbol int64 holds index 5, outside [-3, 3)
        """
        with precision(self.dtype):
            return bind_once(self.program, inputs, self.dtype, given=given)

    def bind_batched(self, inputs: Mapping | None = None) -> tuple[list, list]:
        """``(argument values, batch axes)``: as ``bind``, where a Symbol's value may carry one
        leading batch axis more than the Symbol (its axis is then 0, else None)."""
        with precision(self.dtype):
            return bind_once(self.program, inputs, self.dtype, batched=True)

    def cached(self, tag: tuple, make: Callable[[], Callable],
               keep: Circuit | Sequence[Circuit] | None = None) -> Callable:
        """``jax.jit`` of ``make()``, a caller's own function of this program (a gradient, a vmap
        with a reduction), in the one compile cache under this program's key and ``tag``;
        ``keep``: the circuit this program was lowered from, or its roots in order (no ``given``),
        to keep the executable on disk under their content hashes, the dtype and ``tag`` so that a
        new process loads it without tracing (``cache.compiled.stable_name``)."""
        kept_as = None if keep is None else stable_name(keep, repr((self.dtype, *tag)).encode())
        return cached_jit((self.program.key, *tag), make, kept_as)

    def function(self, mode: str = "auto") -> Callable[[list], list]:
        """``args -> outputs``: compiled (from the compile cache) or not, as the jit policy decides
        for ``mode``: ``'auto'``, ``'jit'``, or ``'uncompiled'`` (the program's skeleton as it is,
        each operation dispatched by JAX; ``'eager'`` is its former name).  Call it within
        ``precision(dtype)`` (``circuits.backend.precision``: float64 needs JAX's x64 mode)."""
        return run_function(self.program, mode)

    def run(self, inputs: Mapping | None = None, *, given: Mapping | None = None, mode: str = "auto") -> list:
        """The values of the roots (device arrays): ``bind`` then ``function(mode)``.
        ``mode='uncompiled'`` compiles nothing (a program of leaves gives their values as the
        program sees them)."""
        with precision(self.dtype):
            return self.function(mode)(self.bind(inputs, given=given))

    def vmap(self, in_axes: Sequence[int | None], mode: str = "auto") -> Callable[[list], list]:
        """``args -> outputs`` vmapped over the arguments whose ``in_axes`` entry is an axis (0: a
        leading axis), compiled and cached like ``function``.  Call it within ``precision(dtype)``."""
        return vmap_function(self.program, in_axes, mode)

    def traceable(self) -> Callable[[list], list]:
        """``args -> outputs`` as a plain traceable function (nothing compiled, nothing cached),
        for a caller's own ``jax.vjp``, ``jax.grad`` or ``jax.jit``."""
        return self.program.skeleton().run

    def is_compiled(self) -> bool:
        """Whether the compile cache holds this program's function, plain or vmapped over any axes."""
        return is_compiled(run_key(self.program)) or is_compiled_any((self.program.key, "vmap"))

    def __repr__(self):
        return f"<Lowered {len(self)} nodes, {len(self.args)} arguments, {self.dtype}>"
