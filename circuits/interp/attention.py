"""``attention_patterns(circuit, tokens)``: every attention head's pattern of a circuit, evaluated
and shown with the token strings (``circuits.text.attention.AttentionView``: a layer × head
overview, the focused head's query × key heatmap, hover values).

The patterns are the circuit's ``softmax`` nodes over a square (or, with a KV cache, wider)
``[queries, keys]`` block: per head (``'b1.a.head3.a.attn_probs'``, the seed's ``'a.attn_probs'``
inside ``'b1.a.head3'``, GPT-2's ``'h1.attn.head3.probs'``) or fused over leading head axes
(``'h1.attn.probs'`` ``[heads, ..., q, k]``).  Layer and head numbers come from the node's name,
or from the nearest node above it whose name carries them (the seed's heads).  ``sites`` (names,
matchers or nodes) picks them by hand.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(0, vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=8)
>>> view = attention_patterns(attn_only(w, np.arange(7)), [f'tok{i}' for i in range(7)])
>>> view.shape, view.layers, view.heads, view.tokens[:2]
((2, 2, 5, 5), ['layer 0', 'layer 1'], ['head 0', 'head 1'], ['tok0', 'tok1'])
>>> bool(np.allclose(view.patterns.sum(-1), 1.0))
True
"""

from __future__ import annotations

import re
from collections import deque

import numpy as np

from ..errors import CircuitError, SelectionError
from ..nodes import Circuit, GeneralFunction
from ..text.attention import AttentionView
from ..traversal import parents_map, toposort
from .sites import resolve_sites

__all__ = ["attention_patterns"]

_NUMBER = re.compile(r"\d+")


def _is_pattern(node: Circuit) -> bool:
    return (isinstance(node, GeneralFunction) and node.function.name == "softmax" and len(node.shape) >= 2
            and 0 < node.shape[-2] <= node.shape[-1])


def _numbers(name) -> list:
    return [int(x) for x in _NUMBER.findall(name or "")]


def _label(node: Circuit, parents: dict, wanted: int) -> list:
    """The first ``wanted`` numbers of the node's name, or of the nearest named node above it
    (breadth first) whose name has that many."""
    queue, seen = deque([node]), {node.hash}
    while queue:
        n = queue.popleft()
        found = _numbers(n.name)
        if len(found) >= wanted:
            return found[:wanted]
        for p in parents.get(n.hash, ()):
            if p.hash not in seen:
                seen.add(p.hash)
                queue.append(p)
    return []


def attention_patterns(circuit: Circuit, tokens=None, inputs=None, *, sites=None, batch: int = 0,
                       **evaluate_options) -> AttentionView:
    """The attention patterns of ``circuit``'s heads as an ``AttentionView`` (see the module
    docstring): evaluated once (``C.evaluate(circuit, inputs, also=...)``; ``evaluate_options``
    such as ``dtype`` go there), arranged ``[layers, heads, queries, keys]``.

    ``tokens``: the token strings (or ids), one per key position; a circuit that reads only its
    first positions (the seed's loss reads ``n + 2`` tokens and attends over ``n``) shows the
    first ones.  ``batch``: which entry of a leading batch axis to show.  An error names what is
    missing when the circuit has no attention pattern, or when layers and heads cannot be told
    apart from the names (then give ``sites`` in order: they are shown as one layer).
    """
    from ..backend import evaluate

    if sites is not None:
        found = [n for _, n in resolve_sites(circuit, sites, "attention pattern")]
    else:
        found = [n for n in toposort(circuit) if _is_pattern(n)]
    if not found:
        raise SelectionError(f"attention_patterns: no attention pattern (a softmax over [queries, keys]) in the "
                             f"circuit rooted at {circuit.line()}; give sites=[...] naming them")
    _, values = evaluate(circuit, inputs, also=found, **evaluate_options)
    parents = parents_map(circuit) if sites is None else {}
    blocks = []  # (layer, head, [q, k] array)
    for i, node in enumerate(found):
        v = np.asarray(values[node], dtype=np.float64)
        if v.ndim > 2 and sites is None and len(_numbers(node.name)) < 2:
            # fused heads: [heads, ..., q, k], maybe behind a batch axis the circuit was given
            layer = _label(node, parents, 1)
            heads = v.reshape(-1, *v.shape[-2:])
            for h, block in enumerate(heads):
                blocks.append((layer[0] if layer else 0, h, block))
            continue
        while v.ndim > 2:
            v = v[batch]
        if sites is not None:
            blocks.append((0, i, v))
            continue
        label = _label(node, parents, 2)
        if not label:
            raise CircuitError(f"attention_patterns: cannot tell the layer and head of {node.line()} from its name "
                               "or the names above it; give sites=[...] in order")
        blocks.append((label[0], label[1], v))
    layers = sorted({b[0] for b in blocks})
    heads = sorted({b[1] for b in blocks})
    n_q, n_k = blocks[0][2].shape
    if any(b[2].shape != (n_q, n_k) for b in blocks):
        raise CircuitError("attention_patterns: the patterns have different shapes "
                           f"{sorted({b[2].shape for b in blocks})}; give sites=[...] of one shape")
    out = np.full((len(layers), len(heads), n_q, n_k), np.nan)
    for layer, head, block in blocks:
        out[layers.index(layer), heads.index(head)] = block
    if tokens is not None:
        tokens = [str(t) for t in (tokens.tolist() if isinstance(tokens, np.ndarray) else tokens)]
        if len(tokens) < n_k:
            raise CircuitError(f"attention_patterns: {len(tokens)} tokens for {n_k} key positions")
        tokens = tokens[:n_k]
    return AttentionView(out, tokens, layers=[f"layer {x}" for x in layers], heads=[f"head {h}" for h in heads])
