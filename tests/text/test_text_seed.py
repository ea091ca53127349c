"""The golden circuit: the seed's attention-only transformer loss, parsed, printed, evaluated.

The oracle for the evaluation is a plain-numpy float64 reading of the seed text, written here by
hand from the seed's lines (layer norm as mean-subtract / variance / rsqrt, masked softmax
attention with the seed's ``(1 - mask) * -10000`` bias, log-softmax and a per-position gather).
"""

import re
from pathlib import Path

import numpy as np
import pytest

import circuits as C
from circuits.io.values import bind, fill_random, placeholders
from circuits.text import parse, parse_many, print_many, to_text

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SEED_TEXT = (GOLDEN / "attn_only_loss.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def seed():
    return parse(SEED_TEXT)


@pytest.fixture(scope="module")
def evaluated(seed):
    """The seed with random weights and a real causal mask, its loss and the weights used."""
    filled = fill_random(seed, seed=0)
    n = 300
    filled = bind(filled, {"t.a.c.causal_mask": np.tril(np.ones((n, n), np.float32))})
    weights = {a.name: np.asarray(a.value) for a in C.toposort(filled) if isinstance(a, C.Array)}
    return filled, C.evaluate(filled), weights


def test_seed_prints_back_byte_for_byte(seed):
    assert to_text(seed) == SEED_TEXT
    assert not SEED_TEXT.endswith("\n")


def test_seed_structure(seed):
    nodes = C.toposort(seed)
    # Every line is a definition (it has a node type) or a reference, so the distinct nodes are
    # the definition lines.
    types = re.compile(r"(^| )(Einsum|Add|Array|Scalar|Index|GeneralFunction)( |$)")
    definition_lines = [l for l in SEED_TEXT.split("\n") if types.search(l.strip())]
    assert len(nodes) == len(definition_lines) == 312
    assert seed.shape == (300,) and seed.name == "t.loss"
    toks = [n for n in nodes if n.name == "toks_int_var"]
    assert len(toks) == 1 and toks[0].dtype == "int64" and toks[0].shape == (302,)
    holes = placeholders(seed)
    assert len(holes) == SEED_TEXT.count(" Array ") == 19
    assert {h.dtype for h in holes if h.name != "toks_int_var"} == {"float32"}
    # Shared subtrees are shared objects, not copies.
    idxed = [n for n in nodes if n.name == "idxed_embeds"]
    assert len(idxed) == 1


def test_seed_other_options_parse_back(seed):
    for options in (dict(tree=True), dict(shapes=True, comments=True), dict(color=True),
                    dict(max_indent=5), dict(tree=True, max_indent=3, color=True, comments=True)):
        assert parse(to_text(seed, **options)) == seed, options
    assert parse(to_text(seed, names=False)) == C.strip_names(seed)


def test_seed_deep_printing_stays_small(seed):
    text = to_text(seed, max_indent=8)
    assert max(len(l) - len(l.lstrip(" ")) for l in text.split("\n")) <= 16
    assert text.count("\n~ ") >= 1
    assert parse(text) == seed


def test_seed_depth_limited_view(seed):
    text = str(seed)
    assert text == to_text(seed, depth=6)
    lines = text.split("\n")
    assert lines[0] == "'t.loss' Einsum a,->a"
    assert max(len(l) - len(l.lstrip(" ")) for l in lines) == 2 * 7
    assert any(l.strip() == "..." for l in lines)
    with pytest.raises(C.ParseError, match="depth=None"):
        parse(text)


def test_seed_golden_views(seed):
    # The tree view of the top of the seed, with shape/dtype comments (a golden file).
    want = (GOLDEN / "attn_only_loss_tree_depth4.txt").read_text(encoding="utf-8")
    assert to_text(seed, tree=True, comments=True, depth=4) == want


def test_seed_parse_many_shares_nodes(seed):
    ll = seed.children[0]
    text = print_many([ll, seed])
    a, b = parse_many(text)
    assert a == ll and b == seed and b.children[0] is a
    assert text.split("\n")[-3:] == ["'t.loss' Einsum a,->a", "  'll'", "  'nll.neg' [] Scalar -1"]


def _layer_norm(x, scale, bias, eps=1e-5):
    mean_subbed = x - x.mean(-1, keepdims=True)
    var = (mean_subbed ** 2).mean(-1, keepdims=True)
    return mean_subbed / np.sqrt(var + eps) * scale + bias


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _seed_loss(w):
    w = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in w.items()}
    toks = w["toks_int_var"]
    inp, target = toks[:-2], toks[1:-1]
    x = w["t.w.tok_embeds"][inp]
    pos = w["t.w.pos_embeds"][:300]
    mask = w["t.a.c.causal_mask"]
    for layer in (0, 1):
        norm = _layer_norm(x, w[f"a{layer}.ln.w.scale"], w[f"a{layer}.ln.w.bias"])
        qk = norm + pos
        out = 0.0
        for h in range(8):
            q = qk @ w[f"a{layer}.w.q"][h].T
            k = qk @ w[f"a{layer}.w.k"][h].T
            v = norm @ w[f"a{layer}.w.v"][h].T
            scores = (q @ k.T) / np.sqrt(32) * mask + (1 - mask) * -10000.0
            out = out + _softmax(scores) @ v @ w[f"a{layer}.w.o"][h].T
        x = out + x
    logits = _layer_norm(x, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -log_probs[np.arange(300), target]


def test_seed_loss_evaluates_like_numpy(evaluated):
    filled, loss, weights = evaluated
    assert loss.shape == (300,)
    assert np.isfinite(loss).all()
    toks = weights["toks_int_var"]
    assert toks.dtype == np.int64 and toks.min() >= 0 and toks.max() < 50259
    want = _seed_loss(weights)
    np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-4)
    # Random weights give near-uniform predictions: the loss sits near log(vocab).
    assert abs(float(loss.mean()) - np.log(50259)) < 1.0


def test_filled_seed_prints_with_its_new_hashes(evaluated):
    filled, _, weights = evaluated
    text = to_text(filled)
    # Same lines but the Array hashes, which now name the random values.
    old_lines, new_lines = SEED_TEXT.split("\n"), text.split("\n")
    assert len(old_lines) == len(new_lines)
    for old, new in zip(old_lines, new_lines):
        if " Array " in old:
            assert old.rsplit(" ", 1)[0] == new.rsplit(" ", 1)[0]
        else:
            assert old == new
    # The text parses back to placeholders that print the same; binding the values (by name)
    # gives the filled circuit itself.
    parsed = parse(text)
    assert to_text(parsed) == text and parsed != filled
    named = {a.name: a.value for a in filled.get(C.Array)}
    assert C.bind(parsed, named) == filled
