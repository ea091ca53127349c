"""Model builders: circuits for real architectures from their weights, and models as researchers load them.

``load(path_or_id) -> Model`` reads a HuggingFace folder (or a hub id from the user's cache): the
config, the weights (each read once), the tokenizer; ``Model.circuit(text_or_tokens)`` builds the
logits, loss or generation-step circuit, ``Model.generate`` continues text with a KV cache and
any edit applied to every step (``model``, ``generate``, ``tokenizer``, ``checkpoint``).

``blocks`` holds the layers every builder shares (layer norm, RMS norm, masks, rotary
embeddings, attention, MLPs) and ``sequence`` the positions, masks and KV cache; each builder
module assembles them: ``attn_only`` (the seed's model), ``gpt2``, ``opt``, ``gpt_neox``
(GPT-NeoX, Pythia), and ``decoder``'s rotary decoder read from a ``llama`` (Llama, Mistral),
``qwen2`` or ``gemma2`` config; ``from_huggingface`` picks the builder from a ``transformers``
model or checkpoint directory (``circuits.summary`` prints a big one collapsed: its 88 equal
layers as one line).  ``induction_weights()`` is the shipped trained induction model
(``induction``; trained by ``train_induction``).

>>> from circuits.models import attn_only, random_weights, gpt2, opt, llama, from_huggingface, load, Model
"""

from .attn_only import attn_only, random_weights, tokens_symbol
from .blocks import attention_head, causal_mask, layer_norm, rms_norm
from .bloom import bloom
from .falcon import falcon
from .gemma import gemma
from .gemma2 import gemma2
from .gpt2 import gpt2
from .gpt_neo import gpt_neo
from .gpt_neox import gpt_neox
from .gptj import gptj
from .huggingface import from_huggingface, load_checkpoint
from .induction import induction_tokens, induction_weights
from .llama import llama
from .mixtral import mixtral
from .model import Model, load
from .opt import opt
from .phi3 import phi3
from .qwen2 import qwen2
from .qwen3 import qwen3
from .sequence import position_mask
from .stablelm import stablelm
from .tokenizer import Tokenizer

mistral = llama

__all__ = ["attn_only", "attention_head", "bloom", "causal_mask", "falcon", "from_huggingface", "gemma", "gemma2",
           "gpt2", "gpt_neo", "gpt_neox", "gptj", "induction_tokens", "induction_weights", "layer_norm", "llama",
           "load", "load_checkpoint", "mistral", "mixtral", "Model", "opt", "phi3", "position_mask", "qwen2", "qwen3",
           "random_weights", "rms_norm", "stablelm", "tokens_symbol", "Tokenizer"]
