"""What the HuggingFace-family builders (``gpt2``, ``opt``, ``llama``) share: reading a config,
taking weights by their state-dict keys (shape-checked, every key accounted for, placeholders
when there are no weights), the tokens node, and the loss head.

Naming scheme (every builder, unique per site):

- weights keep their state-dict key with the model's base prefix (``transformer.``,
  ``model.decoder.``, ``model.``) dropped and ``h.{l}.`` / ``layers.{l}.`` written ``h{l}.``:
  ``h3.attn.c_attn.weight``, ``h3.self_attn.q_proj.weight``, ``wte.weight``, ``lm_head.weight``;
- layer ``l``'s nodes are ``h{l}.ln1``, ``h{l}.attn.q`` / ``.k`` / ``.v`` / ``.scores`` /
  ``.probs`` / ``.z``, ``h{l}.attn`` (its output), ``h{l}.mid`` (residual after attention),
  ``h{l}.ln2``, ``h{l}.mlp.fc`` / ``.gate`` / ``.up`` / ``.act``, ``h{l}.mlp``, and ``h{l}`` (the
  residual after the layer); with ``split_heads=True`` each head's nodes are
  ``h{l}.attn.head{h}.q`` / ``.k`` / ``.scores`` / ``.probs`` / ``.z`` and its contribution
  ``h{l}.attn.head{h}``;
- globals: ``tok_embeds``, ``pos_embeds``, ``embeds``, ``final.ln``, ``logits``; the loss
  variant ends in ``log_probs``, ``ll``, ``loss``.
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from ..errors import CircuitError, ShapeError
from ..hashing import content_hash
from ..nodes import Array, Circuit, Einsum, GeneralFunction, Index, Module, ModuleArgSpec, ModuleSpec, Scalar, Symbol

REQUIRED = object()

# Bounds on what a config may ask for: more layers than any real model (a config-only build of
# n_layer=10**9 placeholder layers would never return), sizes a tensor axis can sensibly have.
MAX_LAYERS = 4096
MAX_SIZE = 1 << 24
MAX_POSITIONS = 1 << 31


def _shown(value) -> str:
    """A config value as an error message quotes it (a long one cut)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def config_dict(config) -> dict:
    """A plain dict from a ``transformers`` config object, a ``config.json`` dict, or any object
    with ``to_dict()``."""
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    raise CircuitError(f"config must be a dict (config.json) or a transformers config, got {type(config).__name__}")


# Config keys that do not change what a causal LM computes in inference: bookkeeping, training
# (dropout, initialisation), generation defaults, heads other than the LM head, token ids.  Any
# other key a builder does not read is refused (``Config.check_understood``): a variant is built
# exactly or not at all.
HARMLESS_KEYS = frozenset({
    "transformers_version", "architectures", "model_type", "_name_or_path", "name_or_path", "dtype", "torch_dtype",
    "output_hidden_states", "output_attentions", "return_dict", "use_return_dict", "torchscript", "use_cache",
    "problem_type", "id2label", "label2id", "num_labels", "finetuning_task", "tokenizer_class", "prefix",
    "task_specific_params", "chunk_size_feed_forward", "is_decoder", "cross_attention_hidden_size",
    "tie_encoder_decoder", "initializer_range", "initializer_factor", "init_std", "gradient_checkpointing",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "attn_implementation", "_attn_implementation", "_attn_implementation_autoset", "_commit_hash",
    "attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop", "hidden_dropout", "dropout",
    "activation_dropout", "classifier_dropout", "layerdrop", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "tf_legacy_loss",
    "use_bfloat16", "pruned_heads", "transformers.js_config",
})


