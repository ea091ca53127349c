"""The fused lowering of a gathered log_softmax (``circuits.backend.lower.fusion``): every fused or
chunked form equals the plain lowering (``batch_heads=False``: the circuit computed as printed,
log_softmax then gather) within float rounding, in float32 and float64, on the seed, GPT-2,
Llama, drawn circuits, batches, and with ``also=``."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as C
from circuits.backend.cache.compiled import clear_compile_cache as clear_cache
from circuits.backend.evaluation import make_jaxpr
from circuits.backend.lower import fusion
from circuits.backend.lower.lowering import program_with_also
from circuits.models import attn_only, gpt2, llama, random_weights, tokens_symbol
from circuits.models.gpt2 import random_gpt2_weights
from circuits.models.llama import random_llama_weights
from circuits.testing import arrays, circuits_with_inputs
from circuits.testing.strategies import int_arrays

TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "float64": dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunk every fused logsumexp (a vocabulary of a few dozen entries in chunks of 7-ish)."""
    monkeypatch.setattr(fusion, "CHUNK_FROM_ENTRIES", 1)
    monkeypatch.setattr(fusion, "CHUNK_ENTRIES", 40)
    clear_cache()
    yield
    clear_cache()


def _lines(circuit, also=None):
    program, _ = program_with_also(circuit, "float32", also, True)
    return [n.line() for n in program.nodes]


def _check(circuit, dtype, inputs=None, also=None):
    fused = C.evaluate(circuit, inputs, dtype=dtype, also=also)
    plain = C.evaluate(circuit, inputs, dtype=dtype, also=also, batch_heads=False)
    if also is None:
        fused, plain = (fused,), (plain,)
    else:
        fused, plain = (fused[0], *fused[1].values()), (plain[0], *plain[1].values())
    for a, b in zip(fused, plain):
        assert a.dtype == b.dtype == np.dtype(dtype)
        np.testing.assert_allclose(a, b, **TOL[dtype])


