"""TransformerLens's hook names on the builders' circuits: one table, one naming convention per
family of builders.

A TransformerLens user writes ``cache['blocks.1.attn.hook_pattern']``; our circuits name their
nodes after the seed (``'b1.a.head0.a.attn_probs'``, ``'idxed_embeds'``) or after a model's
state dict (``'h1.attn.probs'``, ``'h1.mlp'``).  ``HOOKS`` says, for each naming convention,
which of our nodes each hook name stands for:

- ``'attn_only'``: the seed's model (``models.attn_only``, its own names or ``unique_names=True``);
- ``'hf'``: every HuggingFace-family builder (``gpt2``, ``opt``, ``llama``/``mistral`` and any
  builder that follows ``circuits.models.common``'s scheme: ``h{l}.ln1``, ``h{l}.attn``,
  ``h{l}.mid``, ``h{l}.mlp``, ``h{l}``, ``final.ln``, ``logits``), fused or split heads;
- ``'tracr'``: ``importers.from_tracr`` (``b{l}.a.head{h}``, ``b{l}.mid``, ``h{l}.mlp``, ``b{l}``).

A new builder plugs in by naming its nodes as one of these conventions does (a new HuggingFace
family as ``'hf'``); a new convention is one more entry of ``HOOKS`` and of ``CONVENTIONS``.
Each hook lists options, tried in order, so one entry serves fused and split heads, LayerNorm and
RMSNorm, rotary and learned positions.  ``hook_table()`` writes the table as the docs show it.

Used as a selector (``get``, ``update``, ``patch``, ``ablate``, ``steer``), a hook name selects
the nodes it stands for: a per-head hook (``hook_q``, ``hook_z``, ``hook_pattern``...) selects every
head's node of that layer; a name that some node of the circuit has itself keeps meaning that node.
``hook_value`` assembles the value TransformerLens gives (``hook_q/k/v/z`` and ``hook_result``
``[pos, head, ...]``, ``hook_pattern`` / ``hook_attn_scores`` ``[head, query, key]``, a batch axis
first), and the ones computed from a node (``hook_scale``: TransformerLens's ``sqrt(var + eps)``,
the inverse of our ``rsqrt``, ``[pos, 1]``).  Masked attention scores are ``-10000`` here where
TransformerLens writes ``-inf``.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.arange(6), unique_names=True)
>>> [n.name for n in hook_nodes(loss, 'blocks.1.attn.hook_pattern')]
['b1.a.head0.a.attn_probs', 'b1.a.head1.a.attn_probs']
>>> [n.name for n in loss.get('blocks.0.hook_resid_post')]
['b0']
>>> hook_names(loss)[:3]
['hook_embed', 'hook_pos_embed', 'blocks.0.hook_resid_pre']
"""

from __future__ import annotations

import difflib
import re
import threading
import weakref

import numpy as np

from ..errors import SelectionError
from ..nodes import Circuit
from ..traversal import toposort
from .norms import norm_parts

__all__ = ["HOOKS", "CONVENTIONS", "READOUT", "is_hook_name", "hook_source", "hook_nodes", "hook_value", "hook_names",
           "naming_convention", "hook_table", "HookSource"]

# ---------------------------------------------------------------------------- the table
# An option is one of:
#   ('node', name)                the node so named (``name`` may hold {l} and {prev}: l - 1);
#   ('heads', head, inner)        each head's node: ``head`` names head h ({l}, {h}), ``inner`` the
#                                 node inside it (``'<head>.<inner>'``, or the one named ``inner``
#                                 that the head owns: the seed's own names); inner None: the head;
#   ('kv_heads', name)            each key-value head's node (grouped-query attention, split heads);
#   ('norm', name, part)          a LayerNorm / RMSNorm named ``name``, by structure: part
#                                 'normalized' (TransformerLens's hook_normalized: a LayerNorm's
#                                 output, after its weight and bias; an RMSNorm's x / scale,
#                                 before its weight) or 'scale' (its sqrt(var + eps), [pos, 1]).
# Each hook's layout: 'pos_head' ([pos, head, ...]), 'head_qk' ([head, query, key]) or None (as is).
# 'requires' (optional): a node name that must exist for the hook to apply (rotary's hook_rot_q).

_EMBED = {"attn_only": [("node", "idxed_embeds")], "hf": [("node", "tok_embeds"), ("node", "embeds")],
          "tracr": [("node", "tok_embeds")]}

