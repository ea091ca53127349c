"""``from_huggingface(model, tokens)``: the logits circuit of a ``transformers`` causal LM (every
family ``circuits.models.load`` builds: ``model.FAMILIES``) from its config and weights, or from a
checkpoint directory on disk (``config.json`` + ``*.safetensors`` as ``save_pretrained`` writes
them, read once each by ``circuits.models.checkpoint``: torch is not imported).  Nothing is
downloaded.  ``circuits.models.load`` gives the same model with its tokenizer, as a ``Model``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import CircuitError
from ..nodes import Circuit
from .checkpoint import read_weights, regular_file
from .common import as_numpy
from .model import FAMILIES

BUILDERS = {kind: family.builder for kind, family in FAMILIES.items()}  # one home: model.FAMILIES


def load_checkpoint(path) -> tuple[dict, dict]:
    """``(config, weights)`` from a directory holding ``config.json`` and ``*.safetensors`` (one
    file or shards), as read-only numpy arrays, each read once (``circuits.models.checkpoint``);
    torch is not needed.

    >>> load_checkpoint('/nonexistent')
    Traceback (most recent call last):
    ...
    circuits.errors.CircuitError: /nonexistent: no config.json there (a checkpoint directory as save_pretrained writes it)
    """
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CircuitError(f"{path}: no config.json there (a checkpoint directory as save_pretrained writes it)")
    return read_config(cfg_file), read_weights(path)


MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few kB; a bigger one is not a config
_regular_file = regular_file


def read_config(path) -> dict:
    """The dict in a ``config.json``: UTF-8 JSON holding an object, at most ``MAX_CONFIG_BYTES``;
    anything else (bad JSON, bad bytes, nesting too deep to read) is a ``CircuitError``.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), 'config.json')
    >>> _ = open(p, 'w').write('["gpt2"]')
    >>> read_config(p)
    Traceback (most recent call last):
    circuits.errors.CircuitError: ...config.json: holds a JSON list, not an object {key: value}
    """
    path = Path(path)
    _regular_file(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise CircuitError(f"{path}: cannot read it ({e.strerror or e})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise CircuitError(f"{path}: over {MAX_CONFIG_BYTES} bytes, too big for a config.json")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CircuitError(f"{path}: not UTF-8 text (byte {e.start}); a config.json is UTF-8 JSON") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise CircuitError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise CircuitError(f"{path}: JSON nested too deeply to read; a config.json is a flat object") from None
    if not isinstance(config, dict):
        raise CircuitError(f"{path}: holds a JSON {type(config).__name__}, not an object {{key: value}}")
    return config


def from_huggingface(model, tokens, *, loss: bool = False, split_heads: bool = False, **options) -> Circuit:
    """The logits ``'logits'`` [len(tokens), vocab] of a ``transformers`` causal LM: ``model`` is
    the model object (its ``config`` and ``state_dict()`` are read) or the path of a checkpoint
    directory (``config.json`` + ``*.safetensors``), or a config dict alone (placeholder weights).
    ``config.model_type`` picks the builder
    (``gpt2``, ``opt``, ``llama``, ``mistral``, ``qwen2``, ``gemma2``, ``gpt_neox``, ``gemma``, ``qwen3``,
    ``phi3``, ``mixtral``, ``stablelm``, ``gptj``, ``gpt_neo``, ``falcon``, ``bloom``); ``loss``, ``split_heads`` and any other option
    of that builder (``modules=True`` for ``gpt2``, ``llama``, ``mistral``) are passed on.
    ``tokens`` may be a 1-d int Symbol (``circuits.models.tokens_symbol(n)``).

    >>> from_huggingface({'model_type': 'bert'}, [1])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    circuits.errors.CircuitError: config model_type='bert' has no builder (supported: 'gpt2', 'opt', ..., 'bloom'); circuits.importers.from_torch(model, example_inputs) may import it through torch.export
    """
    if isinstance(model, (str, os.PathLike)):
        config, weights = load_checkpoint(model)
    elif isinstance(model, dict):  # a config alone: placeholder weights
        config, weights = model, None
    else:
        if not hasattr(model, "config") or not hasattr(model, "state_dict"):
            raise CircuitError(f"from_huggingface needs a transformers model or a checkpoint path, got "
                               f"{type(model).__name__}")
        config = model.config.to_dict()
        weights = {k: as_numpy(v, k) for k, v in model.state_dict().items()}
    kind = config.get("model_type")
    builder = BUILDERS.get(kind) if isinstance(kind, str) else None
    if builder is None:
        raise CircuitError(f"config model_type={kind!r:.80} has no builder (supported: "
                           f"{', '.join(map(repr, BUILDERS))}); circuits.importers.from_torch(model, example_inputs) "
                           "may import it through torch.export")
    return builder(config, weights, tokens, loss=loss, split_heads=split_heads, **options)
