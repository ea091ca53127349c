"""Sweeps: many variants of a circuit evaluated together, sharing their common work.

``sweep(circuit, variants)`` evaluates every variant (a dict name -> circuit, typically ``circuit``
with some nodes replaced: ablations, patches, path patches) the way one would by hand, without
paying for what the variants share:

1. **Common work, once.**  The nodes of the base circuit, and the nodes that two or more variants
   share (e.g. a corrupted forward pass read by many path patches), are *common*.  They are
   computed by one program, once.
2. **Each variant's own part, abstracted.**  A variant's own part is the set of its nodes that are
   not common.  Its leaves (the common nodes it reads, its own Arrays, Scalars and Symbols) become
   *arguments*: the part is lowered with them as given values, so two variants whose own parts
   differ only in which values they read (an ablation constant here or there, which head's output
   is patched, which receiver is rebuilt) lower to the same program key.  Before lowering, the
   children of every Add in the own part are put in a fixed order (arguments first, then computed
   terms; each group in its original order), so that e.g. rebuilding head 2 or head 5 of a layer
   gives one program.  Addition is commutative: the value is the same, summed in another order (so
   it may differ from one-at-a-time evaluation in the last bits of a float).
3. **One compiled program per group.**  Variants with the same key form a group evaluated by one
   program ``vmap``-ed over the arguments that differ between them (stacked along a new axis),
   in chunks whose size bounds memory (a short last chunk is padded, so one compiled function
   serves every chunk); arguments that every variant of the group shares are passed once.  A
   variant with big own values (``LOOP_FROM_BYTES``) is called alone through the same compiled
   program instead: on the CPU vmap only adds work there.

The 16 single-head zero-ablations of the seed model are one group; exact path patching of every
layer-0 head into every layer-1 head's queries, keys and values and of every head into the logits
is five groups.  The result is a ``SweepResult``: a mapping name -> numpy array, with the base
circuit's value, a table of reduced values and their change from the base (``table()``, also the
notebook view), and ``reduce``.

>>> import numpy as np, circuits as C
>>> from circuits.interp import sweep
>>> x = C.Array(np.arange(4, dtype=np.float32), name='x')
>>> terms = [C.Einsum.from_spec('a,->a', x, C.Scalar(float(k))) for k in range(3)]
>>> total = C.Add(*terms, name='total')
>>> zero = C.Array(np.zeros(4, np.float32), name='zero')
>>> variants = {f'drop{k}': C.traversal.replace(total, {terms[k]: zero}) for k in range(3)}
>>> result = sweep(total, variants, mode='jit')
>>> result['drop1']
array([0., 2., 4., 6.], dtype=float32)
>>> result.reduce(np.sum)
{'drop0': 18.0, 'drop1': 12.0, 'drop2': 6.0}
>>> result.info['programs']
1
>>> sweep(total, variants, mode='ops').info['tier']     # op by op over the value cache
'ops'
"""

from __future__ import annotations

import collections
import contextlib
from typing import Callable, Mapping

import numpy as np

from ..backend import (
    Lowered,
    RunInfo,
    check_mode,
    compile_seconds,
    float_dtype,
    has_batch_axis,
    precision,
    run_variants,
)
from ..errors import CircuitError, printable
from ..nodes import Add, Array, Circuit, Scalar, Symbol
from ..progress import SilentBar
from ..progress import progress as progress_bar
from ..text.html import escape
from ..traversal import replace, toposort

__all__ = ["sweep", "SweepResult", "SWEEP_MEMORY", "LOOP_FROM_BYTES", "OPTIMIZE_FROM", "ROWS_FROM"]

ARGUMENT_TYPES = Lowered.ARGUMENT_TYPES  # the leaves: arguments of every program