def _seed(vocab=53, positions=9):
    w = random_weights(3, vocab=vocab, d_model=16, n_heads=2, head_size=4, n_layers=2, max_positions=32)
    return w, np.random.default_rng(1).integers(0, vocab, positions + 2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("chunked", [False, True])
def test_seed_loss_fused_equals_plain(dtype, chunked, request):
    if chunked:
        request.getfixturevalue("small_chunks")
    w, toks = _seed()
    loss = attn_only(w, toks)
    lines = _lines(loss)
    assert "GeneralFunction logsumexp_of_einsum" in lines and "GeneralFunction log_softmax" not in " ".join(lines)
    assert "Einsum sh,sh->s" in lines  # the true token's logit: one dot product per position
    _check(loss, dtype)
    np.testing.assert_allclose(C.compile(loss, dtype=dtype)(), C.evaluate(loss, dtype=dtype, batch_heads=False),
                               **TOL[dtype])


def test_chunk_bounds_cover_the_vocabulary(small_chunks):
    bounds = fusion._chunk_bounds(53, 9)
    assert len(bounds) > 2 and bounds[0][0] == 0 and bounds[-1][1] == 53
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert fusion._chunk_bounds(53, 9) != [(0, 53)]


def test_unchunked_when_small():
    assert fusion._chunk_bounds(50259, 1) == [(0, 50259)]
    assert len(fusion._chunk_bounds(50259, 300)) > 8


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_seed_batched_fused_equals_plain(dtype, small_chunks):
    w, _ = _seed()
    loss = attn_only(w, tokens_symbol(11))
    toks = np.random.default_rng(2).integers(0, 53, (3, 11))
    fused = C.evaluate_batched(loss, {"toks_int_var": toks}, dtype=dtype, batch_size=2)
    plain = C.evaluate_batched(loss, {"toks_int_var": toks}, dtype=dtype, batch_heads=False, mode="ops")
    np.testing.assert_allclose(fused, plain, **TOL[dtype])


def test_also_keeps_what_it_names():
    w, toks = _seed()
    loss = attn_only(w, toks)
    # the log-probabilities asked for: nothing to fuse
    assert "GeneralFunction logsumexp_of_einsum" not in _lines(loss, "log_probs")
    _check(loss, "float64", also=["log_probs"])
    # the logits asked for: the gather reads them, logsumexp is taken of them (no log_softmax)
    lines = _lines(loss, "t.call")
    assert "GeneralFunction logsumexp" in lines and "GeneralFunction logsumexp_of_einsum" not in lines
    _check(loss, "float64", also=["t.call", "ll"])


def _gpt2(dtype):
    cfg = dict(n_embd=8, n_head=2, n_layer=2, vocab_size=37, n_positions=16, activation_function="gelu_new")
    return gpt2(cfg, random_gpt2_weights(cfg, dtype=np.dtype(dtype)), np.array([1, 4, 2, 7, 4, 2, 30]), loss=True)


def _llama(dtype):
    cfg = dict(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
               intermediate_size=16, vocab_size=37, max_position_embeddings=16, rms_norm_eps=1e-6, hidden_act="silu")
    return llama(cfg, random_llama_weights(cfg, dtype=np.dtype(dtype)), np.array([1, 4, 2, 7, 4, 2, 30]), loss=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_real_model_losses(build, dtype, small_chunks):
    loss = build(dtype)
    assert "GeneralFunction logsumexp_of_einsum" in _lines(loss)  # logits[:-1] moved onto the operands
    _check(loss, dtype)


GATHERS = [  # (name, index shape from (s, v), negative indices allowed)
    ("gen_index_at_0_batch_x_c", lambda s, v: (s,), False),
    ("gen_index_at_-1_c", lambda s, v: (2,), False),
    ("gen_index_at_-1", lambda s, v: (3, 2), True),
    ("gen_index_at_1_no_batch_index", lambda s, v: (2,), True),
]


@st.composite
def gathered_log_softmaxes(draw):
    """A gather of ``log_softmax(z)`` along its last axis, ``z`` a drawn circuit ``[s, v]`` or
    a drawn circuit ``[s, h]`` times an unembedding ``[v, h]``; and the inputs."""
    s, v, h = draw(st.integers(1, 4)), draw(st.integers(2, 9)), draw(st.integers(1, 4))
    through_einsum = draw(st.booleans())
    case = draw(circuits_with_inputs((s, h) if through_einsum else (s, v), max_nodes=10))
    z = case.circuit
    if through_einsum:
        unembed = C.Array(draw(arrays((v, h), "float64")), name="unembed")
        z = C.Einsum.from_spec("sh,vh->sv", z, unembed, name="logits")
    name, idx_shape, negative = draw(st.sampled_from(GATHERS))
    idx = C.Array(draw(int_arrays(idx_shape(s, v), -v if negative else 0, v)), name="idx")
    gathered = C.GeneralFunction(name, C.GeneralFunction("log_softmax", z), idx, name="ll")
    return gathered, case.inputs


def _check_lowered(circuit, inputs, dtype):
    """The lowered circuit against the circuit as printed (both lowered as they are)."""
    (lowered,), _ = fusion.lower([circuit])
    assert lowered.line() == "'ll' Add"  # the top log_softmax is gone (a drawn one below may stay)
    got = C.evaluate(lowered, inputs, dtype=dtype, batch_heads=False)
    want = C.evaluate(circuit, inputs, dtype=dtype, batch_heads=False)
    np.testing.assert_allclose(got, want, **TOL[dtype])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gathered_log_softmaxes(), st.sampled_from(["float32", "float64"]))
def test_drawn_gathers_fused_equal_plain(case, dtype):
    circuit, inputs = case
    assert fusion.has_gathered_log_softmax(C.toposort(circuit))
    _check_lowered(circuit, inputs, dtype)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gathered_log_softmaxes(), st.sampled_from(["float32", "float64"]))
