"""``batch_heads``: the rewrite form of the backend's per-head batching lowering
(``circuits.backend.lower.head_batching``, which ``evaluate``, ``compile`` and ``evaluate_batched``
apply by default).  A sum of per-head subcircuits (the same computation on ``Index`` slices of
one weight, as the seed prints its attention heads) becomes one computation over a head axis and
one Einsum that sums it; the value is unchanged.  Use it to print, save or analyse (``cost``) the
batched circuit.

Head batching has three homes, one job each: ``circuits.backend.lower.head_batching`` (the lowering
``evaluate`` / ``compile`` apply: per-head sums batched over a head axis, the circuit untouched),
``rewrites.batch_heads`` (the same transformation as a rewrite, for a circuit to print, save or
cost) and ``circuits.interp.split_heads`` (the inverse: a fused layer split into named per-head
subcircuits, to intervene on one head).  ``batch_heads(split_heads(c, at))`` fuses the heads again.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
>>> c = attn_only(w, np.arange(6))
>>> b = batch_heads(c)
>>> b.get_unique('b0.a').line()
"'b0.a' Einsum WsV,WdV->sd"
>>> import circuits as C
>>> bool(np.allclose(C.evaluate(b), C.evaluate(c, batch_heads=False), atol=1e-5))
True
"""

from __future__ import annotations

from circuits.backend import batch_heads as _lower
from circuits.nodes import Circuit

__all__ = ["batch_heads"]


def batch_heads(circuit: Circuit) -> Circuit:
    """``circuit`` with every sum of per-head subcircuits batched over a head axis (value-preserving;
    the circuit itself when there is none)."""
    (out,), _ = _lower([circuit])
    return out
