"""Random-weight ``transformers`` models and a tokenizer trained here, saved in HuggingFace's own
folder layout: what ``circuits.models.load`` reads, made without the network.

- ``tokenizer()``: a byte-level BPE (GPT-2's kind) trained by the ``tokenizers`` package on a
  small corpus, ``'<|endoftext|>'`` its BOS and EOS token (id 0), ``VOCAB_TOKENIZER`` ids;
- ``hf_model(family, **config)``: a ``transformers`` causal LM with random weights big enough to
  move the logits (``VOCAB`` >= the tokenizer's ids), in eval mode (the verification matrix's
  configs: ``circuits.models.matrix``);
- ``save(model, folder, tok)``: ``save_pretrained`` of both (safetensors);
- ``float64_oracle()``: the context in which a ``.double()`` transformers model computes in float64
  throughout (``circuits.models.matrix.float64_oracle``).
"""

from __future__ import annotations

import functools

import numpy as np

from circuits.models import matrix
from circuits.models.matrix import float64_oracle, randomize  # noqa: F401  (one home: the matrix's)

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


def hf_model(family: str, seed: int = 0, **overrides):
    """A random-weight ``transformers`` model of ``family`` with the matrix's config and a vocabulary
    of ``VOCAB`` (the tokenizer's ids fit)."""
    return matrix.hf_model(family, seed, vocab=VOCAB, **overrides)


def save(model, folder, tok=True):
    model.save_pretrained(folder, safe_serialization=True)
    if tok:
        hf_tokenizer().save_pretrained(folder)
    return folder


def state(model) -> dict:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def rng_tokens(seed: int, n: int, high: int = VOCAB_TOKENIZER) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, high, n)
