"""Fused lowering of a gathered ``log_softmax``: the gathered logit minus a ``logsumexp``, the
``logsumexp`` of the logits' Einsum computed chunk by chunk over the vocabulary on the CPU.

A language model's per-token loss reads one log-probability per position out of
``log_softmax(logits)``, ``[positions, vocab]``: ``gen_index_at_0_batch_x_c(log_softmax(z), t)``
as the seed prints it.  Computed as written, the whole log-probability tensor is formed and
all but one entry a row thrown away.  This module lowers it, inside the backend, to what a careful
hand-written forward computes:

- ``z[t] - logsumexp(z)``: no log-probability tensor;
- when ``z`` is an Einsum (activations times the unembedding) that nothing else reads, the
  gathered logit is one dot product per position (the gather moves into the unembedding's rows)
  and the ``logsumexp`` is one fused node over the Einsum's operands: on the CPU it runs the
  contraction a slice of the vocabulary at a time (``CHUNK_ENTRIES`` entries of logits each), in
  a loop (``lax.scan``, one chunk after another) and combines the per-chunk ``logsumexp`` s, so
  the ``[positions, vocab]`` logits are never held at once and each chunk stays in cache;
  elsewhere (a GPU) it contracts once and reduces;
- an ``Index`` of leading axes between the Einsum and the ``log_softmax`` (``logits[:-1]``, as
  the GPT-2 and Llama builders print it) is moved onto the Einsum's operands first.

A ``logsumexp`` of such an Einsum that nothing else reads (what ``rewrites.optimize`` leaves of a
gathered ``log_softmax``: the rewrite keeps the circuit printable and leaves the chunking to this
lowering, so an optimized circuit runs the same code as ``compile`` of the original) becomes the
same fused node.

It is a lowering choice, not a rewrite: ``compile``, ``evaluate`` and ``evaluate_batched`` make
it where they batch heads (``circuits.backend.lower.lowering.program_with_also``; ``batch_heads=False``
lowers the circuit as printed), the circuit itself is untouched and the value is the same up to
float rounding (``tests/backend/test_fusion.py`` checks it against the plain lowering in float32
and float64, on the seed, GPT-2, Llama and drawn circuits).  A ``log_softmax`` that a node other
than such a gather reads, or whose value ``also=`` asks for, is left alone.

>>> import numpy as np
>>> from circuits import Array, Einsum, GeneralFunction, Index, evaluate
>>> rng = np.random.default_rng(0)
>>> x = Array(rng.normal(size=(4, 8)).astype(np.float32), name='x')
>>> w = Array(rng.normal(size=(50, 8)).astype(np.float32), name='unembed')
>>> t = Array(np.array([3, 1, 4, 1]), name='t')
>>> lp = GeneralFunction('log_softmax', Einsum.from_spec('sh,vh->sv', x, w))
>>> ll = GeneralFunction('gen_index_at_0_batch_x_c', lp, t, name='ll')
>>> (fused,), _ = fuse_gathers([ll])
>>> fused.line(), sorted(c.line() for c in fused.children)
("'ll' Add", ['Einsum a,->a', 'Einsum sh,sh->s'])
>>> bool(np.allclose(evaluate(fused), evaluate(ll, batch_heads=False), rtol=1e-5))
True
"""

from __future__ import annotations

import functools
from typing import Collection, Sequence

from ...errors import CircuitError
from ...functions import FunctionSpec, GenIndex, per_row
from ...nodes import Add, Circuit, Einsum, GeneralFunction, Index, Rearrange, Scalar
from ...traversal import toposort
from .einsum import einsum_op
from .head_batching import batch_heads, has_head_sums

__all__ = ["fuse_gathers", "has_gathered_log_softmax", "has_fusable_logsumexp", "lower", "worth_lowering", "logsumexp_of_einsum",
           "CHUNK_ENTRIES", "CHUNK_FROM_ENTRIES"]