# Default bound on the bytes of the values one chunk of a group computes (the sum of the sizes of
# a variant's own nodes, times the chunk): it decides how many variants run in one vmap.
SWEEP_MEMORY = 1 << 30
# A variant whose own values take at least this many bytes runs alone, through the group's one
# compiled program without ``vmap``: on the CPU, vmap-ing big programs only adds work (a variant of
# the seed model's path patching, ~180 MB of its own values, took 2.6x longer vmapped in a chunk
# of one, and 1.2-1.5x longer in chunks of 2 to 8, than called alone), while small programs gain
# from sharing one call.
LOOP_FROM_BYTES = 16 << 20
# ``optimize='auto'`` rewrites the program of a group of big variants with at least this many
# members: on the seed model the rewrite and its larger compiled program cost about 0.4 s per
# group on this CPU and save about 65 ms per variant.
OPTIMIZE_FROM = 16
# A sweep over a dataset op by op runs its variants as rows of one kernel per node
# (``run_variants``: a kernel call serves many variants, as for one prompt) when the variants times
# the base circuit's nodes reach this many, and one variant after the other below: rows need
# kernels over the variants (compiled once per shape, kept on disk), which a small sweep does not
# repay, while one by one reuses the clean run's kernels (nothing compiles after the clean run) but
# pays each node's call for each variant (GPT-2 small's 144 head patches over 8 prompts: 1.2 s a
# variant one by one, 0.65 s as rows).
ROWS_FROM = 20_000
# A progress bar (tqdm) is shown by default from this many variants on.
PROGRESS_FROM = 32


class SweepResult(Mapping):
    """The values of a sweep: a mapping variant name -> numpy array (in the order given), with
    ``base`` (the base circuit's value) and ``info`` (how the sweep ran: ``variants``,
    ``programs`` — distinct programs run for the variants —, ``common_nodes``, ``chunks``,
    ``optimized`` — programs rewritten by ``rewrites.optimize``).

    ``reduce(fn)`` maps each value through ``fn`` (default ``np.mean``); ``effects(fn)`` gives
    ``fn(value) - fn(base)``; ``table(fn)`` prints both (``_repr_html_`` is the notebook view);
    ``stack()`` stacks the values along a new first axis.
    """

    def __init__(self, values: dict, base, info: dict):
        self._values = values
        self.base = base
        self.info = info

    def __getitem__(self, name):
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def reduce(self, fn: Callable = np.mean) -> dict:
        """``{name: fn(value)}`` (a 0-d result becomes a Python number)."""
        return {k: _plain(fn(v)) for k, v in self._values.items()}

    def effects(self, fn: Callable = np.mean) -> dict:
        """``{name: fn(value) - fn(base)}``: the change each variant makes, reduced."""
        b = fn(self.base)
        return {k: _plain(fn(v) - b) for k, v in self._values.items()}

    def stack(self) -> np.ndarray:
        """The values stacked along a new first axis, in the order of the names."""
        return np.stack(list(self._values.values()))

    def _rows(self, fn, sort, limit):
        values, effects = self.reduce(fn), self.effects(fn)
        names = list(values)
        if sort:
            names.sort(key=lambda k: -abs(float(np.mean(effects[k]))))
        return [(k, values[k], effects[k]) for k in names[:limit]], len(names)

    def table(self, fn: Callable = np.mean, *, sort: bool = False, limit: int | None = None) -> str:
        """A text table: each variant's ``fn(value)`` and its change from the base's.  ``sort=True``
        puts the largest changes first; ``limit`` keeps that many rows."""
        rows, total = self._rows(fn, sort, limit)
        label = getattr(fn, "__name__", "value")
        head = ("variant", label, f"{label} - base")
        body = [(printable(str(k)), _fmt(v), _fmt(e, signed=True)) for k, v, e in rows]  # names shown escaped
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(3)]
        lines = [f"{head[0]:<{widths[0]}}  {head[1]:>{widths[1]}}  {head[2]:>{widths[2]}}"]
        lines.append(f"{'(base)':<{widths[0]}}  {_fmt(_plain(fn(self.base))):>{widths[1]}}  {'':>{widths[2]}}")
        lines += [f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}" for a, b, c in body]
        if len(rows) < total:
            lines.append(f"... {total - len(rows)} more")
        return "\n".join(lines)

    def __repr__(self):
        return (f"<SweepResult: {len(self)} variants, {self.info.get('programs')} programs>\n"
                + self.table(limit=20))

    def _repr_html_(self):
        rows, total = self._rows(np.mean, False, 200)
        cells = "".join(f"<tr><td>{escape(str(k))}</td><td>{_fmt(v)}</td><td>{_fmt(e, signed=True)}</td></tr>"
                        for k, v, e in rows)
        more = f"<p>... {total - len(rows)} more</p>" if len(rows) < total else ""
        return (f"<p>sweep: {len(self)} variants, {self.info.get('programs')} programs</p>"
                "<table><tr><th>variant</th><th>mean</th><th>mean - base</th></tr>"
                f"<tr><td>(base)</td><td>{_fmt(_plain(np.mean(self.base)))}</td><td></td></tr>{cells}</table>{more}")


