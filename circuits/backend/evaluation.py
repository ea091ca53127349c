"""Evaluation with JAX.

A circuit is lowered in toposort order to one JAX function (``circuits.backend.lower.program``): each distinct
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
the inputs), and ``make_jaxpr(circuit, inputs)``.  Which way ``evaluate`` runs (a known value, op
by op, the whole program) is the tier policy's business (``circuits.backend.tiers.run``), shared
with ``evaluate_batched`` and the gradients.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import EvaluationError
from ..nodes import Circuit
from .batched import evaluate_batched
from .cache.background import WARM, in_background
from .cache.compiled import stable_name
from .cache.persistent import compiled_before, note_compiled
from .lower.binding import float_dtype, precision
from .lower.calling import bind_once, binder_of
from .lower.lowering import (
    as_items,
    cached_program,
    expand_also,
    items_key_of,
    package_outputs,
    program_with_also,
    resolve_also,
)
from .lower.sharding import Placement, mesh_of
from .tiers.host import host_mode
from .tiers.lowered import Lowered, run_function, run_key
from .tiers.op_by_op import RunInfo, run_ops
from .tiers.policy import Route, check_mode, run, settings, worth_compiling
from .tiers.symbols import has_batch_axis
from .tiers.values import Binding, cached_values, remember

__all__ = ["evaluate", "compile", "Compiled", "make_jaxpr"]


def _numpy_outputs(outs, items):
    return package_outputs([np.asarray(o) for o in outs], items)


def _outputs(outs, items):
    if any(isinstance(o, np.ndarray) for o in outs):  # computed with numpy (tiers.host)
        import jax.numpy as jnp

        outs = [jnp.asarray(o) if isinstance(o, np.ndarray) else o for o in outs]
    return package_outputs(list(outs), items)


def evaluate(circuit: Circuit, inputs: Mapping | None = None, *, dtype="float32", also=None,
             mode: str = "auto", batch_heads: bool = True, cache: bool = True, return_jax: bool = False):
    """Evaluate ``circuit`` and return a numpy array.

    - ``inputs`` binds Symbols: ``{symbol_or_name: value}``.  A value with one leading axis more
      than its Symbol is a batch: the circuit is evaluated on every row in one program
      (``evaluate_batched``) and the result has the batch axis first.
    - ``dtype``: float values are computed in float32 by default; ``'float64'`` on request.
    - ``also``: nodes (or names of nodes) of the circuit whose values come back from the same
      pass: the result is then ``(value, {item: value})`` keyed by the items as given; a matcher
      (``circuits.select``: ``Glob('*.attn_probs')``, ``Regex``, ``Type``, a TransformerLens hook
      name) gives every node it matches, keyed by name (by node where names repeat).
    - ``mode`` pins a tier (``circuits.backend.tiers``): ``'ops'`` runs op by op through kernels
      cached per operation, over the values already computed in this process (nothing new
      compiles for a new variant of a known model); ``'jit'`` runs one compiled program;
      ``'numpy'`` runs op by op with numpy wherever a node has a numpy op;
      ``'auto'`` (default) runs a circuit op by op until it has been evaluated ``JIT_AFTER``
      times, then compiles it whole (in the background) and runs that; op by op, a node whose
      kernel is not made yet is computed with numpy while the kernel is made in the background
      (``circuits.backend.tiers.host``: a first call compiles nothing).  ``last_run()`` says
      which tier ran.
    - ``batch_heads``: in the whole-program tier, compute a sum of per-head subcircuits as one
      computation over a head axis (``circuits.backend.lower.head_batching``); op by op, a one-head
      change recomputes only that head.
    - ``cache=False``: neither read nor keep values in the value cache (for measuring
      throughput); ``return_jax=True`` leaves the result on the device as a jax array.

    Every input is checked before anything runs; problems raise one ``EvaluationError``.

    >>> from circuits import Symbol, GeneralFunction, Add
    >>> x = Symbol((2,), name='x')
    >>> y = GeneralFunction('exp', x, name='y')
    >>> evaluate(Add(y, x), {'x': np.zeros(2)}, also=['y'])
    (array([1., 1.], dtype=float32), {'y': array([1., 1.], dtype=float32)})
    >>> evaluate(Add(y, x), {'x': np.zeros((3, 2))}).shape        # a batch of 3 rows
    (3, 2)
    """
    fdt = float_dtype(dtype)
    mode = check_mode(mode)
    also = expand_also(circuit, also)
    if has_batch_axis(circuit, inputs):
        return evaluate_batched(circuit, inputs, dtype=fdt, also=also, mode=mode, batch_heads=batch_heads,
                                return_jax=return_jax, cache=cache)
    with precision(fdt):
        return run(_Evaluation(circuit, inputs, fdt, also, mode, bool(batch_heads), cache, return_jax))


class _Evaluation(Route):
    """``evaluate``'s ways to a value: the value cache, op by op, the whole program (see
    ``tiers.run`` for which)."""

    def __init__(self, circuit, inputs, fdt, also, mode, batch_heads, cache, return_jax):
        self.circuit, self.inputs, self.fdt, self.also, self.mode = circuit, inputs, fdt, also, mode
        self.batch_heads, self.cache = batch_heads, cache
        self.out = _outputs if return_jax else _numpy_outputs
        items_key = items_key_of(also)
        # a whole program is tracked only where the also= items have a key (names, nodes)
        self.key = None if items_key is None else ("run", circuit.hash, fdt, items_key, batch_heads)
        self.cold_start = items_key is not None and not also
        self._binding = self._keys = self._program = None

    def binding(self) -> Binding:
        """The circuit with its inputs bound (checked and hashed once for every way)."""
        if self._binding is None:
            self._binding = Binding([self.circuit], self.inputs, self.fdt)
        return self._binding

    def keys(self):
        """The value cache's keys of the circuit for these inputs."""
        if self._keys is None:
            self._keys = [self.binding().root_keys()]
        return self._keys[0]

    def program(self):
        if self._program is None:
            self._program = cached_program(self.circuit, self.fdt, self.also, self.batch_heads)
        return self._program

    def from_earlier_process(self) -> bool:
        if not compiled_before(_mark(self.circuit, self.fdt, self.batch_heads)) \
                or cached_values(self.keys()) is not None:
            return False
        program, _ = self.program()
        return worth_compiling(program, run_key(program))

    def cached(self):
        if not self.cache or self.also or not self.circuit.children:  # a leaf's value is not kept
            return None
        found = cached_values(self.keys())
        return None if found is None else self.out(found, [])

    def whole(self, kept: bool = False):
        program, items = self.program()
        args = bind_once(program, self.inputs, self.fdt)
        kept_as = _kept_as(self.circuit, self.fdt, self.batch_heads) if kept else None
        values = run_function(program, "jit", kept_as)(args)
        if not self.also:
            note_compiled(_mark(self.circuit, self.fdt, self.batch_heads))
        if self.mode == "auto" and self.cache and not self.also:
            remember(self.keys(), values)
        return self.out(values, items)

    def by_ops(self, groups: bool):
        items = as_items(self.also)
        roots = [self.circuit, *(resolve_also(self.circuit, items, self.fdt) if items else ())]
        info = RunInfo()
        binding = None if items else self.binding()
        values = run_ops(roots, self.inputs, self.fdt, cache=self.cache, info=info, groups=groups, binding=binding,
                         host=host_mode(self.mode, self.fdt, self.inputs, self.out is _outputs))
        tier = ("numpy" if self.mode == "numpy" else "ops") if info.computed else "cache"
        return self.out(values, items), tier, info.computed, info.reused, info.numpy

    def compile_whole(self, keep: bool = False):
        return _compile_whole(self.circuit, self.fdt, self.also, self.batch_heads, self.inputs, keep)

    def warm(self) -> None:
        if self.cache:
            _warm_ops(self.circuit, self.inputs, self.fdt)


