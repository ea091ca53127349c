"""Batched evaluation over datasets: ``vmap`` over Symbol inputs that carry a leading batch axis,
in chunks of ``batch_size`` rows to bound memory, optionally sharded over several devices with
JAX's own sharding (``jax.sharding``): the chunk is split along the batch axis, Arrays and Scalars
are replicated, and XLA places the computation.

>>> import numpy as np
>>> from circuits import Symbol, Array, Einsum
>>> x = Symbol((3,), name='x')
>>> w = Array(np.eye(3, dtype=np.float32), name='w')
>>> y = Einsum.from_spec('a,ab->b', x, w)
>>> evaluate_batched(y, {'x': np.arange(12.0).reshape(4, 3)}, batch_size=3)
array([[ 0.,  1.,  2.],
       [ 3.,  4.,  5.],
       [ 6.,  7.,  8.],
       [ 9., 10., 11.]], dtype=float32)
"""

from __future__ import annotations

import logging
from typing import Mapping, NamedTuple

import numpy as np

from ..errors import EvaluationError
from ..nodes import Circuit
from .cache.bounded import BoundedCache
from .lower.binding import float_dtype, precision
from .lower.calling import bind_once
from .lower.lowering import (
    as_items,
    cached_program,
    expand_also,
    items_key_of,
    package_outputs,
    program_with_also,
    resolve_also,
)
from .lower.memory import INPUT_TYPES, peak_bytes, value_bytes
from .lower.program import Program
from .lower.sharding import BATCH_AXIS, Placement
from .tiers.batch_tuning import tail_sizes, tune_chunk
from .tiers.host import host_mode
from .tiers.kernels import broadcast_rows, on_cpu
from .tiers.lowered import run_function, run_key, vmap_function
from .tiers.op_by_op import OverBudget, RunInfo, run_ops
from .tiers.policy import Route, check_mode, run, worth_compiling
from .tiers.values import VALUES, Binding, cached_values

__all__ = ["evaluate_batched", "BatchPlan", "plan_batch", "DEFAULT_MEMORY_BUDGET", "ops_memory_budget",
           "variants_over_batch"]

log = logging.getLogger(__name__)

# The memory one chunk may take when no batch_size is given.  On a 2-core CPU the seed model
# (about 115 MiB of temporaries per row: its [300, 50259] logits and their log_softmax) runs 32
# rows fastest in chunks of 1-2 rows (7.3 s) and slowest all at once (20 s: page faults), so
# the budget allows about two such rows (BENCHMARKS.md, "batched").
DEFAULT_MEMORY_BUDGET = 256 << 20


