"""Edges: a transformer's head-level computational graph, and patching exactly the edges one names.

The residual stream is a sum: the embeddings plus every head's and every MLP's output (plus
constant biases).  Each reader of the residual stream (a head's query, key or value input, an
MLP's input, the output) reads that sum, so its input is exactly a sum of one term per upstream
*source* (residual-stream path expansion, as in ``residual_terms``).  An *edge* is one such term:
``'<source> -> <destination>'``.

- sources: ``'embeds'`` (what the embeddings put into the residual stream: the seed model's token
  embeddings, GPT-2's token plus position embeddings), each head (``'b0.a.head2'``,
  ``'h3.attn.head5'``), each MLP (``'h0.mlp'``);
- destinations: each head's query, key and value inputs (the head's top-most nodes named
  ``…q``, ``…k``, ``…v``: ``'b1.a.head0.a.k'``; under grouped-query attention the key-value
  head's ``'h0.attn.kv1.k'``), each MLP (its input: ``'h1.mlp'``), and ``'output'``.

Heads are found by name (``…head<h>``, as ``attn_only(unique_names=True)`` and the builders'
``split_heads=True`` name them), MLPs by name (``….mlp``); the residual sum each destination
reads is found by structure (the input of the LayerNorm it reads, or the Add it reads).  A block
whose output is normalised before it joins the residual stream (Gemma-2's sandwich norms:
``'h{l}.attn.post_ln'``, ``'h{l}.mlp.post_ln'``) adds no sum of heads to it, so its normalised
output is one source named after the block (``'h{l}.attn'``, ``'h{l}.mlp'``); its heads stay
destinations (their query, key and value inputs).

``patch_edges(circuit, edges, source)`` rebuilds each destination that has a patched edge over
its own copy of the residual sum, ``'<destination>.resid'``, in which the patched edges' terms
are the senders recomputed from ``source`` (or their zero / mean ablation) and every other term
is the sender as computed in the patched circuit; the nodes between the residual sum and the
destination are copied (``'<name>@<destination>'``).  With ``mask=True`` every covered edge's
term is ``sender + w * (patched sender - sender)`` for its weight ``w`` in the Symbol
``'edges.mask'``: one compiled program serves every edge set and every interpolated mask.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.arange(6), unique_names=True)
>>> g = edges(loss)
>>> len(g), g[0], g[-1]
(29, 'embeds -> b0.a.head0.a.q', 'b1.a.head1 -> output')
>>> p = patch_edges(loss, ['b0.a.head1 -> b1.a.head0.a.k'], {'toks_int_var': np.array([1, 7, 3, 9, 5, 6])})
>>> [t.name for t in p.get_unique('b1.a.head0.a.k.resid').children]
['idxed_embeds', 'b0.a.head0', 'b0.a.head1.source']
"""

from __future__ import annotations

import collections
import re
from typing import Mapping, Sequence

import numpy as np

from ...errors import CircuitError, SelectionError
from ...nodes import Add, Array, Circuit, Concat, Einsum, Index, Rearrange, Scalar, Symbol
from ...traversal import replace, toposort
from ..interventions import source_copies, values_over_batch
from ..residual_paths import layer_norm_parts
from ..sites import copy_with, resolve_inputs

__all__ = ["Edges", "edges", "patch_edges", "ABLATIONS", "MASK_NAME"]

ABLATIONS = ("resample", "zero", "mean")
MASK_NAME = "edges.mask"
EMBEDS = "embeds"
OUTPUT = "output"
_HEAD = re.compile(r"(^|\.)head\d+$")
_MLP = re.compile(r"(^|\.)mlp$")
_POST = ".post_ln"  # a block's output normalised before the residual stream adds it (Gemma-2)
_ROLES = ("q", "k", "v")


class _Dest:
    __slots__ = ("label", "node", "resid", "sources", "consts")

    def __init__(self, label, node, resid, sources, consts):
        self.label, self.node, self.resid = label, node, resid
        self.sources, self.consts = sources, consts  # source labels in order; constant summands