def _warm_ops(circuit: Circuit, inputs: Mapping | None, fdt: str) -> None:
    """After a new process's first evaluation ran whole from JAX's persistent cache: evaluate the
    circuit op by op in the background (its root too: the fused groups it meets are then those a
    variant meets), so that the op kernels are loaded and the
    clean values kept, and the first intervention that follows (an ablation of one head) computes
    only what it reaches instead of every node.  The inputs are copied now (the caller may write
    to its arrays); the thread runs in the caller's float and matmul precision."""
    import jax

    inputs = None if inputs is None else {k: np.array(v, copy=True) for k, v in inputs.items()}
    matmul = jax.config.jax_default_matmul_precision
    groups = settings().groups

    def warm():
        with precision(fdt), jax.default_matmul_precision(matmul):
            run_ops([circuit], inputs, fdt, cache=True, info=RunInfo(), groups=groups, warm=True)

    in_background(warm, name=WARM)


def _compile_whole(circuit: Circuit, fdt: str, also, batch_heads: bool, inputs, keep: bool = False) -> bool | None:
    """Compile (and run once) the whole program of ``circuit``: the tier ``'auto'`` moves to
    (None for a program over ``jit_max_ops`` distinct nodes, not already compiled: XLA's compile
    time grows with program size, and such a program stays op by op).  ``keep``: its executable
    is kept on disk for the next process's first evaluation (a new process's first circuit)."""
    with precision(fdt):
        program, _ = cached_program(circuit, fdt, also, batch_heads)
        if not worth_compiling(program, run_key(program)):
            return None
        args = bind_once(program, inputs, fdt)
        kept_as = _kept_as(circuit, fdt, batch_heads) if keep and not also else None
        for value in run_function(program, "jit", kept_as)(args):
            value.block_until_ready()
        if not also:
            note_compiled(_mark(circuit, fdt, batch_heads))
    return True


