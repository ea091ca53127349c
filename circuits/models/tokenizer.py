"""A model's tokenizer, read from its HuggingFace folder with the ``tokenizers`` package (an
optional dependency: ``pip install circuits[models]``; ``transformers`` is not needed).

``Tokenizer.from_folder(path)`` reads ``tokenizer.json`` (or a GPT-2-style ``vocab.json`` +
``merges.txt``) and the special tokens named in ``tokenizer_config.json`` /
``special_tokens_map.json`` (falling back to the ids in ``config.json`` and
``generation_config.json``).  Text is encoded without the tokenizer's own special-token template
and the BOS token is prepended by ``encode(..., prepend_bos=True)``, as TransformerLens's
``to_tokens`` does; decoding keeps special tokens and does no clean-up of spaces, so decoding the
tokens of a text gives the text back.

>>> from tokenizers import Tokenizer as Backend, models, pre_tokenizers, decoders, trainers
>>> backend = Backend(models.BPE())
>>> backend.pre_tokenizer, backend.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
>>> backend.train_from_iterator(['the cat sat on the mat'] * 10, trainers.BpeTrainer(
...     vocab_size=280, special_tokens=['<|endoftext|>'], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
>>> tok = Tokenizer(backend, bos_token='<|endoftext|>', eos_token='<|endoftext|>')
>>> ids = tok.encode('the cat')
>>> tok.str_tokens(ids), tok.decode(ids)
(['<|endoftext|>', 'the', ' cat'], '<|endoftext|>the cat')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import CircuitError

SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")
MAX_JSON_BYTES = 64 << 20


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_JSON_BYTES:
        raise CircuitError(f"{path}: over {MAX_JSON_BYTES} bytes, too big to be a tokenizer's settings")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CircuitError(f"{path}: not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _token_text(value) -> str | None:
    """A special token as the settings write it: a string, or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _backend():
    try:
        import tokenizers
    except ImportError:
        raise CircuitError("reading a tokenizer needs the tokenizers package (pip install 'circuits[models]')") from None
    return tokenizers


class Tokenizer:
    """Text to token ids and back (see the module docstring).  ``bos_token_id``,
    ``eos_token_id``, ``pad_token_id`` (None where the model has none), ``eos_token_ids`` (every id
    that ends generation), ``vocab_size`` (the largest id + 1)."""

    def __init__(self, backend, *, bos_token: str | None = None, eos_token: str | None = None,
                 pad_token: str | None = None, eos_token_ids: Sequence[int] = (), name: str = ""):
        self.backend = backend
        self.name = name
        self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
        self.bos_token_id = self._id(bos_token, "bos_token")
        self.eos_token_id = self._id(eos_token, "eos_token")
        self.pad_token_id = self._id(pad_token, "pad_token")
        ids = [i for i in [self.eos_token_id, *eos_token_ids] if i is not None]
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in ids))
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size = (max(vocab.values()) + 1) if vocab else 0

    def _id(self, token: str | None, what: str) -> int | None:
        if token is None:
            return None
        i = self.backend.token_to_id(token)
        if i is None:
            raise CircuitError(f"tokenizer {self.name or ''}: {what} {token!r} is not in its vocabulary")
        return int(i)

    @classmethod
    def from_folder(cls, folder, config: dict | None = None) -> "Tokenizer | None":
        """The tokenizer saved in a model folder, or None when it holds none."""
        folder = Path(folder)
        tokenizers = None
        if (folder / "tokenizer.json").is_file():
            tokenizers = _backend()
            try:
                backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as e:  # the Rust library raises its own Exception type for a bad file
                raise CircuitError(f"{folder / 'tokenizer.json'}: the tokenizers package cannot read it ({e})") from None
        elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            tokenizers = _backend()
            from tokenizers import decoders, models, pre_tokenizers

            try:
                backend = tokenizers.Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
            except Exception as e:  # as above
                raise CircuitError(f"{folder}: vocab.json and merges.txt do not make a BPE tokenizer ({e})") from None
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = decoders.ByteLevel()
        elif (folder / "tokenizer.model").is_file():
            raise CircuitError(f"{folder}: holds only a SentencePiece tokenizer.model; save the tokenizer with "
                               "transformers (tokenizer.save_pretrained writes tokenizer.json) to read it here")
        else:
            return None
        settings = {**_json(folder / "special_tokens_map.json"), **_json(folder / "tokenizer_config.json")}
        if backend.get_vocab_size(with_added_tokens=True) == 0:
            raise CircuitError(f"{folder}: the tokenizer has an empty vocabulary")
        names = {key: _token_text(settings.get(key)) for key in SPECIAL}
        config = config or {}
        generation = _json(folder / "generation_config.json")
        for key in ("bos_token", "eos_token", "pad_token"):
            if names[key] is None:  # the model's config may name the id alone
                i = generation.get(f"{key}_id", config.get(f"{key}_id"))
                i = i[0] if isinstance(i, list) and i else i
                if isinstance(i, int) and not isinstance(i, bool):
                    names[key] = backend.id_to_token(i)
        eos_ids = generation.get("eos_token_id", config.get("eos_token_id"))
        eos_ids = [eos_ids] if isinstance(eos_ids, int) else eos_ids if isinstance(eos_ids, list) else []
        return cls(backend, bos_token=names["bos_token"], eos_token=names["eos_token"], pad_token=names["pad_token"],
                   eos_token_ids=[i for i in eos_ids if isinstance(i, int) and not isinstance(i, bool)],
                   name=str(folder))

    # ------------------------------------------------------------------ text -> tokens
    def encode(self, text: str, *, prepend_bos: bool = True) -> np.ndarray:
        """The token ids of ``text`` (int64), the BOS token first when ``prepend_bos`` and the
        tokenizer has one."""
        if not isinstance(text, str):
            raise CircuitError(f"encode takes a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if prepend_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return np.asarray(ids, np.int64)

    def encode_batch(self, texts: Sequence[str], *, prepend_bos: bool = True) -> list[np.ndarray]:
        for t in texts:
            if not isinstance(t, str):
                raise CircuitError(f"encode_batch takes strs, got a {type(t).__name__}")
        rows = self.backend.encode_batch(list(texts), add_special_tokens=False)
        bos = [self.bos_token_id] if prepend_bos and self.bos_token_id is not None else []
        return [np.asarray(bos + r.ids, np.int64) for r in rows]

    # ------------------------------------------------------------------ tokens -> text
    def decode(self, ids) -> str:
        """The text of ``ids``, special tokens kept, spaces not cleaned up."""
        return self.backend.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=False)

    def str_tokens(self, ids) -> list[str]:
        """Each token decoded on its own (a piece of a multi-byte character decodes to U+FFFD, as
        in TransformerLens)."""
        return [self.backend.decode([int(i)], skip_special_tokens=False) for i in np.asarray(ids).reshape(-1)]

    def check_vocabulary(self, vocab_size: int, where: str = "") -> None:
        """Refuse a tokenizer whose ids reach past the model's embedding table."""
        if self.vocab_size > vocab_size:
            raise CircuitError(f"{where or self.name}: the tokenizer has ids up to {self.vocab_size - 1} but the model's "
                               f"vocabulary is vocab_size={vocab_size}; they do not belong together")

    def __repr__(self):
        return (f"<Tokenizer {self.vocab_size} ids, bos={self.bos_token!r}, eos={self.eos_token!r}"
                f"{', ' + self.name if self.name else ''}>")
