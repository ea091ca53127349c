"""The induction hypothesis for causal scrubbing of a two-layer attention-only model (``attn_only``).

``induction_hypothesis(prev_head, induction_heads)``: the loss depends on the direct path from the
token embeddings, and on each induction head of layer 1, whose values read the token embeddings
directly and whose attention pattern depends only on the token-equality pattern of the input
(which tokens repeat where), through its queries (token embeddings) and its keys (the
previous-token head ``prev_head`` of layer 0).  Everything else (the other heads, the other paths
into the claimed heads) is resampled.  Heads are numbers within their layer; pick them by
measurement (attention to the previous token, induction score), not by index:
``head_scores(circuit, tokens)`` measures both.

>>> print(induction_hypothesis(2, [0]))
Claim 't.loss' [exact] other=random
├ Claim 'direct' [exact] avoid Name('b0.a', 'b1.a')
└ Claim 'induction 0' [exact] other=random
  ├ Claim 'values 0' [exact] other=random
  │ └ Claim 'v embeds 0' [exact] avoid b0.a
  └ Claim 'pattern 0' [token equality] other=random
    ├ Claim 'queries 0' [exact] other=random
    │ └ Claim 'q embeds 0' [exact] avoid b0.a
    └ Claim 'keys 0' [exact] other=random
      └ Claim 'prev-token 0' [exact]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import CircuitError
from ..select import Name
from .hypothesis import Claim, Feature

__all__ = ["induction_hypothesis", "head_scores"]


def _previous_occurrence(row: np.ndarray, ignore) -> np.ndarray:
    """For each position, the latest earlier position holding the same token (-1 if none, or if
    the token is in ``ignore``)."""
    last: dict = {}
    out = np.full(len(row), -1)
    for q, tok in enumerate(row.tolist()):
        if tok not in ignore and tok in last:
            out[q] = last[tok]
        last[tok] = q
    return out


def head_scores(circuit, tokens, *, input: str | None = None, ignore=(0,)) -> tuple[np.ndarray, np.ndarray]:
    """``(previous_token, induction)``, each ``[layers, heads]``: for every head, its mean attention
    to the previous position, and its induction score — the mean attention, over positions whose
    token occurred before, to the position just after that token's latest earlier occurrence
    (tokens in ``ignore``, by default the BOS token 0, are not counted as repeats).

    ``circuit``: any builder's circuit (``attn_only`` with its own names or ``unique_names=True``,
    ``gpt2``/``opt``/``llama``/... fused or split heads, ``from_tracr``), of any number of layers,
    whose patterns TransformerLens's ``blocks.{l}.attn.hook_pattern`` finds
    (``circuits.select.hooks``); its token input is the Symbol ``input`` (default: its one int
    Symbol), bound to ``tokens``, an int array ``[rows, tokens]``.  The model's positions are the
    first ``n`` tokens of a row, ``n`` the attention pattern's size.

    >>> from circuits.models import attn_only, induction_weights, induction_tokens, tokens_symbol
    >>> toks = induction_tokens(16, seed=0)
    >>> prev, ind = head_scores(attn_only(induction_weights(), tokens_symbol(toks.shape[1])), toks)
    >>> prev.shape, int(np.argmax(prev[0])), [h for h in range(4) if ind[1, h] > 0.4]
    ((2, 4), 2, [0, 1, 2, 3])
    """
    from ..select.hooks import hook_source
    from ..traversal import toposort
    from .cache import run_with_cache

    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise CircuitError(f"head_scores: tokens must be [rows, tokens], got shape {list(tokens.shape)}")
    if input is None:
        ints = [n for n in toposort(circuit) if n.type_name == "Symbol" and str(n.dtype).startswith("int")]
        if len(ints) != 1:
            found = ", ".join(repr(n.name) for n in ints) or "none"
            raise CircuitError(f"head_scores: the circuit's token input is its int Symbol; it has {found}: build it over "
                               "a tokens Symbol (models.tokens_symbol) or say which with input=")
        input = ints[0].name
    hooks, layer = [], 0
    while hook_source(circuit, f"blocks.{layer}.attn.hook_pattern") is not None:
        hooks.append(f"blocks.{layer}.attn.hook_pattern")
        layer += 1
    if not hooks:
        raise CircuitError(f"head_scores: found no attention pattern (TransformerLens's 'blocks.0.attn.hook_pattern') in "
                           f"{circuit.line()}: give a builder's circuit (attn_only, gpt2, ...)")
    cache = run_with_cache(circuit, {input: tokens}, names=hooks)
    probs = [cache[h] for h in hooks]  # each [rows, heads, q, k]
    n = probs[0].shape[-1]
    i = np.arange(1, n)
    prev = np.stack([p[:, :, i, i - 1].mean(axis=(0, 2)) for p in probs])
    rows, qs, ks = [], [], []
    for r, row in enumerate(tokens[:, :n]):
        before = _previous_occurrence(row, set(ignore))
        q = np.nonzero(before >= 0)[0]
        rows += [r] * len(q)
        qs += q.tolist()
        ks += (before[q] + 1).tolist()
    if not qs:
        raise CircuitError("head_scores: no token repeats within the model's positions; give sequences "
                           "with repeated tokens (e.g. models.induction_tokens)")
    ind = np.stack([p[rows, :, qs, ks].mean(axis=0) for p in probs])
    return prev, ind


def induction_hypothesis(prev_head: int, induction_heads: Sequence[int], *, output: str = "t.loss") -> Claim:
    """The induction circuit as a ``Claim`` tree over ``attn_only``'s names (see the module
    docstring).  Under a claimed head, the first ``'a.v'``, ``'a.attn_probs'``, ``'a.q'`` and
    ``'a.k'`` a path meets are that head's own."""
    equality = Feature.equality()

    def embeds(name):
        return Claim("idxed_embeds", avoid="b0.a", name=name)

    heads = [
        Claim(f"b1.a.head{h}", name=f"induction {h}", children=[
            Claim(Name("a.v"), name=f"values {h}", children=[embeds(f"v embeds {h}")]),
            Claim(Name("a.attn_probs"), feature=equality, name=f"pattern {h}", children=[
                Claim(Name("a.q"), name=f"queries {h}", children=[embeds(f"q embeds {h}")]),
                Claim(Name("a.k"), name=f"keys {h}", children=[Claim(f"b0.a.head{prev_head}", name=f"prev-token {h}")]),
            ]),
        ])
        for h in induction_heads
    ]
    return Claim(output, children=[Claim("idxed_embeds", avoid=Name("b0.a", "b1.a"), name="direct"), *heads])
