"""Model builders: circuits for real architectures from their weights.

``blocks`` holds the layers every builder shares (layer norm, RMS norm, masks, rotary
embeddings, attention, MLPs); each builder module assembles them: ``attn_only`` (the seed's
model), ``gpt2``, ``opt``, ``llama`` (Llama and Mistral); ``from_huggingface`` picks the builder
from a ``transformers`` model or checkpoint directory (``circuits.summary`` prints a big one
collapsed: its 88 equal layers as one line).  ``induction_weights()`` is the shipped trained induction model
(``induction``; trained by ``train_induction``).

>>> from circuits.models import attn_only, random_weights, gpt2, opt, llama, from_huggingface
"""

from .attn_only import attn_only, random_weights, tokens_symbol
from .blocks import attention_head, causal_mask, layer_norm, rms_norm
from .gemma2 import gemma2
from .gpt2 import gpt2
from .gpt_neox import gpt_neox
from .huggingface import from_huggingface, load_checkpoint
from .induction import induction_tokens, induction_weights
from .llama import llama
from .opt import opt
from .qwen2 import qwen2

mistral = llama

__all__ = ["attn_only", "attention_head", "causal_mask", "from_huggingface", "gemma2", "gpt2", "gpt_neox",
           "induction_tokens", "induction_weights", "layer_norm", "llama", "load_checkpoint", "mistral",
           "opt", "qwen2", "random_weights", "rms_norm", "tokens_symbol"]
