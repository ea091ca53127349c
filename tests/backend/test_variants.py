"""Variants op by op with their changed nodes as rows of one kernel (``circuits.backend.tiers.variants``,
the tier a first sweep runs in): each variant's value equals its own whole-program evaluation,
work the variants share is done once, chunks, padding and groups change nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits import Array
from circuits.backend import evaluate
from circuits.backend.tiers import variants
from circuits.backend.tiers.op_by_op import RunInfo, run_ops
from circuits.backend.tiers.variants import run_variants
from circuits.testing import circuits_with_inputs


def _check(base, vs, inputs=None, *, rtol=2e-5, atol=2e-6, cache=False):
    info = RunInfo()
    base_value, values = run_variants(base, vs, inputs, "float32", cache=cache, info=info)
    np.testing.assert_allclose(np.asarray(base_value), evaluate(base, inputs, mode="jit"), rtol=rtol, atol=atol)
    for v, value in zip(vs, values):
        np.testing.assert_allclose(np.asarray(value), evaluate(v, inputs, mode="jit"), rtol=rtol, atol=atol,
                                   err_msg=v.to_text()[:2000], equal_nan=True)
    return info


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=circuits_with_inputs(max_nodes=12, max_depth=5), data=st.data())
def test_variants_equal_their_own_evaluation_on_generated_circuits(case, data):
    circuit, inputs = case
    nodes = [n for n in C.toposort(circuit) if n.dtype.startswith("float") and n is not circuit]
    if not nodes:
        return
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    vs = [circuit]
    for _ in range(data.draw(st.integers(1, 5))):
        picked = data.draw(st.sampled_from(nodes))
        new = Array(rng.uniform(0.5, 1.5, picked.shape).astype(np.float32))
        vs.append(C.traversal.replace(circuit, {picked: new}))
    vs.append(vs[-1])  # the same variant twice
    _check(circuit, vs, inputs, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def shipped():
    from circuits.models import attn_only, induction_weights

    w = induction_weights()
    toks = np.random.default_rng(1).integers(1, 64, 34)
    return attn_only(w, toks, unique_names=True)


def test_ablations_and_path_patches_of_the_shipped_model(shipped):
    from circuits.interp import ablate, path_patch

    corrupt = np.random.default_rng(2).integers(1, 64, 34)
    vs = [ablate(shipped, f"b{l}.a.head{h}") for l in range(2) for h in range(4)]
    vs += [path_patch(shipped, "b0.a.head2", f"b1.a.head{h}.a.{r}", {"toks_int_var": corrupt})
           for h in range(4) for r in "qkv"]
    info = _check(shipped, vs)
    alone = RunInfo()
    for v in vs:
        run_ops([v], None, "float32", cache=False, info=alone)
    # the clean run, and the corrupted run the path patches share, are computed once
    assert info.computed < alone.computed / 4


def test_chunks_padding_and_groups_change_nothing(shipped, monkeypatch):
    """Few rows per kernel (chunks that mix rows of several children chunks with unchanged
    values, a short last chunk padded) and tiny groups of variants give the same values."""
    from circuits.interp import ablate

    vs = [ablate(shipped, f"b{l}.a.head{h}") for l in range(2) for h in range(4)][::-1]
    monkeypatch.setattr(variants, "ROWS", 4)
    _check(shipped, vs)
    monkeypatch.setattr(variants, "GROUP_BYTES", 1)
    monkeypatch.setattr(variants, "ROWS", 2)
    _check(shipped, vs)


def test_every_head_of_a_small_gpt2_patched():
    from circuits.interp import patch
    from circuits.models import gpt2
    from circuits.models.gpt2 import random_gpt2_weights

    cfg = dict(n_embd=16, n_head=4, n_layer=3, vocab_size=31, n_positions=16, activation_function="gelu_new")
    rng = np.random.default_rng(3)
    toks, corrupt = rng.integers(0, 31, 9), rng.integers(0, 31, 9)
    c = gpt2(cfg, random_gpt2_weights(cfg), toks, loss=True, split_heads=True)
    vs = [patch(c, f"h{l}.attn.head{h}", {"tokens": corrupt}) for l in range(3) for h in range(4)]
    info = _check(c, vs, rtol=1e-4, atol=1e-5)
    assert info.computed > 0


def test_variants_whose_value_is_cached_are_not_computed_again(shipped):
    from circuits.interp import ablate

    vs = [ablate(shipped, f"b1.a.head{h}") for h in range(4)]
    first = run_variants(shipped, vs, None, "float32")[1]
    info = RunInfo()
    again = run_variants(shipped, vs, None, "float32", info=info)[1]
    assert info.computed == 0
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_inputs_are_reported_before_anything_runs():
    x = C.Symbol((3,), name="x_variants")
    y = C.GeneralFunction("exp", x)
    with pytest.raises(C.EvaluationError, match="x_variants"):
        run_variants(y, [C.Add(y, y)], {"x_variants": np.zeros(4)}, "float32")


def test_rows_that_differ_only_in_name():
    """Two variants rebuild one node over the very same children, under other names: every
    child of the chunk is unbatched (a vmap over nothing) — computed once for both."""
    x = C.Symbol((3,), name="x_names")
    inner = C.Einsum.from_spec("a,->a", x, C.Scalar(2.0), name="inner")
    y = C.GeneralFunction("exp", inner, name="y")
    vs = [C.traversal.replace(y, {inner: C.Einsum.from_spec("a,->a", x, C.Scalar(3.0), name=f"inner_{k}")})
          for k in range(3)]
    _check(y, vs, {"x_names": np.ones(3, np.float32)})


def _small_gpt2():
    from circuits.models import gpt2
    from circuits.models.gpt2 import random_gpt2_weights

    cfg = dict(n_embd=16, n_head=4, n_layer=2, vocab_size=31, n_positions=16, activation_function="gelu_new")
    toks = np.random.default_rng(4).integers(0, 31, 9)
    return gpt2(cfg, random_gpt2_weights(cfg), toks, loss=True, split_heads=True), toks


@pytest.mark.parametrize("bad_value", [31, -40])
def test_tokens_outside_the_vocabulary_in_rows_are_refused_as_evaluate_refuses_them(shipped, bad_value):
    """A variant's own tokens reach a gather through rows of the base's kernels (which do not
    check indices): they are range-checked once per distinct token array, before anything runs,
    with the error ``evaluate`` gives.  An Array reaching the gather through an Index (the shipped
    model), and a Symbol's bound tokens reaching GPT-2's embedding gather directly."""
    from circuits.interp import ablate, patch

    c, toks = _small_gpt2()
    bad = toks.copy()
    bad[2] = bad_value
    tokens = c.get_unique("tokens")
    sym = C.Symbol(tokens.shape, name="bad_toks_variants", dtype=tokens.dtype)
    good = [patch(c, f"h{l}.attn.head{h}", {"tokens": toks[::-1].copy()}) for l in range(2) for h in range(2)]
    shipped_toks = shipped.get_unique("toks_int_var")
    shipped_bad = np.asarray(shipped_toks.value).copy()
    shipped_bad[5] = 64 + 1 if bad_value > 0 else bad_value
    shipped_good = [ablate(shipped, f"b1.a.head{h}") for h in range(3)]
    cases = [
        (c, good, patch(c, "h0.attn.head1", {"tokens": sym}), {"bad_toks_variants": bad}),
        (shipped, shipped_good, C.traversal.replace(shipped, {shipped_toks: Array(shipped_bad.astype(
            shipped_toks.dtype), name=shipped_toks.name)}), None),
    ]
    for base, fine, variant, inputs in cases:
        with pytest.raises(C.EvaluationError, match="holds index .*, outside") as evaluated:
            evaluate(variant, inputs, mode="ops", cache=False)  # the op-by-op tier, as the rows
        before = RunInfo()
        with pytest.raises(C.EvaluationError, match="holds index .*, outside") as swept:
            run_variants(base, [*fine, variant, *fine], inputs, "float32", cache=False, info=before)
        assert before.computed == 0  # refused before anything ran
        assert str(evaluated.value).splitlines()[1:] == str(swept.value).splitlines()[1:]
    # in range, the same variants run (a patch from the clean tokens' Symbol equals the base)
    _check(c, [*good, patch(c, "h0.attn.head1", {"tokens": sym})], {"bad_toks_variants": toks}, rtol=1e-4, atol=1e-5)


def test_index_rows_take_their_ints_as_arguments():
    """Rows of Index nodes of ints and slices (a head picked from a layer's heads) run through one
    kernel per slice pattern, the ints passed in: negative ints, reversed and strided slices, ints
    on several axes; each value equals its own evaluation."""
    from circuits.backend.tiers import kernels

    x = C.Symbol((4, 5, 6), name="x_index_rows")
    scale = C.Scalar(2.0)
    y = C.Einsum.from_spec("abc,->abc", x, scale, name="y")
    picks = [C.Index(y, (h, slice(None, None, -2)), name=f"pick{h}") for h in (0, 1, -1)]
    picks += [C.Index(y, (slice(1, 3), h, k), name=f"two{h}{k}") for h, k in ((0, 5), (-2, -6))]
    base = C.Add(*[C.Einsum.from_spec("".join("abc"[:p.ndim]) + "->", p) for p in picks], name="total")
    vs = [C.traversal.replace(base, {scale: C.Scalar(float(k))}) for k in range(3, 8)]
    inputs = {"x_index_rows": np.random.default_rng(5).normal(size=(4, 5, 6)).astype(np.float32)}
    before = kernels.kernel_info()["kernel_misses"]
    _check(base, vs, inputs)
    made = kernels.kernel_info()["kernel_misses"] - before
    _check(base, vs + [C.traversal.replace(base, {y: C.Array(np.ones((4, 5, 6), np.float32))})], inputs)
    assert made > 0
    # the three [h, ::-2] picks share one row kernel, the two [1:3, h, k] picks another
    keys = [k for k in kernels._kernels.keys() if k[0] == "rows-index" and k[2] == (4, 5, 6)]
    assert {k[1] for k in keys} == {(None, (None, None, -2)), ((1, 3, None), None, None)}


def test_groups_compute_the_rows_they_share_once(shipped, monkeypatch):
    """Path patches in many small groups: the corrupted run of the sender, a single row read by
    every group, is computed once, before the groups (fewer kernel calls than the groups run one
    by one), and every value is still the variant's own."""
    from circuits.interp import path_patch

    corrupt = np.random.default_rng(2).integers(1, 64, 34)
    vs = [path_patch(shipped, "b0.a.head2", f"b1.a.head{h}.a.{r}", {"toks_int_var": corrupt})
          for h in range(4) for r in "qkv"]
    monkeypatch.setattr(variants, "GROUP_BYTES", 1)
    monkeypatch.setattr(variants, "ROWS", 2)  # groups of two variants
    together = _check(shipped, vs)
    base = RunInfo()
    run_variants(shipped, [], None, "float32", cache=False, info=base)
    alone = base.computed
    for k in range(0, len(vs), 2):
        info = RunInfo()
        run_variants(shipped, vs[k:k + 2], None, "float32", cache=False, info=info)
        alone += info.computed - base.computed  # each run computes the base too
    assert together.computed < alone


def test_rows_groups_share_are_given_values_and_the_rest_still_fuse(monkeypatch):
    """Head patches of a small GPT-2 over a batch in groups of four, the first holding patches
    of layers 0 and 1: the corrupted run both groups read is computed before the groups and read
    as given values, so in the first group layer 1's norm (rows of the layer-0 patches, while
    the layer-1 patches read the corrupted run's) is still fused into its reader; the values
    equal each variant's evaluation prompt by prompt."""
    c, _, _, feed, vs = _small_gpt2_head_patches("corrupt_grouped", 11)
    vs = vs[:2] + vs[4:]  # groups (layer 0 heads 0-1, layer 1 heads 0-1) and (layer 1 heads 2-3)
    monkeypatch.setattr(variants, "GROUP_BYTES", 1)
    monkeypatch.setattr(variants, "ROWS", 4)
    fronts, made, group = [], [], []
    monkeypatch.setattr(variants._Group, "read_as_given",
                        lambda self, keep, by=variants._Group.read_as_given: fronts.append(by(self, keep)) or fronts[-1])
    monkeypatch.setattr(variants._Group, "run",
                        lambda self, *a, by=variants._Group.run: group.append(self) or by(self, *a))
    monkeypatch.setattr(variants, "_tree_kernel",
                        lambda tree, *a, made_by=variants._tree_kernel: made.append((len(group), tree)) or made_by(tree, *a))
    _check_batched(c, vs, feed, 3, set(feed))
    assert len(fronts) == 2 and all(fronts)  # both groups read the corrupted run as given
    fused = {n.name for g, tree in made if g == 1 for n in variants._tree_nodes(tree)[1:]}
    assert any(name.startswith("h1.ln1") for name in fused), sorted(fused)


# ------------------------------------------------------------------ over a batch (a dataset)
def _rows_oracle(v, feed, rows, batched):
    """``v`` evaluated prompt by prompt (whole program), stacked: an oracle independent of the
    batch axis (``batched``: the keys of ``feed`` bound over the batch)."""
    return np.stack([evaluate(v, {k: x[i] if k in batched else x for k, x in feed.items()}, mode="jit")
                     for i in range(rows)])


def _check_batched(base, vs, feed, rows, batched, *, rtol=1e-4, atol=1e-5, cache=False):
    info = RunInfo()
    base_value, values = run_variants(base, vs, feed, "float32", cache=cache, info=info, batched=True)
    np.testing.assert_allclose(np.asarray(base_value), _rows_oracle(base, feed, rows, batched), rtol=rtol, atol=atol,
                               equal_nan=True)
    for v, value in zip(vs, values):
        assert np.shape(value)[0] == rows  # every value with the batch axis, batched input or not
        np.testing.assert_allclose(np.asarray(value), _rows_oracle(v, feed, rows, batched), rtol=rtol, atol=atol,
                                   err_msg=v.to_text()[:2000], equal_nan=True)
    return info


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=circuits_with_inputs(max_nodes=12, max_depth=5), data=st.data())
def test_variants_over_a_batch_equal_their_evaluation_prompt_by_prompt(case, data):
    """Generated circuits with some inputs batched: variants replacing a node by a constant, by a
    new Symbol bound over the batch (a row carrying the batch axis where its partner does not),
    or by one bound once; in rows of one, of two and of many per kernel."""
    from circuits.testing import inputs_for

    circuit, inputs = case
    nodes = [n for n in C.toposort(circuit) if n.dtype.startswith("float") and n is not circuit]
    if not nodes or not inputs:
        return
    rows = data.draw(st.integers(1, 3))
    batched = data.draw(st.lists(st.sampled_from(list(inputs)), min_size=1, unique=True))
    stacked = [data.draw(inputs_for(circuit)) for _ in range(rows)]
    feed = {s: (np.stack([r[s] for r in stacked]) if s in batched else inputs[s]) for s in inputs}
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    vs = [circuit]
    for k in range(data.draw(st.integers(1, 5))):
        picked = data.draw(st.sampled_from(nodes))
        how = data.draw(st.sampled_from(["array", "batched", "once"]))
        if how == "array":
            new = Array(rng.uniform(0.5, 1.5, picked.shape).astype(np.float32))
        else:
            new = C.Symbol(picked.shape, name=f"new_{k}_{how}")
            value = rng.uniform(0.5, 1.5, picked.shape).astype(np.float32)
            feed[new.name] = np.stack([value * (1 + i) for i in range(rows)]) if how == "batched" else value
            if how == "batched":
                batched.append(new.name)
        vs.append(C.traversal.replace(circuit, {picked: new}))
    vs.append(vs[-1])  # the same variant twice
    _check_batched(circuit, vs, feed, rows, batched)
    if len(vs) > 2:  # a row per kernel, groups of one
        with pytest.MonkeyPatch.context() as m:
            m.setattr(variants, "ROWS", 1)
            m.setattr(variants, "GROUP_BYTES", 1)
            _check_batched(circuit, vs, feed, rows, batched)