#: Logits of at least this many entries (per evaluation: a batch's vmap multiplies it) have their
#: ``logsumexp`` computed chunk by chunk on the CPU ...
CHUNK_FROM_ENTRIES = 1 << 20
#: ... each chunk about this many entries of logits (4 MiB of float32; 2^19 to 2^21 measured alike on the seed).
CHUNK_ENTRIES = 1 << 20
_MAX_CHUNKS = 128


# ---------------------------------------------------------------------------- matching
def _gather_on_last_axis(node: Circuit):
    """``(GenIndex, source)`` when ``node`` gathers along the last axis of its first child."""
    if type(node) is not GeneralFunction:
        return None
    g = node.function.gather
    if g is None or len(node.children) != 2:
        return None
    x, idx = node.children
    if g.axis(len(x.shape), len(idx.shape)) != len(x.shape) - 1:
        return None
    return g, x


def _is_log_softmax(node: Circuit) -> bool:
    return type(node) is GeneralFunction and node.function.name == "log_softmax" and len(node.children) == 1


def has_gathered_log_softmax(nodes: Sequence[Circuit]) -> bool:
    """Cheap test: does any node gather along the last axis of a ``log_softmax``?"""
    for n in nodes:
        found = _gather_on_last_axis(n)
        if found is not None and _is_log_softmax(found[1]):
            return True
    return False


def _is_logsumexp_of_einsum(node: Circuit) -> bool:
    return (type(node) is GeneralFunction and node.function.name == "logsumexp" and len(node.children) == 1
            and type(node.children[0]) is Einsum and _vocab_holder(node.children[0]) is not None
            and node.children[0].dtype != "bool")


def has_fusable_logsumexp(nodes: Sequence[Circuit]) -> bool:
    """Cheap test: a gathered ``log_softmax``, or a ``logsumexp`` over the last axis of an Einsum
    (what ``rewrites.optimize`` leaves of one: it is fused here, not by the rewrite)?"""
    return has_gathered_log_softmax(nodes) or any(_is_logsumexp_of_einsum(n) for n in nodes)


# ---------------------------------------------------------------------------- the fused logsumexp
def _sizes(in_axes, shapes) -> dict:
    sizes = {}
    for axes, shape in zip(in_axes, shapes):
        for a, n in zip(axes, shape):
            sizes[a] = n
    return sizes