class Config:
    """Read a config by key; a missing required key or a value the builder cannot honour is an
    error naming the key.  Every key read is recorded: ``check_understood()`` refuses a config
    holding a key the builder never read that is not in ``HARMLESS_KEYS`` (a variant the builder
    does not implement: it is never built approximately).

    >>> cfg = Config({'n_head': 2, 'use_flash_mlp': True}, 'gpt2')
    >>> cfg.size('n_head')
    2
    >>> cfg.check_understood()
    Traceback (most recent call last):
    circuits.errors.CircuitError: gpt2: config field 'use_flash_mlp' (True) is not understood by this builder; a variant it does not implement is refused rather than built approximately
    """

    def __init__(self, config, family: str):
        self.d = config_dict(config)
        self.family = family
        self.read: set = set()

    def __call__(self, key, default=REQUIRED):
        self.read.add(key)
        v = self.d.get(key)
        if v is None:
            if default is REQUIRED:
                raise CircuitError(f"{self.family}: config has no {key!r}, which this builder needs")
            return default
        return v

    def get(self, key, default=None):
        """``config[key]`` (or ``default`` when absent or None), recorded as read."""
        self.read.add(key)
        v = self.d.get(key)
        return default if v is None else v

    def understood(self, *keys):
        """Record ``keys`` as handled (a key whose every value the builder honours, or checks
        elsewhere)."""
        self.read.update(keys)

    def check_understood(self):
        """Refuse a config holding a key that is neither read by the builder nor harmless."""
        left = sorted(k for k in self.d if k not in self.read and k not in HARMLESS_KEYS)
        if left:
            shown = ", ".join(f"{k!r} ({_shown(self.d[k])})" for k in left[:8])
            raise CircuitError(
                f"{self.family}: config field{'s' if len(left) > 1 else ''} {shown} "
                f"{'are' if len(left) > 1 else 'is'} not understood by this builder; a variant it does not "
                "implement is refused rather than built approximately")

    def size(self, key, default=REQUIRED, *, most: int = MAX_SIZE) -> int:
        """An int the config gives (a count, a size): a JSON int, not a string, float or bool,
        from 1 to ``most``; anything else is an error naming the key.

        >>> Config({'n_head': 12}, 'gpt2').size('n_head')
        12
        >>> Config({'n_head': '12'}, 'gpt2').size('n_head')
        Traceback (most recent call last):
        circuits.errors.CircuitError: gpt2: config n_head='12' must be an int from 1 to 16777216
        """
        v = self(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= most:
            raise CircuitError(f"{self.family}: config {key}={_shown(v)} must be an int from 1 to {most}")
        return int(v)

    def number(self, key, default=REQUIRED) -> float:
        """A positive finite number the config gives (an epsilon, a rotary base)."""
        return positive_number(self.family, key, self(key, default))

    def require(self, key, allowed, default=None, why=""):
        self.read.add(key)
        v = self.d.get(key, default)
        if v is None:
            v = default
        if v not in allowed:
            raise CircuitError(
                f"{self.family}: config {key}={_shown(v)} is not supported (supported: "
                f"{', '.join(map(repr, allowed))}){'; ' + why if why else ''}"
            )
        return v

    def reject_alibi(self):
        for key in ("alibi", "use_alibi", "position_embedding_type"):
            self.read.add(key)
            v = self.d.get(key)
            if v is True or (isinstance(v, str) and "alibi" in v.lower()):
                raise CircuitError(f"{self.family}: config {key}={v!r}: alibi position biases are not supported")
            if v not in (None, False, "absolute", "rotary") and key == "position_embedding_type":
                raise CircuitError(f"{self.family}: config {key}={_shown(v)} is not supported")

    def common(self):
        """Check the keys every decoder-only builder shares: no encoder-decoder, no cross-attention,
        no pruned heads, no quantization (the weights would not be what they say)."""
        self.require("is_encoder_decoder", (False,), False)
        self.require("add_cross_attention", (False,), False)
        self.read.add("pruned_heads")
        if self.d.get("pruned_heads"):
            raise CircuitError(f"{self.family}: config pruned_heads={_shown(self.d['pruned_heads'])}: pruned "
                               "heads are not supported")
        if self.d.get("quantization_config") is not None:
            raise CircuitError(f"{self.family}: config quantization_config: quantized weights are not supported "
                               "(load a float checkpoint)")


def rope_theta(cfg: Config, theta_key: str = "rope_theta", default: float = 10000.0) -> tuple[float, float]:
    """``(theta, partial_rotary_factor)`` of a config's default rotary embeddings, from
    ``rope_parameters`` (transformers 5) or ``rope_scaling`` / ``rope_theta`` (earlier); any
    ``rope_type`` but ``'default'`` (linear, dynamic, yarn, llama3, longrope...) is refused
    naming it, as is any field of those dicts this reading does not know.  The fraction may also
    sit at the config's top level (``partial_rotary_factor``, as configs saved before
    ``transformers`` 5 keep it)."""
    known = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
    factor = None
    for key in ("rope_parameters", "rope_scaling"):
        value = cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise CircuitError(f"{cfg.family}: config {key}={_shown(value)} is not supported")
        kind = value.get("rope_type", value.get("type", "default"))
        if kind != "default":
            raise CircuitError(f"{cfg.family}: config {key} has rope_type={kind!r}; only 'default' rotary "
                               "embeddings are supported")
        extra = sorted(set(value) - known)
        if extra:
            raise CircuitError(f"{cfg.family}: config {key}.{extra[0]}={_shown(value[extra[0]])} is not supported "
                               "(default rotary embeddings take rope_theta and partial_rotary_factor)")
        if value.get("partial_rotary_factor") is not None:
            factor = value["partial_rotary_factor"]
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and params.get("rope_theta") is not None:
        theta = positive_number(cfg.family, "rope_parameters.rope_theta", params["rope_theta"])
    else:
        theta = cfg.number(theta_key, default)
    if factor is None:  # a config.json from before transformers 5 keeps it at the top level
        factor = cfg.get("partial_rotary_factor", 1.0)
    factor = positive_number(cfg.family, "partial_rotary_factor", factor)
    if factor > 1:
        raise CircuitError(f"{cfg.family}: config partial_rotary_factor={factor} must be at most 1")
    return theta, factor


def positive_number(family: str, key: str, v) -> float:
    """``v`` (config ``key``) as a float, checked: a positive finite int or float."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 < v < float("inf"):
        raise CircuitError(f"{family}: config {key}={_shown(v)} must be a positive finite number")
    return float(v)


ACTIVATIONS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu_fast": None,
               "gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu", "tanh": "tanh",
               "sigmoid": "sigmoid"}


def activation(cfg: Config, key: str, default=REQUIRED) -> str:
    name = cfg(key, default)
    fn = ACTIVATIONS.get(name) if isinstance(name, str) else None
    if fn is None:
        supported = ", ".join(repr(k) for k, v in ACTIVATIONS.items() if v)
        raise CircuitError(f"{cfg.family}: config {key}={_shown(name)} is not a supported activation ({supported})")
    return fn


_LAYER_KEY = re.compile(r"^(?:h|layers)\.(\d+)\.")


def placeholder(name: str, shape, dtype="float32") -> Array:
    """A placeholder Array (no value) for weight ``name``: its hash is derived from the name and
    shape, so two builds from one config give the same circuit; ``circuits.bind`` or
    ``circuits.fill_random`` gives it a value."""
    digest = content_hash(np.frombuffer(f"placeholder|{name}|{list(shape)}|{dtype}".encode(), np.uint8))
    return Array.placeholder(tuple(int(s) for s in shape), digest, name=name, dtype=dtype)


class Weights:
    """The weights of one model by state-dict key, with the base prefix ``prefixes`` tried in
    order.  ``take(key, shape)`` returns the Array (named as the module docstring says), checking
    its shape; ``finish()`` raises if a weight was never taken (nothing is silently dropped).
    ``weights=None`` makes placeholders of the expected shapes."""

    def __init__(self, weights: Mapping | None, prefixes, family: str, *, ignored=(), dtype="float32"):
        self.family = family
        self.placeholders = weights is None
        self.dtype = dtype
        self.raw = {} if weights is None else dict(weights)
        self.prefix = ""
        if not self.placeholders:
            for p in prefixes:
                if any(k.startswith(p) for k in self.raw):
                    self.prefix = p
                    break
        self.ignored = tuple(re.compile(p) for p in ignored)
        self.used: set = set()
        self.nodes: dict = {}

    @staticmethod
    def short_name(key: str) -> str:
        return _LAYER_KEY.sub(lambda m: f"h{m.group(1)}.", key)

    # keys that sit outside the base model's prefix (GPT-NeoX checkpoints before transformers 5
    # call the unembedding 'embed_out')
    ROOT_KEYS = ("lm_head.", "embed_out.")

    def full_key(self, key: str) -> str:
        return key if key.startswith(self.ROOT_KEYS) else self.prefix + key

    def has(self, key: str) -> bool:
        return self.placeholders or self.full_key(key) in self.raw

    def take(self, key: str, shape) -> Circuit:
        shape = tuple(int(s) for s in shape)
        full = self.full_key(key)
        name = self.short_name(key)
        if full in self.nodes:
            return self.nodes[full]
        if self.placeholders:
            node = placeholder(name, shape, self.dtype)
        else:
            if full not in self.raw:
                raise CircuitError(f"{self.family}: weight {full!r} is missing (the config says it exists)")
            v = self.raw[full]
            if isinstance(v, Circuit):
                node = v if v.name == name else _renamed(v, name, full)
            else:
                arr = as_numpy(v, full)
                node = Array(arr, name=name)
            if node.shape != shape:
                raise ShapeError(
                    f"{self.family}: weight {full!r} has shape {list(node.shape)}; the config implies {list(shape)}"
                )
            self.used.add(full)
        self.nodes[full] = node
        return node

    def mark_used(self, key: str):
        self.used.add(self.full_key(key))

    def finish(self):
        if self.placeholders:
            return
        left = sorted(k for k in self.raw if k not in self.used and not any(p.search(k) for p in self.ignored))
        if left:
            shown = ", ".join(map(repr, left[:20])) + (f", ... ({len(left)} in all)" if len(left) > 20 else "")
            raise CircuitError(
                f"{self.family}: weights the config does not account for: {shown} (a variant this builder "
                "does not support? nothing is dropped silently)"
            )


def _renamed(node: Array, name: str, key: str) -> Circuit:
    if not isinstance(node, Array):
        raise CircuitError(f"weight {key!r} is a {node.type_name} node; give an array or an Array")
    return node.rename(name)  # a valued Array keeps its value (no copy), a placeholder stays one


def as_numpy(v, key: str) -> np.ndarray:
    """A numpy array from a numpy array or a torch tensor (bfloat16 widened to float32, which is
    exact)."""
    if isinstance(v, np.ndarray):
        return v
    if hasattr(v, "detach"):  # a torch tensor; torch is imported by whoever made it
        t = v.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.numpy()
    try:
        return np.asarray(v)
    except Exception as e:  # pragma: no cover - exotic inputs
        raise CircuitError(f"weight {key!r}: cannot read a {type(v).__name__} as an array ({e})") from None


def tokens_node(tokens, vocab: int) -> Circuit:
    """The tokens as an int64 Array named ``'tokens'``, or the given 1-d Symbol/node; values
    outside ``[0, vocab)`` are an error."""
    if isinstance(tokens, Circuit):
        if len(tokens.shape) != 1:
            raise CircuitError(f"tokens must be 1-d, got {tokens.line()}")
        return tokens
    arr = np.asarray(tokens)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.size == 0:
        raise CircuitError(f"tokens must be a non-empty 1-d int array, got dtype {arr.dtype} shape {list(arr.shape)}")
    if arr.min() < 0 or arr.max() >= vocab:
        raise CircuitError(f"tokens must lie in [0, {vocab}) (the vocabulary), got {int(arr.min())}..{int(arr.max())}")
    return Array(arr.astype(np.int64), name="tokens")


def tokens_symbol(length: int, name: str = "tokens") -> Symbol:
    """The tokens input of the HuggingFace-family builders as a Symbol (int64), to evaluate
    many sequences with ``C.compile`` or ``C.evaluate_batched``.

    >>> tokens_symbol(5).line()
    "'tokens' [5] Symbol int64"
    """
    return Symbol((length,), name=name, dtype="int64")


def embed(table: Circuit, toks: Circuit, name: str) -> Circuit:
    return GeneralFunction("gen_index_at_0_c", table, toks, name=name)


def loss_head(logits: Circuit, toks: Circuit, mask: Circuit | None = None) -> Circuit:
    """Per-token negative log-likelihood [positions - 1] of each next token: ``'loss'``
    (TransformerLens's convention: n tokens give n - 1 losses); with ``mask`` [positions - 1]
    each loss times its mask entry (a ragged batch's padding zeroed)."""
    if toks.shape[0] < 2:
        raise CircuitError("the loss needs at least 2 tokens")
    log_probs = GeneralFunction("log_softmax", Index(logits, (slice(None, -1),), name="logits.pred"),
                                name="log_probs")
    true = Index(toks, (slice(1, None),), name="true_tokens")
    ll = GeneralFunction("gen_index_at_0_batch_x_c", log_probs, true, name="ll")
    if mask is None:
        return Einsum.from_spec("a,->a", ll, Scalar(-1.0, name="nll.neg"), name="loss")
    return Einsum.from_spec("a,,a->a", ll, Scalar(-1.0, name="nll.neg"), mask, name="loss")


def stack_layers(resid: Circuit, layer_inputs, layer, *, modules: bool = False) -> Circuit:
    """The residual after each layer in turn: ``layer(resid, inputs, h)`` builds one block whose
    node names start with ``h``; ``layer_inputs``: per layer, its inputs by key (weights, a KV
    cache Symbol; the same keys and shapes each layer).  Plain, layer ``l`` is built with
    ``h = 'h{l}'``.  With ``modules=True`` the block is built once, ``h = 'h'``, over Symbols
    ``'h.resid'`` and ``'h.<key>'`` (rust_circuit's module library writes layers this way), and
    layer ``l`` is the Module ``'h{l}'`` applying it to the residual and that layer's inputs."""
    if not modules:
        for l, inputs in enumerate(layer_inputs):
            resid = layer(resid, inputs, f"h{l}")
        return resid
    spec = None
    for l, inputs in enumerate(layer_inputs):
        if spec is None:
            syms = {key: Symbol(node.shape, name=f"h.{key}", dtype=node.dtype) for key, node in inputs.items()}
            resid_sym = Symbol(resid.shape, name="h.resid", dtype=resid.dtype)
            spec = ModuleSpec(layer(resid_sym, syms, "h"),
                              [ModuleArgSpec(resid_sym)] + [ModuleArgSpec(sym) for sym in syms.values()])
        resid = Module(spec, resid, *inputs.values(), name=f"h{l}")
    return resid


def layout_for(layout, n: int, past_len: int, family: str, modules: bool = False):
    """The ``Layout`` a builder computes ``n`` tokens in: the one given, or a fixed one after
    ``past_len`` cached tokens."""
    from .sequence import Layout

    if layout is None:
        if isinstance(past_len, bool) or not isinstance(past_len, (int, np.integer)):
            raise CircuitError(f"{family}: past_len={past_len!r} must be an int")
        if past_len < 0:
            raise CircuitError(f"{family}: past_len={past_len} must be >= 0")
        return Layout.fixed(n, int(past_len))
    if not isinstance(layout, Layout):
        raise CircuitError(f"{family}: layout= must be a circuits.models.sequence.Layout, got {type(layout).__name__}")
    if past_len:
        raise CircuitError(f"{family}: give past_len= or layout=, not both")
    if layout.n != n:
        raise CircuitError(f"{family}: the layout is for {layout.n} tokens but {n} were given")
    if modules and layout.dynamic:
        raise CircuitError(f"{family}: modules=True builds fixed layouts only (a generation step is built plain)")
    return layout
