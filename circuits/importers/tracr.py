"""``from_tracr(model, inputs)``: a program compiled by tracr (RASP -> transformer weights) as a circuit.

tracr (``pip install tracr-pypi``; an optional extra, imported only when called) compiles a RASP
program into an ``AssembledTransformerModel``: haiku parameters for a plain transformer with no
LayerNorm, ReLU MLPs, one-hot token and position embeddings, and an unembedding that projects
the residual stream onto the program's output space.  The circuit built here computes exactly
what tracr's forward pass computes, in the node layout that interventions and
``circuits.interp.edges`` expect:

- ``'tokens'`` (the encoded inputs: an int64 Array, or a 1-d int Symbol the caller gives) ->
  ``'tok_embeds'`` + ``'pos_embeds'`` = ``'embeds'``, the residual stream's start;
- layer ``l``'s attention: one subcircuit per head, ``'b{l}.a.head{h}'``, whose queries, keys
  and values are ``'b{l}.a.head{h}.a.q'`` / ``'.a.k'`` / ``'.a.v'`` (products of the residual
  stream itself, ``circuits.models.blocks.attention_head``), summed into ``'b{l}.a'``; the
  residual after it is ``'b{l}.mid'``;
- layer ``l``'s MLP: ``'h{l}.mlp'`` (``'h{l}.mlp.fc'``, ``'h{l}.mlp.act'``: ``circuits.models
  .blocks.mlp``); the residual after it is ``'b{l}'``;
- ``'logits'`` [positions, outputs]: the final residual stream projected onto the output space
  (tracr's ``unembed`` before its argmax; one column for a numerical program).

Every layer and head tracr's parameters hold is kept, the empty ones too (tracr fills a layer it
does not need with zero weights), so the edges are those auto-circuit and the ACDC repository
see.  ``tracr_decode(model, value)`` turns the logits into what ``model.apply(inputs).decoded``
gives.

Example (compiling with tracr takes seconds, so instead of a doctest it runs as
``test_module_example`` in ``tests/importers/test_tracr.py``)::

    from tracr.compiler import compiling, lib
    from tracr.rasp import rasp
    program = lib.make_frac_prevs(rasp.tokens == "a")
    model = compiling.compile_rasp_to_model(program, {"a", "b"}, 4, compiler_bos="BOS")
    logits = circuits.evaluate(from_tracr(model, ["BOS", "a", "b", "a"]))  # [4, 1]: numerical
    tracr_decode(model, logits)  # ['BOS', 1.0, 0.5, 0.666...], as model.apply(...).decoded
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from ..errors import CircuitError
from ..models.blocks import ALL, attention_head, causal_mask, mlp, neg_inf_bias
from ..models.common import embed
from ..nodes import Add, Array, Circuit, Einsum, Index

_ATTN_PARTS = ("query", "key", "value", "linear")
_MLP_PARTS = ("linear_1", "linear_2")


def _require_tracr():
    try:
        import haiku  # noqa: F401
        import tracr  # noqa: F401
    except ImportError as e:  # pragma: no cover - the test extra installs both
        raise CircuitError(
            "from_tracr needs tracr and haiku: pip install 'circuits[tracr]' "
            "(tracr-pypi==1.0.0, dm-haiku==0.0.17)") from e


def _model_parts(model):
    """(params as float32 numpy arrays by haiku module and name, model config), checked."""
    missing = [a for a in ("params", "model_config", "input_encoder", "get_compiled_model") if not hasattr(model, a)]
    if missing:
        raise CircuitError(
            f"from_tracr: expected a tracr AssembledTransformerModel (compiling.compile_rasp_to_model), got "
            f"{type(model).__name__} without {', '.join(missing)}")
    raw = model.params
    if not isinstance(raw, Mapping):
        raise CircuitError(
            f"from_tracr: model.params must be haiku's parameters, a dict {{module name: {{name: array}}}}, got a "
            f"{type(raw).__name__}; give the model compile_rasp_to_model returned")
    params = {}
    for mod, vals in raw.items():
        if not isinstance(mod, str) or not isinstance(vals, Mapping):
            raise CircuitError(
                f"from_tracr: model.params[{_brief(mod)}] must be a dict {{name: array}} of one haiku module, got a "
                f"{type(vals).__name__}")
        params[mod] = {k: _float_array(v, f"model.params[{_brief(mod)}][{_brief(k)}]") for k, v in vals.items()}
    return params, model.model_config


def _brief(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _float_array(value, what: str) -> np.ndarray:
    """``value`` as a float32 array; a string, an object or a ragged list is an error naming it."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise CircuitError(f"from_tracr: {what} is not an array ({e})") from None
    if arr.dtype.kind not in "fiub":
        raise CircuitError(f"from_tracr: {what} holds {arr.dtype} values ({_brief(value)}), not numbers; give "
                           "the parameters tracr assembled")
    return arr.astype(np.float32)


