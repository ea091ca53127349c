"""Random-weight ``transformers`` models and a tokenizer trained here, saved in HuggingFace's own
folder layout: what ``circuits.models.load`` reads, made without the network.

- ``tokenizer()``: a byte-level BPE (GPT-2's kind) trained by the ``tokenizers`` package on a
  small corpus, ``'<|endoftext|>'`` its BOS and EOS token (id 0), ``VOCAB_TOKENIZER`` ids;
- ``hf_model(family, **config)``: a ``transformers`` causal LM with random weights big enough to
  move the logits (``VOCAB`` >= the tokenizer's ids), in eval mode;
- ``save(model, folder, tok)``: ``save_pretrained`` of both (safetensors);
- ``float64_oracle()``: the context in which a ``.double()`` transformers model computes in float64
  throughout (see its docstring).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

CORPUS = [
    "the cat sat on the mat. the dog sat on the log. a cat and a dog met on the mat.",
    "once upon a time there was a small model that learned to count: one two three four five six.",
    "naïve café, ünïcödé and 🙂 emoji travel as bytes through a byte-level tokenizer.",
    "The quick brown fox jumps over the lazy dog; THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!",
]
VOCAB_TOKENIZER = 320
VOCAB = 331  # the model's table is larger than the tokenizer's ids, as in Pythia


@functools.lru_cache(maxsize=None)
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_TOKENIZER, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def hf_tokenizer():
    import transformers

    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer(), bos_token="<|endoftext|>",
                                                eos_token="<|endoftext|>")


def randomize(model, seed: int):
    """Weights large enough that every part of the model moves the logits (the default init
    leaves them near zero); Gemma's norm weights are offsets from 1, so they stay near 0."""
    import torch

    offset = 0.0 if "gemma" in type(model).__name__.lower() else 1.0
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "ln" in name):
                p.copy_(offset + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * min(p.shape) ** -0.5)
    return model.eval()


CONFIGS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=32, n_head=4, n_layer=2, n_positions=64)),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_dim=48,
                                                max_position_embeddings=64, word_embed_proj_dim=32)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                                      num_hidden_layers=2, intermediate_size=48,
                                                      max_position_embeddings=64)),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                                            num_hidden_layers=2, intermediate_size=48, sliding_window=5,
                                                            max_position_embeddings=64)),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                                                             intermediate_size=48, max_position_embeddings=64,
                                                             rotary_pct=0.5)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                                         head_dim=8, num_hidden_layers=3, intermediate_size=48,
                                                         sliding_window=5, query_pre_attn_scalar=8,
                                                         attn_logit_softcapping=4.0, final_logit_softcapping=6.0,
                                                         max_position_embeddings=64)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                                      num_hidden_layers=2, intermediate_size=48,
                                                      max_position_embeddings=64)),
}


def hf_model(family: str, seed: int = 0, **overrides):
    import transformers

    transformers.logging.set_verbosity_error()
    model_cls, config_cls, base = CONFIGS[family]
    config = getattr(transformers, config_cls)(**{**base, "vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0,
                                                  "pad_token_id": 0, "attn_implementation": "eager", **overrides})
    return randomize(getattr(transformers, model_cls)(config), seed)


def save(model, folder, tok=True):
    model.save_pretrained(folder, safe_serialization=True)
    if tok:
        hf_tokenizer().save_pretrained(folder)
    return folder


@contextlib.contextmanager
def float64_oracle(model):
    """``model`` (a ``transformers`` causal LM) computing in float64 throughout.

    transformers upcasts some steps to float32 for half-precision models: the attention softmax
    (``softmax(..., dtype=torch.float32)``), RMS norms (``.to(torch.float32)``, Gemma's
    ``x.float()``) and the rotary frequencies (computed in float32 at init, read with
    ``.float()``).  On a ``.double()`` model those "upcasts" are downcasts that cap its precision
    at float32's (about 1e-7), so a float64 comparison at 1e-9 would measure transformers'
    rounding, not ours.  Here the model is made float64 and, while the context lasts, a request
    to turn a float64 tensor into float32 keeps it float64, and the rotary frequencies are
    recomputed in float64 from the config; nothing else of the model changes.
    """
    import torch

    model.double()
    for module in model.modules():
        if hasattr(module, "inv_freq") and isinstance(module.inv_freq, torch.Tensor):
            dim = 2 * module.inv_freq.numel()
            params = getattr(model.config, "rope_parameters", None) or {}
            theta = params.get("rope_theta", getattr(model.config, "rope_theta", 10000.0))
            inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            module.inv_freq = inv
            if hasattr(module, "original_inv_freq"):
                module.original_inv_freq = inv.clone()
    to, flt, softmax = torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax

    def keep_to(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return to(self, *args, **kwargs)

    def keep_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else flt(self, *args, **kwargs)

    def keep_softmax(x, *args, **kwargs):
        if x.dtype == torch.float64 and kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return softmax(x, *args, **kwargs)

    torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax = keep_to, keep_float, keep_softmax
    try:
        yield model
    finally:
        torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax = to, flt, softmax


def state(model) -> dict:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def rng_tokens(seed: int, n: int, high: int = VOCAB_TOKENIZER) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, high, n)