def test_many_drawn_gathers_fused_equal_plain(case, dtype):
    _check_lowered(*case, dtype)


def test_drawn_gathers_chunked(small_chunks):
    @settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(gathered_log_softmaxes(), st.sampled_from(["float32", "float64"]))
    def run(case, dtype):
        _check_lowered(*case, dtype)

    run()


def test_log_softmax_read_elsewhere_is_left_alone():
    z = C.Array(np.random.default_rng(0).normal(size=(3, 5)), name="z")
    lsm = C.GeneralFunction("log_softmax", z, name="lsm")
    ll = C.GeneralFunction("gen_index_at_0_batch_x_c", lsm, C.Array(np.array([0, 4, 2]), name="t"))
    both = C.Add(C.Einsum.from_spec("s,->s", ll, C.Scalar(2.0)), C.Einsum.from_spec("sv->s", lsm))
    (lowered,), _ = fusion.fuse_gathers([both])
    assert lowered is both
    _check(both, "float64")


def test_out_of_range_token_is_still_an_error():
    w, toks = _seed()
    loss = attn_only(w, tokens_symbol(11))
    bad = toks.copy()
    bad[3] = 53
    with pytest.raises(C.EvaluationError, match="toks_int_var"):
        C.evaluate(loss, {"toks_int_var": bad})