# tracr's TransformerConfig fields that the circuit reads: sizes (ints >= 1) and flags (bools).
_CONFIG_SIZES = ("num_layers", "num_heads", "key_size", "mlp_hidden_size")
_CONFIG_FLAGS = ("causal", "layer_norm")


def _check_config(cfg):
    import jax

    missing = [a for a in _CONFIG_SIZES + ("causal", "activation_function") if not hasattr(cfg, a)]
    if missing:
        raise CircuitError(
            f"from_tracr: model.model_config must be tracr's TransformerConfig, got {_brief(cfg)} (without "
            f"{', '.join(missing)}); give the model compile_rasp_to_model returned")
    for flag in _CONFIG_FLAGS:
        value = getattr(cfg, flag, False)
        if not isinstance(value, (bool, np.bool_)):
            raise CircuitError(f"from_tracr: model_config.{flag}={_brief(value)} must be True or False")
    for size in _CONFIG_SIZES:
        value = getattr(cfg, size)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
            raise CircuitError(f"from_tracr: model_config.{size}={_brief(value)} must be an int >= 1")
    if cfg.layer_norm:
        raise CircuitError("from_tracr: model_config.layer_norm=True is not supported (tracr compiles without "
                           "LayerNorm; a model with it was not assembled by tracr's compiler)")
    if cfg.activation_function is not jax.nn.relu:
        raise CircuitError(f"from_tracr: model_config.activation_function={cfg.activation_function!r} is not "
                           "supported; tracr's compiler uses jax.nn.relu")


def _layer_param(params, name: str, key: str, shape) -> np.ndarray:
    if name not in params or key not in params[name]:
        raise CircuitError(f"from_tracr: the model's params have no {name!r}[{key!r}]")
    v = params[name][key]
    if tuple(v.shape) != tuple(shape):
        raise CircuitError(f"from_tracr: params {name!r}[{key!r}] has shape {list(v.shape)}, expected {list(shape)}")
    return v


_LAYER_PARAM = re.compile(r"transformer/layer_(0|[1-9][0-9]*)/(?:attn/(?:query|key|value|linear)|mlp/linear_[12])")


def _check_known_params(params, n_layers: int):
    """Every parameter is one tracr assembles, and the layers they hold are the config's
    ``num_layers`` (read from the parameters, so a config claiming 10**9 layers is refused at
    once, not after building names for them)."""
    layers, extra = set(), []
    for key in params:
        if key in ("token_embed", "pos_embed"):
            continue
        m = _LAYER_PARAM.fullmatch(key)
        if m is None:
            extra.append(key)
        else:
            layers.add(int(m.group(1)))
    if extra:
        raise CircuitError(f"from_tracr: unsupported parameters {', '.join(map(repr, sorted(extra)))} (a tracr model "
                           "has only token/position embeddings and per-layer attention and MLP weights)")
    if len(layers) != n_layers or (layers and max(layers) != n_layers - 1):  # (never a set of range(n_layers))
        held = sorted(layers)
        shown = ", ".join(f"layer_{l}" for l in held[:6]) + (", ..." if len(held) > 6 else "")
        raise CircuitError(
            f"from_tracr: model_config.num_layers={n_layers}, but the params hold {len(held)} layer(s)"
            f"{f' ({shown})' if held else ''}; give the config and params of one compiled model")


def _unembedding(model, d_model: int) -> tuple[np.ndarray, bool]:
    """tracr's projection of the residual stream onto the output space, [outputs, d_model], read by
    running the model's own unembedding module on the identity; and whether it takes an argmax
    (a categorical program)."""
    import haiku as hk

    found = {}

    def project(x):
        compiled = model.get_compiled_model()
        found["categorical"] = bool(compiled.use_unembed_argmax)
        return compiled.unembed(x, use_unembed_argmax=False)

    out = np.asarray(hk.without_apply_rng(hk.transform(project)).apply(model.params, np.eye(d_model, dtype=np.float32)),
                     dtype=np.float32)
    if out.ndim == 1:  # tracr squeezes a single output dimension (numerical programs)
        out = out[:, None]
    return np.ascontiguousarray(out.T), found["categorical"]


