"""Chunked logsumexp: a large ``logsumexp`` of an Einsum computed chunk by chunk.

A language model's normaliser is ``logsumexp`` over the vocabulary of logits = activations times
an unembedding.  ``logsumexp`` of the per-chunk ``logsumexp`` s is the same value, each chunk
reading a slice of the unembedding, so the full logit matrix is never held in memory at once
(each chunk stays in cache).  The rule makes evaluation faster without simplifying, so it is not
part of ``simp``; ``rewrites.optimize`` runs it last, only on logits no other node reads.

The rule has a parameter, ``chunks`` (by default it decides from the size, and small Einsums are
left alone); its example runs with ``chunks=2`` (``example_options``), small enough for the
meta-test to prove exact with sympy.

>>> from circuits import Einsum, GeneralFunction, Symbol
>>> x, w = Symbol((3, 4), name='x'), Symbol((6, 4), name='w')
>>> lse = GeneralFunction('logsumexp', Einsum.from_spec('sh,vh->sv', x, w))
>>> chunk_logsumexp(lse) is None, chunk_logsumexp.with_options(chunks=3)(lse).children[0].line()
(True, 'Concat 1')
"""

from __future__ import annotations

from circuits.nodes import Concat, Einsum, GeneralFunction, Index, Rearrange

from ..engine import RuleSet, rule
from ._common import same_type, sole_holder

__all__ = ["chunk_logsumexp", "CHUNK_MIN_ENTRIES", "CHUNK_ENTRIES", "RULES"]

#: An Einsum feeding a logsumexp is split when it has at least this many entries ...
CHUNK_MIN_ENTRIES = 1 << 21
#: ... into chunks of about this many entries (small enough to stay in a CPU's cache).
CHUNK_ENTRIES = 1 << 19
_MAX_CHUNKS = 64


@rule(on=GeneralFunction, example=(
    "'lse' GeneralFunction logsumexp\n  'z' Einsum sh,vh->sv\n    'x' [3,4] Symbol\n    'w' [6,4] Symbol",
    "'lse' GeneralFunction logsumexp\n  0 Concat 1\n    1 Rearrange a0 -> a0 1\n"
    "      2 GeneralFunction logsumexp\n        3 Einsum sh,vh->sv\n"
    "          'x' [3,4] Symbol\n          4 [3,4] Index [0:3]\n"
    "            'w' [6,4] Symbol\n    5 Rearrange a0 -> a0 1\n"
    "      6 GeneralFunction logsumexp\n        7 Einsum sh,vh->sv\n          'x'\n"
    "          8 [3,4] Index [3:6]\n            'w'",
), example_options={"chunks": 2})
def chunk_logsumexp(node, *, chunks: int | None = None):
    """``logsumexp`` over the last axis of an Einsum whose last axis comes from one operand only
    (logits = activations times an unembedding) is the ``logsumexp`` of the per-chunk
    ``logsumexp`` s, the operand sliced along that axis.  Same value; no chunk is large.  Fires on
    Einsums of at least ``CHUNK_MIN_ENTRIES`` entries unless ``chunks`` is given (as in the
    example, which splits in two)."""
    if node.function.name != "logsumexp":
        return None
    (z,) = node.children
    if not isinstance(z, Einsum) or not z.out_axes:
        return None
    v = z.out_axes[-1]
    h = sole_holder(z, v)
    if h is None:
        return None
    n = z.shape[-1]
    if chunks is None:
        if z.numel < CHUNK_MIN_ENTRIES:
            return None
        chunks = min(_MAX_CHUNKS, -(-z.numel // CHUNK_ENTRIES), n)
    if chunks < 2:
        return None
    w = z.children[h]
    pos = z.in_axes[h].index(v)
    size = -(-n // chunks)
    lead = " ".join(f"a{i}" for i in range(len(z.shape) - 1)) if len(z.shape) > 1 else ""
    parts = []
    for start in range(0, n, size):
        sel = (slice(None),) * pos + (slice(start, min(start + size, n)),)
        piece = z.with_children(z.children[:h] + (Index(w, sel),) + z.children[h + 1:]).rename(None)
        lse = GeneralFunction("logsumexp", piece)
        parts.append(Rearrange(lse, f"{lead} -> {lead} 1".strip() if lead else " -> 1"))
    out = GeneralFunction("logsumexp", Concat(*parts, axis=len(z.shape) - 1))
    return same_type(node, out)


RULES = RuleSet(chunk_logsumexp, name="chunking")
