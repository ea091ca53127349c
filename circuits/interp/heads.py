"""``split_heads``: a fused attention layer (one computation over a head axis) as a sum of named
per-head subcircuits, value unchanged.

The fused layer's output is an Einsum that sums over the head axis (``'hqV,hdV->qd'`` in
``circuits.models.blocks.attention_fused``).  Head ``h``'s term is that Einsum without the head
axis over its operands indexed at ``h``; the Index is then pushed down through the layer's
Einsums, Adds and functions (the ``rewrites`` Index rules, scoped to the new nodes) until it
reaches the weights, so each head is its own subcircuit (``'<name>.head{h}'``) reading
``W_q[h]``, ``W_k[h]``, ... as in the unfused seed model.

Head batching has three homes, one job each: ``circuits.backend.lower.head_batching`` (the lowering
``evaluate`` / ``compile`` apply: per-head sums batched over a head axis, the circuit untouched),
``rewrites.batch_heads`` (the same transformation as a rewrite, for a circuit to print, save or
cost) and ``circuits.interp.split_heads`` (the inverse: a fused layer split into named per-head
subcircuits, to intervene on one head).  ``batch_heads(split_heads(c, at))`` fuses the heads again.

>>> import numpy as np
>>> from circuits import Array, evaluate
>>> from circuits.models.blocks import attention_fused, causal_mask, neg_inf_bias
>>> rng = np.random.default_rng(0)
>>> x = Array(rng.standard_normal((3, 4)).astype(np.float32), name='x')
>>> w = [Array(rng.standard_normal(s).astype(np.float32), name=n)
...      for n, s in [('q', (2, 5, 4)), ('k', (2, 5, 4)), ('v', (2, 5, 4)), ('o', (2, 4, 5))]]
>>> m = Array(causal_mask(3), name='mask')
>>> fused = attention_fused(x, x, *w, m, neg_inf_bias(m), 'attn')
>>> split = split_heads(fused, 'attn')
>>> [c.name for c in split.children]
['attn.head0', 'attn.head1']
>>> bool(np.allclose(evaluate(split), evaluate(fused), atol=1e-5))
True
"""

from __future__ import annotations

from ..errors import CircuitError
from ..nodes import Add, Circuit, Einsum, Index
from ..select import get_unique
from ..traversal import replace, toposort

__all__ = ["split_heads"]


def _head_axis(node: Einsum, axis: int | None) -> int:
    summed = {a for axes in node.in_axes for a in axes} - set(node.out_axes)
    if axis is not None:
        if axis not in summed:
            raise CircuitError(f"split_heads: axis id {axis} is not summed by {node.line()}")
        return axis
    # The head axis leads every operand that has it (q/k/v/o as [heads, ...]).
    leading = [a for a in sorted(summed)
               if all(axes and axes[0] == a for axes in node.in_axes if a in axes)
               and sum(a in axes for axes in node.in_axes) >= 2]
    if len(leading) != 1:
        raise CircuitError(
            f"split_heads: {node.line()} does not sum over exactly one head axis leading its operands "
            f"(candidates: {leading or 'none'}); it must be the fused layer's output, e.g. 'hqV,hdV->qd'. "
            "Name the head axis id with axis="
        )
    return leading[0]


def split_heads(circuit: Circuit, at, *, axis: int | None = None, stop_at=None) -> Circuit:
    """``circuit`` with the fused attention output ``at`` (a node or a matcher of one node: an
    Einsum summing over a head axis) replaced by the ``Add`` (named like ``at``) of one
    subcircuit per head, named ``'<at's name>.head{h}'``; the value is unchanged.

    ``axis``: the head axis's id in ``at``'s einsum (found when one summed axis leads every
    operand that has it); ``stop_at``: a matcher of nodes the head index is not pushed into.
    See the module docstring for an example.
    """
    import rewrites
    from rewrites.rules import index as index_rules

    node = at if isinstance(at, Circuit) else get_unique(circuit, at)
    if not isinstance(node, Einsum):
        raise CircuitError(f"split_heads: {node.line()} is not an Einsum; give the fused attention output")
    head = _head_axis(node, axis)
    n_heads = node.axis_sizes()[head]
    in_axes = tuple(tuple(a for a in axes if a != head) for axes in node.in_axes)
    original = {n.hash for n in toposort(circuit)}
    push = rewrites.normalize(index_rules.RULES)
    label = node.name or "attn"
    heads = []
    for h in range(n_heads):
        operands = []
        for child, axes in zip(node.children, node.in_axes):
            if head in axes:
                entries = tuple(h if a == head else slice(None) for a in axes)
                child = Index(child, entries)
            operands.append(child)
        term = Einsum(*operands, in_axes=in_axes, out_axes=node.out_axes, name=f"{label}.head{h}")
        # Push the new Index nodes (and those they become) down; nodes of the circuit stay as they are.
        term = rewrites.apply(push, term, where=lambda n: n.hash not in original, stop_at=stop_at)
        heads.append(term)
    return replace(circuit, {node: Add(*heads, name=node.name)})
