"""The interpretability layer: sites, ablation, patching, path patching, attribution, sweeps, scrubbing.

This package is the home of the interventions of DESIGN §10.  It sits above the backend and may
use ``rewrites``; the core never imports it.

- ``scrub`` (``scrubbing``): causal scrubbing of a hypothesis, a tree of ``Claim``s over the
  circuit's paths with the input ``Feature`` each depends on (``hypothesis``), on a treeified
  circuit (``treeify``).
"""

from .hypothesis import EXACT, RANDOM, Claim, Feature
from .scrubbing import ScrubResult, scrub

__all__ = [
    # causal scrubbing
    "scrub", "ScrubResult", "Claim", "Feature", "EXACT", "RANDOM",
]
