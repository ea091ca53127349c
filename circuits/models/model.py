"""``load(path_or_id) -> Model``: a model as researchers load it, with its tokenizer.

A ``Model`` holds the config, the weights (as Arrays named as the builders name them, each
read from the safetensors files once and never copied again: ``circuits.models.checkpoint``) and
the tokenizer
(``circuits.models.tokenizer``), and builds circuits:

- ``model.circuit(text_or_tokens, output='logits')``: the logits [n, vocab] of a text (the BOS
  token first, as ``to_tokens`` gives it) or a token array, with per-head nodes
  (``'h{l}.attn.head{h}'``) so heads can be ablated, patched and found by ``interp.edges``;
  ``output='loss'``: the per-token next-token loss [n - 1] (TransformerLens's convention: n
  tokens give n - 1 losses); ``output='step'``: one generation step (the circuit ``generate``
  applies an ``edit`` to: the new tokens over a KV cache of Symbols).
- a batch (a list of texts or token rows, or a 2-d array) gives the circuit of one row over the
  Symbol ``'tokens'`` [longest row] and ``model.inputs(batch)`` its values: rows padded on the
  right (causal attention never reads the padding), and for a ragged batch ``'loss_mask'``, which
  zeroes the losses that would read padding: ``C.evaluate(model.circuit(batch, 'loss'),
  model.inputs(batch))`` is [rows, longest - 1].
- ``to_tokens``, ``to_str_tokens``, ``to_string`` behave as TransformerLens's (``to_tokens``
  returns [batch, pos], the BOS token first by default).
- ``generate(prompt, max_new_tokens, *, edit=None, ...)``: ``circuits.models.generate``.

>>> import tempfile, numpy as np, circuits as C
>>> from circuits.models import gpt2
>>> from circuits.models.gpt2 import random_gpt2_weights
>>> from circuits.models.model import Model
>>> cfg = dict(model_type='gpt2', n_embd=8, n_head=2, n_layer=1, vocab_size=11, n_positions=16)
>>> m = Model(cfg, random_gpt2_weights(cfg))
>>> c = m.circuit(np.array([1, 2, 3]))
>>> c.name, c.shape, bool(np.allclose(C.evaluate(c), C.evaluate(gpt2(cfg, random_gpt2_weights(cfg), [1, 2, 3]))))
('logits', (3, 11), True)
>>> m.circuit([[1, 2, 3], [4, 5]], output='loss').shape, m.inputs([[1, 2, 3], [4, 5]])['loss_mask'].tolist()
((2,), [[1.0, 1.0], [1.0, 0.0]])
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..errors import CircuitError
from ..nodes import Array, Circuit, Symbol
from .bloom import bloom
from .common import Weights, config_dict, loss_head
from .falcon import falcon
from .gemma import gemma
from .gemma2 import gemma2
from .gpt2 import gpt2
from .gpt_neo import gpt_neo
from .gpt_neox import PREFIXES as NEOX_PREFIXES
from .gpt_neox import gpt_neox
from .gptj import gptj
from .llama import llama
from .mixtral import mixtral
from .opt import opt
from .phi3 import phi3
from .qwen2 import qwen2
from .qwen3 import qwen3
from .sequence import Layout
from .stablelm import stablelm
from .tokenizer import Tokenizer

OUTPUTS = ("logits", "loss", "step")


class Family:
    """How one ``model_type`` is built: its builder, the state-dict prefixes it strips, the
    config field giving its context length (and that field's default; ``context_key=None``: no
    limit, as for ALiBi's BLOOM), the field giving its number of layers."""

    def __init__(self, builder, prefixes, context_key, context_default=None, layers_key="num_hidden_layers"):
        self.builder, self.prefixes = builder, prefixes
        self.context_key, self.context_default = context_key, context_default
        self.layers_key = layers_key


FAMILIES = {
    "gpt2": Family(gpt2, ("transformer.",), "n_positions", 1024, "n_layer"),
    "opt": Family(opt, ("model.decoder.", "decoder."), "max_position_embeddings", 2048),
    "llama": Family(llama, ("model.",), "max_position_embeddings", 2048),
    "mistral": Family(llama, ("model.",), "max_position_embeddings", 131072),
    "qwen2": Family(qwen2, ("model.",), "max_position_embeddings", 32768),
    "gemma2": Family(gemma2, ("model.",), "max_position_embeddings", 8192),
    "gpt_neox": Family(gpt_neox, NEOX_PREFIXES, "max_position_embeddings", 2048),
    "gemma": Family(gemma, ("model.",), "max_position_embeddings", 8192),
    "qwen3": Family(qwen3, ("model.",), "max_position_embeddings", 32768),
    "phi3": Family(phi3, ("model.",), "max_position_embeddings", 4096),
    "mixtral": Family(mixtral, ("model.",), "max_position_embeddings", 131072),
    "stablelm": Family(stablelm, ("model.",), "max_position_embeddings", 4096),
    "gptj": Family(gptj, ("transformer.",), "n_positions", 2048, "n_layer"),
    "gpt_neo": Family(gpt_neo, ("transformer.",), "max_position_embeddings", 2048, "num_layers"),
    "falcon": Family(falcon, ("transformer.",), "max_position_embeddings", 2048),
    "bloom": Family(bloom, ("transformer.",), None, None, "n_layer"),
}


def named_arrays(weights: Mapping, prefixes, family: str, *, owned: bool = False) -> dict[str, Array]:
    """Each weight as an Array named as the builders name it (``Weights.short_name`` of the key
    without the base prefix), so building a circuit never renames, copies or re-hashes one.
    ``owned``: the arrays were just read by ``checkpoint.read_weights`` and nothing else holds
    them, so each Array takes its array as its own value instead of copying it."""
    probe = Weights(weights, prefixes, family)
    out = {}
    for key, value in weights.items():
        short = key[len(probe.prefix):] if probe.prefix and key.startswith(probe.prefix) else key
        if isinstance(value, Circuit):
            out[key] = value
        elif owned:
            out[key] = Array(value, name=Weights.short_name(short), _owned=True)
        else:
            out[key] = Array(value, name=Weights.short_name(short))
    return out


class Model:
    """A causal language model with its tokenizer (see the module docstring).  ``config`` is the
    ``config.json`` dict, ``weights`` the state dict (numpy arrays, read-only ones kept without a
    copy), ``tokenizer`` a ``Tokenizer`` or None, ``dtype`` the precision circuits are built and
    evaluated in (``'float32'`` or ``'float64'``)."""

    def __init__(self, config, weights: Mapping, tokenizer: Tokenizer | None = None, *, dtype: str = "float32",
                 path: str | None = None, _owned: bool = False):
        self.config = config_dict(config)
        kind = self.config.get("model_type")
        family = FAMILIES.get(kind) if isinstance(kind, str) else None
        if family is None:
            raise CircuitError(f"config model_type={kind!r:.80} has no builder (supported: {', '.join(map(repr, FAMILIES))}); "
                               "circuits.importers.from_torch(model, example_inputs) may import it through torch.export")
        if dtype not in ("float32", "float64"):
            raise CircuitError(f"dtype={dtype!r}: a model computes in 'float32' or 'float64'")
        self.family, self._family, self.dtype, self.path = kind, family, dtype, path
        self.weights = named_arrays(weights, family.prefixes, kind, owned=_owned)
        self.tokenizer = tokenizer
        context = self.config.get(family.context_key, family.context_default) if family.context_key else None
        self.context = int(context) if isinstance(context, int) and not isinstance(context, bool) else None
        self._build(Symbol((1,), name="tokens", dtype="int64"))  # every config field and weight checked now
        self.vocab_size = int(self.config["vocab_size"])
        if tokenizer is not None:
            tokenizer.check_vocabulary(self.vocab_size, str(path or "model"))
        self._steps: dict = {}  # (new tokens, cache slots) -> the step circuit (see ``step_circuit``)
        self._programs: dict = {}  # generation's compiled step programs (``generate.step_program``)

    def __repr__(self):
        layers = self.config.get(self._family.layers_key)
        return (f"<Model {self.family} {layers} layers, vocab {self.config.get('vocab_size')}, context {self.context}, "
                f"{self.dtype}{', ' + str(self.path) if self.path else ''}>")

    # ------------------------------------------------------------------ building
    def _build(self, tokens, **options) -> Circuit:
        return self._family.builder(self.config, self.weights, tokens, dtype=self.dtype, **options)

    def _check_length(self, n: int, what: str = "the tokens") -> None:
        if self.context is not None and n > self.context:
            raise CircuitError(f"{what}: {n} tokens, longer than the model's context of {self.context} "
                               f"({self._family.context_key})")

    def circuit(self, text_or_tokens, output: str = "logits", *, split_heads: bool = True,
                prepend_bos: bool = True, past: int | None = None) -> Circuit:
        """The circuit of a text, a token array or a batch (see the module docstring):
        ``output='logits'`` [n, vocab], ``'loss'`` [n - 1], or ``'step'`` (the generation step
        over a KV cache of ``past`` slots: Symbols ``'tokens'``, ``'positions'``,
        ``'attention_mask'``, ``'h{l}.attn.past_k'`` / ``'past_v'``).  ``split_heads=False``
        builds each attention layer as one fused node (faster to evaluate, no per-head sites)."""
        if output not in OUTPUTS:
            raise CircuitError(f"output={output!r}: use one of {', '.join(map(repr, OUTPUTS))}")
        rows, batch = self._rows(text_or_tokens, prepend_bos)
        n = max(len(r) for r in rows)
        self._check_length(n)
        if output == "step":
            if batch:
                raise CircuitError("output='step' takes one sequence of new tokens (a step's batch is generate's)")
            capacity = past if past is not None else _bucket(n)
            return self._build(rows[0], layout=Layout.step(n, capacity), split_heads=split_heads)
        if output == "loss" and n < 2:
            raise CircuitError("output='loss' needs at least 2 tokens (n tokens give n - 1 losses)")
        tokens = Symbol((n,), name="tokens", dtype="int64") if batch else rows[0]
        if output == "loss" and batch and len({len(r) for r in rows}) > 1:
            logits = self._build(tokens, split_heads=split_heads)
            return loss_head(logits, tokens, Symbol((n - 1,), name="loss_mask"))
        return self._build(tokens, loss=output == "loss", split_heads=split_heads)

    def inputs(self, batch, *, prepend_bos: bool = True) -> dict[str, np.ndarray]:
        """The Symbols' values for the circuit of ``batch``: ``'tokens'`` [rows, longest] (padded on
        the right with the pad token, else EOS, else 0) and, for rows of different lengths,
        ``'loss_mask'`` [rows, longest - 1] (1 where the loss reads two real tokens)."""
        rows, _ = self._rows(batch, prepend_bos)
        n = max(len(r) for r in rows)
        tokens = np.full((len(rows), n), self._pad_id(), np.int64)
        for i, r in enumerate(rows):
            tokens[i, :len(r)] = r
        out = {"tokens": tokens}
        lengths = np.array([len(r) for r in rows])
        if len(set(lengths.tolist())) > 1:
            out["loss_mask"] = (np.arange(1, n)[None, :] < lengths[:, None]).astype(np.float32)
        return out

    def _pad_id(self) -> int:
        tok = self.tokenizer
        for i in ((tok.pad_token_id, tok.eos_token_id) if tok is not None else ()):
            if i is not None:
                return int(i)
        for key in ("pad_token_id", "eos_token_id"):
            i = self.config.get(key)
            i = i[0] if isinstance(i, list) and i else i
            if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.vocab_size:
                return i
        return 0

    def _rows(self, x, prepend_bos: bool) -> tuple[list[np.ndarray], bool]:
        """``(rows of token ids, is a batch)`` for a text, tokens or a batch of either."""
        if isinstance(x, str):
            return [self._tok().encode(x, prepend_bos=prepend_bos)], False
        if isinstance(x, Circuit):
            raise CircuitError("give text or token ids (a tokens Symbol goes to the builders: circuits.models.gpt2...)")
        if isinstance(x, (list, tuple)) and x and all(isinstance(t, str) for t in x):
            return self._tok().encode_batch(list(x), prepend_bos=prepend_bos), True
        if isinstance(x, (list, tuple)) and x and all(isinstance(r, (list, tuple, np.ndarray)) or hasattr(r, "shape")
                                                     for r in x):
            rows = [self._check_tokens(r) for r in x]
            return rows, True
        arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.ndim == 2:
            return [self._check_tokens(r) for r in arr], True
        return [self._check_tokens(arr)], False

    def _check_tokens(self, row) -> np.ndarray:
        arr = np.asarray(row.detach().cpu().numpy() if hasattr(row, "detach") else row)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise CircuitError(f"tokens must be non-empty 1-d int arrays (a text, or a batch of either), got dtype "
                               f"{arr.dtype} shape {list(arr.shape)}")
        if arr.min() < 0 or arr.max() >= self.vocab_size:
            raise CircuitError(f"tokens must lie in [0, {self.vocab_size}) (the vocabulary), got "
                               f"{int(arr.min())}..{int(arr.max())}")
        return arr.astype(np.int64)

    def step_circuit(self, n: int, capacity: int, split_heads: bool = True) -> Circuit:
        """The generation step of ``n`` new tokens over a cache of ``capacity`` slots, over the
        Symbol ``'tokens'`` (built once per shape and kept)."""
        return self._step(n, capacity, split_heads)[0]

    def step_window(self, n: int, capacity: int, split_heads: bool = True) -> int | None:
        """The sliding window of the step's windowed layers (None when every layer sees all)."""
        return self._step(n, capacity, split_heads)[1].window

    def _step(self, n: int, capacity: int, split_heads: bool):
        key = (n, capacity, split_heads)
        got = self._steps.get(key)
        if got is None:
            layout = Layout.step(n, capacity)
            c = self._build(Symbol((n,), name="tokens", dtype="int64"), layout=layout, split_heads=split_heads)
            if len(self._steps) >= 16:
                self._steps.pop(next(iter(self._steps)))
            got = self._steps[key] = (c, layout)
        return got

    @property
    def attention_layers(self) -> list[str]:
        n = self.config.get(self._family.layers_key)
        return [f"h{l}.attn" for l in range(int(n))]

    # ------------------------------------------------------------------ tokens and text
    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise CircuitError(f"{self.path or 'this model'} has no tokenizer (no tokenizer.json in its folder); give "
                               "token ids, or load a folder with a tokenizer")
        return self.tokenizer

    def to_tokens(self, text: str | Sequence[str], *, prepend_bos: bool = True,
                  padding_side: str = "right") -> np.ndarray:
        """Token ids [batch, pos] (int64) of a text or a list of texts, the BOS token first
        (``prepend_bos``), rows of a list padded on ``padding_side`` with the pad token (else EOS)."""
        if padding_side not in ("right", "left"):
            raise CircuitError(f"padding_side={padding_side!r}: 'right' or 'left'")
        texts = [text] if isinstance(text, str) else list(text)
        rows = self._tok().encode_batch(texts, prepend_bos=prepend_bos)
        n = max(len(r) for r in rows)
        out = np.full((len(rows), n), self._pad_id(), np.int64)
        for i, r in enumerate(rows):
            if padding_side == "right":
                out[i, :len(r)] = r
            elif len(r):
                out[i, -len(r):] = r
        return out

    def to_str_tokens(self, x, *, prepend_bos: bool = True) -> list:
        """Each token of a text (or of token ids [pos] or [1, pos]) as its own string; a list of
        texts gives a list of lists."""
        if isinstance(x, str):
            return self._tok().str_tokens(self._tok().encode(x, prepend_bos=prepend_bos))
        if isinstance(x, (list, tuple)) and x and all(isinstance(t, str) for t in x):
            return [self.to_str_tokens(t, prepend_bos=prepend_bos) for t in x]
        arr = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        arr = arr.squeeze() if arr.ndim > 1 else arr
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim != 1:
            raise CircuitError(f"to_str_tokens takes a text, a list of texts or tokens [pos] or [1, pos]; got shape "
                               f"{list(arr.shape)}")
        return self._tok().str_tokens(arr)

    def to_string(self, tokens) -> str | list[str]:
        """The text of token ids [pos] (a str) or [batch, pos] (a list of str)."""
        arr = np.asarray(tokens.detach().cpu().numpy() if hasattr(tokens, "detach") else tokens)
        if arr.ndim == 2:
            return [self._tok().decode(r) for r in arr]
        if arr.ndim > 2:
            raise CircuitError(f"to_string takes tokens [pos] or [batch, pos], got shape {list(arr.shape)}")
        return self._tok().decode(arr.reshape(-1))

    # ------------------------------------------------------------------ generation
    def generate(self, prompt, max_new_tokens: int = 10, *, edit=None, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0, **options):
        """Text or tokens continued by the model (``circuits.models.generate.generate``: KV cache,
        greedy or sampled, batches, ``stream=True``, stop tokens and strings, ``edit=`` applied to
        every step)."""
        from .generate import generate

        return generate(self, prompt, max_new_tokens, edit=edit, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, **options)


def _bucket(n: int, least: int = 16) -> int:
    """The power of two at least ``n`` (and ``least``): lengths that share one compiled program."""
    size = least
    while size < n:
        size *= 2
    return size


def load(path_or_id, *, dtype: str = "float32", revision: str | None = None) -> Model:
    """The model in a HuggingFace folder (``config.json``, ``*.safetensors``, the tokenizer's
    files), or of a hub id from the user's HuggingFace cache (``HF_HUB_OFFLINE=1``: the cache
    only; ``circuits.models.checkpoint``).  Each weight is read from its file once, into memory its
    Array then owns (no further copy); torch and transformers are not imported."""
    from .checkpoint import read_weights, resolve
    from .huggingface import read_config

    folder = resolve(path_or_id, revision=revision)
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise CircuitError(f"{folder}: no config.json there (a model folder as save_pretrained writes it)")
    config = read_config(cfg_file)
    weights = read_weights(folder)
    tokenizer = Tokenizer.from_folder(folder, config)
    return Model(config, weights, tokenizer, dtype=dtype, path=os.fspath(Path(folder)), _owned=True)
