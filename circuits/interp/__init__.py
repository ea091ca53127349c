"""The interpretability layer: sites, ablation, patching, path patching, attribution, sweeps, scrubbing.

This package is the home of the interventions of DESIGN §10. It sits above the backend and may
use ``rewrites``; the core never imports it. Nothing lives here yet.
"""
