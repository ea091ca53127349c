"""A loss's picked log-probabilities computed from the product that makes the logits, a block of
the vocabulary at a time: the logits are never written out whole.

A language model's loss is ``gather(log_softmax(logits[:-1]), next_tokens)`` with
``logits = final_residual @ W_U``: over GPT-2's 50,257 entries a row, the logits of a few
thousand tokens take hundreds of MB, written by the product and read again by the log-softmax.
``picked_log_softmax`` computes the same entries over blocks of ``VOCAB_BLOCK`` columns of the
weight: each block's logits stay in the CPU's cache while a running maximum and sum of
exponentials (the log-sum-exp, rescaled as the maximum grows) and the picked entries are taken
from them.  The values agree with the log-softmax's to float rounding.

``chain(gather)`` says whether a gather node computes such a loss (and from which product);
``picked_op`` builds the fused op.

>>> import numpy as np, jax.numpy as jnp
>>> from circuits import Einsum, GeneralFunction, Index, Symbol
>>> h = Symbol((5, 8), name='h'); w = Symbol((8, 5000), name='w'); t = Symbol((4,), name='t', dtype='int64')
>>> logits = Einsum.from_spec('sd,dv->sv', h, w)
>>> lp = GeneralFunction('log_softmax', Index(logits, (slice(None, -1),)))
>>> ll = GeneralFunction('gen_index_at_0_batch_x_c', lp, t)
>>> chain(ll) is not None
True
>>> rng = np.random.default_rng(0)
>>> hv, wv, tv = rng.normal(size=(5, 8)), rng.normal(size=(8, 5000)), rng.integers(0, 5000, 4)
>>> got = picked_op(*chain(ll))(jnp.asarray(hv, 'float32'), jnp.asarray(wv, 'float32'), jnp.asarray(tv))
>>> x = (hv @ wv)[:-1]
>>> want = (x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True))[np.arange(4), tv]
>>> np.allclose(got, want, atol=1e-4)
True
"""

from __future__ import annotations

from ...dtypes import is_float
from ...functions.builtins import LONG_ROWS
from ...nodes import Circuit, Einsum, GeneralFunction, Index
from .einsum import einsum_op

__all__ = ["chain", "picked_op", "VOCAB_BLOCK"]

# Columns of the weight a block computes: GPT-2's 1,024 tokens x 1,024 entries (4 MB of logits)
# stay in the cache (4 x 8 x 32 tokens: 0.32 s a call against 0.53 s for the product and the
# log-softmax apart, 2,048 columns 0.33 s, 4,096 0.34 s, on a 2-core Sapphire Rapids VM).
VOCAB_BLOCK = 1024
# Fewer entries a row than this: the plain product and log-softmax.
LONG = LONG_ROWS


def chain(gather: Circuit):
    """``(product, slicings, gather_spec)`` where ``gather`` picks one entry of each row of
    ``log_softmax(product[slices...])``: a ``_batch_x`` gather along the last axis, over an Index
    (any number, slices only) of an Einsum of two float operands whose last output axis (the
    vocabulary, at least ``LONG``) is an axis of one operand alone.  None otherwise."""
    spec = getattr(gather, "function", None)
    g = getattr(spec, "gather", None)
    if type(gather) is not GeneralFunction or g is None or g.layout != "batch":
        return None
    lsm, idx = gather.children
    if type(lsm) is not GeneralFunction or lsm.function.name != "log_softmax" or not lsm.shape:
        return None
    if len(idx.shape) != len(lsm.shape) - 1 or g.axis(len(lsm.shape), len(idx.shape)) != len(lsm.shape) - 1:
        return None
    slicings = []
    node = lsm.children[0]
    while type(node) is Index:
        if not _keeps_last_axis(node):
            return None
        slicings.append(node.index)
        node = node.children[0]
    if type(node) is not Einsum or len(node.children) != 2 or not is_float(node.dtype) or not node.shape \
            or node.shape[-1] < LONG or any(not is_float(c.dtype) for c in node.children):
        return None
    v = node.out_axes[-1]
    holders = [k for k, axes in enumerate(node.in_axes) if v in axes]
    if len(holders) != 1 or list(node.in_axes[holders[0]]).count(v) != 1 or list(node.out_axes).count(v) != 1:
        return None
    return node, tuple(reversed(slicings)), g


def _keeps_last_axis(node: Index) -> bool:
    """Whether an Index slices only (no int, no array) and keeps its child's last axis whole."""
    entries = node.index
    if not all(type(e) is slice for e in entries):
        return False
    n = node.children[0].shape[-1]
    if len(entries) < len(node.children[0].shape):
        return True
    return range(*entries[-1].indices(n)) == range(n)


def picked_op(product: Einsum, slicings: tuple, g, block: int | None = None):
    """``op(a, b, index)``: ``gather(log_softmax(product(a, b)[slicings...]), index)`` computed a
    block of ``block`` vocabulary entries at a time (``VOCAB_BLOCK`` by default; ``chain``'s parts)."""
    block = VOCAB_BLOCK if block is None else block
    in_axes = [tuple(t) for t in product.in_axes]
    out_axes = tuple(product.out_axes)
    shapes = [c.shape for c in product.children]
    v = out_axes[-1]
    side = next(k for k, axes in enumerate(in_axes) if v in axes)
    axis = in_axes[side].index(v)
    size = shapes[side][axis]
    full, rest = divmod(size, block)

    def product_of(width):
        s = [list(t) for t in shapes]
        s[side][axis] = width
        return einsum_op(in_axes, out_axes, [tuple(t) for t in s])

    whole = product_of(block) if full else None
    tail = product_of(rest) if rest else None
    lo, hi = g.valid_range(size)

    def op(a, b, index):
        import jax.numpy as jnp
        from jax import lax

        operands = [a, b]
        w = operands[side]

        def logits(fn, part):
            args = list(operands)
            args[side] = part
            x = fn(*args)
            for entries in slicings:
                x = x[entries]
            return x

        bad = (index < lo) | (index >= hi)  # NaN there, as the gather gives
        idx = jnp.where(index < 0, index + size, index)

        def fold(carry, x, start, width):
            peak, total, picked = carry
            new = jnp.maximum(peak, jnp.max(x, axis=-1))
            shift = jnp.where(jnp.isfinite(new), new, 0)  # no block seen yet but -inf: nothing to rescale
            total = total * jnp.exp(peak - shift) + jnp.sum(jnp.exp(x - shift[..., None]), axis=-1)
            local = idx - start
            inside = (local >= 0) & (local < width)
            got = jnp.take_along_axis(x, jnp.clip(local, 0, width - 1)[..., None], axis=-1)[..., 0]
            return new, total, jnp.where(inside, got, picked)

        dtype = jnp.result_type(a, b)
        shape = index.shape
        carry = (jnp.full(shape, -jnp.inf, dtype), jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
        if full:
            def step(c, i):
                part = lax.dynamic_slice_in_dim(w, i * block, block, axis)
                return fold(c, logits(whole, part), i * block, block), None

            carry, _ = lax.scan(step, carry, jnp.arange(full))
        if rest:
            part = lax.slice_in_dim(w, full * block, size, axis=axis)
            carry = fold(carry, logits(tail, part), full * block, rest)
        peak, total, picked = carry
        out = picked - (peak + jnp.log(total))
        return jnp.where(bad, jnp.nan, out)

    return op