def _plain(v):
    arr = np.asarray(v)
    return arr.item() if arr.ndim == 0 else arr


def _fmt(v, signed=False):
    if isinstance(v, (int, float)):
        return f"{v:+.6g}" if signed else f"{v:.6g}"
    return f"array{list(np.shape(v))}"


# ---------------------------------------------------------------------------- planning
class _Own:
    """One variant's own part, lowered with its leaves as given values."""

    __slots__ = ("name", "root", "lowered", "args")

    def __init__(self, name, root: Circuit, lowered: Lowered):
        self.name = name
        self.root = root
        self.lowered = lowered
        self.args = lowered.args


def _check_variants(circuit, variants):
    if not isinstance(circuit, Circuit):
        raise CircuitError(f"sweep: the base circuit must be a circuit node, got {type(circuit).__name__}")
    if not isinstance(variants, Mapping):
        raise CircuitError(f"sweep: variants must be a dict {{name: circuit}}, got {type(variants).__name__}")
    for name, v in variants.items():
        if not isinstance(v, Circuit):
            raise CircuitError(
                f"sweep: variant {name!r} is a {type(v).__name__}, not a circuit; give each variant as a "
                "circuit (e.g. circuit.update(...))")


def _is_given(node, common) -> bool:
    return node.hash in common or type(node) in ARGUMENT_TYPES


def _ordered_own_part(root: Circuit, common: set) -> Circuit:
    """``root`` with every Add of its own part taking its given children first (see step 2 of the
    module docstring); the rest unchanged."""
    new: dict[bytes, Circuit] = {}
    for node in toposort(root, stop=lambda n: _is_given(n, common)):
        if _is_given(node, common):
            new[node.hash] = node
            continue
        kids = tuple(new[c.hash] for c in node.children)
        if type(node) is Add and len(kids) > 1:
            kids = tuple(sorted(kids, key=lambda k: not _is_given(k, common)))
        new[node.hash] = node.with_children(kids)
    return new[root.hash]


def _plan(circuit, variants, fdt):
    """Common node hashes, the variants computed by the common program, and the own parts."""
    base = {n.hash for n in toposort(circuit)}
    counts: collections.Counter = collections.Counter()
    new_nodes = {}
    for name, v in variants.items():
        mine = [n for n in toposort(v, stop=lambda n: n.hash in base) if n.hash not in base]
        new_nodes[name] = mine
        counts.update(n.hash for n in mine)
    common = set(base)
    common.update(h for h, k in counts.items() if k > 1)
    own, direct = {}, {}
    for name, v in variants.items():
        if _is_given(v, common):
            direct[name] = v
            continue
        ordered = _ordered_own_part(v, common)
        given = {n.hash for n in toposort(ordered, stop=lambda n: _is_given(n, common)) if _is_given(n, common)}
        own[name] = _Own(name, ordered, Lowered(ordered, fdt, given=given))
    return common, direct, own


