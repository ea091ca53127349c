"""Many variants of one circuit, op by op, their changed nodes computed as rows of one kernel.

A sweep's variants (ablations, patches, path patches of one circuit) are the circuit with some
nodes rebuilt: the same operations over other values.  ``run_variants`` lines each variant up with
the base circuit, from the roots down:

- a variant node equal to its base partner is *unchanged*: its value is the base's (from the
  value cache);
- a variant node computing the same operation as its partner (same type, payload and shapes) over
  other children is a *row* of that partner;
- any other variant node (a patched-in value, an ablation constant, other tokens) is *given*: it is
  evaluated op by op on its own (``run_ops``, through the value cache, so what several variants
  share is computed once).

The rows of one base node (one per distinct variant node: variants that share a rebuilt node share
its row) are computed together, by the base node's kernel ``vmap``-ed over a leading row axis, in
chunks of at most ``ROWS`` rows whose size is a power of two (on a CPU, as many as fit
``CACHE_BYTES`` of the group's biggest value that fits them), so a few kernels serve every layer of
a model; a child that is unchanged in every row of a chunk is passed once, unbatched (a weight is
never copied).  The twelve head patches of one GPT-2 layer then run the layers above it as twelve
rows of each matmul, not as twelve forwards, and layer 0 is computed once for all of them.

Over a dataset (``batched=True``: a sweep over a batch), a row holds the variant's value over the
prompts: each kernel is ``vmap``-ed over the prompts (the children that carry them) inside the
vmap over the rows, so one call computes every variant of a chunk on every prompt.  The rows of a
sum of more than two terms are all stacked (a term unchanged in every row repeated), so one kernel
serves whichever terms the variants change.

A step read by a single node, with as many rows, each read by the matching row, is computed
inside its reader's kernel when it is elementwise or moves data (a bias add, a gelu, a layer
norm's scaling, a slice before a log-softmax: ``_fusable``), up to ``FUSED`` levels deep: XLA
fuses them, and their values are never written out.  A sum of products of one form (a layer's
heads, ``z_h @ W_O[h]`` each) is computed as one product over the terms stacked: one matmul over
``heads x d_head``, not one per head of ``d_head``.

Values are freed after their last reader; variants are run in groups whose rows fit
``GROUP_BYTES``.  Each variant's value is offered to the value cache, and a variant whose value
is cached is not computed again.

>>> import numpy as np, circuits as C
>>> x = C.Symbol((3,), name='x')
>>> y = C.GeneralFunction('exp', C.Einsum.from_spec('a,->a', x, C.Scalar(2.0)), name='y')
>>> twice = [C.traversal.replace(y, {C.Scalar(2.0): C.Scalar(float(k))}) for k in range(3)]
>>> base, values = run_variants(y, twice, {'x': np.ones(3)}, 'float32')
>>> np.allclose(np.stack(values), np.exp(np.arange(3.0))[:, None]), np.allclose(base, np.exp(2.0))
(True, True)
"""

from __future__ import annotations

import collections
from typing import Mapping, Sequence

import numpy as np

from ...dtypes import dtype_str, is_float, is_int
from ...nodes import Add, Circuit, Einsum, GeneralFunction, Index, Rearrange, SetSymbolicShape, Tag
from ...traversal import toposort
from ..lower import picked_log_softmax
from ..lower.binding import raise_problems
from ..lower.numpy_ops import new_id
from ..lower.ops import build_op
from ..lower.picked_log_softmax import chain, picked_op
from ..lower.program import node_key_part
from .groups import foreground
from .kernels import broadcast_rows, cached_kernel, kernel, kernel_over_rows, on_cpu, pick_row
from .op_by_op import RunInfo, check_leaf_indices, run_ops
from .values import VALUES, Binding

__all__ = ["run_variants", "ROWS", "GROUP_BYTES"]

# Rows computed by one kernel call at most (a power of two); fewer when the node is big.
ROWS = 16
# Bytes the rows of one chunk may take (node size x rows): GPT-2 small's logits over 8 prompts
# (51 MB a row) ran a row a call at 64 MiB, 25 % slower than 4 (BENCHMARKS.md).
CHUNK_BYTES = 256 << 20
# On a CPU, a group's chunks hold at most as many rows as fit this many bytes of its biggest
# value that fits them at all (its logits aside): a product whose result stays in the last-level
# cache runs faster (GPT-2's MLP matmul 768 -> 3,072 on a 2-core EPYC with 32 MiB of L3: 143-152
# GFLOP/s for 1,024-2,048 rows of tokens, 100-113 for 4,096 and more).  One bound for every node
# of the group, so chunks line up (a bound per node measured slower: rows copied between chunks).
CACHE_BYTES = 32 << 20
# Bytes the rows of the biggest node may take for one group of variants (about three such
# values are alive at once: a node's rows, its parent's, and what is being assembled).
GROUP_BYTES = 1 << 30

