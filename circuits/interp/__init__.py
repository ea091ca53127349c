"""The interpretability layer: sites, ablation, patching, path patching, attribution, sweeps, scrubbing.

This package is the home of the interventions of DESIGN §10. It sits above the backend and may
use ``rewrites``; the core never imports it.  Here so far: residual-stream path expansion
(``residual_terms``, ``expand_residual``) and ``split_heads``.
"""

from .expansion import expand_residual, layer_norm_parts, residual_terms
from .heads import split_heads

__all__ = ["expand_residual", "layer_norm_parts", "residual_terms", "split_heads"]