HOOKS: dict[str, dict] = {
    "hook_embed": {"options": _EMBED},
    "hook_pos_embed": {"options": {"attn_only": [("node", "t.w.pos_embeds_idxed")], "hf": [("node", "pos_embeds")],
                                   "tracr": [("node", "pos_embeds")]}},
    "blocks.{l}.hook_resid_pre": {"options": {
        "attn_only": [("first", "idxed_embeds", "b{prev}")], "hf": [("first", "embeds", "h{prev}")],
        "tracr": [("first", "embeds", "b{prev}")]}},
    "blocks.{l}.ln1.hook_scale": {"options": {"attn_only": [("norm", "a{l}.norm", "scale")],
                                              "hf": [("norm", "h{l}.ln1", "scale")]}},
    "blocks.{l}.ln1.hook_normalized": {"options": {"attn_only": [("norm", "a{l}.norm", "normalized")],
                                                   "hf": [("norm", "h{l}.ln1", "normalized")]}},
    "blocks.{l}.attn.hook_q": {"layout": "pos_head", "options": {
        "attn_only": [("heads", "b{l}.a.head{h}", "a.q")], "tracr": [("heads", "b{l}.a.head{h}", "a.q")],
        # rotary models: the projection before rotary (TransformerLens's hook_q; hook_rot_q after)
        "hf": [("node", "h{l}.attn.proj.q"), ("heads", "h{l}.attn.head{h}", "q"), ("node", "h{l}.attn.q")]}},
    "blocks.{l}.attn.hook_k": {"layout": "pos_head", "options": {
        "attn_only": [("heads", "b{l}.a.head{h}", "a.k")], "tracr": [("heads", "b{l}.a.head{h}", "a.k")],
        "hf": [("node", "h{l}.attn.proj.k"), ("heads", "h{l}.attn.head{h}", "k"), ("kv_heads", "h{l}.attn.kv{h}.k"),
               ("node", "h{l}.attn.k")]}},
    "blocks.{l}.attn.hook_v": {"layout": "pos_head", "options": {
        "attn_only": [("heads", "b{l}.a.head{h}", "a.v")], "tracr": [("heads", "b{l}.a.head{h}", "a.v")],
        "hf": [("node", "h{l}.attn.proj.v"), ("heads", "h{l}.attn.head{h}", "v"), ("kv_heads", "h{l}.attn.kv{h}.v"),
               ("node", "h{l}.attn.v")]}},
    "blocks.{l}.attn.hook_rot_q": {"layout": "pos_head", "requires": "h{l}.attn.proj.q", "options": {
        "hf": [("heads", "h{l}.attn.head{h}", "q"), ("node", "h{l}.attn.q")]}},
    "blocks.{l}.attn.hook_rot_k": {"layout": "pos_head", "requires": "h{l}.attn.proj.k", "options": {
        "hf": [("heads", "h{l}.attn.head{h}", "k"), ("kv_heads", "h{l}.attn.kv{h}.k"), ("node", "h{l}.attn.k")]}},
    "blocks.{l}.attn.hook_attn_scores": {"layout": "head_qk", "options": {
        "attn_only": [("heads", "b{l}.a.head{h}", "a.attn_scores")],
        "tracr": [("heads", "b{l}.a.head{h}", "a.attn_scores")],
        "hf": [("heads", "h{l}.attn.head{h}", "scores"), ("node", "h{l}.attn.scores")]}},
    "blocks.{l}.attn.hook_pattern": {"layout": "head_qk", "options": {
        "attn_only": [("heads", "b{l}.a.head{h}", "a.attn_probs")],
        "tracr": [("heads", "b{l}.a.head{h}", "a.attn_probs")],
        "hf": [("heads", "h{l}.attn.head{h}", "probs"), ("node", "h{l}.attn.probs")]}},
    "blocks.{l}.attn.hook_z": {"layout": "pos_head", "options": {
        "attn_only": [("heads", "b{l}.a.head{h}", "a.comb_v")], "tracr": [("heads", "b{l}.a.head{h}", "a.comb_v")],
        "hf": [("heads", "h{l}.attn.head{h}", "z"), ("node", "h{l}.attn.z")]}},
    "blocks.{l}.attn.hook_result": {"layout": "pos_head", "options": {
        "attn_only": [("heads", "b{l}.a.head{h}", None)], "tracr": [("heads", "b{l}.a.head{h}", None)],
        "hf": [("heads", "h{l}.attn.head{h}", None)]}},
    "blocks.{l}.hook_attn_out": {"options": {
        "attn_only": [("node", "b{l}.a")], "tracr": [("node", "b{l}.a")],
        "hf": [("node", "h{l}.attn.post_ln"), ("node", "h{l}.attn")]}},  # Gemma-2: after its post-norm
    "blocks.{l}.hook_resid_mid": {"options": {"hf": [("node", "h{l}.mid")], "tracr": [("node", "b{l}.mid")]}},
    "blocks.{l}.ln2.hook_scale": {"options": {"hf": [("norm", "h{l}.ln2", "scale")]}},
    "blocks.{l}.ln2.hook_normalized": {"options": {"hf": [("norm", "h{l}.ln2", "normalized")]}},
    "blocks.{l}.mlp.hook_pre": {"options": {"hf": [("node", "h{l}.mlp.gate"), ("node", "h{l}.mlp.fc")],
                                            "tracr": [("node", "h{l}.mlp.fc")]}},
    "blocks.{l}.mlp.hook_pre_linear": {"options": {"hf": [("node", "h{l}.mlp.up")]}},
    "blocks.{l}.mlp.hook_post": {"options": {"hf": [("node", "h{l}.mlp.hidden"), ("node", "h{l}.mlp.act")],
                                             "tracr": [("node", "h{l}.mlp.act")]}},
    "blocks.{l}.hook_mlp_out": {"options": {"hf": [("node", "h{l}.mlp.post_ln"), ("node", "h{l}.mlp")],
                                            "tracr": [("node", "h{l}.mlp")]}},
    "blocks.{l}.hook_resid_post": {"options": {"attn_only": [("node", "b{l}")], "hf": [("node", "h{l}")],
                                               "tracr": [("node", "b{l}")]}},
    "ln_final.hook_scale": {"options": {"attn_only": [("norm", "final.call", "scale")],
                                        "hf": [("norm", "final.ln", "scale")]}},
    "ln_final.hook_normalized": {"options": {"attn_only": [("norm", "final.call", "normalized")],
                                             "hf": [("norm", "final.ln", "normalized")]}},
}