def ops_memory_budget() -> int:
    """The memory one op-by-op run over a dataset may take for its new values when no
    ``memory_budget`` is given: half the value cache's bound, at least ``DEFAULT_MEMORY_BUDGET``.
    The op-by-op tier keeps its values in the value cache anyway, so rows in small chunks save
    no memory, and each chunk pays every node's call again: GPT-2 small's attribution over 8
    prompts took 5.3 s in chunks of 2 rows, 3.5 s at once (BENCHMARKS.md)."""
    return max(DEFAULT_MEMORY_BUDGET, (VALUES.max_bytes or 0) // 2)


class BatchPlan(NamedTuple):
    """How ``evaluate_batched`` splits a dataset: ``chunk`` rows at a time, each row estimated
    at ``row_bytes`` of temporaries (``circuits.backend.lower.memory``: the op-by-op peak of one row
    plus its batched inputs), within ``budget`` bytes; ``reason`` says why in words."""

    chunk: int
    row_bytes: int
    budget: int | None
    reason: str


def plan_batch(program: Program, total: int, fdt: str, batch_size: int | None = None,
               memory_budget: int | None = None, batched_args=(), row_bytes: int | None = None) -> BatchPlan:
    """The chunk size: ``batch_size`` when given, else as many rows as fit ``memory_budget``
    (default ``DEFAULT_MEMORY_BUDGET``) by the cost model, at least one and at most ``total``.

    >>> from circuits import Symbol, GeneralFunction
    >>> x = Symbol((1024,), name='x')
    >>> prog = Program([GeneralFunction('exp', x)], 'float32')
    >>> p = plan_batch(prog, 100, 'float32', memory_budget=40960, batched_args=[x])
    >>> p.chunk, p.row_bytes      # exp(x): 4096 bytes a row, and the row of x: 4096 more
    (5, 8192)
    """
    row = _row_bytes(program, fdt, batched_args) if row_bytes is None else row_bytes
    if batch_size is not None:
        chunk = min(int(batch_size), total) or 1
        return BatchPlan(chunk, row, None, f"batch_size={batch_size} given")
    budget = DEFAULT_MEMORY_BUDGET if memory_budget is None else int(memory_budget)
    if budget <= 0:
        raise EvaluationError(f"memory_budget={memory_budget}: give a positive number of bytes")
    fit = budget // row if row else total
    chunk = max(1, min(total, fit)) if total else 1
    why = (f"{chunk} of {total} rows: about {row} bytes of temporaries a row (cost model), "
           f"memory budget {budget} bytes")
    if fit < 1:
        why += " (one row is over the budget: running one at a time)"
    return BatchPlan(chunk, row, budget, why)


def _row_bytes(program: Program, fdt: str, batched_args) -> int:
    """The cost model's bytes of temporaries for one row (``program`` with its nodes)."""
    roots = [program.nodes[i] for i in program.outputs]
    order = [n for n in program.nodes if type(n) not in INPUT_TYPES]
    return peak_bytes(order, roots, fdt) + sum(value_bytes(n, fdt) for n in batched_args)


# One row's bytes of temporaries (``_row_bytes``) and matmul height (``matmul_rows``), by (program key, precision, batch axes): a
# circuit evaluated on batch after batch (a masked search) is lowered and costed once (its
# program comes from the cache of live circuits' programs, which keeps no tensor alive).
_ROW_COSTS = BoundedCache("row costs", "compiled", max_entries=1024)


def _devices(devices):
    """``None`` (JAX's default placement), ``'all'``, a count, or a sequence of jax devices."""
    if devices is None:
        return None
    import jax

    available = jax.devices()
    if isinstance(devices, str):
        if devices != "all":
            raise EvaluationError(f"devices={devices!r}: use None, 'all', a count or a list of devices")
        return available
    if isinstance(devices, int):
        if not 1 <= devices <= len(available):
            raise EvaluationError(f"devices={devices}: there are {len(available)} devices ({available})")
        return available[:devices]
    devices = list(devices)
    if not devices:
        raise EvaluationError("devices=[]: give at least one device")
    return devices


#: On the CPU, a chunk of rows whose temporaries (cost model) are at least this many bytes a row
#: runs as a ``lax.map`` over groups of rows (a scan of small vmaps, ``map_group``) instead of one
#: vmap over the whole chunk: what depends on the weights alone (the unembedding's vocabulary
#: slices, transposed weights) is computed once per chunk, not once per row, and only a group's
#: temporaries are live at once.  The seed's loss, 16 rows in one chunk: 6.5 s this way against
#: 8.9 s as one vmap and 9.6 s row by row (BENCHMARKS.md, issue 24); a hand-written
#: ``lax.map(..., batch_size=2)`` was the fastest hand-written batch in every run.
MAP_FROM_BYTES = 1 << 20
#: A group holds as many rows as make the weights' matmuls about ``MAP_GROUP_TOKENS`` rows tall
#: (``matmul_rows``: a row's positions; a power of two from ``MAP_GROUP`` to ``MAP_GROUP_MAX``):
#: a short sequence is too little work to vmap two at a time.  GPT-2 small's loss on this CPU,
#: hand-written ``lax.map``, ms a row at groups of 2, 4, 8, 16 (the rule's pick in brackets):
#: 32 tokens 104, 91, [85], 83; 64 tokens 200, [184], 216; 128 tokens [355], 370, 399 (1 row:
#: 393); the seed's 300 positions: groups of 2 fastest (issue 24).
MAP_GROUP = 2
MAP_GROUP_MAX = 16
MAP_GROUP_TOKENS = 256


def map_group(rows: float) -> int:
    """Rows a ``lax.map`` group vmaps at once when one row's weight matmuls are ``rows`` tall
    (``matmul_rows``).

    >>> map_group(300), map_group(128), map_group(64), map_group(32), map_group(1)
    (2, 2, 4, 8, 16)
    """
    group = MAP_GROUP
    while group * 2 <= MAP_GROUP_MAX and group * rows < MAP_GROUP_TOKENS:
        group *= 2
    return group


def map_chunk(cap: int, group: int, total: int) -> tuple[int, str]:
    """The rows a chunk of the map form holds: the memory plan's ``cap`` (and the dataset's
    size), rounded down to whole groups, and why in words.  Not measured: from a group up, a
    bigger chunk of the map form was faster a row at every size tried (GPT-2 small's loss, 32
    tokens, groups of 8: 99, 94, 87, 85 ms a row at 8, 16, 32, 64 rows a chunk; the seed's 16
    rows, groups of 2: 6.9, 5.9, 5.1, 4.7 s at 2, 4, 8, 16), while measuring compiled a program
    per size tried.

    >>> map_chunk(34, 8, 64)[0], map_chunk(35, 2, 16)[0], map_chunk(5, 8, 64)[0]
    (32, 16, 5)
    """
    chunk = max(1, min(cap, total))
    if chunk > group:
        chunk -= chunk % group
    return chunk, (f"{chunk} rows a chunk, a lax.map over groups of {group} rows (the memory cap, "
                   f"{cap} rows, in whole groups)")


def matmul_rows(program: Program, batched_args) -> float:
    """How tall one row's products with the weights are: the multiply-adds of the Einsums that
    contract a per-row value with a value that is the same for every row, over the elements of
    the latter (a ``[tokens, d] x [d, k]`` product: its ``tokens``); 0 with no such Einsum.

    >>> from circuits import Array, Einsum, Symbol
    >>> x = Symbol((32, 8), name='x')
    >>> prog = Program([Einsum.from_spec('td,dk->tk', x, Array(np.ones((8, 4)), name='w'))], 'float32')
    >>> matmul_rows(prog, [x])
    32.0
    """
    from ..nodes import Einsum

    per_row = {id(n) for n in batched_args}
    macs = weights = 0
    for node in program.nodes:
        if type(node) in INPUT_TYPES or not any(id(c) in per_row for c in node.children):
            continue
        per_row.add(id(node))
        if isinstance(node, Einsum):
            fixed = [c for c in node.children if id(c) not in per_row]
            if fixed:
                macs += int(np.prod(list(node.axis_sizes().values()), dtype=np.int64))
                weights += sum(int(np.prod(c.shape, dtype=np.int64)) for c in fixed)
    return macs / weights if weights else 0.0


def _row_function(program: Program, axes: tuple, how: str):
    """``args -> outputs`` for a chunk of one row: the program itself on that row (the function
    ``compile`` and ``evaluate`` use, from the same compile cache), its outputs given a batch axis
    of one.  A ``vmap`` of one row is slower on the CPU (the seed's loss 1.14x a hand-written
    ``lax.map``; the row's own program 1.02x: BENCHMARKS.md, issue 24): XLA keeps the unit batch
    axis in its contractions."""
    run = run_function(program, how)

    def one_row(part):
        outs = run([a[0] if ax == 0 else a for a, ax in zip(part, axes)])
        return [o[None] for o in outs]

    return one_row


def take_rows(value, start: int, count: int):
    """``count`` rows from ``start``, the last row repeated to fill a short final chunk (so every
    chunk has one shape and one compiled function serves them all); the value itself when that
    is all of it (indexing a device array goes through JAX's indexing in Python at every call)."""
    if start == 0 and value.shape[0] == count:
        return value
    part = value[start:start + count]
    short = count - part.shape[0]
    if short:
        if isinstance(part, np.ndarray):
            part = np.concatenate([part, np.repeat(part[-1:], short, axis=0)])
        else:
            import jax.numpy as jnp

            part = jnp.concatenate([part, jnp.repeat(part[-1:], short, axis=0)])
    return part


def _batch_size_of(program: Program, args, axes) -> int:
    sizes = {}
    for node, value, axis in zip(program.arg_nodes(), args, axes):
        if axis == 0:
            sizes.setdefault(int(value.shape[0]), []).append(node)
    if not sizes:
        raise EvaluationError(
            "evaluate_batched: no input has a batch axis; give at least one Symbol a value of shape "
            "[batch, *symbol.shape] (use evaluate() for a single example)"
        )
    if len(sizes) > 1:
        detail = "; ".join(f"{n} for {', '.join(s.line() for s in nodes[:3])}" for n, nodes in sizes.items())
        raise EvaluationError(f"evaluate_batched: batched inputs disagree on the batch size: {detail}")
    return next(iter(sizes))


def evaluate_batched(circuit: Circuit, inputs: Mapping, *, batch_size: int | None = None, dtype="float32",
                     also=None, devices=None, mode: str = "auto", return_jax: bool = False,
                     memory_budget: int | None = None, verbose: bool = False, batch_heads: bool = True,
                     mesh=None, shard=None, cache: bool = True):
    """Evaluate ``circuit`` on every row of a dataset; the result has a leading batch axis.

    Which way it runs is the tier policy's (``circuits.backend.tiers``), as for one row: a value
    known already is returned; a circuit met for the first time runs op by op over the rows,
    every node through its kernel mapped over the batch (shared by every circuit of the same
    shapes) and only the nodes the value cache does not hold computed, so that once the clean run
    over a batch is known, a patch or an ablation over the same batch computes what it changes and
    compiles nothing; a circuit run so ``jit_after`` times gets its whole program compiled in the
    background, and that runs from then on.  ``cache=False``: op by op, neither read nor keep
    values in the value cache.

    - A Symbol input of shape ``[batch, *symbol.shape]`` is batched; one of the Symbol's own
      shape is shared by every row.  All batched inputs must agree on ``batch``.
    - ``batch_size`` bounds how many rows run at once; a short last chunk is padded, so one
      compiled function serves every chunk.  When it is not given, the chunk is at most as many
      rows as fit ``memory_budget`` bytes (default ``DEFAULT_MEMORY_BUDGET``, 256 MiB; op by op,
      ``ops_memory_budget()``: half the value cache's bound, whose values it keeps anyway) by the cost
      model (``plan_batch``): a full-batch vmap whose temporaries do not fit in cache and memory is
      slower than chunks.  With neither given, the size within that bound is measured on the
      dataset's own rows (``circuits.backend.tiers.batch_tuning``; kept per program for later calls).
      The choice is logged (logger ``circuits.backend.batched``, INFO) and printed with
      ``verbose=True``.  A chunk of one row runs the program itself on the row (no ``vmap``);
      on the CPU, a chunk of rows of large work (``MAP_FROM_BYTES``) runs as a ``lax.map`` over
      groups of rows (``map_group``: 2 to 16, by how tall their matmuls are) instead of one
      ``vmap``, and its chunk is the memory bound in whole groups, not measured (``map_chunk``).
    - ``devices``: ``None`` (default device), ``'all'``, a count, or a list of jax devices to
      shard each chunk over along the batch axis (the chunk is rounded up to a multiple).
    - ``mesh`` (a ``jax.sharding.Mesh``) and ``shard`` (``{matcher: PartitionSpec}``): batched
      inputs are split along the mesh axis named ``'batch'`` (if it has one), the matched Arrays
      and Symbols as their specs say, the rest replicated (``circuits.backend.lower.sharding``); not
      with ``devices``.
    - ``also``, ``dtype``, ``mode``, ``batch_heads`` as for ``evaluate`` (``mode='ops'`` runs op by
      op; with ``devices`` or ``mesh``, the whole program runs, uncompiled in ``'ops'``);
      ``return_jax=True`` leaves results on the device(s) as jax arrays instead of copying them to
      numpy.  The chunks of the op-by-op tier hold ``batch_size`` rows, else as many as fit
      ``memory_budget`` by the cost model (not measured).

    Equals stacking ``evaluate(circuit, row_inputs)`` over rows:

    >>> from circuits import Symbol, Add
    >>> x, b = Symbol((2,), name='x'), Symbol((2,), name='b')
    >>> evaluate_batched(Add(x, b), {'x': np.ones((3, 2)), 'b': np.array([0.0, 10.0])})
    array([[ 1., 11.],
           [ 1., 11.],
           [ 1., 11.]], dtype=float32)
    """
    fdt = float_dtype(dtype)
    mode = check_mode(mode)
    if batch_size is not None and int(batch_size) < 1:
        raise EvaluationError(f"batch_size={batch_size}: give a positive number of rows")
    devs = _devices(devices)
    if devs is not None and mesh is not None:
        raise EvaluationError("evaluate_batched: give devices= or mesh=, not both")
    if shard and devs is None and mesh is None:
        raise EvaluationError("evaluate_batched: shard= needs mesh= (a jax.sharding.Mesh)")
    also = expand_also(circuit, also)
    with precision(fdt):
        return run(_Batched(circuit, inputs, fdt, also, mode, batch_size, devs, return_jax, memory_budget, verbose,
                            batch_heads and mode != "ops", mesh, shard, bool(cache)))


# The chunk of rows the op-by-op tier split a dataset into, by (fingerprint of a batched input,
# rows): a later circuit over the same dataset (a patch after the clean run) takes the same
# chunks, so that the values the clean run kept are found under their keys.
_CHUNKS = BoundedCache("dataset chunks", "values", max_entries=1024)


def _dataset_keys(binding) -> list:
    return [(fp, binding.rows) for h, fp in binding.keys.fps.items() if h in binding.keys.batched]


def known_chunk(binding) -> int | None:
    """The smallest chunk a batched input of ``binding`` ran in before (None: none known)."""
    found = [c for c in (_CHUNKS.get(k) for k in _dataset_keys(binding)) if c is not None]
    return min(found) if found else None


def remember_chunk(binding, chunk: int) -> None:
    for key in _dataset_keys(binding):
        _CHUNKS.put(key, chunk, 0)


class _Batched(Route):
    """``evaluate_batched``'s ways (see ``tiers.run`` for which): the value cache, op by op over
    the rows (``by_ops``: each node through its kernel mapped over the batch, computing only what
    the value cache does not hold; chunks of rows by the cost model), and the whole program over
    chunks of rows (``plan`` the chunks, ``whole`` runs them)."""

    def __init__(self, circuit, inputs, fdt, also, mode, batch_size, devs, return_jax, memory_budget, verbose,
                 heads, mesh, shard, cache=True):
        self.circuit, self.inputs, self.fdt, self.also, self.mode = circuit, inputs, fdt, also, mode
        self.batch_size, self.devs, self.return_jax, self.memory_budget = batch_size, devs, return_jax, memory_budget
        self.verbose, self.heads, self.mesh, self.shard, self.cache = verbose, heads, mesh, shard, cache
        self.whole_tier = "ops" if mode == "ops" else "jit"  # 'ops' over devices: the program uncompiled
        items_key = items_key_of(also)
        placed = devs is not None or mesh is not None
        # a whole program over a batch is tracked (it takes over for repeated work) like one row's
        self.key = None if items_key is None or placed else ("batched", circuit.hash, fdt, items_key, heads)
        self._parts = None

    def parts(self):
        """The op-by-op tier's binding of every row and the ``also=`` items; None where this
        batch goes whole (devices or a mesh; inputs the whole program reports on, or no rows)."""
        if self._parts is None:
            self._parts = [self._make_parts()]
        return self._parts[0]

    def _make_parts(self):
        if self.devs is not None or self.mesh is not None:
            return None
        items = as_items(self.also)
        roots = [self.circuit, *(resolve_also(self.circuit, items, self.fdt) if items else ())]
        binding = Binding(roots, self.inputs, self.fdt, batched=True)
        if binding.problems or not binding.rows:  # the whole program's binding says what is wrong (or: no rows)
            return None
        return binding, items

    def chunks(self, binding: Binding, chunk: int) -> list:
        """``[(binding, start, rows)]`` of chunks of ``chunk`` rows, the last padded with its last
        row (every chunk has one shape: one set of kernels)."""
        total, batched = binding.rows, binding.keys.batched
        out = []
        for start in range(0, total, chunk):
            part = {s: take_rows(binding.values[s.hash], start, chunk) if s.hash in batched else binding.values[s.hash]
                    for s in binding.free}
            out.append((Binding(binding.roots, part, self.fdt, batched=True), start, min(chunk, total - start)))
        return out

    def _outputs(self, parts: list, items: list, per_part: list):
        """The roots' values over every row (batch axis first) from each chunk's values."""
        pieces = []
        for (binding, _, real), outs in zip(parts, per_part):
            rows = binding.rows
            keys = binding.keys
            row_outs = []
            for root, value in zip(binding.roots, outs):
                if not keys.is_batched(root):  # the same for every row
                    value = (np.broadcast_to(value, (rows, *value.shape)) if isinstance(value, np.ndarray)
                             else broadcast_rows(value, rows))
                if self.return_jax and isinstance(value, np.ndarray):  # computed with numpy (tiers.host)
                    import jax.numpy as jnp

                    value = jnp.asarray(value)
                value = value if self.return_jax else np.asarray(value)
                row_outs.append(value[:real] if real < rows else value)
            pieces.append(row_outs)
        return package_outputs([_concat([p[k] for p in pieces], self.return_jax) for k in range(len(pieces[0]))],
                               items)

    def cached(self):
        found = self.parts() if self.cache else None
        if found is None:
            return None
        binding, items = found
        values = cached_values(binding.root_keys())
        return None if values is None else self._outputs([(binding, 0, binding.rows)], items, [values])

    def by_ops(self, groups: bool):
        """Op by op over the rows: all at once when the new values fit the memory budget
        (``memory_budget``, default ``ops_memory_budget()``; checked before anything runs), else
        in chunks of as many rows as fit; ``batch_size`` rows a chunk when given."""
        found = self.parts()
        if found is None:
            return None
        binding, items = found
        info = RunInfo()
        host = host_mode(self.mode, self.fdt, self.inputs, self.return_jax)
        total = binding.rows
        parts = None
        known = known_chunk(binding)
        if self.batch_size is not None and int(self.batch_size) < total:
            parts = self.chunks(binding, int(self.batch_size))
        elif self.batch_size is None and known is not None and known < total:
            parts = self.chunks(binding, known)  # the chunks this dataset ran in before: their values are kept
        else:
            budget = ops_memory_budget() if self.memory_budget is None else int(self.memory_budget)
            if budget <= 0:
                raise EvaluationError(f"memory_budget={self.memory_budget}: give a positive number of bytes")
            try:
                values = run_ops(binding.roots, None, self.fdt, cache=self.cache, info=info, binding=binding,
                                 max_bytes=budget, host=host)
            except OverBudget as over:
                fit = max(1, min(total, budget // max(1, over.row_bytes)))
                chunk = 1 << (fit.bit_length() - 1)  # a power of two
                self._say(f"op by op: {chunk} rows a chunk of {total} (about {over.row_bytes} bytes of new values "
                          f"a row, memory budget {budget} bytes)")
                remember_chunk(binding, chunk)
                parts = self.chunks(binding, chunk)
            else:
                return (self._outputs([(binding, 0, total)], items, [values]), self._tier(info), info.computed,
                        info.reused, info.numpy)
        per_part = [run_ops(b.roots, None, self.fdt, cache=self.cache, info=info, binding=b, host=host)
                    for b, _, _ in parts]
        return self._outputs(parts, items, per_part), self._tier(info), info.computed, info.reused, info.numpy

    def _tier(self, info) -> str:
        return ("numpy" if self.mode == "numpy" else "ops") if info.computed else "cache"

    def compile_whole(self, keep: bool = False):
        """Compile (and run once, quietly) the whole program over this batch's chunks: what
        ``'auto'`` takes for a circuit run op by op over batches ``jit_after`` times."""
        with precision(self.fdt):
            program, _ = cached_program(self.circuit, self.fdt, self.also, self.heads)
            if not worth_compiling(program, run_key(program)):
                return None
            self.verbose = False
            self.whole(quiet=True)
        return True

    def whole(self, kept: bool = False, quiet: bool = False):
        chunks = self.plan(quiet)
        if chunks.total == 0:
            return _empty_outputs(chunks.function, chunks.args, chunks.axes, chunks.items, self.return_jax)
        if self.batch_size is None and self.memory_budget is None and chunks.placement is None \
                and self.mode != "ops":
            why = chunks.tune()
            if not quiet:
                self._say(why)
        return package_outputs(chunks.run(), chunks.items)

    def plan(self, quiet: bool = False) -> "_Chunks":
        """The program, its arguments bound, and how many rows each chunk holds."""
        circuit, fdt, also, heads, devs, mesh = self.circuit, self.fdt, self.also, self.heads, self.devs, self.mesh
        if devs is None and mesh is None:
            program, items = cached_program(circuit, fdt, also, heads)
        else:  # placement reads the program's nodes
            program, items = program_with_also(circuit, fdt, also, heads)
        args, axes = bind_once(program, self.inputs, fdt, batched=True)
        total = _batch_size_of(program, args, axes)
        axes = tuple(axes)
        row_key = (program.key, fdt, axes)
        costs = _ROW_COSTS.get(row_key)
        if costs is None:
            full = program if program.nodes is not None else program_with_also(circuit, fdt, also, heads)[0]
            batched_args = [n for n, ax in zip(full.arg_nodes(), axes) if ax == 0]
            costs = (_row_bytes(full, fdt, batched_args), matmul_rows(full, batched_args))
            _ROW_COSTS.put(row_key, costs, 0)
        row, tall = costs
        plan = plan_batch(program, total, fdt, self.batch_size, self.memory_budget, row_bytes=row)
        group = (map_group(tall) if plan.row_bytes >= MAP_FROM_BYTES and devs is None and mesh is None
                 and on_cpu() else None)
        if not quiet:
            self._say(plan.reason)
        chunks = _Chunks(program, items, args, axes, total, plan, group, self.mode, self.return_jax)
        if devs is not None or mesh is not None:
            if devs is not None:
                from jax.sharding import Mesh

                mesh = Mesh(np.array(devs), (BATCH_AXIS,))
            batch_axis = BATCH_AXIS if BATCH_AXIS in mesh.axis_names else None
            chunks.place(Placement(mesh, program, self.shard, batch_axis))
        elif self.shard:
            raise EvaluationError("evaluate_batched: shard= needs mesh= (a jax.sharding.Mesh)")
        return chunks

    def _say(self, why: str | None) -> None:
        if why is not None:
            log.info("evaluate_batched: %s", why)
            if self.verbose:
                print(f"evaluate_batched: {why}")


class _Chunks:
    """A batch planned (``_Batched.plan``): ``run()`` evaluates it chunk by chunk."""

    def __init__(self, program: Program, items: list, args: list, axes: tuple, total: int, plan: BatchPlan,
                 group: int | None, mode: str, return_jax: bool):
        self.program, self.items, self.args, self.axes, self.total = program, items, args, axes, total
        self.chunk, self.row_bytes, self.group, self.mode, self.return_jax = plan.chunk, plan.row_bytes, group, mode, return_jax
        self.placement = None
        self.start = 0  # rows evaluated while measuring chunk sizes
        self.compiled: set = set()  # chunk sizes already compiled
        self.pieces: list = []
        self._made: dict = {}  # the chunk function and the one-row function, each made on first use

    def function(self, part, one_row: bool = False):
        """The outputs for ``part`` (the arguments with a chunk of rows)."""
        f = self._made.get(one_row)
        if f is None:
            how = "uncompiled" if self.mode == "ops" else self.mode
            f = self._made[one_row] = (_row_function(self.program, self.axes, how) if one_row
                                       else vmap_function(self.program, self.axes, how, self.group))
        return f(part)

    def place(self, placement) -> None:
        """Shard over ``placement``'s devices: the chunk a multiple of them, the constants placed."""
        self.placement = placement
        ways = placement.batch_devices()
        self.chunk = -(-self.chunk // ways) * ways
        unbatched = placement.place(self.args)
        self.args = [a if ax == 0 else u for a, u, ax in zip(self.args, unbatched, self.axes)]

    def tune(self) -> str | None:
        """Choose the chunk size: the CPU's map form in whole groups, else measured on the first
        rows (``batch_tuning``: those rows are real work, kept); why, in words (None: the plan's
        size stands)."""
        import jax

        if self.group is not None:
            self.chunk, why = map_chunk(self.chunk, self.group, self.total)
            return why
        self.start, self.chunk, why, self.compiled = tune_chunk(
            (self.program.key, self.axes, jax.default_backend()), self.total, self.chunk, self.row_bytes,
            self.run_chunk)
        return why

    def run_chunk(self, start: int, size: int) -> list:
        """The outputs of ``size`` rows from ``start`` (padded to ``size`` at the end), kept."""
        axes, total = self.axes, self.total
        part = [a if ax is None else take_rows(a, start, size) for a, ax in zip(self.args, axes)]
        if self.placement is not None:
            placed = self.placement.place(part, axes)
            part = [p if ax == 0 else a for a, p, ax in zip(part, placed, axes)]
        outs = self.function(part, size == 1 and self.placement is None)
        real = min(size, total - start)
        outs = [o[:real] if real < size else o for o in outs]
        self.pieces.append(outs if self.return_jax else [np.asarray(o) for o in outs])
        return self.pieces[-1]

    def run(self) -> list:
        """Every row's outputs, batch axis first: the rows not measured yet, chunk by chunk."""
        start = self.start
        for size in tail_sizes(self.total - start, self.chunk, self.compiled):
            self.run_chunk(start, size)
            start += size
        pieces = self.pieces
        return [_concat([p[k] for p in pieces], self.return_jax) for k in range(len(pieces[0]))]


def _concat(parts, as_jax: bool):
    if len(parts) == 1:
        return parts[0]
    if as_jax:
        import jax.numpy as jnp

        return jnp.concatenate(parts)
    return np.concatenate(parts)


def _empty_outputs(fn, args, axes, items, as_jax):
    import jax

    probe = [jax.ShapeDtypeStruct((1, *a.shape[1:]), a.dtype) if ax == 0 else a for a, ax in zip(args, axes)]
    shapes = jax.eval_shape(fn, probe)
    outs = [np.zeros((0, *s.shape[1:]), dtype=s.dtype) for s in shapes]
    if as_jax:
        import jax.numpy as jnp

        outs = [jnp.asarray(o) for o in outs]
    return package_outputs(outs, items)


def variants_over_batch(base: Circuit, variants: list, inputs: Mapping, fdt: str, *, info: RunInfo | None = None,
                        on_group=None) -> tuple:
    """``(value of base, [value of each variant])`` over a dataset, as numpy arrays with the batch
    axis first, the variants' changed nodes computed as rows of one kernel per base node
    (``run_variants(batched=True)``: each kernel over the variants and the prompts at once).  The
    base runs first (op by op: the clean run, its values kept), and the variants then run in the
    chunks of prompts the clean run ran in, so every value they read unchanged is found in the
    value cache.  ``on_group(fraction)``: a share of the variants is done (a progress bar's update).

    >>> from circuits import Symbol, GeneralFunction, Add
    >>> x = Symbol((2,), name='x_over_batch')
    >>> y = GeneralFunction('exp', x)
    >>> base, (double,) = variants_over_batch(y, [Add(y, y)], {'x_over_batch': np.zeros((3, 2))}, 'float32')
    >>> base.shape, double.tolist()
    ((3, 2), [[2.0, 2.0], [2.0, 2.0], [2.0, 2.0]])
    """
    from .tiers.variants import run_variants

    base_value = np.asarray(evaluate_batched(base, inputs, dtype=fdt, mode="ops"))
    binding = Binding([base, *variants], inputs, fdt, batched=True)
    total = binding.rows
    chunk = min(total, known_chunk(binding) or total)
    starts = range(0, total, chunk)
    step = None if on_group is None else (lambda n: on_group(n / len(variants) / len(starts)))
    pieces: list = []
    with precision(fdt):
        for start in starts:
            part = {s: take_rows(binding.values[s.hash], start, chunk) if s.hash in binding.keys.batched
                    else binding.values[s.hash] for s in binding.free}
            _, values = run_variants(base, variants, part, fdt, info=info, batched=True, on_group=step)
            real = min(chunk, total - start)
            pieces.append([np.asarray(v)[:real] for v in values])
    return base_value, [np.concatenate([p[k] for p in pieces]) if len(pieces) > 1 else pieces[0][k]
                        for k in range(len(variants))]