# ---------------------------------------------------------------------------- values
class _Values:
    """Values of the common nodes and leaves the own parts read (device values, computed by one
    program for the non-leaves; the leaves bound by the backend's one binder, as a program of
    leaves sees them: checked, Scalars broadcast)."""

    def __init__(self, circuit, needed: list, inputs, fdt):
        self.fdt = fdt
        self.values: dict[bytes, object] = {}
        computed = [n for n in needed if type(n) not in ARGUMENT_TYPES]
        outs = Lowered([circuit, *computed], fdt).run(inputs)
        self.base = outs[0]
        for node, value in zip(computed, outs[1:]):
            self.values[node.hash] = value
        leaves = [n for n in needed if type(n) in ARGUMENT_TYPES and n.hash not in self.values]
        if leaves:  # nothing to compute: op by op, the program gives its bound arguments back
            for node, value in zip(leaves, Lowered(leaves, fdt).run(inputs, mode="uncompiled")):
                self.values[node.hash] = value

    def of(self, node):
        return self.values[node.hash]


def _own_bytes(own: _Own, fdt) -> int:
    """Bytes of the values one variant computes itself (its own part, arguments excluded)."""
    item = np.dtype(fdt).itemsize
    program = own.lowered.program
    given = set(program.arg_slots)
    return sum(node.numel * item for i, node in enumerate(program.nodes) if i not in given)


