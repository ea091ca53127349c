"""The interpretability layer: sites, ablation, patching, path patching, attribution, path expansion, scrubbing.

Every intervention is a circuit transform: it returns a plain circuit that prints, saves and
evaluates like any other, sharing the clean circuit's nodes wherever the intervention does not
reach (DESIGN §10).  Sites are names (``attn_only(..., unique_names=True)`` names every head's
nodes ``'b{l}.a.head{h}.<seed name>'``), matchers (``circuits.select.Inside(site, inner)``: the
node named ``inner`` inside ``site``'s own computation) or nodes.

- ``ablate(circuit, sites, kind='zero'|'mean'|'resample', data=None, seed=0)``
- ``patch(circuit, sites, source)``: activation patching from ``source`` inputs
- ``path_patch(circuit, sender, receivers, source, freeze=None)``: exact path patching
- ``attribute(circuit, sites, source, metric=None)``: attribution patching (linear estimates)
- ``sweep(circuit, variants, inputs=None)``: many variants evaluated together, sharing their
  common work and compiling once per group of variants that differ only in values
- ``scrub(circuit, hypothesis, data, samples=, seed=)``: causal scrubbing of a tree of ``Claim``s
  (``hypothesis``) over a treeified circuit (``treeify``)
- ``splice(circuit, site, sae)``: an SAE or transcoder spliced in with an explicit error node;
  ``load_sae`` / ``save_sae`` (SAELens layout), ``train_sae``; ``attribution_graph`` (exact direct
  effects between features, errors, tokens and logits with patterns and norm scales frozen)
- ``edges(circuit)``, ``patch_edges(circuit, edges, source)``, ``discover(circuit, source, metric,
  method=)``, ``faithfulness``: circuit discovery over the head-level graph (EAP, EAP-IG, ACDC, exact),
  the package ``circuits.interp.discovery``; ``metric=`` is read by ``circuits.interp.metric`` for
  ``attribute`` and ``discover`` alike
- ``residual_terms(circuit, at, depth=1, layer_norm='keep'|'freeze')``, ``expand_residual``: residual-stream
  path expansion into named per-source terms (``residual_paths``); ``split_heads`` for fused-head attention
- ``attention_patterns(circuit, tokens)``: every head's attention pattern with the token strings,
  a notebook view (layer × head overview, query × key heatmaps, hover values)
- everyday analysis in TransformerLens's words (``docs/transformerlens.md``): ``positions=`` /
  ``rows=`` in ``patch``, ``ablate``, ``path_patch``, ``attribute`` (``positions``);
  ``steer(circuit, site, vector, scale=, positions=)``, ``steering_vector``;
  ``run_with_cache(circuit, inputs, names)`` answering to hook names (``circuits.select.hooks``);
  ``logit_lens``, ``logit_attribution``; ``patch_grid``, ``residual_patch_grid``, ``head_patch_grid``

This package sits above the backend and may use ``rewrites``; the core never imports it.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
>>> loss = attn_only(w, np.arange(6), unique_names=True)
>>> ablate(loss, ['b0.a.head0', 'b0.a.head1']).get_unique('b0.a').children[1].name
'b0.a.head1.zero_ablated'
"""

from .attention import attention_patterns
from .attribution import attribute
from .attribution_graph import AttributionGraph, attribution_graph
from .cache import ActivationCache, run_with_cache
from .discovery import Discovery, Edges, Faithfulness, FoundCircuit, discover, edges, faithfulness, patch_edges
from .grids import head_patch_grid, patch_grid, residual_patch_grid
from .heads import split_heads
from .hypothesis import EXACT, RANDOM, Claim, Feature
from .induction import head_scores, induction_hypothesis
from .interventions import ablate, patch, path_patch
from .readout import logit_attribution, logit_lens
from .residual_paths import expand_residual, layer_norm_parts, residual_terms
from .sae import SAE
from .sae_files import induction_saes, load_sae, save_sae
from .scrubbing import ScrubResult, scrub
from .splice import feature_site, splice
from .steering import steer, steering_vector
from .sweep import SweepResult, sweep
from .train_sae import train_sae  # binds the function over the submodule of the same name

__all__ = [
    "ablate", "attribute", "expand_residual", "layer_norm_parts", "patch", "path_patch", "residual_terms",
    "split_heads", "attention_patterns", "steer", "steering_vector", "run_with_cache", "ActivationCache",
    "logit_lens", "logit_attribution", "patch_grid", "residual_patch_grid", "head_patch_grid",
    "sweep", "SweepResult",
    # feature circuits
    "SAE", "load_sae", "save_sae", "splice", "feature_site", "attribution_graph", "AttributionGraph",
    "train_sae", "induction_saes",
    # causal scrubbing
    "scrub", "ScrubResult", "Claim", "Feature", "EXACT", "RANDOM", "induction_hypothesis", "head_scores",
    # circuit discovery
    "edges", "Edges", "patch_edges", "discover", "Discovery", "FoundCircuit", "faithfulness", "Faithfulness",
]

