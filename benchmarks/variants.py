"""Intervention variants of the seed model built with plain node operations (a local stand-in
for ``interp.ablate`` / ``interp.path_patch``; the sweep is generic over any variant circuits).

Heads are found by their seed names (``b{l}.a.head{h}``) and a head's query, key and value
einsums by the seed's layout (``circuits.models.blocks.attention_head``)."""

import numpy as np

from circuits import Array
from circuits.traversal import replace


def head(circuit, layer, h):
    return circuit.get_unique(f"b{layer}.a.head{h}")


def role_einsum(head_node, role):
    """The head's ``a.q`` / ``a.k`` / ``a.v`` einsum (its first child is the role's input)."""
    comb_v = head_node.children[0]
    probs, v = comb_v.children
    if role == "v":
        return v
    raw = probs.children[0].children[0]
    return raw.children["qk".index(role)]


def zero_ablation_variants(circuit, n_layers, n_heads):
    out = {}
    for layer in range(n_layers):
        for h in range(n_heads):
            node = head(circuit, layer, h)
            out[node.name] = replace(circuit, {node: Array(np.zeros(node.shape, np.float32), name=node.name)})
    return out


def path_patch_variants(clean, corrupted, n_heads):
    """Exact path patching of a two-layer model: every layer-0 head into every layer-1 head's
    query, key and value input (the receiver's input residual stream is rebuilt with the sender's
    output computed from the corrupted tokens; everything else clean), and every head into the
    logits (only the unembedding's residual stream sees the corrupted sender)."""
    out = {}
    b0, b1 = clean.get_unique("b0"), clean.get_unique("b1")
    for s in range(n_heads):
        new_b0 = replace(b0, {head(clean, 0, s): head(corrupted, 0, s)})
        for r in range(n_heads):
            receiver = head(clean, 1, r)
            for role in "qkv":
                target = role_einsum(receiver, role)
                rebuilt = target.with_children((replace(target.children[0], {b0: new_b0}), *target.children[1:]))
                out[f"b0.a.head{s}->b1.a.head{r}.{role}"] = replace(clean, {receiver: replace(receiver, {target: rebuilt})})
    b1_heads, b1_rest = b1.children
    for s in range(n_heads):
        new_b0 = replace(b0, {head(clean, 0, s): head(corrupted, 0, s)})
        out[f"b0.a.head{s}->logits"] = replace(clean, {b1: b1.with_children((b1_heads, new_b0))})
    for s in range(n_heads):
        new_heads = replace(b1_heads, {head(clean, 1, s): head(corrupted, 1, s)})
        out[f"b1.a.head{s}->logits"] = replace(clean, {b1: b1.with_children((new_heads, b1_rest))})
    return out