# How a circuit's naming convention is recognised: a name only that convention's circuits have.
CONVENTIONS: dict[str, tuple[str, ...]] = {
    "attn_only": ("idxed_embeds",),
    "tracr": ("b0.mid",),
    "hf": ("h0", "embeds"),
}

# What the logit lens and direct logit attribution read, per convention: the unembedding's output
# (before Gemma-2's final soft-capping) and the final norm (None: the model has none).
READOUT = {
    "attn_only": {"logits": ("t.call",), "final_norm": "final.call"},
    "hf": {"logits": ("logits.raw", "logits"), "final_norm": "final.ln"},
    "tracr": {"logits": ("logits",), "final_norm": None},
}

_HOOK = re.compile(r"^(?:hook_embed|hook_pos_embed|hook_tokens|(?:blocks\.\d+\.|ln_final\.)[A-Za-z0-9_.]*hook_[a-z_]+)$")


def is_hook_name(name) -> bool:
    """Whether ``name`` is spelled like a TransformerLens hook name (``'blocks.0.attn.hook_z'``).

    >>> is_hook_name('blocks.0.attn.hook_z'), is_hook_name('ln_final.hook_scale'), is_hook_name('b0.a')
    (True, True, False)
    """
    return isinstance(name, str) and _HOOK.match(name) is not None


def _template_of(name: str) -> tuple[str, int | None]:
    m = re.match(r"^blocks\.(\d+)\.(.*)$", name)
    if m:
        return "blocks.{l}." + m.group(2), int(m.group(1))
    return name, None


# ---------------------------------------------------------------------------- one circuit's names
class _Names:
    """A circuit's nodes by name, and what the owned-node search found (made once per circuit)."""

    __slots__ = ("order", "by_name", "convention", "owned", "__weakref__")

    def __init__(self, circuit: Circuit):
        self.order = toposort(circuit)
        by_name: dict[str, list[Circuit]] = {}
        for n in self.order:
            if n.name is not None:
                by_name.setdefault(n.name, []).append(n)
        self.by_name = by_name
        self.convention = next((c for c, names in CONVENTIONS.items() if all(n in by_name for n in names)), None)
        self.owned: dict = {}

    def one(self, name: str) -> Circuit | None:
        found = self.by_name.get(name)
        return found[0] if found is not None and len(found) == 1 else None

    def inside(self, head: Circuit, inner: str) -> Circuit | None:
        """The node named ``inner`` that ``head`` owns (every path from the root to it passes
        through ``head``): the seed's own names repeat ``'a.q'`` in every head."""
        key = (head.hash, inner)
        if key not in self.owned:
            from . import Inside, Is, Name

            hits = Inside(Is(head), Name(inner)).matches(self.order[-1], self.order)
            self.owned[key] = next((n for n in self.order if n.hash in hits), None) if len(hits) == 1 else None
        return self.owned[key]


