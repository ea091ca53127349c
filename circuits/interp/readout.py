"""Residual-stream analysis: the logit lens and direct logit attribution.

Both read the model's *readout*: the final norm (LayerNorm or RMSNorm) and the unembedding that
turn the final residual stream into logits (``circuits.select.hooks.READOUT`` names them per
naming convention: ``'final.call'`` and ``'t.call'`` for the seed's model, ``'final.ln'`` and
``'logits'`` for the HuggingFace builders; tracr models have no norm).

- ``logit_lens(circuit, inputs)``: each residual stage (the input of every layer, then the final
  residual; ``mid=True`` adds the residual between attention and MLP) read out as logits.
  ``layer_norm='freeze'`` (default) scales every stage by the final norm's scale computed on the
  model's *own* final residual (TransformerLens's ``apply_ln_to_stack``: the scale is the
  circuit's own ``rsqrt`` node, kept, not recomputed), so the last stage is the model's logits
  and every stage is read through the same linear map; ``'recompute'`` applies the final norm
  afresh to each stage (the original logit lens).
- ``logit_attribution(circuit, direction, inputs)``: the final residual stream is a sum of the
  embeddings, every head's and MLP's output and constant biases; with the final norm's scale
  frozen at its value the readout is affine, so ``direction . logits`` at every position is the
  sum of one term per component (named as ``interp.edges`` names sources: ``'embeds'``,
  ``'b0.a.head2'``, ``'h3.mlp'``; a fused attention layer ``'h3.attn'``) plus one per bias
  (each named after its node: an attention output bias in the residual stream, the final norm's
  bias, an unembedding bias).  A logit difference is ``direction = e_a - e_b``.

Each value comes back batch first for a batch of inputs.

>>> import numpy as np
>>> from circuits import evaluate
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.arange(6), unique_names=True)
>>> lens = logit_lens(loss)
>>> list(lens), lens['b1'].shape
(['idxed_embeds', 'b0', 'b1'], (4, 11))
>>> bool(np.allclose(lens['b1'], evaluate(loss.get_unique('t.call')), atol=1e-5))   # the last stage: the logits
True
>>> d = np.eye(11)[3] - np.eye(11)[5]                                               # logit of 3 minus logit of 5
>>> dla = logit_attribution(loss, d)
>>> list(dla)[:3], dla['b1.a.head0'].shape
(['embeds', 'b0.a.head0', 'b0.a.head1'], (4,))
>>> bool(np.allclose(sum(dla.values()), lens['b1'] @ d, atol=1e-5))
True
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Array, Circuit, Einsum, Symbol
from ..select.hooks import READOUT, hook_source, naming_convention
from ..select.norms import norm_parts
from ..traversal import toposort
from .positions import bind_rows
from .residual_paths import linear_nodes, substitute_linear
from .sites import copy_with, one_root

__all__ = ["logit_lens", "logit_attribution", "Readout"]

LAYER_NORM_MODES = ("freeze", "recompute")
_SOURCE = re.compile(r"((^|\.)head\d+|(^|\.)mlp|(^|\.)attn)$")
_LAYER = re.compile(r"^[bh]\d+\.")


class Readout:
    """Where a circuit's readout sits: ``logits`` (the unembedding's output), ``norm`` (the final
    norm's output, or None), ``parts`` (its ``norm_parts``), ``resid`` (the final residual stream
    it reads)."""

    def __init__(self, circuit: Circuit, what: str):
        convention = naming_convention(circuit)
        if convention is None:
            raise CircuitError(f"{what}: {circuit.line()} is not named as a builder names its nodes "
                               "(attn_only, gpt2/opt/llama/..., from_tracr); the readout is found by those names")
        names = READOUT[convention]
        found = {}
        for n in toposort(circuit):
            if n.name is not None:
                found.setdefault(n.name, []).append(n)
        logits = next((found[k][0] for k in names["logits"] if len(found.get(k, ())) == 1), None)
        if logits is None:
            raise CircuitError(f"{what}: the circuit has no unembedding output named "
                               f"{' or '.join(map(repr, names['logits']))}")
        self.logits = logits
        self.norm = self.parts = None
        if names["final_norm"] is not None:
            norm = found.get(names["final_norm"], [None])[0]
            parts = norm_parts(norm) if norm is not None else None
            if parts is None:
                raise CircuitError(f"{what}: {names['final_norm']!r} is not a LayerNorm or RMSNorm the readout "
                                   "recognises (circuits.select.norms)")
            self.norm, self.parts = norm, parts
            self.resid = parts["x"]
        else:
            last = hook_source(circuit, _last_resid(circuit))
            if last is None:
                raise CircuitError(f"{what}: found no final residual stream for {logits.line()}")
            self.resid = last.nodes[0]

    def frozen_linear(self, term: Circuit) -> Circuit:
        """The final norm's linear part applied to ``term`` with the norm's scale frozen at its
        value on the model's own residual: ``(t - mean t) * rsqrt * w`` (LayerNorm), ``t * rsqrt *
        w`` (RMSNorm); ``term`` itself without a norm."""
        if self.parts is None:
            return term
        kind = self.parts["kind"]
        top = self.norm if kind == "rms_norm" else self.parts["y_scaled"]
        rsqrt = self.parts["rsqrt"]
        copies = copy_with([top], {self.resid.hash: term}, "", keep=lambda n: n.hash == rsqrt.hash)
        return copies[top.hash]


def _last_resid(circuit: Circuit) -> str:
    layer = 0
    while hook_source(circuit, f"blocks.{layer + 1}.hook_resid_post") is not None:
        layer += 1
    return f"blocks.{layer}.hook_resid_post"


def _stages(circuit: Circuit, readout: Readout, mid: bool) -> list[Circuit]:
    """The residual stream before each layer (its ``mid`` point too), then the final residual."""
    out, layer = [], 0
    while True:
        pre = hook_source(circuit, f"blocks.{layer}.hook_resid_pre")
        if pre is None or hook_source(circuit, f"blocks.{layer}.hook_resid_post") is None:
            break
        out.append(pre.nodes[0])
        middle = hook_source(circuit, f"blocks.{layer}.hook_resid_mid") if mid else None
        if middle is not None:
            out.append(middle.nodes[0])
        layer += 1
    out.append(readout.resid)
    seen, unique = set(), []
    for n in out:
        if n.hash not in seen:
            seen.add(n.hash)
            unique.append(n)
    return unique


def logit_lens(circuit: Circuit, inputs: Mapping | None = None, *, layer_norm: str = "freeze", mid: bool = False,
               dtype="float32", mode: str = "auto") -> dict[str, np.ndarray]:
    """``{stage: logits}``: each residual stage read out by the model's final norm and
    unembedding (see the module docstring), keyed by the stage node's name, in order; each value
    ``[pos, vocab]`` (batch first).  ``layer_norm``: ``'freeze'`` (TransformerLens's
    ``apply_ln_to_stack``) or ``'recompute'``; ``mid=True`` adds the stage between attention and
    MLP (``'h3.mid'``).

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights, tokens_symbol
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> lens = logit_lens(attn_only(w, tokens_symbol(6)), {'toks_int_var': np.zeros((3, 6), int)}, layer_norm='recompute')
    >>> {k: v.shape for k, v in lens.items()}
    {'idxed_embeds': (3, 4, 11), 'b0': (3, 4, 11)}
    """
    from ..backend import evaluate

    if layer_norm not in LAYER_NORM_MODES:
        raise CircuitError(f"logit_lens: layer_norm={layer_norm!r}; use 'freeze' (the final norm's scale from the "
                           "model's own final residual, as TransformerLens's apply_ln_to_stack) or 'recompute'")
    readout = Readout(circuit, "logit_lens")
    keep = None
    if layer_norm == "freeze" and readout.parts is not None:
        rsqrt = readout.parts["rsqrt"]
        keep = lambda n: n.hash == rsqrt.hash  # noqa: E731
    stages = _stages(circuit, readout, mid)
    outs = []
    for stage in stages:
        copies = copy_with([readout.logits], {readout.resid.hash: stage}, f"@{stage.name}", keep=keep)
        outs.append(copies[readout.logits.hash])
    _, values = evaluate(one_root(outs), bind_rows(circuit, inputs), dtype=dtype, also=outs, mode=mode)
    return {_name(s): np.asarray(values[o]) for s, o in zip(stages, outs)}


def _name(node: Circuit) -> str:
    return node.name if node.name is not None else node.line()


# ---------------------------------------------------------------------------- attribution
def _components(resid: Circuit) -> list[tuple[str, Circuit]]:
    """The final residual stream's summands: ``(label, node)``; heads, MLPs and fused attention
    layers by their names, the full-shape rest ``'embeds'``, lower-rank constants (biases) by
    their own names."""
    out: list[tuple[str, Circuit]] = []
    stack = [resid]
    while stack:
        node = stack.pop()
        named_source = node.name is not None and _SOURCE.search(node.name) is not None and node is not resid
        heads_inside = isinstance(node, Add) and _sources_inside(node)
        if isinstance(node, Add) and (not named_source or heads_inside) and norm_parts(node) is None:
            stack.extend(reversed(node.children))  # a sum: a layer's heads (and output bias), a residual
        elif len(node.shape) < len(resid.shape):
            out.append((_name(node) if node.name is not None else "bias", node))
        elif named_source or (node.name is not None and _LAYER.match(node.name)):
            out.append((node.name, node))  # a head, an MLP, a layer's part (Gemma-2's post-norm output)
        else:
            out.append(("embeds", node))
    return out


def _sources_inside(node: Add) -> bool:
    """Whether a sum holds named sources (heads) among its summands, through nested sums (a
    layer's ``'h0.attn'`` = ``'h0.attn.heads'`` (the heads' sum) + the output bias)."""
    stack = list(node.children)
    while stack:
        child = stack.pop()
        if _SOURCE.search(child.name or ""):
            return True
        if isinstance(child, Add) and norm_parts(child) is None:
            stack.extend(child.children)
    return False


def _pullback(readout: Readout, direction: np.ndarray, fdt) -> tuple[np.ndarray, list[tuple[str, Circuit]]]:
    """``(G, constants)``: ``G`` [pos, d] with ``direction . logits = <G, norm output>`` plus the
    constant summands of the unembedding (an unembedding bias), for the unembedding's linear part."""
    from ..backend import value_and_grad

    top, norm = readout.logits, readout.norm if readout.norm is not None else readout.resid
    consts: list[tuple[str, Circuit]] = []
    lin = linear_nodes(top, norm)
    if top.hash not in lin:
        if not isinstance(top, Add):
            raise CircuitError(f"logit_attribution: {top.line()} is not affine in the final norm's output")
        linear = [c for c in top.children if c.hash in linear_nodes(c, norm)]
        consts = [(_name(c), c) for c in top.children if c.hash not in {x.hash for x in linear}]
        if not linear or any(norm.hash in {n.hash for n in toposort(c)} for _, c in consts):
            raise CircuitError(f"logit_attribution: {top.line()} is not affine in the final norm's output")
        top = linear[0] if len(linear) == 1 else Add(*linear)
        lin = linear_nodes(top, norm)
    x = Symbol(norm.shape, name="logit_attribution.x", dtype=norm.dtype)
    readout_of_x = substitute_linear(top, norm, x, lin)
    rows = direction.shape[:-len(readout.logits.shape)] if direction.ndim > len(readout.logits.shape) else ()
    cot = np.broadcast_to(direction, rows + readout.logits.shape).astype(fdt)
    _, g = value_and_grad(readout_of_x, x, {x: np.zeros(rows + norm.shape, fdt)}, cotangent=cot, dtype=fdt)
    return np.asarray(g), consts