def _mark(circuit: Circuit, fdt: str, batch_heads: bool) -> bytes:
    """What marks ``circuit``'s whole program as compiled across processes (its content hash and
    the options: a program's own key holds ids, which differ between processes)."""
    return circuit.hash + _options(fdt, batch_heads)


def _options(fdt: str, batch_heads: bool) -> bytes:
    return fdt.encode() + (b"+heads" if batch_heads else b"")


def _kept_as(circuit: Circuit, fdt: str, batch_heads: bool) -> bytes | None:
    """What a new process's first program is kept on disk under (``_mark``), or None where the
    circuit computes a function a user registered: its code may differ in the next process,
    under the same name and so the same hash."""
    return stable_name(circuit, _options(fdt, batch_heads))


class Compiled(Lowered):
    """A circuit lowered once (a ``Lowered``, its program ``evaluate`` runs whole): call it with
    ``inputs`` (a dict keyed by Symbol or name).

    Array and Scalar values are uploaded to the device on first use and kept there, shared with
    every other evaluation of the same tensors (``circuits.backend.lower.binding``'s device values).

    >>> from circuits import Symbol, GeneralFunction
    >>> x = Symbol((3,), name='x')
    >>> f = compile(GeneralFunction('exp', x))
    >>> f({'x': np.zeros(3)})
    array([1., 1., 1.], dtype=float32)
    """

    def __init__(self, circuit: Circuit, *, dtype="float32", also=None, batch_heads: bool = True, mesh=None,
                 shard=None):
        self.circuit = circuit
        self.dtype = float_dtype(dtype)
        self.program, self._items = program_with_also(circuit, self.dtype, expand_also(circuit, also), batch_heads)
        self.placement = None
        self._placed = None  # the arguments placed on the mesh once, when there is no Symbol to bind
        self._binder = binder_of(self.program, self.dtype)  # the per-call fast path
        self._run = None
        if mesh is not None:
            self.placement = Placement(mesh_of(mesh), self.program, shard)
        elif shard:
            raise EvaluationError("compile: shard= needs mesh= (a jax.sharding.Mesh or a list of devices)")

    @property
    def float_dtype(self) -> str:
        return self.dtype

    def arguments(self, inputs: Mapping | None = None) -> list:
        """The argument values the compiled function gets (in ``program.arg_slots`` order): checked
        (``bind``), on the device, and placed on the mesh when there is one (``value.sharding``
        shows how; a circuit without free Symbols is placed once, later calls reuse it)."""
        if self.placement is None:
            return self.bind(inputs)
        if self._placed is not None and not inputs:
            return self._placed
        with precision(self.dtype):
            args = self.placement.place(self.bind(inputs))
        if not self.program.free_symbols():
            self._placed = args
        return args

    def __call__(self, inputs: Mapping | None = None, *, return_jax: bool = False):
        """The circuit's value for ``inputs`` (numpy; ``return_jax=True``: a jax array left on
        the device).  The arguments are bound once (``circuits.backend.lower.calling``): a call with
        inputs of shapes and dtypes seen before only checks their values' index ranges and
        runs the compiled function once."""
        with precision(self.dtype):
            args = None if self.placement is not None else self._binder.bind(inputs)
            if args is None:
                args = self.arguments(inputs)
            run = self._run
            if run is None:
                run = self._run = run_function(self.program, "jit")
            outs = run(args)
        if return_jax:
            return package_outputs(outs, self._items)
        return _numpy_outputs(outs, self._items)

    def __repr__(self):
        return f"<Compiled {len(self.program)} nodes, {self.dtype}: {self.circuit.line()}>"


def compile(circuit: Circuit, *, dtype="float32", also=None, batch_heads: bool = True, mesh=None,  # noqa: A001
            shard=None) -> Compiled:
    """Lower ``circuit`` to a jitted JAX function; ``compile(c)(inputs)`` evaluates it
    (``batch_heads`` as for ``evaluate``; ``return_jax=True`` leaves the result on the device).

    ``mesh`` (a ``jax.sharding.Mesh`` or a list of devices) and ``shard`` (``{matcher:
    PartitionSpec}``) split the matched Arrays and Symbols over the devices, the rest replicated,
    and XLA partitions the computation to match (``circuits.backend.lower.sharding``):

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

    low = Lowered(circuit, dtype)
    with precision(low.dtype):
        return jax.make_jaxpr(low.traceable())(low.bind(inputs))
