"""The builder makes the seed's circuit: printed, it equals the seed file but for array hashes."""

import re
from pathlib import Path

import numpy as np
import pytest

import circuits as C
from circuits.models import attn_only, random_weights

SEED = Path(__file__).resolve().parents[1] / "golden" / "attn_only_loss.txt"  # the seed file, byte for byte
HASH = re.compile(r"(Array) [0-9a-f]{24}$", re.M)


def _mask(text):
    return HASH.sub(r"\1 <hash>", text)


@pytest.fixture(scope="module")
def seed_text():
    if not SEED.exists():
        pytest.skip(f"seed file not found at {SEED}")
    return SEED.read_text()


def test_printed_model_equals_seed_except_hashes(seed_text):
    w = random_weights(0)
    toks = np.random.default_rng(0).integers(0, 50259, 302)
    text = attn_only(w, toks).to_text()
    assert _mask(text) == _mask(seed_text)
    assert len(HASH.findall(seed_text)) == 19  # every Array line was masked, nothing else


def test_model_structure_equals_parsed_seed(seed_text):
    """Same DAG as the parsed seed, up to Array identity: bind the seed's placeholders to the
    builder's arrays by name and the two circuits are the same node."""
    w = random_weights(1)
    toks = np.random.default_rng(1).integers(0, 50259, 302)
    built = attn_only(w, toks)
    values = {a.name: a.value for a in built.get(C.Array)}
    parsed = C.bind(C.parse(seed_text), values)
    assert parsed == built
    assert C.count_nodes(parsed) == C.count_nodes(built)