def tracr_tokens(model, inputs) -> np.ndarray:
    """``inputs`` as tracr takes them (``["BOS", 1, 2, 3]``) encoded into the model's token ids
    (int64), as ``model.apply`` encodes them; a batch of such inputs (a list of lists, each
    starting with BOS, all of one length) gives ``[batch, positions]``, to bind to a tokens
    Symbol.  A bad input is a ``CircuitError`` (naming the row of a batch)."""
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__len__"):
        raise CircuitError(f"tracr inputs must be a list like ['BOS', 1, 2, 3], got {inputs!r}")
    inputs = list(inputs)
    if inputs and all(hasattr(row, "__len__") and not isinstance(row, (str, bytes)) for row in inputs):
        rows = []
        for i, row in enumerate(inputs):
            try:
                rows.append(tracr_tokens(model, row))
            except CircuitError as e:
                raise CircuitError(f"tracr inputs, row {i} of the batch: {e}") from None
        lengths = sorted({len(r) for r in rows})
        if len(lengths) > 1:
            raise CircuitError(f"tracr inputs: the rows of a batch must have one length (one circuit's positions), "
                               f"got lengths {lengths}; pad them or group them by length")
        return np.stack(rows)
    if not inputs:
        raise CircuitError("tracr inputs are empty: give at least the BOS token, e.g. ['BOS', 1, 2]")
    encoder = model.input_encoder
    if encoder is None:  # tracr then feeds the inputs to the model as token ids
        bad = [x for x in inputs if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer))
               or not -(1 << 63) <= x < 1 << 63]
        if bad:
            raise CircuitError(
                f"tracr inputs {_brief(inputs)}: the model has no input_encoder, so inputs are token ids "
                f"(ints), not {_brief(bad[0])}; encode them, or give the model its input encoder")
        return np.asarray(inputs, dtype=np.int64)
    try:
        ids = encoder.encode(inputs)
    except (ValueError, TypeError) as e:
        raise CircuitError(f"tracr inputs {inputs!r} do not encode: {' '.join(map(str, e.args))}") from e
    return np.asarray(ids, dtype=np.int64)


def _tokens_node(model, inputs, vocab: int, max_len: int) -> Circuit:
    if isinstance(inputs, Circuit):
        if len(inputs.shape) != 1:
            raise CircuitError(f"from_tracr: a tokens node must be 1-d (encoded token ids), got {inputs.line()}")
        if not str(inputs.dtype).startswith(("int", "uint")):
            raise CircuitError(f"from_tracr: a tokens node must hold int token ids, got {inputs.line()} ({inputs.dtype})")
        toks = inputs
    else:
        ids = tracr_tokens(model, inputs)
        if ids.ndim != 1:
            raise CircuitError(f"from_tracr: {len(ids)} inputs given: a circuit is built for one input; for a batch build it "
                               "over a tokens Symbol (Symbol((n,), name='tokens', dtype='int64')) and bind "
                               "tracr_tokens(model, batch) to it")
        if ids.min() < 0 or ids.max() >= vocab:
            raise CircuitError(f"from_tracr: token ids must lie in [0, {vocab}), got {ids.tolist()}")
        toks = Array(ids, name="tokens")
    n = toks.shape[0]
    if not isinstance(n, int) or not 1 <= n <= max_len:
        raise CircuitError(f"from_tracr: {n} positions but the model takes 1 to {max_len} (its max_seq_len + BOS)")
    return toks


