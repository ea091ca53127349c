"""Model builders: circuits for real architectures from their weights.

``blocks`` holds the layers every builder shares (layer norm, causal mask, attention head);
each builder module (``attn_only``: the seed's model) assembles them.  ``induction_weights()``
is the shipped trained induction model (``induction``; trained by ``train_induction``).

>>> from circuits.models import attn_only, random_weights
"""

from .attn_only import attn_only, random_weights, tokens_symbol
from .blocks import attention_head, causal_mask, layer_norm
from .induction import induction_tokens, induction_weights

__all__ = [
    "attn_only", "attention_head", "causal_mask", "induction_tokens", "induction_weights", "layer_norm",
    "random_weights", "tokens_symbol",
]