def _chunk_bounds(n: int, rows: int) -> list[tuple[int, int]]:
    """Slices of a vocabulary of ``n`` for logits with ``rows`` entries per vocabulary entry."""
    if rows * n < CHUNK_FROM_ENTRIES:
        return [(0, n)]
    chunks = min(_MAX_CHUNKS, n, max(2, -(-rows * n // CHUNK_ENTRIES)))
    size = -(-n // chunks)
    return [(s, min(s + size, n)) for s in range(0, n, size)]


@functools.lru_cache(maxsize=512)
def _lse_spec(in_axes: tuple, out_axes: tuple) -> FunctionSpec:
    """The fused ``logsumexp`` over the last output axis of the Einsum ``in_axes -> out_axes``
    (one spec object per Einsum payload, so compiled programs are reused)."""
    v = out_axes[-1]
    (holder,) = [i for i, axes in enumerate(in_axes) if v in axes]
    pos = in_axes[holder].index(v)

    def shape_rule(shapes):
        sizes = _sizes(in_axes, shapes)
        return tuple(sizes[a] for a in out_axes[:-1])

    def run(*xs):
        import jax
        import jax.numpy as jnp

        shapes = [tuple(x.shape) for x in xs]
        sizes = _sizes(in_axes, shapes)
        n = sizes[v]
        rows = 1
        for a in out_axes[:-1]:
            rows *= sizes[a]
        bounds = _chunk_bounds(n, rows) if jax.default_backend() == "cpu" else [(0, n)]
        if len(bounds) == 1:
            return jax.nn.logsumexp(einsum_op(in_axes, out_axes, shapes)(*xs), axis=-1)
        size = bounds[0][1]
        full, tail = divmod(n, size)

        def chunk_lse(w):
            piece = list(xs)
            piece[holder] = w
            op = einsum_op(in_axes, out_axes, [tuple(p.shape) for p in piece])
            return jax.nn.logsumexp(op(*piece), axis=-1)

        def step(carry, i):  # chunk i: ``size`` vocabulary entries from i * size
            return carry, chunk_lse(jax.lax.dynamic_slice_in_dim(xs[holder], i * size, size, axis=pos))

        # The full chunks one after another in a loop, then the static tail.  Unrolled as static
        # slices, XLA may run the chunks' products concurrently and keeps every chunk's logits
        # live at once (64 MB of temporaries for the seed, as much as unchunked, against 11 MB in
        # the loop): chunking then keeps nothing in cache (BENCHMARKS.md, issue 24).
        _, parts = jax.lax.scan(step, None, jnp.arange(full))
        parts = jnp.moveaxis(parts, 0, -1)
        if tail:
            last = chunk_lse(jax.lax.slice_in_dim(xs[holder], full * size, n, axis=pos))
            parts = jnp.concatenate([parts, last[..., None]], axis=-1)
        return jax.nn.logsumexp(parts, axis=-1)

    def cost(arg_shapes, out_shape):
        sizes = _sizes(in_axes, arg_shapes)
        mults = 1
        for n in sizes.values():
            mults *= n
        logits = mults // max(1, _product(sizes[a] for a in set(sizes) - set(out_axes)))
        counts = per_row(lambda n: {"cmp": n - 1, "add": 2 * n, "exp": n, "log": 1})(
            [tuple(sizes[a] for a in out_axes)], out_shape)
        counts["mul"] = counts.get("mul", 0) + mults
        counts["add"] = counts.get("add", 0) + mults - logits
        return counts

    letters = ",".join("".join(chr(97 + a) if a < 26 else f"<{a}>" for a in axes) for axes in in_axes)
    out = "".join(chr(97 + a) if a < 26 else f"<{a}>" for a in out_axes)
    return FunctionSpec(
        name="logsumexp_of_einsum", shape_rule=shape_rule, jax=run, num_args=(len(in_axes), len(in_axes)),
        description=f"logsumexp over the last axis of einsum {letters}->{out} (fused, chunked on the CPU)",
        cost=cost,
    )


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _vocab_holder(z: Einsum) -> int | None:
    """The operand that alone carries ``z``'s last output axis, once; None otherwise."""
    if not z.out_axes or type(z) is not Einsum:
        return None
    v = z.out_axes[-1]
    holders = [i for i, axes in enumerate(z.in_axes) if v in axes]
    if len(holders) != 1 or z.in_axes[holders[0]].count(v) != 1 or z.out_axes.count(v) != 1:
        return None
    return holders[0]


def logsumexp_of_einsum(z: Einsum) -> Circuit:
    """``logsumexp(z)`` over ``z``'s last axis as one fused node over ``z``'s operands (chunked
    over that axis on the CPU); a plain ``logsumexp`` node when the axis is not one operand's.

    >>> import numpy as np
    >>> from circuits import Array, Einsum, GeneralFunction, evaluate
    >>> x, w = Array(np.ones((2, 3), np.float32)), Array(np.zeros((5, 3), np.float32))
    >>> z = Einsum.from_spec('sh,vh->sv', x, w)
    >>> lse = logsumexp_of_einsum(z)
    >>> lse.line(), [round(float(v), 4) for v in evaluate(lse)]
    ('GeneralFunction logsumexp_of_einsum', [1.6094, 1.6094])
    """
    if _vocab_holder(z) is None or z.dtype == "bool":
        return GeneralFunction("logsumexp", z)
    return GeneralFunction(_lse_spec(tuple(map(tuple, z.in_axes)), tuple(z.out_axes)), *z.children)


# ---------------------------------------------------------------------------- the rewrite of one gather
def _index_into_einsum(z: Index, einsum: Einsum) -> Einsum | None:
    """``Index(einsum, slices)`` as the Einsum of sliced operands, when every indexed axis is
    an output axis indexed by a slice (each operand carrying it is sliced alike)."""
    entries = z.full_index()
    if any(type(e) is not slice for e in entries):
        return None
    cut = {a: e for a, e in zip(einsum.out_axes, entries) if e != slice(None)}
    if not cut or len(set(einsum.out_axes)) != len(einsum.out_axes):
        return None
    kids = []
    for child, axes in zip(einsum.children, einsum.in_axes):
        if any(a in cut for a in axes):
            child = Index(child, tuple(cut.get(a, slice(None)) for a in axes))
        kids.append(child)
    try:
        return Einsum(*kids, in_axes=einsum.in_axes, out_axes=einsum.out_axes)
    except CircuitError:
        return None


def _gathered_logit(g: GenIndex, z: Einsum, idx: Circuit) -> Circuit | None:
    """``gather(z, idx)`` along ``z``'s last axis as the Einsum over the gathered operand (the
    true token's logit is one dot product per position)."""
    h = _vocab_holder(z)
    if h is None:
        return None
    v = z.out_axes[-1]
    axes = z.in_axes[h]
    p = axes.index(v)
    k = len(idx.shape)
    if g.layout == "batch":
        idx_ids = z.out_axes[:k]
        out_axes = z.out_axes[:-1]
    else:
        fresh = max((a for t in z.in_axes for a in t), default=-1) + 1
        idx_ids = tuple(range(fresh, fresh + k))
        out_axes = idx_ids + z.out_axes[:-1] if g.layout == "first" else z.out_axes[:-1] + idx_ids
    # the gathered operand: idx's axes replace the vocabulary axis where it is
    gathered = GeneralFunction(GenIndex(p, False, p == 0, g.checked).name, z.children[h], idx)
    in_axes = z.in_axes[:h] + (axes[:p] + idx_ids + axes[p + 1:],) + z.in_axes[h + 1:]
    try:
        return Einsum(*z.children[:h], gathered, *z.children[h + 1:], in_axes=in_axes, out_axes=out_axes)
    except CircuitError:
        return None


def _fused(node: GeneralFunction, g: GenIndex, z: Circuit, idx: Circuit, own_z: bool) -> Circuit:
    """The gather ``node`` of ``log_softmax(z)`` as ``gather(z) - logsumexp(z)``; with ``own_z``
    (nothing else reads ``z``) the Einsum under ``z`` is taken apart."""
    picked = lse = None
    if own_z:
        inner = z
        if type(z) is Index and type(z.children[0]) is Einsum:
            inner = _index_into_einsum(z, z.children[0]) or z
        if type(inner) is Einsum and _vocab_holder(inner) is not None and inner.dtype != "bool":
            picked = _gathered_logit(g, inner, idx)
            if picked is not None:
                lse = logsumexp_of_einsum(inner)
    if picked is None:
        picked = GeneralFunction(g.name, z, idx)
        lse = GeneralFunction("logsumexp", z)
    out = gathered_minus_logsumexp(picked, lse, g, idx, name=node.name)
    if out.shape != node.shape:  # a layout this module does not know: leave it
        return node
    return out


def gathered_minus_logsumexp(picked: Circuit, lse: Circuit, g, idx: Circuit, name=None) -> Circuit:
    """``picked - lse``: a gathered logit minus its ``logsumexp`` (the value of a gather ``g`` of
    ``log_softmax``), ``lse`` given unit axes where the index's axes sit in ``picked`` (a gather
    that is not batched puts them where the last axis was, or first).  Shared by this lowering and
    the ``rewrites`` rule that does the same as a rewrite."""
    if g.layout != "batch" and idx.shape:
        lead = " ".join(f"a{i}" for i in range(len(lse.shape)))
        units = " ".join("1" for _ in idx.shape)
        spec = f"{lead} -> {units} {lead}" if g.layout == "first" else f"{lead} -> {lead} {units}"
        lse = Rearrange(lse, spec.strip())
    ids = tuple(range(len(lse.shape)))
    return Add(picked, Einsum(lse, Scalar(-1.0), in_axes=(ids, ()), out_axes=ids), name=name)


def fuse_gathers(roots: Sequence[Circuit], keep: Collection[Circuit] = ()) -> tuple[list[Circuit], dict]:
    """``(new_roots, kept)``: ``roots`` with every gather along the last axis of a ``log_softmax``
    that only such gathers read lowered to the fused form (module docstring), every
    ``logsumexp`` of an Einsum that nothing else reads fused likewise, and ``{kept node
    hash: node of the new circuit with its value}`` for the nodes of ``keep`` (``also=``)."""
    roots = list(roots)
    keep_hashes = {n.hash for n in keep}
    order = toposort(*roots, *keep)
    readers: dict[bytes, list[Circuit]] = {}
    for n in order:
        for c in {c.hash: c for c in n.children}.values():
            readers.setdefault(c.hash, []).append(n)

    def only_gathers(lsm):
        return lsm.hash not in keep_hashes and all(
            (found := _gather_on_last_axis(r)) is not None and found[1].hash == lsm.hash
            and r.children[1].hash != lsm.hash for r in readers.get(lsm.hash, ()))

    def alone(z, lsm):  # nothing but the log_softmax reads z (and no root is z)
        return z.hash not in keep_hashes and [r.hash for r in readers.get(z.hash, ())] == [lsm.hash]

    new: dict[bytes, Circuit] = {}
    root_hashes = {r.hash for r in roots}
    for node in order:
        rebuilt = node.with_children(tuple(new[c.hash] for c in node.children)) if node.children else node
        found = _gather_on_last_axis(node)
        if found is not None and _is_log_softmax(found[1]) and only_gathers(found[1]):
            lsm = found[1]
            (z,) = lsm.children
            own = alone(z, lsm) and z.hash not in root_hashes and (
                type(z) is not Index or (alone(z.children[0], z) and z.children[0].hash not in root_hashes))
            rebuilt = _fused(rebuilt, found[0], new[z.hash], new[node.children[1].hash], own)
        elif _is_logsumexp_of_einsum(node) and alone(node.children[0], node) and node.children[0].hash not in root_hashes:
            rebuilt = logsumexp_of_einsum(new[node.children[0].hash]).rename(node.name)
        new[node.hash] = rebuilt
    return [new[r.hash] for r in roots], {n.hash: new[n.hash] for n in keep}


# ---------------------------------------------------------------------------- the backend's lowering
def worth_lowering(nodes: Sequence[Circuit]) -> bool:
    """Whether ``lower`` may change anything: sums of heads or a gathered ``log_softmax``."""
    return has_head_sums(nodes) or has_fusable_logsumexp(nodes)


def lower(roots: Sequence[Circuit], keep: Collection[Circuit] = ()) -> tuple[list[Circuit], dict]:
    """The backend's value-preserving lowering before a program is laid out: heads batched
    (``circuits.backend.lower.head_batching``), then gathered ``log_softmax`` s fused (``fuse_gathers``).
    Returns ``(new_roots, {kept node hash: node with its value})`` like both.

    >>> from circuits import Symbol, GeneralFunction
    >>> z, t = Symbol((3, 5), name='z'), Symbol((3,), name='t', dtype='int64')
    >>> ll = GeneralFunction('gen_index_at_0_batch_x_c', GeneralFunction('log_softmax', z), t)
    >>> lower([ll])[0][0].line()
    'Add'
    """
    roots = list(roots)
    keep = list(keep)
    kept = {n.hash: n for n in keep}
    if has_head_sums(toposort(*roots)):
        roots, kept = batch_heads(roots, keep)
    if has_fusable_logsumexp(toposort(*roots)):
        mid = [kept[n.hash] for n in keep]
        roots, after = fuse_gathers(roots, mid)
        kept = {n.hash: after[m.hash] for n, m in zip(keep, mid)}
    return roots, kept