_NAMES: "weakref.WeakKeyDictionary[Circuit, _Names]" = weakref.WeakKeyDictionary()
_names_lock = threading.Lock()


def _names_of(circuit: Circuit) -> _Names:
    found = _NAMES.get(circuit)
    if found is None:
        found = _Names(circuit)
        with _names_lock:
            found = _NAMES.setdefault(circuit, found)
    return found


def naming_convention(circuit: Circuit) -> str | None:
    """Which of ``CONVENTIONS`` names ``circuit``'s nodes (None: none of them).

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> naming_convention(attn_only(random_weights(vocab=11, d_model=8, n_layers=1, max_positions=8), np.arange(4)))
    'attn_only'
    """
    return _names_of(circuit).convention


# ---------------------------------------------------------------------------- resolving a hook
class HookSource:
    """What one hook name stands for in one circuit: ``nodes`` (in head order for a per-head hook),
    ``layout`` (``'pos_head'``, ``'head_qk'`` or None), ``part`` (None: the nodes' values; a norm's
    ``'scale'`` or RMSNorm's ``'normalized'``, computed from ``nodes`` = (input, rsqrt)), and
    ``per_head`` (several nodes stacked along the head axis)."""

    __slots__ = ("name", "nodes", "layout", "part", "per_head")

    def __init__(self, name, nodes, layout, part=None, per_head=False):
        self.name, self.nodes, self.layout, self.part, self.per_head = name, list(nodes), layout, part, per_head

    @property
    def selectable(self) -> bool:
        """Whether the hook is a node (or a node per head) of the circuit, not a value computed
        from nodes (``hook_scale``; an RMSNorm's ``hook_normalized``)."""
        return self.part is None

    def assemble(self, values: list) -> np.ndarray:
        """TransformerLens's value from the nodes' values (each with the same leading batch axes)."""
        values = [np.asarray(v) for v in values]
        node = self.nodes[0]
        lead = values[0].ndim - len(node.shape)
        if self.part == "scale":  # sqrt(var + eps) = 1 / rsqrt, with a trailing axis of 1
            return (1.0 / values[0])[..., None]
        if self.part == "normalized":  # RMSNorm: x * rsqrt, before the scale
            x, rsqrt = values
            return x * rsqrt[..., None]
        if self.layout is None:
            return values[0]
        if self.per_head:
            axis = -2 if self.layout == "pos_head" else -3
            return np.stack(values, axis=axis)
        value = values[0]
        heads = int(np.prod(node.shape[:-2], dtype=np.int64))
        merged = value.reshape(value.shape[:lead] + (heads,) + node.shape[-2:])
        return np.moveaxis(merged, -3, -2) if self.layout == "pos_head" else merged

    def __repr__(self):
        return f"<HookSource {self.name!r}: {', '.join(repr(n.name) for n in self.nodes)}>"


def _fill(template: str, layer) -> str:
    return template.format(l=layer, prev=None if layer is None else layer - 1)


def _try(names: _Names, option, layer) -> tuple | None:
    kind = option[0]
    if kind == "node":
        node = names.one(_fill(option[1], layer))
        return None if node is None else ([node], None, False)
    if kind == "first":  # layer 0 reads the first name, layer l the second with {prev} = l - 1
        node = names.one(option[1] if layer == 0 else _fill(option[2], layer))
        return None if node is None else ([node], None, False)
    if kind in ("heads", "kv_heads"):
        out, h = [], 0
        while True:
            head_name = option[1].format(l=layer, h=h)
            head = names.one(head_name)
            if head is None:
                break
            if kind == "kv_heads" or option[2] is None:
                node = head
            else:
                node = names.one(f"{head_name}.{option[2]}") or names.inside(head, option[2])
                if node is None:
                    return None
            out.append(node)
            h += 1
        return (out, None, True) if out else None
    if kind == "norm":
        norm = names.one(_fill(option[1], layer))
        parts = norm_parts(norm) if norm is not None else None
        if parts is None:
            return None
        if option[2] == "scale":
            return [parts["rsqrt"]], "scale", False
        if parts["kind"] == "layer_norm":  # TransformerLens's LayerNorm hooks its output: x * w + b
            return [norm], None, False
        return [parts["x"], parts["rsqrt"]], "normalized", False
    raise SelectionError(f"hooks: unknown option kind {kind!r}")  # pragma: no cover - the table is ours


