"""The induction hypothesis for causal scrubbing of a two-layer attention-only model (``attn_only``).

``induction_hypothesis(prev_head, induction_heads)``: the loss depends on the direct path from the
token embeddings, and on each induction head of layer 1, whose values read the token embeddings
directly and whose attention pattern depends only on the token-equality pattern of the input
(which tokens repeat where), through its queries (token embeddings) and its keys (the
previous-token head ``prev_head`` of layer 0).  Everything else (the other heads, the other paths
into the claimed heads) is resampled.  Heads are numbers within their layer; pick them by
measurement (attention to the previous token, induction score), not by index.

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

from ..select import Name
from .hypothesis import Claim, Feature

__all__ = ["induction_hypothesis"]


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