_IDENTITY = (Tag, SetSymbolicShape)
# Levels of nodes one fused kernel computes at most (``_Group._fusions``).
FUSED = 8


def _rows_a_call(biggest: int, cap: int, bound: int | None = None) -> int:
    """Rows of one kernel call, a power of two, for a kernel whose biggest value takes ``biggest``
    bytes a row: at most ``cap`` (``ROWS``, or the group's bound on a CPU: ``_Group._cap``) and
    within ``bound`` bytes (``CHUNK_BYTES`` by default)."""
    bound = CHUNK_BYTES if bound is None else bound
    chunk = min(cap, max(1, bound // max(biggest, 1)))
    return 1 << (chunk.bit_length() - 1)


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


_SLOTS: dict = {}


def _payload_slots(t: type):
    """The payload fields of node type ``t`` (its own slots and those of its bases below
    ``Circuit``), None when some of them live in a ``__dict__``."""
    found = _SLOTS.get(t, False)
    if found is False:
        names: list = []
        for k in t.__mro__:
            if k is Circuit:
                break
            if "__slots__" not in k.__dict__:
                names = None
                break
            names.extend(a for a in k.__dict__["__slots__"] if a != "__weakref__")
        found = _SLOTS[t] = None if names is None else tuple(names)
    return found


class _Partners:
    """``node_key_part`` of base nodes, computed once each (a variant node is compared with it),
    and which node reads each of them where one does."""

    def __init__(self):
        self.keys: dict = {}
        self.sole: dict | None = None

    def sole_readers(self, order: list) -> dict:
        """``{node hash: its reader}`` for the nodes of the base circuit (``order``) that one
        node reads once; found once, for every group."""
        if self.sole is None:
            readers = collections.Counter(c.hash for n in order for c in n.children)
            self.sole = {c.hash: n for n in order for c in n.children if readers[c.hash] == 1}
        return self.sole

    def compatible(self, n: Circuit, m: Circuit) -> bool:
        """Whether ``m`` computes ``n``'s operation (over other children): a row of ``n``."""
        if type(m) is not type(n) or not n.children or len(m.children) != len(n.children) \
                or m.shape != n.shape or m.dtype != n.dtype:
            return False
        for a, b in zip(n.children, m.children):
            if a.shape != b.shape:
                return False
        slots = _payload_slots(type(n))
        if slots is not None:
            for a in slots:
                if getattr(m, a) is not getattr(n, a):
                    break
            else:  # the very payload (a rebuilt node copies its partner's): the same operation
                return True
        k = self.keys.get(n.hash)
        if k is None:
            k = self.keys[n.hash] = node_key_part(n)
        return node_key_part(m) == k


def run_variants(base: Circuit, variants: Sequence[Circuit], inputs: Mapping | None, fdt: str, *,
                 cache: bool = True, info: RunInfo | None = None, batched: bool = False, on_group=None) -> tuple:
    """``(value of base, [value of each variant])`` as device arrays, op by op with the variants'
    changed nodes computed as rows (see the module docstring).  Every input is checked first.
    Work in the background waits meanwhile (``groups.foreground``: the kernels numpy stood in for
    are not compiled beside the sweep's own).

    ``batched=True``: inputs may carry a leading batch axis, as for ``run_ops`` (a dataset, or
    one chunk of it); a value that depends on a batched Symbol then has it first, and a row of a
    chunk holds the variant's value over every prompt (the variants' row axis first, the batch
    axis second): each kernel runs over the variants and the prompts at once.  A variant whose
    value does not depend on a batched input is repeated over it (every value has the batch
    axis first).  ``on_group(n)`` is called as each group of ``n`` variants is done (a progress
    bar's update)."""
    with foreground():
        return _run_variants(base, variants, inputs, fdt, cache, info, batched, on_group)


def _run_variants(base, variants, inputs, fdt, cache, info, batched=False, on_group=None) -> tuple:
    info = info if info is not None else RunInfo()
    binding = Binding([base, *variants], inputs, fdt, batched)
    base, variants = binding.roots[0], binding.roots[1:]
    raise_problems(binding.problems)
    problems: list[str] = []
    bound, keys = binding.values, binding.keys
    out: list = [None] * len(variants)
    carry = [keys.is_batched(v) for v in variants]  # which values have the batch axis
    todo = []
    for i, v in enumerate(variants):
        if v.hash == base.hash:
            continue
        found = VALUES.get(keys(v)) if cache else None
        if found is not None:
            out[i] = found
            info.reused += 1
        else:
            todo.append(i)
    groups = []
    if todo:
        order = toposort(base)
        partners = _Partners()
        size = max((_bytes(n, fdt, keys) for n in order if n.children), default=1)
        group = max(ROWS, (GROUP_BYTES // (3 * max(size, 1))) // ROWS * ROWS)
        for start in range(0, len(todo), group):
            picked = todo[start:start + group]
            groups.append((picked, _Group(base, order, partners, fdt, [variants[i] for i in picked], keys)))
        _check_indices(order, [g for _, g in groups], bound, problems)
        raise_problems(problems)
    (base_value,) = run_ops([base], inputs, fdt, cache=cache, info=info, batched=batched)
    for i, v in enumerate(variants):
        if v.hash == base.hash:
            out[i] = base_value
            carry[i] = keys.is_batched(base)
    # Rows that several groups share (the corrupted run every patch reads) are computed once,
    # before the groups, op by op: the groups read them as given values, so the rows of the
    # same nodes that the variants change are fused as any others.
    known: dict = {}
    if len(groups) > 1:
        seen = collections.Counter(k for _, g in groups for k in g.rows)
        keep = frozenset(k for k, count in seen.items() if count > 1)
        if keep:
            front = {}
            for _, g in groups:
                front.update(g.read_as_given(keep))
            values = run_ops(list(front.values()), inputs, fdt, cache=cache, info=info, batched=batched)
            known = _plain_values(keys, front.values(), values)
    for picked, g in groups:
        values = g.run(inputs, cache, info, known, on_group)
        for i, (value, carries) in zip(picked, values):
            out[i] = value
            if cache and carries == carry[i]:
                VALUES.put(keys(variants[i]), value)
            carry[i] = carries
    if keys.rows is not None:  # over a batch: every value with the batch axis
        if not keys.is_batched(base):
            base_value = broadcast_rows(base_value, keys.rows)
        out = [v if c else broadcast_rows(v, keys.rows) for v, c in zip(out, carry)]
    return base_value, out


def _check_indices(order: list, groups: list, bound: dict, problems: list) -> None:
    """Range-check the int leaves the variants bring (other tokens) that reach a gather through
    rows: a row runs the base's kernel, which does not check indices, so an index outside the
    gathered axis must be reported here, as ``evaluate`` reports it, not give NaN.  Given nodes
    are otherwise checked by ``run_ops`` against the gathers inside them.

    Only the rows on an index path matter: rows of a gather, and rows of the base's nodes that
    pass an index on to one (``gather_index_ranges`` of the base).  They are put in the base's
    order (children first) after the given int nodes' own subtrees, and their ranges are found
    by the same walk ``evaluate``'s binding makes; each distinct leaf is then checked once, from
    its host copy's cached extent (an Array) or its bound value (a Symbol)."""
    given = {}
    for g in groups:
        for h, node in g.given.items():
            if is_int(node.dtype):
                given[h] = node
    if not given:
        return
    from ...io.values import gather_index_ranges

    on_path = gather_index_ranges(order)
    position = {n.hash: i for i, n in enumerate(order)}
    rows = {}
    for g in groups:
        for (mh, nh), m in g.rows.items():
            spec = getattr(m, "function", None)
            if nh in on_path or (spec is not None and spec.index_arg is not None):
                rows[mh] = (position[nh], m)
    below = toposort(*given.values())
    ranges = gather_index_ranges([*below, *(m for _, m in sorted(rows.values(), key=lambda pm: pm[0]))])
    check_leaf_indices(below, ranges, bound, problems)


def _plain_values(keys, nodes, values) -> dict:
    """``{node hash: (value, None, carries the batch axis)}``: values computed op by op, as a
    group reads them (``_Group._source``)."""
    over = keys.rows is not None
    return {n.hash: (v, None, over and keys.is_batched(n)) for n, v in zip(nodes, values)}


def _bytes(node: Circuit, fdt: str, keys) -> int:
    """Bytes of ``node``'s value (over a batch, ``keys.rows`` of them: a row of a variant may
    carry the batch axis where its partner does not)."""
    itemsize = np.dtype(fdt if is_float(node.dtype) else node.dtype).itemsize
    rows = keys.rows if keys.rows is not None else 1
    return int(np.prod(node.shape, dtype=np.int64)) * itemsize * rows


class _Group:
    """One group of variants: aligned with the base, then computed partner by partner."""

    def __init__(self, base: Circuit, order: list, partners: _Partners, fdt: str, variants: list, keys):
        self.base = base
        self.keys = keys  # the binding's: over a batch, which values carry the batch axis
        self.order = order
        self.partners = partners
        self.fdt = fdt
        self.rows: dict = {}  # (variant node hash, partner hash) -> variant node
        self.by_partner: dict = {}  # partner hash -> [row key], in the order the variants came
        self.given: dict = {}  # variant node hash -> node, evaluated on its own
        self.clean: dict = {}  # base node hash -> node, read unchanged by some row
        self.reads = [self._align(v) for v in variants]

    def _align(self, v: Circuit):
        """The rows and given nodes of variant ``v``; what its value will be read from."""
        if not self.partners.compatible(self.base, v):
            self.given[v.hash] = v
            return ("given", v.hash)
        stack = [(self.base, v)]
        rows, by_partner, given, clean = self.rows, self.by_partner, self.given, self.clean
        compatible = self.partners.compatible
        while stack:
            n, m = stack.pop()
            key = (m.hash, n.hash)
            if key in rows:
                continue
            rows[key] = m
            by_partner.setdefault(n.hash, []).append(key)
            for cn, cm in zip(n.children, m.children):
                if cm.hash == cn.hash:
                    clean[cn.hash] = cn
                elif (cm.hash, cn.hash) in rows:
                    continue
                elif compatible(cn, cm):
                    stack.append((cn, cm))
                else:
                    given[cm.hash] = cm
        return ("row", (v.hash, self.base.hash))

    def read_as_given(self, keep: frozenset) -> dict:
        """Drop the rows in ``keep`` (computed before the groups, ``_run_variants``); those that
        the group's other rows or its variants read become given values: ``{hash: node}``."""
        rows, by_partner = self.rows, self.by_partner
        dropped = {}
        for key in [key for key in rows if key in keep]:
            dropped[key[0]] = rows.pop(key)
            by_partner[key[1]].remove(key)
            if not by_partner[key[1]]:
                del by_partner[key[1]]
        if not dropped:
            return {}
        base = {n.hash: n for n in self.order}
        front = {}
        for (mh, nh), m in rows.items():
            for cn, cm in zip(base[nh].children, m.children):
                if (cm.hash, cn.hash) in keep:
                    front[cm.hash] = cm
        for i, (kind, ref) in enumerate(self.reads):
            if kind == "row" and ref in keep:
                self.reads[i] = ("given", ref[0])
                front[ref[0]] = dropped[ref[0]]
        self.given.update(front)
        return front

    def run(self, inputs, cache: bool, info: RunInfo, known=None, on_group=None) -> list:
        """The variants' values, each as ``(value, carries the batch axis)``; ``known``: values
        computed already (``(array, None, carries)`` by node hash: the rows the groups share)."""
        fdt, reads, keys = self.fdt, self.reads, self.keys
        rows = keys.rows
        known = dict(known) if known else {}
        leaves = [n for n in (*self.clean.values(), *self.given.values()) if n.hash not in known]
        if leaves:
            values = run_ops(leaves, inputs, fdt, cache=cache, info=info, batched=rows is not None)
            known.update(_plain_values(keys, leaves, values))
        # Where each row's value is: (array, None, carries) for a plain value, (array, r, carries)
        # for row r of a chunk; ``carries``: it has the batch axis (after the rows' axis).  A
        # partner's rows are dropped after the last partner that reads them.
        loc: dict = {}
        steps = [n for n in self.order if n.hash in self.by_partner]
        into = self._fusions(steps)
        top: dict = {}  # step -> the step whose kernel computes it (itself, or where it is fused)
        for j in range(len(steps) - 1, -1, -1):
            reader = into.get(steps[j].hash)
            top[steps[j].hash] = j if reader is None else top[reader]
        last: dict = {}
        for j, n in enumerate(steps):
            for c in n.children:
                last[c.hash] = max(last.get(c.hash, -1), top[n.hash])
        drop: dict = {}
        for h, j in last.items():
            if h in self.by_partner and h != self.base.hash:
                drop.setdefault(j, []).append(h)
        cap = self._cap(steps)
        computed = 0
        for j, n in enumerate(steps):
            if n.hash in into:  # computed inside its reader's kernel
                continue
            row_keys = self.by_partner[n.hash]
            if type(n) in _IDENTITY:
                for key in row_keys:
                    loc[key] = self._source(key, 0, n, loc, known)
                continue
            if len(row_keys) == 1:
                key = row_keys[0]
                args, flags = [], []
                for i in range(len(n.children)):
                    array, r, carries = self._source(key, i, n, loc, known)
                    args.append(array if r is None else pick_row(array, r))
                    flags.append(carries)
                if any(flags):
                    fn = kernel_over_rows(n, fdt, tuple(0 if f else None for f in flags), rows)
                else:
                    fn = kernel(n, fdt)
                loc[key] = (fn(*args), None, any(flags))
                computed += 1
                continue
            tree = self._tree(n, into)
            whole = tree if tree is not None else (n, (None,) * len(n.children))  # n alone: a tree of one
            terms = _sum_terms(whole)
            # The biggest value the kernel makes (a fused node's too: XLA may write it out).
            biggest = max(_bytes(m, fdt, keys) for m in _tree_nodes(whole))
            chunk = _rows_a_call(biggest, cap)
            # A node with more rows than one chunk pads its last chunk to a full one: one kernel
            # (one compilation) serves all its chunks, and its chunks line up with its parents'.
            full = len(row_keys) > chunk
            for start in range(0, len(row_keys), chunk):
                part = row_keys[start:start + chunk]
                size = chunk if full else min(chunk, _pow2_at_least(len(part)))
                if tree is None:
                    sources = [[self._source(key, i, n, loc, known) for key in part] for i in range(len(n.children))]
                else:  # the leaves of the fused nodes' tree, in its order
                    sources = [list(each) for each in zip(*[self._leaves(n, key, into, loc, known) for key in part])]
                over = rows if any(s[2] for each in sources for s in each) else None  # the batch, if any carries it
                args, axes, flags = [], [], []
                for each in sources:
                    arg, axis, carries = _assemble(each, size, over)
                    args.append(arg)
                    axes.append(axis)
                    flags.append(carries)
                if None in axes and 0 in axes and any(terms):
                    # the terms of a sum of many (a layer's heads): every term as rows, so one
                    # kernel serves whichever terms the variants change (each subset would
                    # compile its own)
                    args = [broadcast_rows(a, size) if t and x is None else a for a, x, t in zip(args, axes, terms)]
                    axes = [0 if t else x for x, t in zip(axes, terms)]
                computed += 1
                batch = tuple(0 if f else None for f in flags) if over is not None else None
                if all(a is None for a in axes):  # rows that differ only in name: one value
                    if tree is not None:
                        fn = _tree_kernel(tree, fdt, None, size, batch)
                    else:
                        fn = kernel(n, fdt) if batch is None else kernel_over_rows(n, fdt, batch, rows)
                    value = fn(*args)
                    for key in part:
                        loc[key] = (value, None, over is not None)
                    continue
                at = _int_entries(n)
                if tree is not None:
                    value = _tree_kernel(tree, fdt, tuple(axes), size, batch)(*args)
                elif at is not None:  # an Index picking a head: the head is an argument, not code
                    value = _rows_index_kernel(n, fdt, tuple(axes), size, batch)(args[0], at)
                else:
                    value = _rows_kernel(n, fdt, tuple(axes), size, batch)(*args)
                for r, key in enumerate(part):
                    loc[key] = (value, r, over is not None)
            for h in drop.get(j, ()):
                for key in self.by_partner[h]:
                    loc.pop(key, None)
        info.computed += computed
        if on_group is not None:
            on_group(len(reads))
        out = []
        for kind, ref in reads:
            array, r, carries = known[ref] if kind == "given" else loc[ref]
            out.append((array if r is None else pick_row(array, r), carries))
        return out

    def _cap(self, steps: list) -> int:
        """The most rows a chunk of this group holds: ``ROWS``, and on a CPU as many as fit
        ``CACHE_BYTES`` of the biggest value of a step that has rows and fits them (a power of
        two): every node's chunks line up."""
        if not on_cpu():
            return ROWS
        fits = [b for b in (_bytes(n, self.fdt, self.keys) for n in steps if len(self.by_partner[n.hash]) > 1)
                if b <= CACHE_BYTES]
        return _rows_a_call(max(fits), ROWS, CACHE_BYTES) if fits else ROWS

    def _fusions(self, steps: list) -> dict:
        """``{step: the step reading it}`` for the steps computed inside their reader's kernel
        (``_fusable``, or a term of ``_stacked_terms``; trees at most ``FUSED`` levels deep): an elementwise or data-moving node read by one node of the base circuit,
        that node a step too, with as many rows (more than one), each reading the matching
        row.  XLA then fuses them (a slice into the log-softmax reading it, a bias into the
        gelu after it) instead of writing each value out: one kernel call, not several."""
        sole = self.partners.sole_readers(self.order)
        by_partner, rows = self.by_partner, self.rows
        into: dict = {}
        # The slicings and the log-softmax over a product's logits a loss picks from add no level:
        # the gather's kernel computes them with the product, a block at a time (``_picked``).
        flat = set()
        for p in steps:
            h = p.hash
            n = sole.get(h)
            if n is None:
                continue
            above = _picked_readers(p, sole)
            if not (_fusable(p) or _stacked_terms(n) or above is not None):
                continue
            keys = by_partner.get(n.hash)
            if keys is None or type(n) in _IDENTITY or _int_entries(n) is not None \
                    or len(keys) < 2 or len(keys) != len(by_partner[h]):
                continue
            i = next(i for i, c in enumerate(n.children) if c.hash == h)
            if all((rows[key].children[i].hash, h) in rows for key in keys):
                into[h] = n.hash
                if above is not None:
                    flat.update(m.hash for m in above)
        depth: dict = {}  # levels of the tree under each step, children first: at most FUSED
        for n in steps:
            deepest = 0
            for c in n.children:
                if c.hash in into:
                    if depth[c.hash] >= FUSED:
                        del into[c.hash]
                    else:
                        deepest = max(deepest, depth[c.hash])
            depth[n.hash] = deepest + (n.hash not in flat)
        return into

    def _tree(self, n: Circuit, into: dict, top: bool = True):
        """``(n, (child's tree, or None for an argument, ...))`` where some child of ``n`` is
        fused into it; None where none is."""
        if top and not any(c.hash in into for c in n.children):
            return None
        return (n, tuple(self._tree(c, into, False) if c.hash in into else None for c in n.children))

    def _leaves(self, n: Circuit, key, into: dict, loc: dict, known: dict, out=None) -> list:
        """The sources of row ``key`` of ``n``'s fused tree's arguments, in the tree's order
        (a tree has at most ``FUSED`` levels: the recursion is shallow)."""
        out = [] if out is None else out
        for i, c in enumerate(n.children):
            if c.hash in into:
                self._leaves(c, (self.rows[key].children[i].hash, c.hash), into, loc, known, out)
            else:
                out.append(self._source(key, i, n, loc, known))
        return out

    def _source(self, key, i: int, n: Circuit, loc: dict, known: dict):
        """Where child ``i`` of row ``key`` (a row of ``n``) is: ``(array, row or None, carries)``."""
        cm = self.rows[key].children[i]
        cn = n.children[i]
        if cm.hash == cn.hash:
            return known[cn.hash]
        found = loc.get((cm.hash, cn.hash))
        if found is not None:
            return found
        return known[cm.hash]


def _assemble(sources: list, size: int, over: int | None):
    """One child of the rows of a chunk (``sources``: where each row's child is, padded to
    ``size`` rows): ``(value, None, carries)`` when every row reads the same plain value, else
    ``(stacked rows, 0, carries)``.  ``over``: the batch's rows when some source carries the
    batch axis (a source without it is repeated over the batch where others have it)."""
    first = sources[0]
    if first[1] is None and all(s[0] is first[0] and s[1] is None for s in sources):
        return first
    if first[1] == 0 and first[0].shape[0] == size and \
            all(s[0] is first[0] and s[1] == r for r, s in enumerate(sources)):
        return first[0], 0, first[2]  # the rows of one chunk, in order (padding rows read its padding)
    carries = over is not None and any(s[2] for s in sources)
    arrays: list = []
    offsets: dict = {}
    index = []
    for array, r, has in sources:
        at = offsets.get(id(array))
        if at is None:
            at = offsets[id(array)] = (len(arrays), sum(a.shape[0] if rows else 1 for a, rows, _ in arrays))
            arrays.append((array, r is not None, has))
        index.append(at[1] + (r or 0))
    index += [index[-1]] * (size - len(index))
    spec = tuple((rows, has) for _, rows, has in arrays)
    fn = _merge_kernel(tuple((a.shape, dtype_str(a.dtype)) for a, _, _ in arrays), spec, size,
                       over if carries else None)
    return fn(np.asarray(index, np.int32), *[a for a, _, _ in arrays]), 0, carries


def _rows_kernel(node: Circuit, fdt: str, axes: tuple, size: int, batch: tuple | None = None):
    """``node``'s kernel over ``size`` rows: ``vmap`` with the children's row axes ``axes``; over
    a batch too where ``batch`` says which children carry it (after the rows' axis)."""
    key = ("rows", node_key_part(node), node.shape, tuple(c.shape for c in node.children), fdt, axes, size, batch)

    def make():
        import jax

        op = build_op(node, fdt)
        if batch is not None:
            op = jax.vmap(op, in_axes=batch)
        return jax.vmap(op, in_axes=axes)

    return cached_kernel(key, make)


def _fusable(node: Circuit) -> bool:
    """Whether ``node`` may be computed inside its reader's kernel: elementwise or data-moving
    work (no contraction, no head picked by an int: that Index passes its head as data)."""
    t = type(node)
    if t is GeneralFunction or t is Add or t is Rearrange:
        return True
    if t is Index:
        return _int_entries(node) is None
    if t is Einsum:  # a product summing nothing (a layer norm's scale)
        out = set(node.out_axes)
        return all(x in out for axes in node.in_axes for x in axes)
    return False


def _stacked_terms(node: Circuit) -> bool:
    """Whether ``node`` sums products of the same form (a layer's heads, each ``z_h`` times its
    ``W_O[h]``): fused, they are one product over the terms stacked (a contraction over
    ``heads x d_head``, not one of ``d_head`` per head)."""
    if type(node) is not Add or len(node.children) < 2:
        return False
    first = node.children[0]
    if type(first) is not Einsum or len(first.children) != 2 or not is_float(first.dtype) \
            or first.shape != node.shape:
        return False
    shapes = tuple(c.shape for c in first.children)
    return all(type(e) is Einsum and e.in_axes == first.in_axes and e.out_axes == first.out_axes
               and tuple(c.shape for c in e.children) == shapes for e in node.children)


def _sum_terms(tree, out=None) -> list:
    """For each argument of a tree (in order): whether it is a term of a sum of more than two
    (not of one computed as a stacked product)."""
    out = [] if out is None else out
    node, subs = tree
    many = type(node) is Add and len(node.children) > 2 and not _is_stacked(tree)
    for sub in subs:
        if sub is None:
            out.append(many)
        else:
            _sum_terms(sub, out)
    return out


def _is_stacked(tree) -> bool:
    """Whether a tree is a sum of products computed as one stacked product: every term fused,
    each over two arguments."""
    node, subs = tree
    return _stacked_terms(node) and all(sub is not None and sub[1] == (None, None) for sub in subs)


def _tree_nodes(tree) -> list:
    """The nodes whose values a tree's kernel computes (and XLA may write out): not the logits
    and log-probabilities of a picked log-softmax (``_picked``), made a block at a time."""
    node, subs = tree
    picked = _picked(tree)
    if picked is not None:
        subs = picked[1]
    return [node] + [m for sub in subs if sub is not None for m in _tree_nodes(sub)]


def _picked_readers(p: Circuit, sole: dict) -> list | None:
    """Where ``p`` is the product whose logits a loss picks log-probabilities of (``chain``: sole
    readers up to the gather), the nodes between them (the slicings, the log-softmax): the
    product is computed inside the gather's kernel, a block at a time.  None elsewhere, and on a
    GPU (the blocks are sized to a CPU's cache; a GPU writes the logits out fast)."""
    if type(p) is not Einsum:
        return None
    between = []
    reader = sole.get(p.hash)
    while type(reader) is Index:
        between.append(reader)
        reader = sole.get(reader.hash)
    if type(reader) is not GeneralFunction:
        return None
    between.append(reader)
    gather = sole.get(reader.hash)
    found = chain(gather) if gather is not None else None
    return between if found is not None and found[0].hash == p.hash and on_cpu() else None


def _picked(tree):
    """``(chain, (subtree of each product operand, subtree of the index))`` where the tree is a
    gather of a log-softmax of a product with every node between fused (``chain``); None where
    it is not."""
    node, subs = tree
    if type(node) is not GeneralFunction or node.function.gather is None:
        return None
    found = chain(node)
    if found is None:
        return None
    sub = subs[0]  # down the log-softmax and the slicings to the product, all fused
    for _ in range(1 + len(found[1])):
        if sub is None:
            return None
        sub = sub[1][0]
    if sub is None or sub[0].hash != found[0].hash:
        return None
    return found, (*sub[1], subs[1])


def _tree_key(tree) -> tuple:
    node, subs = tree
    return (node_key_part(node), node.shape, tuple(c.shape for c in node.children),
            tuple(None if sub is None else _tree_key(sub) for sub in subs))


def _composed(tree, fdt: str):
    """``(fn, arguments)``: the tree's op over its arguments (a fused child's own, in order)."""
    node, subs = tree
    if _is_stacked(tree):
        return _stacked_product(node), 2 * len(subs)
    picked = _picked(tree)
    if picked is not None:  # a loss's log-probabilities, the product's logits a block at a time
        op = picked_op(*picked[0])
        subs = picked[1]
    else:
        op = build_op(node, fdt)
    parts = [None if sub is None else _composed(sub, fdt) for sub in subs]
    counts = [1 if part is None else part[1] for part in parts]

    def run(*args):
        values, at = [], 0
        for part, k in zip(parts, counts):
            values.append(args[at] if part is None else part[0](*args[at:at + k]))
            at += k
        return op(*values)

    return run, sum(counts)


def _stacked_product(node: Add):
    """``fn(a_0, b_0, a_1, b_1, ...)``: the sum of the products ``node``'s terms compute (a
    float einsum of two operands each, ``_stacked_terms``), as one einsum over the terms stacked
    along a new summed axis."""
    import jax.numpy as jnp

    from ..lower.einsum import einsum_op

    term = node.children[0]
    new = new_id(term.in_axes, term.out_axes)
    k = len(node.children)
    op = einsum_op([(new, *t) for t in term.in_axes], tuple(term.out_axes),
                   [(k, *c.shape) for c in term.children])

    def run(*args):
        return op(jnp.stack(args[0::2]), jnp.stack(args[1::2]))

    return run


def _tree_kernel(tree, fdt: str, axes: tuple | None, size: int, batch: tuple | None = None):
    """The kernel of a fused tree (``_Group._tree``) over ``size`` rows, as ``_rows_kernel`` is a
    node's; ``axes`` None: every row reads the same arguments (no rows axis)."""
    key = ("tree", _tree_key(tree), fdt, axes, size, batch, picked_log_softmax.VOCAB_BLOCK)

    def make():
        import jax

        op = _composed(tree, fdt)[0]
        if batch is not None:
            op = jax.vmap(op, in_axes=batch)
        return op if axes is None else jax.vmap(op, in_axes=axes)

    return cached_kernel(key, make)


def _int_entries(node: Circuit):
    """An Index of ints and slices, with at least one int: its ints (made non-negative) as an
    int32 array; None for any other node."""
    if type(node) is not Index:
        return None
    shape = node.children[0].shape
    ints = []
    for axis, e in enumerate(node.index):
        if type(e) is int:
            ints.append(e % shape[axis])
        elif type(e) is not slice:
            return None
    return np.asarray(ints, np.int32) if ints else None


def _rows_index_kernel(node: Circuit, fdt: str, axes: tuple, size: int, batch: tuple | None = None):
    """``node``'s Index over ``size`` rows with its int entries given as an argument: the Index
    ``[h]`` of every head ``h`` of a layer is one kernel, not one each (slices stay static); over
    the batch too where ``batch`` is ``(0,)``."""
    entries = node.index
    pattern = tuple(None if type(e) is int else (e.start, e.stop, e.step) for e in entries)
    key = ("rows-index", pattern, node.children[0].shape, str(node.dtype), fdt, axes, size, batch)

    def make():
        import jax
        import jax.lax as lax

        static = tuple(slice(None) if type(e) is int else e for e in entries)
        int_axes = tuple(a for a, e in enumerate(entries) if type(e) is int)

        def index(x, at):
            x = x[static]  # the slices (int axes kept whole, so no axis moves)
            for k in reversed(range(len(int_axes))):
                x = lax.dynamic_index_in_dim(x, at[k], int_axes[k], keepdims=False)
            return x

        if batch is not None and batch[0] == 0:
            index = jax.vmap(index, in_axes=(0, None))
        return jax.vmap(index, in_axes=(axes[0], None))

    return cached_kernel(key, make)


def _merge_kernel(shapes: tuple, spec: tuple, size: int, over: int | None = None):
    """``(index, *sources) -> concatenate(sources as rows)[index]``: rows picked from chunks and
    plain values (one row each); ``spec``: per source, (is a chunk of rows, carries the batch
    axis).  ``over``: the batch's rows, where a source without the batch axis is repeated over it."""
    key = ("merge", shapes, spec, size, over)

    def make():
        import jax.numpy as jnp

        def merge(index, *sources):
            rows = []
            for s, (is_rows, has) in zip(sources, spec):
                s = s if is_rows else s[None]
                if over is not None and not has:
                    s = jnp.broadcast_to(s[:, None], (s.shape[0], over, *s.shape[1:]))
                rows.append(s)
            return jnp.concatenate(rows, axis=0)[index] if len(rows) > 1 else rows[0][index]

        return merge

    return cached_kernel(key, make)