class Edges(Sequence):
    """The edges of a circuit's head-level graph (``edges(circuit)``): a sequence of edge names
    ``'<source> -> <destination>'``, grouped by destination in topological order, with the
    ``sources`` and ``destinations`` (labels, topological order) and ``index(name)``."""

    def __init__(self, circuit: Circuit, sources: dict, dests: list[_Dest]):
        self.circuit = circuit
        self._sources = sources  # label -> list of member nodes (embeds may be several summands)
        self._dests = dests
        self.names = tuple(f"{s} -> {d.label}" for d in dests for s in d.sources)
        self._templates: dict = {}  # destination label -> (stand-in Symbol, copied path): see _template
        self._original = {n.hash for n in toposort(circuit)}
        self._masked: dict = {}  # (covered edges, ablation, source fingerprint) -> masked circuit
        self._index = {n: i for i, n in enumerate(self.names)}

    @property
    def sources(self) -> list[str]:
        return list(self._sources)

    @property
    def destinations(self) -> list[str]:
        return [d.label for d in self._dests]

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        return self.names[i]

    def __contains__(self, name):
        return name in self._index

    def __iter__(self):
        return iter(self.names)

    def index(self, name, *_):
        """The position of edge ``name`` (an unknown name is a SelectionError with close names)."""
        i = self._index.get(name) if isinstance(name, str) else None
        if i is None:
            raise SelectionError(_unknown_edge(self, name))
        return i

    def resolve(self, names, what: str = "edges") -> list[int]:
        """Positions of a list of edge names (each checked, none twice)."""
        if isinstance(names, str):
            names = [names]
        out = [self.index(n) for n in names]
        if len(set(out)) != len(out):
            twice = sorted({self.names[i] for i in out if out.count(i) > 1})
            raise CircuitError(f"{what}: {twice} given twice; name each edge once")
        return out

    def __repr__(self):
        return (f"<Edges: {len(self)} edges, {len(self._sources)} sources, {len(self._dests)} destinations "
                f"of {self.circuit.line()}>")