def logit_attribution(circuit: Circuit, direction, inputs: Mapping | None = None, *, dtype="float32",
                      mode: str = "auto") -> dict[str, np.ndarray]:
    """``{component: direction . its contribution to the logits}`` at every position (see the
    module docstring): each value ``[pos]`` (batch first), the values summing to ``direction .
    logits`` at every position (exactly, with the final norm's scale at its value).
    ``direction``: ``[vocab]`` (``e_a - e_b`` for a logit difference), ``[pos, vocab]`` (one per
    position) or, for a batch of inputs, ``[batch, pos, vocab]`` (one per row and position: each
    prompt's own answer tokens).

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=1, head_size=4, n_layers=1, max_positions=16)
    >>> dla = logit_attribution(attn_only(w, np.arange(6), unique_names=True), np.eye(11)[2])
    >>> {k: v.shape for k, v in dla.items()}
    {'embeds': (4,), 'b0.a.head0': (4,), 'final.ln.w.bias': (4,)}
    """
    from ..backend import evaluate, float_dtype

    fdt = float_dtype(dtype)
    readout = Readout(circuit, "logit_attribution")
    vocab = readout.logits.shape[-1]
    d = np.asarray(direction, dtype=np.float64)
    per_row = d.ndim == len(readout.logits.shape) + 1 and d.shape[1:] == readout.logits.shape
    if d.shape not in ((vocab,), readout.logits.shape) and not per_row:
        raise CircuitError(f"logit_attribution: direction has shape {list(d.shape)}; give [{vocab}] (a vector over "
                           f"the vocabulary), {list(readout.logits.shape)} (one per position) or [batch, "
                           f"{', '.join(map(str, readout.logits.shape))}] (one per row of a batch)")
    g, unembed_consts = _pullback(readout, d, fdt)
    inputs = dict(inputs or {})
    if per_row:  # one pulled-back direction per row: an input bound with the batch
        pull = Symbol(g.shape[1:], name="logit_attribution.direction", dtype=fdt)
        inputs[pull] = g.astype(fdt)
    else:
        pull = Array(g.astype(fdt), name="logit_attribution.direction")  # in the precision asked for
    letters = "abcdefgh"[: len(pull.shape)]
    pos = letters[:-1]

    def score(term: Circuit) -> Circuit:
        full = term if term.shape == pull.shape else Add(term, _zeros(pull.shape))
        return Einsum.from_spec(f"{letters},{letters}->{pos}", full, pull)

    groups: dict[str, list[Circuit]] = {}
    position = {n.hash: i for i, n in enumerate(toposort(readout.resid))}
    components = _components(readout.resid)
    first = {}
    for label, node in components:
        first[label] = min(first.get(label, len(position)), position[node.hash])
    # in circuit order (embeddings, layer 0's heads, ...), as interp.edges lists its sources
    for label, node in sorted(components, key=lambda item: (first[item[0]], position[item[1].hash])):
        full = node if node.shape == readout.resid.shape else Add(node, _zeros(readout.resid.shape))  # a bias [d]
        groups.setdefault(label, []).append(score(readout.frozen_linear(full)))
    if readout.parts is not None and readout.parts.get("bias") is not None:
        bias = readout.parts["bias"]
        groups.setdefault(_name(bias), []).append(score(bias))
    if per_row:
        dir_node = Symbol(readout.logits.shape, name="logit_attribution.logit_dir", dtype=fdt)
        if unembed_consts:
            inputs[dir_node] = d.astype(fdt)
    else:
        dir_node = Array(np.broadcast_to(d, readout.logits.shape).astype(pull.dtype), name="logit_attribution.logit_dir")
    for label, const in unembed_consts:
        full = const if const.shape == readout.logits.shape else Add(const, _zeros(readout.logits.shape))
        lv = "abcdefgh"[: len(readout.logits.shape)]
        groups.setdefault(label, []).append(Einsum.from_spec(f"{lv},{lv}->{lv[:-1]}", full, dir_node))
    nodes = {k: v[0] if len(v) == 1 else Add(*v) for k, v in groups.items()}
    outs = list(nodes.values())
    _, values = evaluate(one_root(outs), bind_rows(circuit, inputs or None), dtype=fdt, also=outs, mode=mode)
    return {k: np.asarray(values[n]) for k, n in nodes.items()}


def _zeros(shape) -> Circuit:
    from ..nodes import Scalar

    return Scalar(0.0, shape)
