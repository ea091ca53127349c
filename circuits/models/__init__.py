"""Model builders: circuits for real architectures from their weights.

>>> from circuits.models import attn_only, random_weights
"""

from .attn_only import attn_only, causal_mask, layer_norm, random_weights, tokens_symbol

__all__ = ["attn_only", "causal_mask", "layer_norm", "random_weights", "tokens_symbol"]
