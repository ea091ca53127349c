"""The interpretability layer: sites, ablation, patching, path patching, attribution, sweeps, scrubbing.

This package is the home of the interventions of DESIGN §10. It sits above the backend and may
use ``rewrites``; the core never imports it.

- ``sweep(circuit, variants, inputs=None)``: many variants evaluated together, sharing their
  common work (``circuits.interp.sweep``).
"""

from .sweep import SweepResult, sweep

__all__ = ["sweep", "SweepResult"]
