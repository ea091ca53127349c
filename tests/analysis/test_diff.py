"""circuits.diff: changed, added and removed nodes with their paths; save_many / load_many exported."""

import numpy as np

import circuits as C
from circuits.models import attn_only, random_weights


def _seed_like():
    w = random_weights(seed=0, vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    return attn_only(w, np.array([1, 2, 3, 4, 5, 6, 7]))


def test_one_node_change_is_one_entry_with_its_path():
    loss = _seed_like()
    changed = loss.update("a1.w.q", lambda n: C.Array(np.zeros(n.shape, np.float32), name="a1.w.q"))
    d = C.diff(loss, changed)
    assert len(d) == 1
    (entry,) = d
    assert entry.kind == "changed"
    assert entry.path[0] == "t.loss" and entry.path[-1] == "a1.w.q"
    assert entry.old is loss.get_unique("a1.w.q") and entry.new is changed.get_unique("a1.w.q")
    # the path is a real root-to-node path of the new circuit
    node = changed
    for label in entry.path[1:]:
        node = next(c for c in node.children if c.name == label)
    assert node is entry.new
    # a text diff of the same change touches many lines; the diff prints a handful
    text = str(d)
    assert len(text.splitlines()) == 4 and "a1.w.q" in text
    assert "<table" in d._repr_html_() and "a1.w.q" in d._repr_html_()


def test_identical_circuits_give_an_empty_diff():
    loss = _seed_like()
    assert len(C.diff(loss, loss)) == 0 and not C.diff(loss, loss)
    assert str(C.diff(loss, loss)) == "no differences"
    assert "no differences" in C.diff(loss, loss)._repr_html_()
    again = C.parse(loss.to_text())  # placeholders differ from valued Arrays: every Array is reported
    assert {e.kind for e in C.diff(loss, again)} == {"changed"}


def test_added_removed_and_renamed_children():
    x, y, z = (C.Symbol((2,), name=n) for n in "xyz")
    a = C.Add(C.Add(x, y, name="inner"), z, name="top")
    b = C.Add(C.Add(x, name="inner"), z, C.Einsum.from_spec("a->a", y, name="new"), name="top")
    kinds = sorted((e.kind, e.path) for e in C.diff(a, b))
    assert kinds == [("added", ("top", "new")), ("removed", ("top", "inner", "y"))]
    renamed = C.Add(C.Add(x, y, name="inner2"), z, name="top")
    (entry,) = C.diff(a, renamed)
    assert (entry.kind, entry.path, entry.old.name, entry.new.name) == ("changed", ("top", "inner2"), "inner",
                                                                         "inner2")


def test_unnamed_nodes_get_positional_labels_and_shared_changes_are_reported_once():
    x = C.Symbol((2,), name="x")
    shared = C.Einsum.from_spec("a->a", x)
    a = C.Add(shared, C.Add(shared, x), name="r")
    b = a.update(lambda n: n is shared or n == shared, lambda n: C.Einsum.from_spec("a,->a", x, C.Scalar(2.0)))
    entries = [(e.kind, e.path) for e in C.diff(a, b)]
    assert entries == [("changed", ("r", "<Einsum #0>")), ("added", ("r", "<Einsum #0>", "<Scalar #1>"))]


def test_deep_chain():
    x = C.Symbol((2,), name="x")
    node = x
    for _ in range(50_000):
        node = C.Einsum.from_spec("a->a", node)
    other = C.replace(node, {x: C.Symbol((2,), name="y")})
    (entry,) = C.diff(node, other)
    assert len(entry.path) == 50_001 and entry.new.name == "y"


def test_save_many_and_load_many_are_exported(tmp_path):
    loss = _seed_like()
    logits = loss.get_unique("t.call")
    C.save_many([loss, logits], tmp_path / "two.circuit")
    back = C.load_many(tmp_path / "two.circuit")
    assert back == [loss, logits]


def _path_patched():
    w = random_weights(seed=0, vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    loss = attn_only(w, np.array([1, 2, 3, 4, 5, 6, 7]), unique_names=True)
    corrupt = {"toks_int_var": np.array([3, 2, 1, 4, 5, 6, 7])}
    return loss, C.interp.path_patch(loss, "b0.a.head0", "b1.a.head1.a.k", corrupt)


def test_a_path_patch_prints_as_a_summary_and_the_full_list_on_request():
    loss, patched = _path_patched()
    d = C.diff(loss, patched)
    # independent count: the nodes the patch copied carry the suffixes path_patch gives them
    names = [n.name for n in C.toposort(patched) if n.name]
    n_patched = sum(name.endswith(".patched") for name in names)
    n_source = sum(name.endswith(".source") for name in names)
    assert d.copies == {".patched": n_patched, ".source": n_source - 1}  # the tokens changed value too
    assert len(d) == n_patched + n_source
    text = str(d).splitlines()
    assert len(text) <= 8 < len(d)  # it was one entry of 3 lines per node (37 rows) before
    assert "b1.a.head1.a.k (now 'b1.a.head1.a.k.patched')" in text[0]  # what was patched
    assert text[2].startswith(f"{n_source - 1} nodes copied as '<name>.source': b0.a.head0")  # from where
    assert any("toks_int_var.source" in line for line in text)  # what changed in itself: the tokens
    full = str(d.full()).splitlines()
    assert full == str(C.diff(loss, patched, full=True)).splitlines()
    assert full[0] == f"{len(d)} changes" and sum(line[0] in "~+-" for line in full) == len(d)
    html = d._repr_html_()
    assert "copied as" in html and html.count("<tr>") == 2  # header + the one node changed in itself
    assert d.full()._repr_html_().count("<tr>") == len(d) + 1


def test_rust_text_is_rusts_diff_of_the_same_pair():
    from circuits.text.rust_diff import diff_circuits

    loss, patched = _path_patched()
    assert C.diff(loss, patched).rust_text(print_legend=False) == diff_circuits(patched, loss, print_legend=False)
    assert "diff_circuits" not in C.__all__  # one name: C.diff


def test_a_node_wrapped_in_place_is_one_entry_and_unwrapping_is_one_too():
    loss = _seed_like()
    site = loss.get_unique("a1.w.q")
    parents = [n for n in loss.toposort() if any(c is site for c in n.children)]
    wrapped = loss.update("a1.w.q", lambda n: C.GeneralFunction("relu", n, name="a1.w.q.relu"))
    d = C.diff(loss, wrapped)
    assert [e.kind for e in d] == ["wrapped"], str(d)  # was 34 entries: the children cascaded
    (entry,) = d
    assert entry.old is site and entry.new.children[0] is site and entry.path[-1] == "a1.w.q.relu"
    assert any(c.name == entry.path[-2] for c in parents)
    assert "above a1.w.q (unchanged)" in str(d)
    back = C.diff(wrapped, loss)
    assert [(e.kind, e.path[-1]) for e in back] == [("unwrapped", "a1.w.q.relu")]
    assert "now a1.w.q directly" in str(back)
    # a steering-style wrapper with a second, new child is one entry as well
    vec = C.Array(np.ones(site.shape, np.float32), name="vec")
    steered = loss.update("a1.w.q", lambda n: C.Add(n, vec, name="a1.w.q.steered"))
    assert [e.kind for e in C.diff(loss, steered)] == ["wrapped"]