def test_patches_of_the_shipped_model_over_a_batch():
    """Head patches, ablations and path patches over five prompts, in chunks of several sizes:
    each variant's value equals its evaluation prompt by prompt; the clean run and the corrupted
    run the patches share are computed once."""
    from circuits.interp import ablate, patch, path_patch
    from circuits.models import attn_only, induction_weights, tokens_symbol

    sym = tokens_symbol(34)
    corrupt_sym = C.Symbol((34,), name="corrupt_toks_variants", dtype="int64")
    c = attn_only(induction_weights(), sym, unique_names=True)
    rng = np.random.default_rng(6)
    feed = {sym: rng.integers(1, 64, (5, 34)), corrupt_sym: rng.integers(1, 64, (5, 34))}
    vs = [patch(c, f"b{l}.a.head{h}", {"toks_int_var": corrupt_sym}) for l in range(2) for h in range(4)]
    vs += [ablate(c, f"b1.a.head{h}") for h in range(2)]
    vs += [path_patch(c, "b0.a.head2", f"b1.a.head{h}.a.{r}", {"toks_int_var": corrupt_sym}) for h in (0, 3)
           for r in "qk"]
    info = _check_batched(c, vs, feed, 5, set(feed), rtol=2e-5, atol=2e-6)
    alone = RunInfo()
    for v in vs:
        run_ops([v], feed, "float32", cache=False, info=alone, batched=True)
    assert info.computed < alone.computed / 4
    with pytest.MonkeyPatch.context() as m:
        m.setattr(variants, "ROWS", 2)
        m.setattr(variants, "GROUP_BYTES", 1)
        _check_batched(c, vs[::-1], feed, 5, set(feed), rtol=2e-5, atol=2e-6)


