"""Residual-stream path expansion: a node's residual input as a sum of named per-source terms.

``residual_terms(circuit, at, depth=1, layer_norm='keep'|'freeze')`` returns ``{name: node}``, one
node per source, whose values add up to ``at``'s value; ``expand_residual(...)`` returns the
circuit with ``at`` replaced by the ``Add`` of those terms (named like ``at``), so it prints,
diffs and saves like any circuit.

``at`` is either a **residual sum** (an ``Add``, e.g. ``'b1'``: its nested Adds are flattened into
their summands — each head of each layer, the token embeddings ``'idxed_embeds'``) or a
**LayerNorm** output (recognised by structure: bias + scale * (x - mean x) * rsqrt(var + eps),
as ``circuits.models.blocks.layer_norm`` builds it, e.g. ``'a1.norm'`` or the final
``'final.call'``).  For a LayerNorm:

- ``layer_norm='keep'``: the LN is kept whole and the expansion stops at its input: the terms are
  the summands of the LN's input ``x`` (``expand_residual`` rewrites ``x`` inside the LN into the
  Add of its terms).  Exact.
- ``layer_norm='freeze'``: the LN's scale ``s = rsqrt(var(x) + eps)`` is frozen to its clean value
  as a constant, so ``LN(x) = (x - mean x) * s * w + b`` is linear in ``x`` and distributes over
  the sum: one term per summand of ``x`` plus the LN's bias.  Exact *for the frozen scale*: equal
  to ``at`` at the clean input (the one the circuit holds, or ``inputs=``), not for other inputs.

**Names.**  A term is named after its source node (``'b0.a.head3'``, ``'idxed_embeds'``, the LN
bias ``'a1.ln.w.bias'``; an unnamed source is ``'term{i}'``).  A path of several sources is
written from the reader down: ``'b1.a.head3<-b0.a.head5'`` is the part of head 3 of layer 1 that
comes from head 5 of layer 0.

**Depth.**  ``depth=2`` expands each term whose source is a head (any node that is linear in a
LayerNorm output it reads, holding its other inputs — the attention pattern — at their clean
values) into the terms of that LayerNorm's input: paths of length 2, ``depth=3`` paths of length
3, and so on.  It passes through LayerNorms, so it needs ``layer_norm='freeze'``.  The attention
pattern is not a constant: it stays the circuit's own node, computed from the clean input, so the
sum of the terms equals the original value exactly (up to the frozen LN scales).

>>> import numpy as np
>>> from circuits import evaluate
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.array([1, 2, 3, 4, 5, 6]))
>>> sorted(residual_terms(loss, 'b1'))
['b0.a.head0', 'b0.a.head1', 'b1.a.head0', 'b1.a.head1', 'idxed_embeds']
>>> terms = residual_terms(loss, 'a1.norm', depth=2, layer_norm='freeze')
>>> 'b0.a.head1<-idxed_embeds' in terms, 'a1.ln.w.bias' in terms
(True, True)
>>> from circuits import Add
>>> total = evaluate(Add(*terms.values()), dtype='float64')   # the terms add up to the LayerNorm's value
>>> bool(np.allclose(total, evaluate(loss.get_unique('a1.norm'), dtype='float64'), atol=1e-5))
True
>>> bool(np.allclose(evaluate(expand_residual(loss, 'b1')), evaluate(loss), atol=1e-5))
True
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Array, Circuit, Einsum, Index, Rearrange, Tag
from ..select import Pred, as_matcher, get_unique
from ..select.norms import layer_norm_parts
from ..traversal import replace, toposort

__all__ = ["residual_terms", "expand_residual", "layer_norm_parts"]

LAYER_NORM_MODES = ("keep", "freeze")


# ---------------------------------------------------------------------------- linearity
_PASS_THROUGH = (Index, Rearrange, Tag)


def linear_nodes(top: Circuit, leaf: Circuit) -> set[bytes]:
    """Hashes of the nodes of ``top`` that are linear in ``leaf`` when every input that is not
    substituted is held at its value: ``leaf`` itself; an Einsum with exactly one operand linear
    in ``leaf`` (the others, whatever they depend on, held); an Add whose every child is linear
    (an Add of a constant is affine, not linear); an Index, Rearrange or Tag of a linear node."""
    lin: set[bytes] = {leaf.hash}
    for node in toposort(top, stop=lambda n: n.hash == leaf.hash):
        if node.hash == leaf.hash or not node.children:
            continue
        kids = node.children
        if isinstance(node, Einsum):
            if sum(c.hash in lin for c in kids) == 1:
                lin.add(node.hash)
        elif isinstance(node, Add):
            if all(c.hash in lin for c in kids):
                lin.add(node.hash)
        elif isinstance(node, _PASS_THROUGH):
            if kids[0].hash in lin:
                lin.add(node.hash)
    return lin


def substitute_linear(top: Circuit, leaf: Circuit, new: Circuit, lin: set[bytes]) -> Circuit:
    """``top`` with ``leaf`` replaced by ``new`` along its linear occurrences only (``lin``);
    other occurrences (inside held inputs such as an attention pattern) keep the original."""
    if leaf.shape != new.shape:
        new = Add(new, _zeros_like(leaf))
    done: dict[bytes, Circuit] = {leaf.hash: new}
    for node in toposort(top, stop=lambda n: n.hash not in lin or n.hash == leaf.hash):
        h = node.hash
        if h in done or h not in lin:
            continue
        done[h] = node.with_children(tuple(done.get(c.hash, c) if c.hash in lin else c for c in node.children))
    return done[top.hash]


def _zeros_like(node: Circuit) -> Circuit:
    from ..nodes import Scalar

    return Scalar(0.0, node.shape)


# ---------------------------------------------------------------------------- terms
def _summands(x: Circuit, stop) -> list[Circuit]:
    """The summands of ``x``: nested Adds flattened (LayerNorm outputs and ``stop`` nodes stay whole)."""
    out: list[Circuit] = []
    stack = [x]
    while stack:
        node = stack.pop()
        if isinstance(node, Add) and layer_norm_parts(node) is None and not stop(node):
            stack.extend(reversed(node.children))
        else:
            out.append(node)
    return out


class _Expander:
    def __init__(self, root: Circuit, layer_norm: str, inputs, stop):
        self.root = root
        self.layer_norm = layer_norm
        self.inputs = inputs
        self.stop = stop
        self.frozen: dict[bytes, Circuit] = {}  # rsqrt node hash -> its frozen constant

    def frozen_scale(self, rsqrt: Circuit) -> Circuit:
        const = self.frozen.get(rsqrt.hash)
        if const is None:
            from ..backend import evaluate

            # Every LayerNorm scale of the circuit in one pass (one compile), frozen on first need.
            scales = list({p["rsqrt"].hash: p["rsqrt"] for n in toposort(self.root)
                           if (p := layer_norm_parts(n)) is not None}.values())
            if rsqrt.hash not in {r.hash for r in scales}:
                scales.append(rsqrt)
            _, values = evaluate(Add(*scales), self.inputs, dtype="float64", also=scales)
            for r in scales:
                value = np.asarray(values[r]).astype(r.dtype)
                self.frozen[r.hash] = Array(value, name=f"{r.name}.frozen" if r.name else "ln.rsqrt.frozen")
            const = self.frozen[rsqrt.hash]
        return const

    def ln_terms(self, ln: Circuit, parts: dict) -> list[tuple[str, Circuit, Circuit]]:
        """A frozen LayerNorm's terms ``(source name, term node, source node)``: its bias and the
        frozen linear part applied to each summand of its input."""
        linear = replace(parts["y_scaled"], {parts["rsqrt"]: self.frozen_scale(parts["rsqrt"])})
        x = parts["x"]
        lin = linear_nodes(linear, x)
        if linear.hash not in lin:  # pragma: no cover - the structure check makes this linear
            raise CircuitError(f"the LayerNorm {ln.line()} is not linear in its input once its scale is frozen")
        out = [] if parts["bias"] is None else [(_label(parts["bias"], "bias"), parts["bias"], parts["bias"])]
        for i, s in enumerate(_summands(x, self.stop)):
            out.append((_label(s, f"term{i}"), substitute_linear(linear, x, s, lin), s))
        return out

    def reads(self, source: Circuit) -> tuple[Circuit, dict, set] | None:
        """The one LayerNorm output ``source`` is linear in (a head reading the residual stream
        through its value path), or None."""
        found = []
        for node in toposort(source, stop=lambda n: layer_norm_parts(n) is not None and n is not source):
            parts = layer_norm_parts(node) if node is not source else None
            if parts is not None:
                lin = linear_nodes(source, node)
                if source.hash in lin:
                    found.append((node, parts, lin))
        return found[0] if len(found) == 1 else None

    def expand(self, at: Circuit, depth: int) -> list[tuple[str, Circuit]]:
        parts = layer_norm_parts(at)
        if parts is not None and self.layer_norm == "freeze":
            level = self.ln_terms(at, parts)
        else:
            x = parts["x"] if parts is not None else at
            level = [(_label(s, f"term{i}"), s, s) for i, s in enumerate(_summands(x, self.stop))]
        # Each entry: (path name, term node, source node); the term is linear in its source.
        for _ in range(depth - 1):
            nxt = []
            for name, term, source in level:
                read = self.reads(source) if not self.stop(source) else None
                if read is None:
                    nxt.append((name, term, source))
                    continue
                ln, ln_parts, lin_src = read
                lin_term = linear_nodes(term, source)
                for sub_name, sub_term, sub_source in self.ln_terms(ln, ln_parts):
                    inner = substitute_linear(source, ln, sub_term, lin_src)
                    nxt.append((f"{name}<-{sub_name}", substitute_linear(term, source, inner, lin_term), sub_source))
            level = nxt
        # Every term has the value's full shape (a bias [d] broadcast over the positions), so the
        # terms stack and index alike.
        full = [(n, t if t.shape == at.shape else Add(t, _zeros_like(at))) for n, t, _ in level]
        return [(n, t if t.name == n else t.rename(n)) for n, t in _unique_names(full)]


def _label(node: Circuit, fallback: str) -> str:
    return node.name if node.name else fallback


def _unique_names(items):
    seen: dict[str, int] = {}
    out = []
    for name, node in items:
        k = seen.get(name, 0) + 1
        seen[name] = k
        out.append((name if k == 1 else f"{name}#{k}", node))
    return out


def _resolve(circuit: Circuit, at, depth: int, layer_norm: str, stop_at):
    if layer_norm not in LAYER_NORM_MODES:
        raise CircuitError(f"layer_norm={layer_norm!r}: expected 'keep' (stop at the LayerNorm's input) "
                           "or 'freeze' (freeze its scale at the clean value so it distributes)")
    if not isinstance(depth, int) or depth < 1:
        raise CircuitError(f"depth={depth!r}: expected an int >= 1 (1: direct sources, 2: paths of two, ...)")
    if depth > 1 and layer_norm != "freeze":
        raise CircuitError(f"depth={depth} expands heads through the LayerNorms they read, which are not "
                           "linear: pass layer_norm='freeze' (or depth=1)")
    node = at if isinstance(at, Circuit) else get_unique(circuit, at)
    if not (isinstance(node, Add)):
        raise CircuitError(
            f"expand_residual: {node.line()} is neither a residual sum (an Add such as 'b1') nor a "
            "LayerNorm output (such as 'a1.norm'); give the residual stream node or the LayerNorm that reads it"
        )
    stop = as_matcher(stop_at) if stop_at is not None else Pred(lambda n: False, "nothing")
    stops = stop.matches(circuit) if stop_at is not None else set()
    return node, (lambda n: n.hash in stops)


def residual_terms(circuit: Circuit, at, *, depth: int = 1, layer_norm: str = "keep",
                   inputs: Mapping | None = None, stop_at=None) -> dict[str, Circuit]:
    """``{name: term}``: the residual input of ``at`` (a residual sum or a LayerNorm output, a
    node or a matcher of exactly one node of ``circuit``) as named per-source terms whose values
    add up to it (see the module docstring for ``layer_norm`` and ``depth``).  ``stop_at``: a
    matcher of nodes that stay whole terms (not flattened or expanded further); ``inputs``: the
    Symbols' values at which LayerNorm scales are frozen.

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> list(residual_terms(attn_only(w, np.arange(6)), 'final.call', layer_norm='freeze'))
    ['final.ln.w.bias', 'b0.a.head0', 'b0.a.head1', 'idxed_embeds']
    """
    node, stop = _resolve(circuit, at, depth, layer_norm, stop_at)
    return dict(_Expander(circuit, layer_norm, inputs, stop).expand(node, depth))


def expand_residual(circuit: Circuit, at, *, depth: int = 1, layer_norm: str = "keep",
                    inputs: Mapping | None = None, stop_at=None) -> Circuit:
    """``circuit`` with ``at``'s residual input written as the sum of its named per-source terms
    (``residual_terms``): with ``layer_norm='keep'`` a LayerNorm's input becomes the ``Add`` of the
    terms (named like the input) inside the LayerNorm; otherwise ``at`` itself becomes the ``Add``
    of the terms, named like ``at``.  The value is unchanged (for ``'freeze'``: at the clean input).

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    >>> c = expand_residual(attn_only(w, np.arange(6)), 'b1', depth=2, layer_norm='freeze')
    >>> [t.name for t in c.get_unique('b1').children][:3]
    ['b1.a.head0<-a1.ln.w.bias', 'b1.a.head0<-b0.a.head0', 'b1.a.head0<-b0.a.head1']
    """
    node, stop = _resolve(circuit, at, depth, layer_norm, stop_at)
    terms = _Expander(circuit, layer_norm, inputs, stop).expand(node, depth)
    named = [t for _, t in terms]
    parts = layer_norm_parts(node)
    if parts is not None and layer_norm == "keep":
        x = parts["x"]
        new = replace(node, {x: Add(*named, name=x.name)})
    else:
        new = Add(*named, name=node.name)
    if new.shape != node.shape:  # pragma: no cover - every term broadcasts to the node's shape
        raise CircuitError(f"expand_residual: the terms of {node.line()} add up to shape {list(new.shape)}")
    return replace(circuit, {node: new})
