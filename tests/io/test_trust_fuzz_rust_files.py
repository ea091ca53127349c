"""Crafted circuit files holding rust_circuit's syntax (Module argument lines with ``!``, Scatter,
symbolic sizes, SetSymbolicShape, DiscreteVar): each loads as circuits or raises
``StoreError``/``ParseError``, never another exception (issue 21, "Done when")."""

import json
import os
import tempfile

import blake3
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from circuits import Array, Module, ModuleArgSpec, ModuleSpec, Scalar, Scatter, Symbol, parse, symbolic_size
from circuits.io.files import load_many, save_many
from tests.io.test_trust_fuzz_files import FUZZ, assemble, check
from tests.text.test_text_fuzz import RUST_EXAMPLES, RUST_PRINTED, mutated


def _rust_file() -> bytes:
    x = Symbol((symbolic_size(0),), name="x")
    w = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
    spec = ModuleSpec(x, [ModuleArgSpec(x)])
    m = Module(spec, Array(np.ones(3, np.float32), name="arg"), name="m")
    s = Scatter(w, (slice(1, 3), slice(0, 3)), (4, 3), name="sc")
    roots = [m, s, Scalar(1.0, (2,), name="one"), *[parse(t) for t in RUST_EXAMPLES]]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rust.circuit")
        save_many(roots, path, allow_placeholders=True)
        with open(path, "rb") as f:
            return f.read()


BASE = _rust_file()
N = int.from_bytes(BASE[:8], "little")
HEADER = json.loads(BASE[8 : 8 + N])
BODY = BASE[8 + N :]
TEXT_AT = HEADER["__circuit_text__"]["data_offsets"]


def test_the_rust_file_loads():
    fd, path = tempfile.mkstemp(suffix=".circuit")
    with os.fdopen(fd, "wb") as f:
        f.write(BASE)
    try:
        assert [r.name for r in load_many(path)][:3] == ["m", "sc", "one"]
    finally:
        os.unlink(path)


def _with_text(text: str) -> bytes:
    """The base file with its circuit text replaced (the checksum made to match)."""
    header = json.loads(json.dumps(HEADER))
    tensors_end = min(e["data_offsets"][0] for k, e in header.items() if k.startswith("__circuit_"))
    body = BODY[:tensors_end]
    placeholders = None
    if "__circuit_placeholders__" in header:
        a, b = header["__circuit_placeholders__"]["data_offsets"]
        placeholders = BODY[a:b]
    for key in ("__circuit_text__", "__circuit_placeholders__"):
        header.pop(key, None)
    encoded = text.encode("utf-8", "surrogatepass")
    header["__circuit_text__"] = {"dtype": "U8", "shape": [len(encoded)],
                                  "data_offsets": [len(body), len(body) + len(encoded)]}
    body += encoded
    if placeholders is not None:
        header["__circuit_placeholders__"] = {"dtype": "U8", "shape": [len(placeholders)],
                                              "data_offsets": [len(body), len(body) + len(placeholders)]}
        body += placeholders
    header["__metadata__"]["text_blake3"] = blake3.blake3(encoded).hexdigest()
    header["__metadata__"].pop("roots", None)
    return assemble(header, body)


BASE_TEXT = BODY[TEXT_AT[0]:TEXT_AT[1]].decode()


@FUZZ
@given(st.one_of(mutated(BASE_TEXT.split("\n")),
                 st.sampled_from(range(len(RUST_PRINTED))).flatmap(lambda i: mutated(RUST_PRINTED[i]))))
def test_mutated_rust_text_with_a_valid_checksum(text):
    check(_with_text(text))


@FUZZ
@given(st.data())
def test_damaged_characters_of_the_rust_text(data):
    text = list(BASE_TEXT)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text) - 1))
        text[i] = data.draw(st.sampled_from(list("!'[]0123s*,:~# \nft") + ["", "9223372036854775808"]))
    check(_with_text("".join(text)))
