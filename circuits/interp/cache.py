"""A cache of every activation, answering to our names and to TransformerLens's hook names.

``run_with_cache(circuit, inputs=None, names=None)`` evaluates the circuit once (one program,
``evaluate``'s ``also=``) and returns an ``ActivationCache``: a mapping from each selected node's
name to its value, batch axis first for a batch of inputs.  ``names`` is anything ``get`` takes
(a name, a glob or regex matcher, a node type, a TransformerLens hook name, a list of them);
``None`` caches every activation: each named node computed from the inputs (Symbols, or token ids:
int Arrays), not the weights and what is computed from them alone.

The cache answers to TransformerLens's hook names too (``cache['blocks.0.attn.hook_pattern']``,
``'blocks.1.hook_resid_post'``, ``'ln_final.hook_scale'``; ``circuits.select.hooks`` has the
table for every builder's naming), in TransformerLens's layout: ``hook_q/k/v/z`` and
``hook_result`` ``[pos, head, d]``, ``hook_pattern`` ``[head, query, key]``, a batch axis first.
Under our names a value is the node's value as it is.  A name several distinct nodes share (the
seed's own names: ``'a.q'`` in every head) is keyed ``'a.q#1'``, ``'a.q#2'``, ... in circuit
order; the hook names tell the heads apart.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> cache = run_with_cache(attn_only(w, np.arange(6), unique_names=True))
>>> cache['b0.a.head1.a.attn_probs'].shape, cache['blocks.0.attn.hook_pattern'].shape
((4, 4), (2, 4, 4))
>>> cache['blocks.1.attn.hook_q'].shape                      # [pos, head, d_head]
(4, 2, 4)
"""

from __future__ import annotations

import collections
from typing import Mapping

import numpy as np

from ..errors import SelectionError
from ..nodes import Array, Circuit, Scalar, Symbol
from ..select import as_matcher
from ..select.hooks import hook_names, hook_nodes, hook_source, is_hook_name
from ..traversal import toposort
from .positions import bind_rows

__all__ = ["run_with_cache", "ActivationCache", "activations"]


def activations(circuit: Circuit) -> list[Circuit]:
    """The named nodes computed from the inputs (Symbols, int Arrays: token ids), and the nodes a
    TransformerLens hook name stands for (``hook_pos_embed`` is computed from weights alone), in
    circuit order: what ``run_with_cache`` caches by default."""
    hooked = {n.hash for name in hook_names(circuit) for n in hook_source(circuit, name).nodes}
    live: set[bytes] = set()
    out = []
    for n in toposort(circuit):
        if isinstance(n, Symbol) or (isinstance(n, Array) and str(n.dtype).startswith(("int", "uint"))):
            live.add(n.hash)
        elif n.children and any(c.hash in live for c in n.children):
            live.add(n.hash)
        if (n.name is not None and n.hash in live and not isinstance(n, (Array, Scalar))) or n.hash in hooked:
            out.append(n)
    return out


def _selected(circuit: Circuit, names) -> list[Circuit]:
    """The nodes ``names`` selects, in circuit order."""
    if names is None:
        return activations(circuit)
    items = list(names) if isinstance(names, (list, tuple, set, frozenset)) else [names]
    order = toposort(circuit)
    nodes: dict[bytes, Circuit] = {}
    for item in items:
        if isinstance(item, str) and is_hook_name(item) and not any(n.name == item for n in order):
            src = hook_source(circuit, item)
            if src is None:
                hook_nodes(circuit, item)  # raises: no such hook here (with the close names)
            for n in src.nodes:
                nodes.setdefault(n.hash, n)
            continue
        try:
            m = as_matcher(item)
        except TypeError:
            raise SelectionError(f"run_with_cache: names={item!r}: give names, matchers or nodes") from None
        hits = m.matches(circuit, order)
        if not hits:
            raise SelectionError(f"run_with_cache: {m.describe()} matched nothing in the circuit rooted at "
                                 f"{circuit.line()}")
        for n in order:
            if n.hash in hits:
                nodes.setdefault(n.hash, n)
    position = {n.hash: i for i, n in enumerate(order)}
    return sorted(nodes.values(), key=lambda n: position[n.hash])


