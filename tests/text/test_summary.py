"""C.summary: the grouped view, checked against the seed, a unique-named variant, generic circuits."""

import re
from pathlib import Path

import numpy as np
import pytest

import circuits as C
from circuits import Add, Array, Einsum, GeneralFunction, Scalar

from .test_html import dom

SEED = Path(__file__).resolve().parents[1] / "golden" / "attn_only_loss.txt"


@pytest.fixture(scope="module")
def seed():
    return C.parse(SEED.read_text())


def subtree(node, stop=None):
    out, stack = {}, [node]
    while stack:
        n = stack.pop()
        if n.hash in out or (stop is not None and n is stop):
            continue
        out[n.hash] = n
        stack.extend(n.children)
    return out


def dominated(root, head):
    """Oracle: the nodes every path from root to which passes through ``head``."""
    return {h: n for h, n in subtree(head).items() if h not in subtree(root, stop=head)}


def rename_head_internals(c):
    """The seed with each head's own nodes named in full: 'b1.a.head3.a.q' (the unique_names form)."""
    owner = {}
    for head in c.get(C.select.Regex(r"^b\d+\.a\.head\d+$")):
        for h, n in dominated(c, head).items():
            if n is not head and (n.name or "").startswith("a."):
                owner[h] = head.name
    new = {}
    for n in C.toposort(c):  # children first, one pass over the whole circuit
        m = n.with_children(tuple(new[k.hash] for k in n.children)) if n.children else n
        new[n.hash] = m.rename(f"{owner[n.hash]}.{n.name}") if n.hash in owner else m
    return new[c.hash]


def test_seed_layers_heads_and_head_contents(seed):
    s = C.summary(seed)
    assert (s.n_layers, s.heads_per_layer) == (2, 8)
    assert s.n_nodes == C.count_nodes(seed)
    floats = [n for n in seed.toposort() if isinstance(n, Array) and n.dtype.startswith("float")]
    assert s.params == sum(int(np.prod(n.shape)) for n in floats)
    text = str(s)
    for l in range(2):
        assert f"layer {l}" in text
        for h in range(8):
            head = seed.get_unique(f"b{l}.a.head{h}")
            g = s.group(f"b{l}.a.head{h}")
            assert g.node is head
            # The head's group holds exactly what only the head reaches, less the weights' named slices.
            own = [n for n in dominated(seed, head).values() if not (n.name or "").startswith(f"a{l}.w.")]
            assert g.n_nodes == len(own) == 11
            named = dict(g.named_locals())
            assert named["a.q"].shape == (300, 32) and named["a.attn_probs"].shape == (300, 300)
            assert re.search(rf"b{l}\.a\.head{h}  Einsum \[300,256\] .*a\.q \[300,32\], a\.k \[300,32\], a\.v \[300,32\]",
                             text)
        # Shared by the layer's heads: placed in the layer's attention group.
        assert [n for n, _ in s.group(f"b{l}.a").named_locals()] == ["a.qk_input"]
        assert s.group(f"a{l}.norm").node is seed.get_unique(f"a{l}.norm")
    # The weights' per-head slices collapse to one line per weight.
    assert "a0.w.q.head{0..7}  8 × Index [32,256]" in text
    # Lines come in the order the circuit computes them: embeddings, layer 0, layer 1, the loss.
    body = text.split("\n", 1)[1]
    order = [body.index(x) for x in ("idxed_embeds", "layer 0", "layer 1", "final.call", "t.loss")]
    assert order == sorted(order)


def test_unique_names_group_the_same(seed):
    renamed = rename_head_internals(seed)
    assert renamed.get_unique("b1.a.head3.a.q").shape == (300, 32)
    a, b = C.summary(seed), C.summary(renamed)
    assert (b.n_layers, b.heads_per_layer) == (2, 8)
    for l in range(2):
        for h in range(8):
            name = f"b{l}.a.head{h}"
            assert b.group(name).n_nodes == a.group(name).n_nodes
            assert b.group(f"{name}.a.q").node is renamed.get_unique(f"{name}.a.q")
            assert b.group(f"{name}.a.attn_probs").node.shape == (300, 300)
    assert str(b).count("a.q  Einsum [300,32]") == 16


def test_generic_name_prefix_grouping_and_unnamed_nodes():
    x = Array(np.ones((2, 3), np.float32), name="enc.w")
    y = Array(np.ones((3,), np.float32), name="dec.bias")
    h = GeneralFunction("tanh", Einsum.from_spec("ab->a", x), name="enc.out")
    z = Add(Einsum.from_spec("a,b->b", h, y), Scalar(1.0), name="dec.out")
    s = C.summary(z, layers=False)
    assert s.group("enc").n_nodes == 3  # enc.w, enc.out and the unnamed Einsum it alone reads
    assert s.group("enc").params == 6 and s.group("dec").params == 3
    assert s.group("dec.out").node is z
    assert s.n_layers == 0 and "layer" not in str(s)
    with pytest.raises(KeyError, match="enc"):
        s.group("nope")
    flat = C.summary(Add(Scalar(1.0), Scalar(2.0)))
    assert flat.n_nodes == 3 and flat.root.n_nodes == 3


def test_max_depth_limits_the_lines(seed):
    shallow = str(C.summary(seed, max_depth=1))
    assert "layer 0" in shallow and "b0.a.head0" not in shallow and "a0.norm" not in shallow
    assert "b0.a.head0" in str(C.summary(seed, max_depth=4))


def test_html_is_well_formed_and_collapsible(seed):
    page = C.summary(seed)._repr_html_()
    root = dom(page)
    details = [e for e in root.iter() if e.tag == "details"]
    assert details and any("open" in e.attrs for e in details) and any("open" not in e.attrs for e in details)
    text = root.all_text()
    assert "2 layers × 8 heads" in text and "b1.a.head7" in text
    assert "<script" not in page.lower()


@pytest.mark.usefixtures("low_recursion_limit")
def test_a_50000_deep_chain_summarises_without_recursion(deep_chain):
    s = C.summary(deep_chain, max_depth=3)
    assert s.n_nodes == C.count_nodes(deep_chain)
    lines = str(s).splitlines()
    assert len(lines) == 302 and "more groups" in lines[-1]  # header, 300 groups, the note
    assert s.n_layers == 0  # numbered names of a chain are not layers