def hook_source(circuit: Circuit, name: str) -> HookSource | None:
    """What hook ``name`` stands for in ``circuit`` (None: nothing there: an unknown hook, a
    layer past the last, a hook the model does not have, a circuit of no known convention)."""
    names = _names_of(circuit)
    template, layer = _template_of(name)
    entry = HOOKS.get(template)
    if entry is None or names.convention is None:
        return None
    requires = entry.get("requires")
    if requires is not None and names.one(_fill(requires, layer)) is None:
        return None
    for option in entry["options"].get(names.convention, ()):
        found = _try(names, option, layer)
        if found is not None:
            nodes, part, per_head = found
            return HookSource(name, nodes, entry.get("layout"), part, per_head)
    return None


def hook_nodes(circuit: Circuit, name: str) -> list[Circuit]:
    """The nodes hook ``name`` selects in ``circuit`` (every head's node for a per-head hook); a
    name the circuit does not have, or a hook computed from nodes rather than being one, is a
    ``SelectionError`` that says so."""
    src = hook_source(circuit, name)
    if src is None:
        raise SelectionError(_missing(circuit, name))
    if not src.selectable:
        raise SelectionError(
            f"{name!r} is computed from {', '.join(repr(n.name) for n in src.nodes)} (TransformerLens's "
            f"{name.rsplit('.', 1)[-1]}), not a node of its own: select one of those, or read it from "
            "interp.run_with_cache")
    return src.nodes


def hook_value(circuit: Circuit, name: str, values: dict) -> np.ndarray:
    """TransformerLens's value of hook ``name``, from ``values`` (node hash -> value, as evaluated)."""
    src = hook_source(circuit, name)
    if src is None:
        raise SelectionError(_missing(circuit, name))
    return src.assemble([values[n.hash] for n in src.nodes])


def _missing(circuit: Circuit, name: str) -> str:
    names = _names_of(circuit)
    if names.convention is None:
        return (f"{name!r}: TransformerLens's hook names need a circuit named as a builder names it "
                f"({', '.join(CONVENTIONS)}: see circuits.select.hooks); {circuit.line()} is not")
    known = hook_names(circuit)
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else f"; it has {len(known)} hook names"
    return f"{name!r}: no such hook in this circuit ({names.convention} names){hint}"


def hook_names(circuit: Circuit) -> list[str]:
    """Every TransformerLens hook name ``circuit`` answers to, in TransformerLens's order (global
    hooks, then each layer's in forward order, then ``ln_final``)."""
    names = _names_of(circuit)
    if names.convention is None:
        return []
    out = [h for h in HOOKS if "{l}" not in h and not h.startswith("ln_final") and hook_source(circuit, h)]
    layer = 0
    while hook_source(circuit, f"blocks.{layer}.hook_resid_post") is not None:
        out += [t.format(l=layer) for t in HOOKS if "{l}" in t and hook_source(circuit, t.format(l=layer))]
        layer += 1
    out += [h for h in HOOKS if h.startswith("ln_final") and hook_source(circuit, h)]
    return out


def hook_table(conventions=None) -> str:
    """The hook table as the docs show it (markdown): each hook name and what it stands for in
    each convention."""
    conventions = list(conventions or [c for c in CONVENTIONS])

    def spell(option) -> str:
        kind = option[0]
        if kind == "node":
            return f"`{option[1]}`"
        if kind == "first":
            return f"`{option[1]}` (layer 0), `{option[2].replace('{prev}', '{l-1}')}`"
        if kind == "heads":
            return f"`{option[1]}` (per head)" if option[2] is None else f"`{option[1]}.{option[2]}` (per head)"
        if kind == "kv_heads":
            return f"`{option[1]}` (per key-value head)"
        if option[2] == "normalized":
            return f"`{option[1]}` (a LayerNorm's output; an RMSNorm's x / scale, before its weight)"
        return f"{option[2]} of the norm `{option[1]}`"

    lines = ["| TransformerLens | layout | " + " | ".join(conventions) + " |",
             "|---|---|" + "---|" * len(conventions)]
    for hook, entry in HOOKS.items():
        layout = {"pos_head": "[pos, head, d]", "head_qk": "[head, query, key]"}.get(entry.get("layout"), "as the node")
        if hook.endswith("hook_scale"):
            layout = "[pos, 1] (1 / rsqrt)"
        cells = [" or ".join(spell(o) for o in entry["options"].get(c, ())) or "—" for c in conventions]
        lines.append(f"| `{hook}` | {layout} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

