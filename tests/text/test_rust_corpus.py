"""rust_circuit's own circuit texts (``rust_corpus/texts.json``, extracted from its python tests,
demos and module library by ``rust_corpus/extract.py``; MIT licence, attribution in the file):
every text parses, prints and parses back to the same circuits, and where it evaluates (no Symbol,
no placeholder, no DiscreteVar) keeps its value under ``rewrites.simp`` and ``rewrites.optimize``.
Texts that need what rust's tests pass its parser get it here: reference circuits
(``REFERENCES``) and the index tensors its tensor cache holds (``TENSORS``).

``EXPECTED_FAILURES`` lists, with the reason, every text that does not parse; each is a strict
xfail, so a text that starts to parse fails until it is taken off the list:

- CUMULANT: Cumulant and StoredCumulantVar, which this library leaves out;
- RUST_REFUSES: texts rust_circuit's own tests expect its parser to refuse;
- PRINT_MODE: outputs of print modes rust itself cannot parse back (unquoted names, '...',
  repeated children, matcher reprs);
"""

import json
from pathlib import Path

import numpy as np
import pytest

import circuits as C
import rewrites
from circuits.text import parse_many, print_many
from circuits.traversal import toposort

CUMULANT = "cumulant nodes (left out)"
RUST_REFUSES = "rust_circuit's tests expect its parser to refuse this text"
PRINT_MODE = "output of a print mode rust_circuit cannot parse back"
# What rust's demos pass to its parser: on_repeat_check_info_same=False, so that '8 tok_embeds' (a
# repeat printed with bijection=False, the name unquoted) is node 8 whatever else it says.
PARSE_OPTIONS = {
    "basic_scope_manager:9": {"check_repeats": False},
    "push_down_index:24": {"check_repeats": False},
}

# What rust's tests pass to its parser as reference circuits (``reference_circuits=``), by text.
REFERENCES = {
    "test_rust_printing:528": lambda: {"asdfadsf": C.Scalar(1.0, (2, 1), name="asdfadsf_the_referred")},
    # module_library builds 'p.norm_call' (a layer norm over Symbol 'p.norm.input') before this
    # fragment, and passes it with 'b.input': stand-ins of the same kind here
    "module_library:601": lambda: [C.GeneralFunction("tanh", C.Symbol((5, 4), name="p.norm.input"), name="p.norm_call"),
                                   C.Symbol((5, 4), name="p.norm.input"), C.Symbol((5, 4), name="b.input")],
    "test_sample_transform:780": lambda: [C.Array(np.random.default_rng(0).integers(0, 800, (100,)),
                                                  name="int_vals")],
}

EXPECTED_FAILURES = {
    'printing_parsing:118': CUMULANT,
    'test_flags:7': CUMULANT,  # its DiscreteVars parse; 'cum_var' Cumulant does not
    'test_rust_get_update:1069': PRINT_MODE,  # a Matcher's repr: 'a_name' Scalar <hash prefix>
    'test_rust_printing:77': RUST_REFUSES,
    'test_rust_printing:98': CUMULANT,
    'test_rust_printing:108': CUMULANT,
    'test_rust_printing:420': RUST_REFUSES,
    'test_rust_printing:452': RUST_REFUSES,
    'test_rust_printing:468': RUST_REFUSES,  # '4 ! bye' under an Einsum: pytest.raises(UnexpectedChildInfo)
    'test_rust_printing:559': RUST_REFUSES,
    'test_rust_printing:560': RUST_REFUSES,
    'test_rust_printing:562': RUST_REFUSES,
    'test_rust_printing:564': RUST_REFUSES,
    'test_rust_printing:565': RUST_REFUSES,
    'test_rust_printing:566': RUST_REFUSES,
    'test_rust_printing:594': PRINT_MODE,  # 'Concat 0 ...': a traversal-limited print (end_depth=3)
    'test_rust_printing:617': PRINT_MODE,  # 'Concat 0 ...': a traversal-limited print (end_depth=3)
    'test_rust_printing:628': PRINT_MODE,  # 'yoyo  [2,3,3] Scalar 1': bijection=False prints names unquoted
    'test_rust_printing:655': PRINT_MODE,  # 'Scatter [0:2,0:1] ...': PrintOptions.repr_depth output
    'test_rust_printing:2116': CUMULANT,
    'test_rust_printing:2209': PRINT_MODE,  # number_leaves=True, bijection=False: repeats print children
    'test_rust_printing:2228': PRINT_MODE,  # number_leaves with end_depth=2: 'Add ...'
    'test_rust_printing:2328': RUST_REFUSES,  # a cycle: pytest.raises(ParseCircuitCycleError)
}

CORPUS = json.loads((Path(__file__).parent / "rust_corpus" / "texts.json").read_text())
TEXTS = {e["id"]: e for e in CORPUS["texts"]}


# Index tensors rust's texts name by rust's hash (``t<hash> [n]``), as rust's tensor cache holds
# them: test_print_tensor_index's tensor is written in the test; test_simplify_sampled's 100
# indices below 12 are its sampler's draws, which the text does not hold (seeded stand-ins).
TENSORS = {
    "test_rust_printing:444": {"292d9fdb22": np.array([1, 2, 3, 3, 2, 1])},
    "test_sample_transform:649": {"df3c928b0b": np.random.default_rng(11).integers(0, 12, 100)},
}


class _Store:
    """The valued Arrays of the parsed circuits, by content hash (what a tensor store does),
    and ``tensors`` by their hashes."""

    def __init__(self, roots=(), tensors=None):
        self.values = dict(tensors or {})
        for node in toposort(*roots):
            if node.type_name == "Array" and node.value is not None:
                self.values[node.content_hash] = node.value

    def find(self, prefix):
        found = [h for h in self.values if h.startswith(prefix)]
        return found[0] if len(found) == 1 else None

    def get(self, full):
        return np.asarray(self.values[full])


def _evaluates(root):
    """No Symbol, no placeholder, no DiscreteVar (no single value: it evaluates through
    ``circuits.expand.sample``), and small enough (some texts hold [1000000000] Scalars)."""
    return all(not (n.type_name in ("Symbol", "DiscreteVar") or (n.type_name == "Array" and n.value is None))
               and int(np.prod(n.shape)) <= 1 << 20 for n in toposort(root))


def _params():
    for key in TEXTS:
        reason = EXPECTED_FAILURES.get(key)
        marks = [pytest.mark.xfail(strict=True, raises=C.errors.CircuitError, reason=reason)] if reason else []
        yield pytest.param(key, marks=marks, id=key)


def test_corpus_is_complete():
    assert len(TEXTS) == len(CORPUS["texts"]) >= 200
    assert set(EXPECTED_FAILURES) <= set(TEXTS)
    assert "MIT" in CORPUS["licence"] and CORPUS["origin"].endswith("rust_circuit_public")


@pytest.mark.parametrize("key", list(_params()))
def test_rust_text(key):
    references = REFERENCES[key]() if key in REFERENCES else None
    roots = parse_many(TEXTS[key]["text"], references=references, store=_Store(tensors=TENSORS.get(key)),
                       **PARSE_OPTIONS.get(key, {}))
    again = parse_many(print_many(roots), store=_Store(roots))
    assert again == roots
    root = roots[-1]
    if _evaluates(root):
        want = np.asarray(C.evaluate(root, dtype="float64"))
        for rewrite in (rewrites.simp, rewrites.optimize):
            got = np.asarray(C.evaluate(rewrite(root), dtype="float64"))
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, equal_nan=True)