class ActivationCache(Mapping):
    """The values ``run_with_cache`` computed: a mapping from our names to values (``keys()``:
    each cached node's name, ``'name#k'`` where names repeat), that also answers to
    TransformerLens's hook names (``hook_names()`` lists those it can give) and to nodes.
    ``output`` is the circuit's own value; ``nodes`` maps each key to its node."""

    def __init__(self, circuit: Circuit, nodes: list[Circuit], values: dict, output):
        self.circuit = circuit
        self.output = output
        counts = collections.Counter(n.name for n in nodes)
        seen: collections.Counter = collections.Counter()
        self.nodes: dict[str, Circuit] = {}
        for n in nodes:
            if counts[n.name] == 1 and n.name is not None:
                key = n.name
            else:
                seen[n.name] += 1
                key = f"{n.name if n.name is not None else n.type_name}#{seen[n.name]}"
            self.nodes[key] = n
        self._values = values  # node hash -> value
        self._hooks: dict[str, np.ndarray] = {}

    def __getitem__(self, key):
        if isinstance(key, Circuit):
            if key.hash in self._values:
                return self._values[key.hash]
            raise KeyError(f"{key.line()} is not in the cache")
        node = self.nodes.get(key)
        if node is not None:
            return self._values[node.hash]
        if isinstance(key, str) and is_hook_name(key):
            found = self._hooks.get(key)
            if found is None:
                src = hook_source(self.circuit, key)
                if src is None:
                    raise KeyError(f"{key!r}: the circuit has no such hook (cache.hook_names() lists those it has)")
                missing = [n for n in src.nodes if n.hash not in self._values]
                if missing:
                    raise KeyError(f"{key!r} reads {', '.join(repr(n.name) for n in missing)}, which this cache "
                                   f"did not keep: run_with_cache(..., names=[..., {key!r}])")
                found = self._hooks[key] = src.assemble([self._values[n.hash] for n in src.nodes])
            return found
        if isinstance(key, str) and any(k.startswith(key + "#") for k in self.nodes):
            raise KeyError(f"{key!r} is the name of several nodes: {', '.join(k for k in self.nodes if k.startswith(key + '#'))}"
                           " (or use a TransformerLens hook name, or the node itself)")
        raise KeyError(key)

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self):
        return len(self.nodes)

    def __contains__(self, key):
        try:
            self[key]
        except KeyError:
            return False
        return True

    def hook_names(self) -> list[str]:
        """The TransformerLens hook names this cache can give (its nodes hold their values)."""
        out = []
        for name in hook_names(self.circuit):
            src = hook_source(self.circuit, name)
            if src is not None and all(n.hash in self._values for n in src.nodes):
                out.append(name)
        return out

    def __repr__(self):
        shown = ", ".join(list(self.nodes)[:8]) + (", ..." if len(self.nodes) > 8 else "")
        return f"<ActivationCache: {len(self)} nodes ({shown}); {len(self.hook_names())} hook names>"


def run_with_cache(circuit: Circuit, inputs: Mapping | None = None, names=None, *, dtype="float32",
                   mode: str = "auto", cache: bool = True) -> ActivationCache:
    """Evaluate ``circuit`` once and keep the values of every node ``names`` selects (see the
    module docstring): an ``ActivationCache``.  ``inputs`` binds Symbols as for ``evaluate``
    (values with a leading batch axis: every value batch first; the Symbol ``'row'`` of an
    intervention made with ``rows=`` is bound for you); ``dtype``, ``mode`` and ``cache`` as for
    ``evaluate``.

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights, tokens_symbol
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> batch = np.random.default_rng(0).integers(0, 11, (5, 6))
    >>> cache = run_with_cache(attn_only(w, tokens_symbol(6)), {'toks_int_var': batch}, names='blocks.0.attn.hook_z')
    >>> list(cache), cache['blocks.0.attn.hook_z'].shape    # the seed's names repeat: keyed a.comb_v#1, #2
    (['a.comb_v#1', 'a.comb_v#2'], (5, 4, 2, 4))
    """
    from ..backend import evaluate

    nodes = _selected(circuit, names)
    inputs = bind_rows(circuit, inputs)
    if nodes:
        output, values = evaluate(circuit, inputs, dtype=dtype, also=nodes, mode=mode, cache=cache)
    else:
        output, values = evaluate(circuit, inputs, dtype=dtype, mode=mode, cache=cache), {}
    return ActivationCache(circuit, nodes, {n.hash: values[n] for n in nodes}, output)