def from_tracr(model, inputs) -> Circuit:
    """The circuit of a tracr-compiled program on ``inputs``: its value is the output-space
    logits ``'logits'`` [positions, outputs] that tracr's unembedding computes (before the argmax
    of a categorical program; one column for a numerical one), see ``tracr_decode``.

    ``model``: a tracr ``AssembledTransformerModel``; ``inputs``: the inputs as tracr takes them
    (``["BOS", 1, 2, 3]``), or the encoded token ids as a 1-d int node (e.g. a Symbol named
    ``'tokens'``, to evaluate many inputs with one compiled program).  The node layout (module
    docstring) names each head ``'b{l}.a.head{h}'`` and each MLP ``'h{l}.mlp'``.

    Unsupported (each a ``CircuitError`` naming it): LayerNorm, an activation other than ReLU,
    nonzero attention biases, parameters other than tracr's, a config whose sizes are not ints
    >= 1, whose flags are not bools or whose ``num_layers`` is not the params' layer count, inputs
    that do not encode.  A causal
    model (``compile_rasp_to_model(..., causal=True)``) is supported.
    """
    _require_tracr()
    params, cfg = _model_parts(model)
    _check_config(cfg)
    n_layers, n_heads, key_size, hidden = (int(getattr(cfg, size)) for size in _CONFIG_SIZES)
    _check_known_params(params, n_layers)
    tok_table = params.get("token_embed", {}).get("embeddings")
    if tok_table is None or tok_table.ndim != 2:
        raise CircuitError("from_tracr: params 'token_embed' must hold embeddings [vocab, d_model]")
    vocab, d = tok_table.shape
    pos_table = params.get("pos_embed", {}).get("embeddings")
    if pos_table is None or pos_table.ndim != 2 or pos_table.shape[1] != d:
        raise CircuitError(f"from_tracr: params 'pos_embed' must hold embeddings [positions, {d}]")
    toks = _tokens_node(model, inputs, vocab, pos_table.shape[0])
    n = toks.shape[0]

    tok = embed(Array(tok_table, name="w.tok_embeds"), toks, "tok_embeds")
    pos = Index(Array(pos_table, name="w.pos_embeds"), (slice(0, n), ALL), name="pos_embeds")
    resid = Add(tok, pos, name="embeds")
    mask = Array(causal_mask(n) if cfg.causal else np.ones((n, n), np.float32), name="attn_mask")
    bias = neg_inf_bias(mask)
    width = n_heads * key_size
    for l in range(n_layers):
        p = f"transformer/layer_{l}/attn/"
        w = {}
        for part, key, shape in (("query", "q", (d, width)), ("key", "k", (d, width)), ("value", "v", (d, width)),
                                 ("linear", "o", (width, d))):
            w[key] = _layer_param(params, p + part, "w", shape)
            b = _layer_param(params, p + part, "b", shape[1:])
            if np.any(b):
                raise CircuitError(f"from_tracr: nonzero bias {p + part!r}['b'] is not supported (tracr's "
                                   "compiler assembles zero biases)")
        # haiku stores [d, (heads c)] and [(heads c), d]; a head's block wants [c, d] and [d, c].
        stacked = {k: Array(np.ascontiguousarray(w[k].reshape(d, n_heads, key_size).transpose(1, 2, 0)),
                            name=f"b{l}.a.w.{k}") for k in "qkv"}
        stacked["o"] = Array(np.ascontiguousarray(w["o"].reshape(n_heads, key_size, d).transpose(0, 2, 1)),
                             name=f"b{l}.a.w.o")
        heads = []
        for h in range(n_heads):
            name = f"b{l}.a.head{h}"
            wq, wk, wv, wo = (Index(stacked[k], (h, ALL, ALL), name=f"{name}.w_{k}") for k in "qkvo")
            heads.append(attention_head(resid, resid, wq, wk, wv, wo, mask, bias, name=name, prefix=name + "."))
        resid = Add(Add(*heads, name=f"b{l}.a"), resid, name=f"b{l}.mid")

        p = f"transformer/layer_{l}/mlp/"
        w_in = _layer_param(params, p + "linear_1", "w", (d, hidden))
        b_in = _layer_param(params, p + "linear_1", "b", (hidden,))
        w_out = _layer_param(params, p + "linear_2", "w", (hidden, d))
        b_out = _layer_param(params, p + "linear_2", "b", (d,))
        m = f"h{l}.mlp"
        out = mlp(resid, Array(w_in, name=f"{m}.w_in"), Array(b_in, name=f"{m}.b_in") if np.any(b_in) else None,
                  Array(w_out, name=f"{m}.w_out"), Array(b_out, name=f"{m}.b_out") if np.any(b_out) else None,
                  "relu", m, w_in_out=True)
        resid = Add(out, resid, name=f"b{l}")
    unembed, _ = _unembedding(model, d)
    return Einsum.from_spec("sd,vd->sv", resid, Array(unembed, name="w.unembed"), name="logits")


def tracr_decode(model, value) -> list:
    """What ``model.apply(inputs).decoded`` gives, from the value of ``from_tracr(model, inputs)``
    ([positions, outputs]; a batch [..., positions, outputs] gives nested lists): a categorical
    program's argmax decoded by the model's output encoder, a numerical program's values as
    floats; the first position is the BOS token, as tracr reports it."""
    _require_tracr()
    arr = np.asarray(value)
    if arr.ndim < 2:
        raise CircuitError(f"tracr_decode: expected the logits [positions, outputs], got shape {list(arr.shape)}")
    if arr.ndim > 2:
        return [tracr_decode(model, a) for a in arr]
    params, _ = _model_parts(model)
    d = params["token_embed"]["embeddings"].shape[1]
    unembed, categorical = _unembedding(model, d)
    if arr.shape[1] != unembed.shape[0]:
        raise CircuitError(f"tracr_decode: the model has {unembed.shape[0]} outputs but the value has shape "
                           f"{list(arr.shape)}")
    if categorical:
        ids = [int(i) for i in np.argmax(arr, axis=-1)]
        decoded = model.output_encoder.decode(ids) if model.output_encoder is not None else ids
    else:
        decoded = [float(v) for v in arr[:, 0].astype(np.float32)]
        if model.output_encoder is not None:
            decoded = model.output_encoder.decode(decoded)
    bos = getattr(model.input_encoder, "bos_token", None) if model.input_encoder is not None else None
    if bos:
        decoded = [bos] + list(decoded[1:])
    return list(decoded)
