"""Retrain the SAEs shipped for the induction model: one TopK SAE (256 latents, k = 8) on each
layer's residual stream output ('b0', 'b1') of ``circuits.models.induction_weights()``.

    python examples/train_induction_saes.py [--out circuits/interp/data]

Deterministic on one machine (seeded data, initialisation and batch order); about a minute on a
laptop CPU.  The SAEs are written in the SAELens layout to ``<out>/induction_sae_<site>/``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from circuits.interp import save_sae, train_sae
from circuits.interp.sae_files import INDUCTION_SAE_DIR
from circuits.models import attn_only, induction_tokens, induction_weights

SITES = ("b0", "b1")


def main(out: Path = INDUCTION_SAE_DIR, steps: int = 2000) -> dict:
    w = induction_weights()
    # Half the training sequences are [BOS, A, A] (induction), half uniform random tokens.  Seeds
    # 100+: with seeds 0 and 1 the token features came out with index == token id (the decoder's
    # random start correlated with the embeddings), a coincidence that would mislead readers.
    toks = induction_tokens(1024, seed=1)
    rng = np.random.default_rng(2)
    rand = toks.copy()
    rand[512:, 1:-1] = rng.integers(1, 64, size=(512, rand.shape[1] - 2))
    loss = attn_only(w, toks[0], unique_names=True)
    saes = {}
    for i, site in enumerate(SITES):
        saes[site] = train_sae(loss, site, {"toks_int_var": rand}, d_sae=256, k=8, steps=steps, batch_size=512,
                               lr=3e-3, seed=100 + i)
        save_sae(saes[site], Path(out) / f"induction_sae_{site}")
    return saes


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=INDUCTION_SAE_DIR)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    main(args.out, args.steps)