def _unknown_edge(g: Edges, name) -> str:
    import difflib

    if not isinstance(name, str):
        return f"edge {name!r}: give an edge name such as {g.names[0]!r}"
    if not name.strip():
        return "an empty edge name: give names such as " + repr(g.names[0])
    if " -> " not in name:
        return f"edge {name!r} is not of the form '<source> -> <destination>' (e.g. {g.names[0]!r})"
    close = difflib.get_close_matches(name, g.names, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    src, dst = name.split(" -> ", 1)
    if src not in g._sources:
        hint += f" ({src!r} is not a source: the sources are {', '.join(list(g._sources)[:6])}, ...)"
    elif dst not in g.destinations:
        hint += f" ({dst!r} is not a destination)"
    else:
        hint += f" ({src!r} is not upstream of {dst!r})"
    return f"the circuit has no edge {name!r}{hint}"


# ---------------------------------------------------------------------------- the graph
def _summands(x: Circuit, stop) -> list[Circuit]:
    """The summands of ``x``: nested Adds flattened; sources, LayerNorm outputs stay whole."""
    out, stack = [], [x]
    while stack:
        node = stack.pop()
        if isinstance(node, Add) and not stop(node) and layer_norm_parts(node) is None:
            stack.extend(reversed(node.children))
        else:
            out.append(node)
    return out


def _find_resid(dest: Circuit, is_source, label: str, shape: tuple | None = None) -> Circuit:
    """The one residual sum ``dest`` reads: the input of a LayerNorm, or an Add with sources
    among its summands, or a source read directly; the first met on every path down.  With
    ``shape`` (the residual stream's), a LayerNorm of anything else (StableLM's norm of each
    head's queries) is walked through."""
    found: dict[bytes, Circuit] = {}
    stack, seen = list(dest.children) if dest is not None else [], set()
    while stack:
        n = stack.pop()
        if n.hash in seen:
            continue
        seen.add(n.hash)
        parts = layer_norm_parts(n)
        if is_source(n):
            found[n.hash] = n
        elif parts is not None and (shape is None or parts["x"].shape == shape):
            found[parts["x"].hash] = parts["x"]
        elif isinstance(n, Add) and any(is_source(s) for s in _summands(n, is_source)):
            found[n.hash] = n
        else:
            stack.extend(n.children)
    if len(found) != 1:
        what = "no residual stream" if not found else "the residual stream at several nodes: " + ", ".join(
            r.line() for r in found.values())
        raise CircuitError(f"edges: destination {label!r} ({dest.line()}) reads {what}; a destination must read "
                           "one residual sum (through a LayerNorm or directly)")
    return next(iter(found.values()))


def _analyse(circuit: Circuit) -> Edges:
    order = toposort(circuit)
    def named(pattern):  # computed nodes so named (not weights such as 'a0.w.q.head0')
        return [n for n in order if n.name is not None and pattern.search(n.name)
                and not isinstance(n, (Array, Index, Rearrange, Symbol, Scalar))]

    heads, mlps = named(_HEAD), named(_MLP)
    if not heads and not mlps:
        raise CircuitError(
            f"edges: {circuit.line()} has no heads (nodes named '...head<h>') and no MLPs ('....mlp'); build "
            "the model with per-head names: attn_only(..., unique_names=True), gpt2/opt/llama(..., split_heads=True)")
    # Each source: (label, node).  A head is its own source unless its block is normalised before
    # the residual stream adds it (then the block's normalised output is the source).
    post = {n.name[: -len(_POST)]: n for n in order if n.name and n.name.endswith(_POST) and n.children}

    def label(head):  # the block's name when the block is normalised, else the head's own
        block_name = head.name.rsplit(".", 1)[0]
        return block_name if block_name in post else head.name

    label_of = {h.hash: label(h) for h in heads}
    # by node: a normalised block's heads give one source; distinct heads sharing a name stay two
    # (refused below by name)
    by_node = {}
    for h in heads:
        node = h if label_of[h.hash] == h.name else post[label_of[h.hash]]
        by_node.setdefault(node.hash, (label_of[h.hash], node))
    sources = list(by_node.values()) + [(m.name, post.get(m.name, m)) for m in mlps]
    block = {node.hash: node for _, node in sources}
    # The final residual stream: what the output reads; its summands that are not sources or
    # broadcast constants are the embeddings.
    out_resid = _find_resid(circuit, lambda n: n.hash in block, OUTPUT)
    terms = _summands(out_resid, lambda n: n.hash in block)
    term_set = {t.hash for t in terms}
    sources = [(label, node) for label, node in sources if node.hash in term_set]
    kept = {label for label, _ in sources}
    heads = [h for h in heads if label_of[h.hash] in kept]
    mlps = [m for m in mlps if m.name in kept]
    embeds = []
    for t in terms:
        if t.hash in block or t.ndim < out_resid.ndim:
            continue
        embeds.append(t)
    for t in embeds:
        inner = [n for n in toposort(t) if n.hash in term_set and n is not t]
        if inner:
            raise CircuitError(
                f"edges: the residual stream term {t.line()} is computed from other terms ({inner[0].line()}) but is "
                "neither a head ('...head<h>') nor an MLP ('....mlp'): split fused attention into heads "
                "(split_heads=True) or name the block")
    _check_unique([label for label, _ in sources] + [EMBEDS], "sources", "{} -> output")
    source_of: dict[bytes, str] = {node.hash: label for label, node in sources}
    for t in embeds:
        source_of[t.hash] = EMBEDS
    members: dict[str, list[Circuit]] = {}
    for n in order:  # topological order of sources
        if n.hash in source_of:
            members.setdefault(source_of[n.hash], []).append(n)
    if EMBEDS not in members:
        raise CircuitError(f"edges: found no embeddings in the final residual stream {out_resid.line()}")

    def is_source(n):
        return n.hash in source_of

    dests: list[tuple[str, Circuit]] = []
    for h in heads:
        for role, node in _roles(h, is_source).items():
            dests.append((node.name, node))
    dests += [(m.name, m) for m in mlps]
    pos = {n.hash: i for i, n in enumerate(order)}
    dests = list({node.hash: (label, node) for label, node in dests}.values())
    dests.sort(key=lambda d: pos[d[1].hash])
    _check_unique([label for label, _ in dests] + [OUTPUT], "destinations", "embeds -> {}")
    out: list[_Dest] = []
    for label, node in dests + [(OUTPUT, circuit)]:
        resid = out_resid if label == OUTPUT else _find_resid(node, is_source, label, out_resid.shape)
        summands = _summands(resid, is_source)
        srcs, consts = [], []
        for s in summands:
            if is_source(s):
                if source_of[s.hash] not in srcs:
                    srcs.append(source_of[s.hash])
            elif any(is_source(n) for n in toposort(s)):
                raise CircuitError(
                    f"edges: the residual stream {resid.line()} read by {label!r} has a term {s.line()} computed from "
                    "sources but not itself a head, an MLP or the embeddings; split heads (split_heads=True)")
            else:
                consts.append(s)
        srcs.sort(key=lambda s: pos[members[s][0].hash])
        _check_only_through(node if label != OUTPUT else circuit, resid, is_source, label)
        out.append(_Dest(label, node, resid, srcs, consts))
    return Edges(circuit, members, out)


def _check_unique(labels: list[str], what: str, example: str) -> None:
    """Refuse labels of distinct sources or destinations that repeat: their edges' names would
    (a model built without per-head names: every head's query input is ``'a.q'``)."""
    counts = collections.Counter(labels)
    twice = [label for label, k in counts.items() if k > 1]
    if twice:
        named = ", ".join(f"{label!r} {counts[label]} times" for label in twice[:3])
        raise CircuitError(
            f"edges: distinct {what} share names ({named}{', ...' if len(twice) > 3 else ''}), so edge names would "
            f"repeat ({example.format(twice[0])!r}); build the model with unique names: "
            "attn_only(..., unique_names=True), gpt2/opt/llama(..., split_heads=True), or name each node apart")


def _roles(head: Circuit, is_source) -> dict[str, Circuit]:
    """A head's top-most nodes named ``…q``, ``…k``, ``…v`` (not inside another source)."""
    found: dict[str, list[Circuit]] = {r: [] for r in _ROLES}
    stack, seen = list(head.children), set()
    while stack:
        n = stack.pop()
        if n.hash in seen or is_source(n):
            continue
        seen.add(n.hash)
        role = n.name.rsplit(".", 1)[-1] if n.name and n.children else None
        if role in found:
            found[role].append(n)
        else:
            stack.extend(n.children)
    for role, nodes in found.items():
        if len(nodes) != 1:
            got = "none" if not nodes else ", ".join(n.line() for n in nodes)
            raise CircuitError(f"edges: head {head.name!r} must have one {role} input (a node named '...{role}' "
                               f"inside it), found {got}")
    return {r: nodes[0] for r, nodes in found.items()}


def _check_only_through(dest: Circuit, resid: Circuit, is_source, label: str):
    for n in toposort(dest, stop=lambda n: n.hash == resid.hash or is_source(n)):
        if n.hash != resid.hash and n is not dest and is_source(n):
            raise CircuitError(f"edges: destination {label!r} reads {n.line()} other than through the residual "
                               f"stream {resid.line()}; edges would not be exact")


_CACHE: dict[bytes, Edges] = {}


def edges(circuit: Circuit) -> Edges:
    """The head-level computational graph of ``circuit`` (see the module docstring): an ``Edges``
    sequence of edge names ``'<source> -> <destination>'``.

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=1, head_size=4, n_layers=2, max_positions=16)
    >>> g = edges(attn_only(w, np.arange(6), unique_names=True))
    >>> g.sources, g.destinations[-2:]
    (['embeds', 'b0.a.head0', 'b1.a.head0'], ['b1.a.head0.a.v', 'output'])
    >>> [e for e in g if e.endswith('.a.k')]
    ['embeds -> b0.a.head0.a.k', 'embeds -> b1.a.head0.a.k', 'b0.a.head0 -> b1.a.head0.a.k']
    """
    if not isinstance(circuit, Circuit):
        raise CircuitError(f"edges: expected a circuit, got {type(circuit).__name__}")
    g = _CACHE.get(circuit.hash)
    if g is None:
        g = _analyse(circuit)
        if len(_CACHE) > 16:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[circuit.hash] = g
    return g


_graph_of = edges  # patch_edges' parameter is named like the function


# ---------------------------------------------------------------------------- patching
def patched_sources(g: Edges, labels, source, ablation: str, data) -> dict[str, list[Circuit]]:
    """Each needed source's patched value, member by member: recomputed from ``source``
    (resample), zeros, or its mean over ``source``'s batch."""
    if ablation not in ABLATIONS:
        raise CircuitError(f"ablation={ablation!r}: use one of {', '.join(map(repr, ABLATIONS))}")
    labels = list(dict.fromkeys(labels))
    nodes = [(lab, m) for lab in labels for m in g._sources[lab]]
    if ablation == "zero":
        if source is not None:
            raise CircuitError("ablation='zero' takes no source (give source=None)")
        return {lab: [Array(np.zeros(m.shape, np.dtype(m.dtype)), name=f"{m.name or lab}.zero_ablated")
                      for m in g._sources[lab]] for lab in labels}
    if source is None:
        raise CircuitError(f"ablation={ablation!r} needs source=, a mapping from input names to values"
                           + (" with a leading batch axis" if ablation == "mean" else ""))
    if ablation == "mean":
        vals = values_over_batch(g.circuit, [(lab, m) for lab, m in nodes], source, None, None, "auto") \
            if nodes else []
        arrs = {m.hash: Array(np.asarray(v.mean(axis=0)).astype(np.dtype(m.dtype)), name=f"{m.name or lab}.mean_ablated")
                for (lab, m), v in zip(nodes, vals)}
        return {lab: [arrs[m.hash] for m in g._sources[lab]] for lab in labels}
    inputs = resolve_inputs(g.circuit, source, "source")
    table = {h: v if isinstance(v, Circuit) else Array(v, name=f"{n.name if n.name is not None else 'input'}.source")
             for h, (n, v) in inputs.items()}
    copies = copy_with([m for _, m in nodes], table, ".source")
    if nodes and all(copies[m.hash] is m for _, m in nodes):
        source_copies(g.circuit, nodes[:1], source, "patch_edges")  # raises: nothing depends on the source
    return {lab: [copies[m.hash] for m in g._sources[lab]] for lab in labels}


def _sum(nodes: list[Circuit], name=None) -> Circuit:
    return nodes[0] if len(nodes) == 1 and name is None else Add(*nodes, name=name)


def rebuild(g: Edges, term_of, new: dict | None = None, swap: dict | None = None) -> Circuit:
    """The circuit rebuilt with each destination ``d`` for which ``term_of(d, new)`` returns a
    residual sum reading that sum (the nodes between copied, ``'<name>@<destination>'``);
    ``new`` (filled if given): original node hash -> rebuilt node; ``swap`` (optional): node
    hash -> function of its rebuilt node giving what stands in its place (e.g. an interpolation)."""
    dest_at = {d.node.hash: d for d in g._dests if d.label != OUTPUT}
    out_dest = g._dests[-1]
    new = {} if new is None else new
    for n in toposort(g.circuit):
        h = n.hash
        d = dest_at.get(h)
        if d is None and n is g.circuit:
            d = out_dest
        rebuilt = n if not n.children else n.with_children(tuple(new[c.hash] for c in n.children))
        if swap and h in swap:
            rebuilt = swap[h](rebuilt)
        if d is not None:
            resid = term_of(d, new)
            if resid is not None:
                slot, template = _template(g, d)
                copy = replace(template, {slot: resid})
                rebuilt = copy.rename(n.name) if n.name is not None and copy.name != n.name else copy
        new[h] = rebuilt
    return new[g.circuit.hash]


def _template(g: Edges, d: _Dest) -> tuple[Circuit, Circuit]:
    """The destination's path from its residual sum, copied over a stand-in Symbol (``slot``),
    made once per destination: a fused-projection destination (GPT-2's ``h0.attn.head3.q``, an
    Index of the layer's ``qkv``) gets its Index pushed down into the weights (``split_heads``'
    rules, on the copy only), so each destination computes its own head's slice, not the layer's
    whole projection."""
    cached = g._templates.get(d.label)
    if cached is not None:
        return cached
    slot = Symbol(d.resid.shape, name=f"{d.label}.resid", dtype=d.resid.dtype)
    copies = copy_with([d.node], {d.resid.hash: slot}, f"@{d.label}")
    template = copies[d.node.hash]
    if d.label != OUTPUT:
        fresh = {c.hash for c in copies.values() if c.hash not in g._original}
        if any(isinstance(n, Index) and n.hash in fresh for n in toposort(template)):
            import rewrites
            from rewrites.rules import index as index_rules

            push = rewrites.normalize(index_rules.RULES)
            template = rewrites.apply(push, template, where=lambda n: n.hash not in g._original)
    g._templates[d.label] = (slot, template)
    return slot, template


def patch_edges(circuit: Circuit, edges: Sequence[str] | None, source: Mapping | None, *,  # noqa: F811
                ablation: str = "resample", mask: bool = False) -> Circuit:
    """``circuit`` with exactly the given edges patched: each destination reads its patched
    edges' senders recomputed from ``source`` (``ablation='resample'``, ``source`` as in
    ``patch``), zeroed (``'zero'``, no source) or averaged over ``source``'s batch (``'mean'``,
    values with a leading batch axis); every other edge, and everything else (the loss's targets
    included), stays as in ``circuit``.  No edge gives ``circuit`` itself.

    ``mask=True``: the masked form; ``edges`` lists the covered edges (``None``: every edge, in
    ``edges(circuit)``'s order) and the result reads a Symbol ``'edges.mask'`` of one weight per
    covered edge (1: patched, 0: clean, in between: interpolated), so one compiled program
    evaluates every edge set.

    >>> import numpy as np
    >>> from circuits import evaluate
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    >>> loss = attn_only(w, np.arange(6), unique_names=True)
    >>> masked = patch_edges(loss, None, None, ablation='zero', mask=True)
    >>> m = np.zeros(len(edges(loss)), np.float32)
    >>> bool(np.allclose(evaluate(masked, {'edges.mask': m}), evaluate(loss), atol=1e-5))
    True
    """
    g = _graph_of(circuit)
    if mask:
        covered = list(range(len(g))) if edges is None else g.resolve(edges)
        return masked_with_parts(g, covered, source, ablation)[0]
    if edges is None:
        raise CircuitError("patch_edges: give a list of edge names (an empty list patches nothing)")
    chosen = g.resolve(edges)
    if not chosen:
        return circuit
    picked = {g.names[i] for i in chosen}
    patched = patched_sources(g, [g.names[i].split(" -> ", 1)[0] for i in chosen], source, ablation, None)

    def term_of(d: _Dest, new):
        hit = [s for s in d.sources if f"{s} -> {d.label}" in picked]
        if not hit:
            return None
        terms = []
        for s in d.sources:
            terms += patched[s] if s in hit else [new[m.hash] for m in g._sources[s]]
        return Add(*terms, *d.consts, name=f"{d.label}.resid")

    return rebuild(g, term_of)


def masked_with_parts(g: Edges, covered: list[int], source, ablation: str) -> tuple[Circuit, dict]:
    """``patch_edges``' masked form over the ``covered`` edge positions and its ``parts`` (see
    ``_masked``), made once per graph, edge set, ablation and source."""
    key = (tuple(covered), ablation, fingerprint(source))
    found = g._masked.get(key)
    if found is None:
        parts: dict = {}
        found = (_masked(g, covered, source, ablation, parts=parts), parts)
        if len(g._masked) >= 8:
            g._masked.pop(next(iter(g._masked)))
        g._masked[key] = found
    return found


def fingerprint(source) -> tuple | None:
    """A key for a source mapping: names (or node hashes) and value digests."""
    if source is None or not isinstance(source, Mapping):
        return None
    out = [(k.hash if isinstance(k, Circuit) else str(k), value_digest(v)) for k, v in source.items()]
    return tuple(sorted(out, key=repr))


def value_digest(v):
    """A key for one value: a node's hash, or an array's shape, dtype and a digest of its bytes."""
    import hashlib

    if isinstance(v, Circuit):
        return v.hash
    a = np.ascontiguousarray(v)
    return a.shape, str(a.dtype), hashlib.blake2b(a.tobytes(), digest_size=16).digest()


def _masked(g: Edges, covered: list[int], source, ablation: str, *, deltas: dict | None = None,
            parts: dict | None = None) -> Circuit:
    """The masked form; ``deltas`` (source label -> node) fixes each covered edge's term to
    ``sender + w * delta`` instead of ``sender + w * (patched sender - sender)``.

    Destinations that read the same covered senders share one stack of sender differences and
    one einsum ``[dests, senders] x [senders, ...]`` (a matrix product, not one product per
    destination); each destination's sum ``'<destination>.resid'`` reads its row.  ``parts``
    (filled if given): ``'resid'`` (destination label -> that sum), ``'senders'`` (source label
    -> member nodes as the masked circuit computes them), ``'patched'`` (label -> the patched
    members; without ``deltas``)."""
    weights = Symbol((len(covered),), name=MASK_NAME, dtype="float32")
    slot = {g.names[e]: i for i, e in enumerate(covered)}
    labels = list(dict.fromkeys(g.names[e].split(" -> ", 1)[0] for e in covered))
    patched = patched_sources(g, labels, source, ablation, None) if covered and deltas is None else {}
    neg = Scalar(-1.0)
    covered_srcs = {d.label: tuple(s for s in d.sources if f"{s} -> {d.label}" in slot) for d in g._dests}
    members: dict[tuple, list[str]] = {}  # senders -> the destinations reading exactly those
    for d in g._dests:
        if covered_srcs[d.label]:
            members.setdefault(covered_srcs[d.label], []).append(d.label)
    groups: dict[tuple, Circuit] = {}
    resid_of: dict[str, Circuit] = {}

    def row(s, new):
        if deltas is not None:
            diff = deltas[s]
        else:
            cur = _sum([new[m.hash] for m in g._sources[s]])
            diff = Add(_sum(patched[s]), Einsum.from_spec(_spec(cur.ndim, "", ","), cur, neg))
        return Rearrange(diff, _stack_spec(diff.ndim), n=1)

    def group_terms(srcs, new) -> Circuit:
        """``[dests of the group, ...]``: each destination's weighted sum of sender differences."""
        rows = [row(s, new) for s in srcs]
        stacked = rows[0] if len(rows) == 1 else Concat(*rows, axis=0)
        dests = members[srcs]
        at = np.array([slot[f"{s} -> {label}"] for label in dests for s in srcs], np.int64)
        w = Rearrange(Index(weights, (at,)), "(g n) -> g n", g=len(dests))
        axes = _spec(stacked.ndim - 1, "", "")
        return Einsum.from_spec(f"gn,n{axes}->g{axes}", w, stacked)

    def term_of(d: _Dest, new):
        srcs = covered_srcs[d.label]
        if not srcs:
            return None
        terms = groups.get(srcs)
        if terms is None:
            terms = groups[srcs] = group_terms(srcs, new)
        delta = Index(terms, (members[srcs].index(d.label),))
        node = resid_of[d.label] = Add(new[d.resid.hash], delta, name=f"{d.label}.resid")
        return node

    new: dict[bytes, Circuit] = {}
    out = rebuild(g, term_of, new)
    if parts is not None:
        parts["resid"] = resid_of
        parts["senders"] = {s: [new[m.hash] for m in ms] for s, ms in g._sources.items()}
        parts["patched"] = patched
    return out


def _spec(ndim: int, prefix: str, suffix: str) -> str:
    axes = "abcdefghijklm"[:ndim]
    return f"{prefix}{axes}{suffix}->{axes}" if suffix else axes


def _stack_spec(ndim: int) -> str:
    axes = " ".join("abcdefghijklm"[:ndim])
    return f"{axes} -> n {axes}"