def _small_gpt2_head_patches(name: str, seed: int):
    """``(circuit, tokens, corrupt tokens, feed over 3 prompts, patches)``: a 3-layer GPT-2 (width
    16, 4 heads, 9 tokens) and the patches of the heads of layers 0 and 1 from ``name``'s tokens
    (each changes every head of layer 2, whose sum is then fused)."""
    from circuits.interp import patch
    from circuits.models import gpt2, tokens_symbol
    from circuits.models.gpt2 import random_gpt2_weights

    cfg = dict(n_embd=16, n_head=4, n_layer=3, vocab_size=31, n_positions=16, activation_function="gelu_new")
    sym = tokens_symbol(9)
    corrupt = C.Symbol((9,), name=name, dtype="int64")
    c = gpt2(cfg, random_gpt2_weights(cfg), sym, loss=True, split_heads=True)
    rng = np.random.default_rng(seed)
    feed = {sym: rng.integers(0, 31, (3, 9)), corrupt: rng.integers(0, 31, (3, 9))}
    vs = [patch(c, f"h{l}.attn.head{h}", {sym.name: corrupt}) for l in range(2) for h in range(4)]
    return c, sym, corrupt, feed, vs


def test_fused_kernels_over_a_batch_agree_with_unfused_and_with_evaluation(monkeypatch):
    """Heads of a small GPT-2 patched over a batch of prompts: steps read by one node are
    computed inside its kernel (a slice inside the log-softmax, the bias inside the gelu), a
    layer's heads' outputs as one product over the heads stacked.  The values equal each
    variant's evaluation prompt by prompt, and the same run with fusion off (FUSED = 1)."""
    from circuits.interp import patch

    c, sym, corrupt, feed, vs = _small_gpt2_head_patches("corrupt_fused", 7)
    made = []
    stacked = []
    monkeypatch.setattr(variants, "_tree_kernel",
                        lambda tree, *a, made_by=variants._tree_kernel: made.append(tree) or made_by(tree, *a))
    monkeypatch.setattr(variants, "_stacked_product",
                        lambda node, by=variants._stacked_product: stacked.append(node) or by(node))
    _check_batched(c, vs, feed, 3, set(feed))
    kinds = {type(n).__name__ for tree in made for n in variants._tree_nodes(tree)[1:]}
    assert {"GeneralFunction", "Index", "Add", "Einsum"} <= kinds  # fused below their readers
    assert any(n.name.endswith("attn.heads") for n in stacked)  # the heads' products as one
    # the heads' sum of layer 2 itself (in the loss, a 0.1 % error in it is within tolerance)
    heads = c.get_unique("h2.attn.heads")
    hs = [patch(heads, f"h{l}.attn.head{h}", {sym.name: corrupt}) for l in range(2) for h in range(4)]
    stacked.clear()
    _check_batched(heads, hs, feed, 3, set(feed), rtol=1e-5, atol=1e-6)
    assert stacked
    fused = run_variants(c, vs + hs, feed, "float32", cache=False, batched=True)[1]
    monkeypatch.setattr(variants, "FUSED", 1)
    made.clear()
    plain = run_variants(c, vs + hs, feed, "float32", cache=False, batched=True)[1]
    assert not made
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_chunks_capped_to_the_cache_line_up_and_agree_with_evaluation(monkeypatch):
    """On a CPU a group's chunks hold as many rows as fit ``CACHE_BYTES`` of its biggest value
    (one bound for every node, so chunks line up): with a bound small enough to cut the eight
    head patches of a small GPT-2 into chunks of two rows, every kernel runs over at most two
    rows, and the values equal each variant's evaluation prompt by prompt and the uncapped run."""
    c, _, _, feed, vs = _small_gpt2_head_patches("corrupt_capped", 3)
    uncapped = run_variants(c, vs, feed, "float32", cache=False, batched=True)[1]
    # the biggest value that has rows: the MLP's hidden layer, 3 prompts x 9 tokens x 64 floats
    hidden = 3 * 9 * 4 * 16 * 4
    monkeypatch.setattr(variants, "CACHE_BYTES", 2 * hidden + 1)
    sizes = []
    for name in ("_rows_kernel", "_tree_kernel"):
        monkeypatch.setattr(variants, name, lambda node, fdt, axes, size, *a, by=getattr(variants, name):
                            sizes.append(size) or by(node, fdt, axes, size, *a))
    _check_batched(c, vs, feed, 3, set(feed))
    assert sizes and max(sizes) == 2
    capped = run_variants(c, vs, feed, "float32", cache=False, batched=True)[1]
    for a, b in zip(capped, uncapped):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_a_loss_over_a_long_vocabulary_picks_its_log_probabilities_a_block_at_a_time(monkeypatch):
    """The loss of head patches over a batch: the unembedding's product, the slice, the
    log-softmax and the gather of the next tokens are one kernel computing the logits a block of
    the vocabulary at a time (``picked_log_softmax``; here a vocabulary of 31 counts as long and
    blocks hold 8 entries: three full blocks and a last of 7).  The logits are never a value of
    the kernel, the values equal each variant's evaluation prompt by prompt, and the same run
    with the plain log-softmax."""
    from circuits.backend.lower import picked_log_softmax

    c, sym, corrupt, feed, vs = _small_gpt2_head_patches("corrupt_picked", 5)
    plain = run_variants(c, vs, feed, "float32", cache=False, batched=True)[1]
    made = []
    monkeypatch.setattr(picked_log_softmax, "LONG", 8)
    monkeypatch.setattr(picked_log_softmax, "VOCAB_BLOCK", 8)
    monkeypatch.setattr(variants, "_tree_kernel",
                        lambda tree, *a, made_by=variants._tree_kernel: made.append(tree) or made_by(tree, *a))
    _check_batched(c, vs, feed, 3, set(feed))

    def subtrees(tree):
        yield tree
        for sub in tree[1]:
            if sub is not None:
                yield from subtrees(sub)

    picked = [t for t in made if any(variants._picked(s) is not None for s in subtrees(t))]
    assert picked  # the loss's tree computes the product inside the gather's kernel
    for tree in picked:
        names = {n.name for n in variants._tree_nodes(tree)}
        assert {"loss", "ll", "final.ln"} <= names and not names & {"logits", "log_probs", "logits.pred"}
    blocked = run_variants(c, vs, feed, "float32", cache=False, batched=True)[1]
    for a, b in zip(blocked, plain):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