def _chunk_size(per_variant: int, n: int, batch_size) -> int:
    """Variants per call for a group of ``n`` whose own values take ``per_variant`` bytes each."""
    if batch_size is not None:
        return max(1, min(int(batch_size), n))
    if per_variant >= LOOP_FROM_BYTES:
        return 1
    most = max(1, min(n, SWEEP_MEMORY // max(1, per_variant)))
    chunks = -(-n // most)
    return -(-n // chunks)  # as even as possible: little padding in the last chunk


def _progress(total: int, progress, total_cost: float | None = None):
    """The sweep's bar (``circuits.progress``: shown where bars are, ``CIRCUITS_PROGRESS``), or
    None; its time left comes from the work done, compilation left out (``compile_seconds``), the
    variants weighing ``total_cost`` together where given (``bar.update(n, cost=)``)."""
    if progress is False or (progress is None and total < PROGRESS_FROM):
        return None
    try:
        import tqdm.auto  # noqa: F401
    except ImportError:
        if progress:
            raise CircuitError("sweep(progress=True) needs tqdm: pip install tqdm (or 'circuits[notebook]')") from None
        return None
    bar = progress_bar(total=total, desc="sweep", unit="variant", enabled=True if progress else None,
                       total_cost=total_cost, one_off=compile_seconds)
    return None if isinstance(bar, SilentBar) else bar


@contextlib.contextmanager
def _bar(total: int, progress, total_cost: float | None = None):
    """``_progress``'s bar (or None) for the block, closed however the block ends."""
    bar = _progress(total, progress, total_cost)
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()


def _ops_result(values: dict, base, computed: int, **extra) -> SweepResult:
    """The result of a sweep run op by op (no programs): ``computed`` nodes, ``extra`` info."""
    info = {"variants": len(values), "programs": 0, "common_nodes": 0, "chunks": 0, "optimized": 0, "tier": "ops",
            **extra, "computed": computed}
    return SweepResult(values, base, info)


def _optimized(first: _Own, axes: tuple, fdt: str):
    """The group's program after ``rewrites.optimize``: its own part with every argument that
    varies, or is computed, as a Symbol (``sweep.arg{j}``, given); shared constants stay in place
    for the rewrites to see.  Returns the lowered program and, per argument, ``j`` or None (a
    constant, bound by the program)."""
    import rewrites

    symbols = {j: Symbol(node.shape, name=f"sweep.arg{j}", dtype=node.dtype)
               for j, (node, axis) in enumerate(zip(first.args, axes))
               if axis is not None or type(node) not in (Array, Scalar)}
    abstract = replace(first.root, {first.args[j]: sym for j, sym in symbols.items()})
    lowered = Lowered(rewrites.optimize(abstract), fdt, given=list(symbols.values()))
    j_of = {sym.hash: j for j, sym in symbols.items()}
    return lowered, [j_of.get(n.hash) for n in lowered.args]


def _run_group(members: list, values: _Values, chunk: int, bar, optimize: bool, cost: float = 1.0) -> dict:
    """Values of one group's variants (same program key): one function vmapped over the
    arguments that differ (a lone variant runs without vmap); ``cost``: one variant's weight on
    the bar."""
    import jax.numpy as jnp

    first = members[0]
    # every variant's arguments through the backend's binder: its own leaves are checked there
    # (e.g. tokens against the vocabulary of the gather they feed), as evaluate checks them
    bound = [m.lowered.bind(given=values.values) for m in members]
    n_args = len(first.args)
    axes = tuple(None if all(m.args[j] == first.args[j] for m in members) else 0 for j in range(n_args))
    lowered, where = first.lowered, list(range(n_args))
    if optimize:
        lowered, where = _optimized(first, axes, values.fdt)
    # the program's arguments: group argument ``j`` where given, else a constant it binds itself
    template = lowered.bind(given=dict.fromkeys(n.hash for n, j in zip(lowered.args, where) if j is not None))

    def arguments(value_of) -> list:
        return [t if j is None else value_of(j) for t, j in zip(template, where)]

    out = {}
    if len(members) == 1 or chunk == 1:
        # one variant per call: the plain program (vmap over one would only add work)
        run = lowered.function()
        for m, args in zip(members, bound):
            out[m.name] = np.asarray(run(arguments(args.__getitem__))[0])
            if bar is not None:
                bar.update(1, cost=cost)
        return out
    fn = lowered.vmap([None if j is None else axes[j] for j in where])
    for start in range(0, len(members), chunk):
        part = list(range(start, min(start + chunk, len(members))))
        padded = part + [part[-1]] * (chunk - len(part))
        args = arguments(lambda j: bound[0][j] if axes[j] is None else jnp.stack([bound[i][j] for i in padded]))
        result = np.asarray(fn(args)[0])
        for k, i in enumerate(part):
            out[members[i].name] = result[k]
        if bar is not None:
            bar.update(len(part), cost=cost * len(part))
    return out


def sweep(circuit: Circuit, variants: Mapping, inputs: Mapping | None = None, *, dtype="float32",
          batch_size: int | None = None, progress: bool | None = None, optimize: bool | str = "auto",
          mode: str = "auto") -> SweepResult:
    """Evaluate every variant in ``variants`` (name -> circuit), sharing the work they have in
    common with ``circuit`` and with each other; see the module docstring for how.

    - ``inputs`` binds Symbols (of the base circuit and of the variants), as for ``evaluate``;
      values with a leading batch axis (a dataset) give every variant's value on every row,
      batch axis first: op by op as ``evaluate_batched`` runs a new circuit (the base's values
      computed once and read by every variant), one variant after the other for a small sweep
      (nothing compiles after the clean run) and, from ``ROWS_FROM`` variants x base nodes, the
      variants as rows of one kernel per node over the variants and the rows at once (as for
      one prompt; those kernels compile once per shape and are kept on disk), and in
      ``'jit'`` (and ``'auto'`` for a sweep run whole before) variants of one structure (a site
      patched at each position, ``patch(..., positions=p)``) run as one compiled program vmapped
      over them and over the rows (``info['groups']``), so a (site x position) grid is one call
      (``patch_grid`` builds it for you, one program for every site).
    - ``dtype``: ``'float32'`` (default) or ``'float64'``, as for ``evaluate``.
    - ``batch_size``: how many variants of one group run in one vmapped call (default: as many as
      fit ``SWEEP_MEMORY`` bytes of their own values; one, called without vmap, when a variant's
      own values take ``LOOP_FROM_BYTES`` or more).
    - ``progress``: a tqdm progress bar (``tqdm.auto``: the notebook widget in Jupyter); by
      default shown from ``PROGRESS_FROM`` variants on where progress bars are shown (a terminal
      or a notebook; ``CIRCUITS_PROGRESS=0/1`` silences or forces them, see ``circuits.progress``)
      when tqdm is installed.  Its time left comes from the variants done, their programs'
      compilation left out: a first compiled chunk is not extrapolated over the rest.
    - ``optimize``: ``True`` rewrites each group's program with ``rewrites.optimize`` before
      compiling it (once per group): e.g. a loss's gathered ``log_softmax`` becomes a gathered
      logit minus a chunked ``logsumexp``, which saves about a third of each path-patching
      variant of the seed model.  ``'auto'`` (the default) does so for the groups of at least
      ``OPTIMIZE_FROM`` variants that are big (``LOOP_FROM_BYTES`` of their own values each),
      where the work saved outweighs the rewrite's and the compilation's cost; ``False`` never.  The values are the same up to float rounding.
    - ``mode``: ``'jit'`` runs the groups' compiled programs as above; ``'ops'`` evaluates each
      variant op by op through the kernels cached per operation, over the process's value cache
      (``circuits.backend.tiers.op_by_op``: the common work is computed once and shared through the
      cache, each variant computes only its own part, and nothing is compiled whole);
      ``'auto'`` (default) takes the compiled programs when every group's is compiled already
      (a sweep of a structure swept before) and runs op by op otherwise (a first sweep answers
      without waiting for XLA).  ``info['tier']`` says which ran.

    Each value equals ``evaluate(variant, inputs)`` (summed in another order where an Add's
    terms were reordered, see the module docstring).

    >>> import numpy as np, circuits as C
    >>> x = C.Symbol((3,), name='x')
    >>> y = C.GeneralFunction('exp', x, name='y')
    >>> r = sweep(y, {'double': C.Add(y, y), 'plus_x': C.Add(y, x)}, {'x': np.zeros(3)})
    >>> r['double'], r['plus_x'], r.base
    (array([2., 2., 2.], dtype=float32), array([1., 1., 1.], dtype=float32), array([1., 1., 1.], dtype=float32))
    """
    _check_variants(circuit, variants)
    fdt = float_dtype(dtype)
    if batch_size is not None and int(batch_size) < 1:
        raise CircuitError(f"sweep: batch_size={batch_size}: give a positive number of variants")
    if mode not in ("auto", "jit", "ops", "eager"):  # 'eager': the former name of 'ops'
        raise CircuitError(f"sweep: mode={mode!r}: give 'auto', 'jit' or 'ops'")
    mode = check_mode(mode)
    if mode == "numpy":  # pinned: a sweep runs JAX's kernels op by op
        mode = "ops"
    if optimize not in (True, False, "auto"):
        raise CircuitError(f"sweep: optimize={optimize!r}: give True, False or 'auto'")
    structure = (circuit.hash, tuple(v.hash for v in variants.values()), fdt, batch_size)
    if has_batch_axis(circuit, inputs):
        # over a dataset: op by op (each variant over the rows, computing what it changes) unless
        # this sweep ran whole before, as for one row
        structure = (*structure, _layout(inputs))
        if mode == "ops" or (mode == "auto" and structure not in _SWEPT_WHOLE):
            if len(variants) * len(toposort(circuit)) >= ROWS_FROM:
                return _sweep_batched_rows(circuit, variants, inputs, fdt, progress)
            return _sweep_batched_each(circuit, variants, inputs, fdt, progress)
        _remember_whole(structure)
        return _sweep_batched(circuit, variants, inputs, fdt, progress)
    if mode == "ops" or (mode == "auto" and structure not in _SWEPT_WHOLE):
        return _sweep_op_by_op(circuit, variants, inputs, fdt, progress)
    common, direct, own = _plan(circuit, variants, fdt)
    if mode == "auto" and not _all_compiled(own, batch_size):
        return _sweep_op_by_op(circuit, variants, inputs, fdt, progress)
    _remember_whole(structure)
    needed: dict[bytes, Circuit] = {}
    for part in own.values():
        for a in part.args:
            needed.setdefault(a.hash, a)
    for v in direct.values():
        needed.setdefault(v.hash, v)
    groups: dict[bytes, list[_Own]] = {}
    for part in own.values():
        groups.setdefault(part.lowered.key, []).append(part)
    results: dict = {}
    chunks = optimized = 0
    with precision(fdt):
        values = _Values(circuit, list(needed.values()), inputs, fdt)
        for name, v in direct.items():
            results[name] = np.asarray(values.of(v))
        per_variants = {key: _own_bytes(members[0], fdt) for key, members in groups.items()}
        with _bar(len(own), progress, sum(per_variants[k] * len(m) for k, m in groups.items())) as bar:
            for key, members in groups.items():
                per_variant = per_variants[key]
                chunk = _chunk_size(per_variant, len(members), batch_size)
                chunks += -(-len(members) // chunk)
                opt = optimize is True or (optimize == "auto" and len(members) >= OPTIMIZE_FROM
                                           and per_variant >= LOOP_FROM_BYTES)
                optimized += opt
                results.update(_run_group(members, values, chunk, bar, opt, per_variant))
        base = np.asarray(values.base)
    info = {"variants": len(variants), "programs": len(groups), "common_nodes": len(common), "chunks": chunks,
            "optimized": optimized, "tier": "jit"}
    return SweepResult({name: results[name] for name in variants}, base, info)


def _sweep_batched(circuit, variants, inputs, fdt, progress) -> SweepResult:
    """Every variant over a dataset (inputs with a leading batch axis), values batch axis first.
    Variants of one structure (the same program but for the values of some Arrays: a site patched
    at other positions, an ablation with other constants) are one group: one compiled program,
    ``vmap``-ed over the variants (the Arrays that differ, stacked) and over the rows, so what does
    not depend on those Arrays (the clean run below the site, the source) is computed once; a
    group of one runs as ``evaluate_batched`` does."""
    import jax

    from ..backend import evaluate_batched

    results = {}
    groups: dict[bytes, list] = {}
    for name, v in variants.items():
        lowered = Lowered(v, fdt)
        groups.setdefault(lowered.key, []).append((name, lowered))
    compiled = 0
    with _bar(len(variants), progress) as bar:
        base = np.asarray(evaluate_batched(circuit, inputs, dtype=fdt))
        for members in groups.values():
            if len(members) == 1:
                name, _ = members[0]
                results[name] = np.asarray(evaluate_batched(variants[name], inputs, dtype=fdt))
                compiled += 1
            else:
                first = members[0][1]
                vary = [j for j, node in enumerate(first.args) if any(m.args[j] != node for _, m in members[1:])]
                with precision(fdt):
                    args, axes = first.bind_batched(inputs)
                    stacks = {j: np.stack([np.asarray(m.bind_batched(inputs)[0][j]) for _, m in members]) for j in vary}
                    if any(axes[j] is not None for j in vary):  # pragma: no cover - Arrays carry no batch axis
                        raise CircuitError("sweep: a varying argument carries the batch axis")
                    skeleton = first.program.skeleton()
                    rows = jax.vmap(lambda a: skeleton.run(a)[0], in_axes=(list(axes),))

                    def make(rows=rows, vary=tuple(vary)):
                        def one(values, args):
                            args = list(args)
                            for j, v in zip(vary, values):
                                args[j] = v
                            return rows(args)
                        return jax.vmap(one, in_axes=(0, None))

                    fn = first.cached(("sweep_batched", tuple(axes), tuple(vary)), make)
                    chunk = _chunk_size(_variant_bytes(first, fdt, args, axes), len(members), None)
                    for start in range(0, len(members), chunk):
                        part = list(range(start, min(start + chunk, len(members))))
                        padded = part + [part[-1]] * (chunk - len(part))
                        out = np.asarray(fn([stacks[j][padded] for j in vary], args))
                        for k, i in enumerate(part):
                            results[members[i][0]] = out[k]
                compiled += 1
            if bar is not None:
                bar.update(len(members))
    info = {"variants": len(variants), "programs": compiled + 1, "common_nodes": 0, "chunks": 0,
            "optimized": 0, "tier": "jit", "batched": True, "groups": len(groups)}
    return SweepResult({name: results[name] for name in variants}, base, info)


def _variant_bytes(lowered: Lowered, fdt, args, axes) -> int:
    """Bytes of one variant's values over the whole batch (the chunk bound of a batched group)."""
    rows = next((np.shape(a)[0] for a, ax in zip(args, axes) if ax is not None), 1)
    item = np.dtype(fdt).itemsize
    return sum(node.numel * item for node in lowered.program.nodes) * rows


# Sweeps (base, variants, precision, batch size) run through compiled programs in this process:
# 'auto' looks for those programs only for these (planning a sweep costs about what running it
# op by op does).
_SWEPT_WHOLE: dict = {}


def _remember_whole(structure) -> None:
    _SWEPT_WHOLE[structure] = True
    while len(_SWEPT_WHOLE) > 256:
        _SWEPT_WHOLE.pop(next(iter(_SWEPT_WHOLE)))


def _layout(inputs) -> tuple:
    """The names and shapes of ``inputs`` (a sweep over a dataset is one structure per layout)."""
    return tuple(sorted((k if isinstance(k, str) else k.hash.hex(), tuple(np.shape(v))) for k, v in inputs.items()))


def _sweep_batched_rows(circuit, variants, inputs, fdt, progress) -> SweepResult:
    """Every variant over a dataset op by op, the variants' changed nodes computed as rows of one
    kernel per base node as for one prompt, each kernel over the variants and the prompts at once
    (``variants_over_batch``: after the clean run, nothing compiles that an earlier sweep of this
    kind compiled)."""
    from ..backend import variants_over_batch

    info = RunInfo()
    with _bar(len(variants), progress) as bar:
        step = None if bar is None else (lambda share: bar.update(share * len(variants)))
        base, values = variants_over_batch(circuit, list(variants.values()), inputs, fdt, info=info, on_group=step)
    return _ops_result(dict(zip(variants, values)), base, info.computed, batched=True)


def _sweep_batched_each(circuit, variants, inputs, fdt, progress) -> SweepResult:
    """Every variant over a dataset op by op, one after the other: ``evaluate_batched``'s op-by-op
    tier, each node through its kernel mapped over the rows, over the value cache: the base
    circuit's values (the clean run) are computed once and read by every variant, which computes
    only what it changes through the kernels every circuit of those shapes shares (after the clean
    run, nothing compiles)."""
    from ..backend import evaluate_batched, last_run

    computed = 0
    results = {}
    with _bar(len(variants), progress) as bar:
        base = np.asarray(evaluate_batched(circuit, inputs, dtype=fdt, mode="ops"))
        for name, variant in variants.items():
            results[name] = np.asarray(evaluate_batched(variant, inputs, dtype=fdt, mode="ops"))
            computed += last_run()["computed"]
            if bar is not None:
                bar.update(1)
    return _ops_result(results, base, computed, batched=True)


def _all_compiled(own: dict, batch_size) -> bool:
    """Whether every group of the sweep has its compiled program already (plain or vmapped)."""
    programs = {part.lowered.key: part.lowered for part in own.values()}
    return all(lowered.is_compiled() for lowered in programs.values())


def _sweep_op_by_op(circuit, variants, inputs, fdt, progress) -> SweepResult:
    """Every variant op by op over the value cache, the variants' changed nodes computed as rows
    of one kernel per base node (``circuits.backend.tiers.variants``): the common work once."""
    info = RunInfo()
    results = {}
    with _bar(len(variants), progress) as bar, precision(fdt):
        base, values = run_variants(circuit, list(variants.values()), inputs, fdt, info=info)
        base = np.asarray(base)
        for name, value in zip(variants, values):
            results[name] = np.asarray(value)
            if bar is not None:
                bar.update(1)
    return _ops_result(results, base, info.computed)
