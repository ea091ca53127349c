"""The shipped trained induction model: ``induction_weights()`` and its evaluation sequences.

A two-layer attention-only transformer of the seed's architecture (``attn_only`` builds it),
trained by ``python -m circuits.models.train_induction`` (see that module for the recipe) so
that induction heads form: vocabulary 64 with token 0 as BOS, d_model 64, 4 heads of 16 per
layer, context 32 (the size of ``'t.a.c.causal_mask'``).  On ``[BOS, A, A]`` with ``A`` random of
length 16 (``induction_tokens``), the first occurrence of ``A`` is unpredictable (loss ≈ ln 63)
and its repeat is predicted by induction (loss well under 0.1).

``attn_only`` takes any length up to the context: up to 34 tokens in the seed's layout
(``SEQ_LEN``: positions + 2), up to 33 in TransformerLens' (``layout='next_token'``: n tokens,
n - 1 losses); fewer positions read the top-left corner of the mask.

The weights ship as one circuit file, ``data/induction.circuit``: the loss circuit
``attn_only(weights, tokens_symbol(34))`` saved with ``C.save``; ``induction_weights()`` reads
every Array of it back by name.

>>> import numpy as np
>>> import circuits as C
>>> from circuits.models import attn_only, induction_weights
>>> w = induction_weights()
>>> w['t.w.tok_embeds'].shape, w['t.a.c.causal_mask'].shape
((64, 64), (32, 32))
>>> loss = C.evaluate(attn_only(w, induction_tokens(1, seed=0)[0]))
>>> bool(loss[REPEATED_HALF].mean() < 0.3), bool(loss[FIRST_HALF].mean() > 3.0)
(True, True)
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import CircuitError

BOS = 0
VOCAB = 64
CONTEXT = 32
SEQ_LEN = CONTEXT + 2  # attn_only's tokens: positions + 2 (inputs t[:-2], targets t[1:-1])
REPEAT = 16  # length of A in the evaluation sequence [BOS, A, A]
# Positions of the evaluation sequence [BOS, A, A, BOS]: position i reads token i and predicts
# token i + 1.  Positions 0..15 predict A's first occurrence; 17..31 predict A[1:] a second time
# (position 16 predicts A[0] after A[15], which no earlier context shows).
FIRST_HALF = slice(0, REPEAT)
REPEATED_HALF = slice(REPEAT + 1, 2 * REPEAT)

WEIGHTS_FILE = Path(__file__).parent / "data" / "induction.circuit"


def induction_tokens(n: int, seed: int = 0, *, vocab: int = VOCAB, repeat: int = REPEAT) -> np.ndarray:
    """``[n, 2 * repeat + 2]`` int64 evaluation sequences ``[BOS, A, A, BOS]``, A uniform over
    1..vocab-1 (the trailing token is attn_only's unused last one).  Positions ``FIRST_HALF``
    predict A's first occurrence, ``REPEATED_HALF`` its repeat.

    >>> t = induction_tokens(2, seed=0)
    >>> t.shape, bool((t[:, 1:17] == t[:, 17:33]).all()), int(t[0, 0])
    ((2, 34), True, 0)
    """
    a = np.random.default_rng(seed).integers(1, vocab, size=(n, repeat))
    bos = np.full((n, 1), BOS)
    return np.concatenate([bos, a, a, bos], axis=1).astype(np.int64)


@lru_cache(maxsize=1)
def _load(path: str) -> tuple:
    from ..io.files import load
    from ..nodes.leaves import Array
    from ..traversal import toposort

    if not Path(path).is_file():
        raise CircuitError(
            f"the induction model's weights are missing ({path}); retrain them with "
            "`python -m circuits.models.train_induction` or reinstall circuits")
    arrays = [n for n in toposort(load(path)) if isinstance(n, Array)]
    return tuple((a.name, a.numpy()) for a in arrays)


def induction_weights() -> dict[str, np.ndarray]:
    """The shipped trained induction model's weights, keyed by the seed's names (``'t.w.tok_embeds'``,
    ``'a0.w.q'``, ..., ``'t.w.unembed'``, ``'t.a.c.causal_mask'``), as fresh float32 numpy arrays.

    >>> w = induction_weights()
    >>> w['a1.w.q'].shape, w['t.w.unembed'].shape
    ((4, 16, 64), (64, 64))
    """
    return {name: np.array(value) for name, value in _load(str(WEIGHTS_FILE))}
