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
from ..select import Depth, Name, Regex
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


def head_scores(circuit, tokens, *, input: str = "toks_int_var", ignore=(0,)) -> tuple[list, list]:
    """``(previous_token, induction)``: for each head of layer 0, its mean attention to the
    previous position; for each head of layer 1, its induction score — the mean attention, over
    positions whose token occurred before, to the position just after that token's latest earlier
    occurrence (tokens in ``ignore``, by default the BOS token 0, are not counted as repeats).

    ``circuit`` is a two-layer ``attn_only`` circuit (seed names or ``unique_names=True``) whose
    token input is the Symbol ``input``; ``tokens`` is an int array ``[rows, tokens]`` bound to it.
    The model's positions are the first ``n`` tokens of a row, ``n`` the attention pattern's size.

    >>> from circuits.models import attn_only, induction_weights, induction_tokens, tokens_symbol
    >>> toks = induction_tokens(16, seed=0)
    >>> prev, ind = head_scores(attn_only(induction_weights(), tokens_symbol(toks.shape[1])), toks)
    >>> int(np.argmax(prev)), [h for h in range(4) if ind[h] > 0.4]
    (2, [0, 1, 2, 3])
    """
    from ..backend import evaluate_batched

    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise CircuitError(f"head_scores: tokens must be [rows, tokens], got shape {list(tokens.shape)}")
    probs = {}
    for layer in (0, 1):
        h = 0
        while True:
            found = circuit.get(f"b{layer}.a.head{h}", require=False)
            if not found:
                break
            head = next(iter(found))
            probs[(layer, h)] = head.get_unique(Regex(r"(^|\.)a\.attn_probs$") & Depth(2))
            h += 1
        if h == 0:
            raise CircuitError(f"head_scores: the circuit has no head b{layer}.a.head0; give a two-layer "
                               "attn_only circuit")
    _, extra = evaluate_batched(circuit, {input: tokens}, also=list(probs.values()))
    n = next(iter(probs.values())).shape[-1]
    i = np.arange(1, n)
    prev = [float(extra[p][:, i, i - 1].mean()) for (layer, _), p in probs.items() if layer == 0]
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
    ind = [float(extra[p][rows, qs, ks].mean()) for (layer, _), p in probs.items() if layer == 1]
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