# ---------------------------------------------------------------------------- logsumexp of an Einsum
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("chunked", [False, True])
def test_logsumexp_of_einsum_fused_equals_plain(dtype, chunked, request):
    """What rewrites.optimize leaves of a gathered log_softmax: a logsumexp of the logits'
    Einsum, fused (and chunked) by the backend where nothing else reads the logits."""
    if chunked:
        request.getfixturevalue("small_chunks")
    rng = np.random.default_rng(4)
    x = C.Array(rng.standard_normal((6, 5)).astype(dtype), name="x")
    w = C.Array(rng.standard_normal((41, 5)).astype(dtype), name="w")
    z = C.Einsum.from_spec("sh,vh->sv", x, w, name="z")
    lse = C.GeneralFunction("logsumexp", z, name="lse")
    assert fusion.has_fusable_logsumexp(C.toposort(lse)) and not fusion.has_gathered_log_softmax(C.toposort(lse))
    assert "'lse' GeneralFunction logsumexp_of_einsum" in _lines(lse)
    _check(lse, dtype)
    # the logits asked for, or read by another node: computed whole, the logsumexp reads them
    assert "'lse' GeneralFunction logsumexp" in _lines(lse, "z")
    _check(lse, dtype, also=["z"])
    both = C.Add(lse, C.Einsum.from_spec("sv->s", z), name="both")
    assert not any("logsumexp_of_einsum" in line for line in _lines(both))
    _check(both, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("build", [lambda d: attn_only(*_seed()), _gpt2, _llama], ids=["seed", "gpt2", "llama"])
def test_optimized_losses_run_the_fused_node(build, dtype, small_chunks):
    """rewrites.optimize turns the gathered log_softmax into a logsumexp of the logits and leaves
    the chunking to the backend: its program holds the same fused node as compile's."""
    from rewrites import optimize

    loss = build(dtype)
    fast = optimize(loss)
    assert "GeneralFunction logsumexp_of_einsum" in [line.split("' ", 1)[-1] for line in _lines(fast)]
    assert not any(isinstance(n, C.Concat) for n in C.toposort(fast))
    np.testing.assert_allclose(C.evaluate(fast, dtype=dtype), C.evaluate(loss, dtype=dtype, batch_heads=False),
                               **TOL[dtype])


@st.composite
def logsumexps_of_einsums(draw):
    """``logsumexp`` of a drawn circuit ``[s, h]`` times an unembedding ``[v, h]``; the inputs."""
    s, v, h = draw(st.integers(1, 4)), draw(st.integers(2, 9)), draw(st.integers(1, 4))
    case = draw(circuits_with_inputs((s, h), max_nodes=10))
    unembed = C.Array(draw(arrays((v, h), "float64")), name="unembed")
    z = C.Einsum.from_spec("sh,vh->sv", case.circuit, unembed, name="logits")
    return C.GeneralFunction("logsumexp", z, name="lse"), case.inputs


def test_drawn_logsumexps_fused_equal_plain(small_chunks):
    @settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(logsumexps_of_einsums(), st.sampled_from(["float32", "float64"]))
    def run(case, dtype):
        circuit, inputs = case
        (lowered,), _ = fusion.lower([circuit])
        assert lowered.line() == "'lse' GeneralFunction logsumexp_of_einsum"
        got = C.evaluate(lowered, inputs, dtype=dtype, batch_heads=False)
        want = C.evaluate(circuit, inputs, dtype=dtype, batch_heads=False)
        np.testing.assert_allclose(got, want, **TOL[dtype])

    run()


# ---------------------------------------------------------------------------- the chunk loop
LOOP_LAYOUTS = [  # (einsum, shapes of its operands by axis letter); the vocabulary is 'v'
    "sh,vh->sv",   # the unembedding [vocab, d]: each chunk a block of rows
    "sh,hv->sv",   # stored [d, vocab]: each chunk a block of columns
    "bsh,vh->bsv",  # a leading batch axis in the logits
    "sh,hk,vk->sv",  # three operands, the vocabulary's last
]


def _numpy_logsumexp(z):
    m = z.max(-1, keepdims=True)
    return (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[..., 0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("vocab", [50, 53, 9])  # chunks that fill it exactly, a shorter tail, one full chunk
@pytest.mark.parametrize("spec", LOOP_LAYOUTS)
def test_chunk_loop_equals_numpy(spec, vocab, dtype, small_chunks):
    """The chunked logsumexp runs its full chunks in a loop and the remainder after it: every
    layout of the vocabulary's operand, with and without a remainder, equals numpy's logsumexp of
    the whole logits and the plain lowering, evaluated and compiled, gradient included."""
    size = fusion._chunk_bounds(vocab, 4)[0][1]
    assert size < vocab  # chunked
    dims = dict(b=2, s=2, h=3, k=5, v=vocab)
    rng = np.random.default_rng(vocab)
    ins, out = spec.split("->")
    values = [rng.standard_normal([dims[a] for a in op]).astype(dtype) for op in ins.split(",")]
    arrays_ = [C.Array(v, name=f"w{i}") for i, v in enumerate(values)]
    lse = C.GeneralFunction("logsumexp", C.Einsum.from_spec(spec, *arrays_, name="z"), name="lse")
    (lowered,), _ = fusion.lower([lse])
    assert lowered.line() == "'lse' GeneralFunction logsumexp_of_einsum"
    assert "scan" in str(make_jaxpr(lowered, dtype=dtype))  # the loop over the full chunks
    want = _numpy_logsumexp(np.einsum(spec, *values))
    got = C.evaluate(lse, dtype=dtype)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    np.testing.assert_allclose(C.compile(lse, dtype=dtype)(), want, **TOL[dtype])
    _check(lse, dtype)
    holder = next(f"w{i}" for i, op in enumerate(ins.split(",")) if "v" in op)
    np.testing.assert_allclose(C.grad(lowered, holder, dtype=dtype), C.grad(lse, holder, dtype=dtype), **TOL[dtype])


def test_chunk_loop_layouts_reach_both_branches(small_chunks):
    """The vocabularies above: one fills its chunks exactly, the others leave a remainder."""
    tails = {n: n % fusion._chunk_bounds(n, 4)[0][1] for n in (50, 53, 9)}
    assert tails[50] == 0 and tails[53] > 0 and tails[9] > 0
    assert 9 // fusion._chunk_bounds(9, 4)[0][1] == 1
