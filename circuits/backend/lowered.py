"""``Lowered``: a circuit lowered to one program, the backend's door for the layers above it.

``Lowered(roots, dtype, given=...)`` lays ``roots`` out as one ``Program`` and offers what a caller
above the backend does with it, each through the one implementation the evaluation paths share:

- ``bind(inputs, given=...)``: the argument values, every one checked before anything runs
  (``circuits.backend.binding.bind_arguments``: unbound or misshapen Symbols, placeholder
  Arrays, ints that would wrap, and indices outside the axis a gather reads);
- ``function(mode)`` / ``run(inputs)``: the program as a function of its arguments, compiled
  under the one jit policy and from the one compile cache (key ``(key, 'run')``);
- ``vmap(in_axes)``: the same vmapped over arguments with a leading axis (key ``(key, 'vmap',
  in_axes)``); ``traceable()``: the plain function, for a caller's own JAX transformation;
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

from ..nodes import Circuit
from .binding import bind_arguments, float_dtype, precision
from .program import ARGUMENT_TYPES, Program
from .runtime import cached_jit, is_compiled, is_compiled_any
from .tiers import maybe_jit

__all__ = ["Lowered"]


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

    __slots__ = ("program", "dtype")

    def __init__(self, roots: Circuit | Sequence[Circuit], dtype="float32", *,
                 given: Collection[Circuit | bytes] = ()):
        self.dtype = float_dtype(dtype)
        roots = [roots] if isinstance(roots, Circuit) else list(roots)
        hashes = {g.hash if isinstance(g, Circuit) else g for g in given}
        self.program = Program(roots, self.dtype, given=hashes)

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
            return bind_arguments(self.program, inputs, self.dtype, given=given)

    def bind_batched(self, inputs: Mapping | None = None) -> tuple[list, list]:
        """``(argument values, batch axes)``: as ``bind``, where a Symbol's value may carry one
        leading batch axis more than the Symbol (its axis is then 0, else None)."""
        with precision(self.dtype):
            return bind_arguments(self.program, inputs, self.dtype, batched=True)

    def cached(self, tag: tuple, make: Callable[[], Callable]) -> Callable:
        """``jax.jit`` of ``make()``, a caller's own function of this program (a gradient, a vmap
        with a reduction), in the one compile cache under this program's key and ``tag``."""
        return cached_jit((self.program.key, *tag), make)

    def function(self, mode: str = "auto") -> Callable[[list], list]:
        """``args -> outputs``: compiled (from the compile cache) or not, as the jit policy decides
        for ``mode``: ``'auto'``, ``'jit'``, or ``'uncompiled'`` (the program's skeleton as it is,
        each operation dispatched by JAX; ``'eager'`` is its former name).  Call it within
        ``precision(dtype)`` (``circuits.backend.precision``: float64 needs JAX's x64 mode)."""
        program = self.program
        return maybe_jit((program.key, "run"), len(program), mode, lambda: program.skeleton().run)

    def run(self, inputs: Mapping | None = None, *, given: Mapping | None = None, mode: str = "auto") -> list:
        """The values of the roots (device arrays): ``bind`` then ``function(mode)``.
        ``mode='uncompiled'`` compiles nothing (a program of leaves gives their values as the
        program sees them)."""
        with precision(self.dtype):
            return self.function(mode)(self.bind(inputs, given=given))

    def vmap(self, in_axes: Sequence[int | None], mode: str = "auto") -> Callable[[list], list]:
        """``args -> outputs`` vmapped over the arguments whose ``in_axes`` entry is an axis (0: a
        leading axis), compiled and cached like ``function``.  Call it within ``precision(dtype)``."""
        import jax

        program = self.program
        in_axes = tuple(in_axes)

        def make():
            return jax.vmap(program.skeleton().run, in_axes=(list(in_axes),))

        return maybe_jit((program.key, "vmap", in_axes), len(program), mode, make)

    def traceable(self) -> Callable[[list], list]:
        """``args -> outputs`` as a plain traceable function (nothing compiled, nothing cached),
        for a caller's own ``jax.vjp``, ``jax.grad`` or ``jax.jit``."""
        return self.program.skeleton().run

    def is_compiled(self) -> bool:
        """Whether the compile cache holds this program's function, plain or vmapped over any axes."""
        key = self.program.key
        return is_compiled((key, "run")) or is_compiled_any((key, "vmap"))

    def __repr__(self):
        return f"<Lowered {len(self)} nodes, {len(self.args)} arguments, {self.dtype}>"
