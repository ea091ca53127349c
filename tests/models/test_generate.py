"""``Model.generate``: greedy generation equal to ``transformers``' ``generate`` token for token
(float64), batches of different lengths, the prefill path, streaming, stopping, sampling, and
edits applied to every step (a head ablation, a steering vector, a position-masked edit, a patch,
a spliced SAE) against torch hooks or the edited full circuit, each edited step compiled once."""

import numpy as np
import pytest

import circuits as C
from circuits import interp
from circuits.models import Model, position_mask
from circuits.models.generate import sample
from tests.models.hf_folders import VOCAB, float64_oracle, hf_model, hf_tokenizer, rng_tokens, state

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


def _models(family, seed=0, dtype="float64", tokenizer=False, **cfg):
    from circuits.models.tokenizer import Tokenizer

    hf = hf_model(family, seed=seed, **cfg)
    tok = None
    if tokenizer:
        tok = Tokenizer(hf_tokenizer().backend_tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    return hf, Model(hf.config.to_dict(), state(hf), tok, dtype=dtype)


def _hf_generate(hf, prompt, n, hooks=(), **kw):
    with float64_oracle(hf), torch.no_grad():
        handles = [register(hf) for register in hooks]
        try:
            ids = torch.tensor(np.asarray(prompt)[None])
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              eos_token_id=None, pad_token_id=0, **kw)
        finally:
            for h in handles:
                h.remove()
    return out[0].numpy()


@pytest.fixture(scope="module")
def gpt2():
    return _models("gpt2", seed=0, tokenizer=True)  # a seed whose greedy text varies (many repeat one token)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_greedy_equals_transformers_token_for_token(family, gpt2):
    hf, m = gpt2 if family == "gpt2" else _models(family, seed=4)
    prompt = rng_tokens(7, 6)
    got = m.generate(prompt, 12, stop_at_eos=False)
    np.testing.assert_array_equal(got, _hf_generate(hf, prompt, 12))


def test_a_long_prompt_takes_the_prefill_program(gpt2):
    hf, m = gpt2
    prompt = rng_tokens(8, 40)  # longer than PREFILL_FROM: prompt computed in one program
    np.testing.assert_array_equal(m.generate(prompt, 6, stop_at_eos=False), _hf_generate(hf, prompt, 6))


def test_a_batch_of_different_lengths_is_each_row_alone(gpt2):
    hf, m = gpt2
    rows = [rng_tokens(1, 3), rng_tokens(2, 7), rng_tokens(3, 5)]
    got = m.generate(rows, 8, stop_at_eos=False)
    assert isinstance(got, list) and [len(g) for g in got] == [11, 15, 13]
    for r, g in zip(rows, got):
        np.testing.assert_array_equal(g, m.generate(r, 8, stop_at_eos=False))
        np.testing.assert_array_equal(g, _hf_generate(hf, r, 8))
    # transformers' own batched generate, padded on the left, agrees too
    width = 7
    ids = torch.tensor(np.stack([np.pad(r, (width - len(r), 0)) for r in rows]))
    mask = torch.tensor(np.stack([np.r_[np.zeros(width - len(r)), np.ones(len(r))] for r in rows]).astype(np.int64))
    with float64_oracle(hf), torch.no_grad():
        want = hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=None,
                           pad_token_id=0).numpy()
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g[len(rows[i]):], want[i, width:])
    two_d = m.generate(np.stack([rows[1], rows[1] + 1]), 3, stop_at_eos=False)
    assert two_d.shape == (2, 10)


def test_text_streaming_and_stop_strings(gpt2):
    _, m = gpt2
    text = m.generate("the cat", 10, stop_at_eos=False)
    assert text.startswith("the cat")
    pieces = list(m.generate("the cat", 10, stop_at_eos=False, stream=True))
    assert "the cat" + "".join(pieces) == text
    assert all(isinstance(p, str) and "\ufffd" not in p for p in pieces[:-1]) or "\ufffd" in text
    tokens = list(m.generate(m.to_tokens("the cat")[0], 10, stop_at_eos=False, stream=True))
    assert all(isinstance(t, int) for t in tokens)
    np.testing.assert_array_equal(np.r_[m.to_tokens("the cat")[0], tokens],
                                  m.generate(m.to_tokens("the cat")[0], 10, stop_at_eos=False))
    # a stop string: generation ends with the token that completes it, and it is kept
    prompt = m.to_tokens("the cat")[0]
    free = m.generate(prompt, 10, stop_at_eos=False)[len(prompt):]
    stop = m.to_string(free[2:4])  # whatever its characters (random tokens make replacement characters)
    first = min(i for i in range(10) if stop in m.to_string(free[:i + 1]))
    assert first <= 3
    np.testing.assert_array_equal(m.generate(prompt, 10, stop_at_eos=False, stop=stop)[len(prompt):],
                                  free[:first + 1])
    assert m.generate("the cat", 10, stop_at_eos=False, stop=["zzz", stop]) == "the cat" + m.to_string(free[:first + 1])


def test_stop_at_eos_and_batch_padding(gpt2):
    _, m = gpt2
    prompt = rng_tokens(9, 4)
    free = m.generate(prompt, 8, stop_at_eos=False)
    first = int(free[4])
    stopped = m.generate(prompt, 8, eos_token_id=first)
    np.testing.assert_array_equal(stopped, free[:5])  # the EOS token kept, nothing after
    rows = np.stack([rng_tokens(4, 4), rng_tokens(0, 4)])  # rows whose continuations differ
    free2 = m.generate(rows, 8, stop_at_eos=False)
    eos = next(int(t) for t in free2[0, 4:] if t not in free2[1, 4:])
    j = list(free2[0, 4:]).index(eos)
    both = m.generate(rows, 8, eos_token_id=eos)  # row 0 stops, row 1 runs on
    assert both.shape == (2, 12)
    np.testing.assert_array_equal(both[1], free2[1])
    np.testing.assert_array_equal(both[0, :5 + j], free2[0, :5 + j])
    assert (both[0, 5 + j:] == m._pad_id()).all()


def test_sampling_is_seeded_and_top_k_one_is_greedy(gpt2):
    _, m = gpt2
    prompt = rng_tokens(11, 5)
    a = m.generate(prompt, 10, temperature=1.0, seed=3, stop_at_eos=False)
    assert np.array_equal(a, m.generate(prompt, 10, temperature=1.0, seed=3, stop_at_eos=False))
    others = [m.generate(prompt, 10, temperature=1.0, seed=s, stop_at_eos=False) for s in (4, 5)]
    assert any(not np.array_equal(a, o) for o in others)
    np.testing.assert_array_equal(m.generate(prompt, 10, temperature=0.7, top_k=1, stop_at_eos=False),
                                  m.generate(prompt, 10, stop_at_eos=False))
    with pytest.raises(C.CircuitError, match="temperature > 0"):
        m.generate(prompt, 3, top_k=5)
    with pytest.raises(C.CircuitError, match="top_p"):
        m.generate(prompt, 3, temperature=1.0, top_p=1.5)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 6, 1.0), (0.5, 50, 0.8), (2.0, 3, 0.5)])
def test_sampled_distribution_matches_transformers_warpers(temperature, top_k, top_p):
    """The filtered distribution ``sample`` draws from, against transformers' own logits
    processors (temperature, then top-k, then top-p) on the same logits."""
    import jax
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = np.random.default_rng(0).normal(size=(1, 12)).astype(np.float32) * 2
    x = torch.tensor(logits)
    x = TemperatureLogitsWarper(temperature)(None, x)
    x = TopKLogitsWarper(top_k)(None, x)
    if top_p < 1:
        x = TopPLogitsWarper(top_p)(None, x)
    want = torch.softmax(x, -1)[0].numpy()
    draws = 4000
    counts = np.zeros(12)
    f = jax.jit(jax.vmap(lambda c: sample(logits, 0, c, temperature, top_k, top_p)))
    for t in np.asarray(f(np.arange(draws))).reshape(-1):
        counts[t] += 1
    assert set(np.nonzero(counts)[0]) <= set(np.nonzero(want)[0])  # nothing outside the kept set
    sd = np.sqrt(want * (1 - want) / draws)
    assert np.all(np.abs(counts / draws - want) <= 5 * sd + 1e-3)


# ---------------------------------------------------------------------------- edits
def _zero_head_hook(layer_attn_out, head, head_dim):
    def register(hf):
        def pre(module, args):
            x = args[0].clone()
            x[..., head * head_dim:(head + 1) * head_dim] = 0
            return (x,) + args[1:]
        return layer_attn_out(hf).register_forward_pre_hook(pre)
    return register


def _add_hook(layer, vector, positions=None):
    """A forward hook adding ``vector`` to a decoder layer's output at the absolute ``positions``
    (every position when None), counting positions over the forward calls of one generation."""
    seen = [0]

    def register(hf):
        def hook(module, args, out):
            h = out[0] if isinstance(out, tuple) else out
            n = h.shape[1]
            add = torch.tensor(vector, dtype=h.dtype)
            if positions is not None:
                at = torch.tensor([float(seen[0] + i in positions) for i in range(n)], dtype=h.dtype)
                add = at[:, None] * add
            seen[0] += n
            h = h + add
            return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h
        return layer(hf).register_forward_hook(hook)
    return register


def test_head_ablation_equals_a_torch_hook(gpt2):
    hf, m = gpt2
    prompt = rng_tokens(12, 6)
    edit = lambda c: interp.ablate(c, "h1.attn.head2")  # noqa: E731
    got = m.generate(prompt, 10, edit=edit, stop_at_eos=False)
    want = _hf_generate(hf, prompt, 10, [_zero_head_hook(lambda h: h.transformer.h[1].attn.c_proj, 2, 8)])
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, m.generate(prompt, 10, stop_at_eos=False))  # the ablation changed something


def test_steering_equals_a_forward_hook_and_compiles_once(gpt2):
    hf, m = gpt2
    prompt = rng_tokens(13, 5)
    v = np.random.default_rng(0).normal(size=32) * 3

    def steer(vector):
        return lambda c: c.update("h0", lambda n: C.Add(n, C.Array(vector, name="steer")))

    got = m.generate(prompt, 10, edit=steer(v), stop_at_eos=False)
    want = _hf_generate(hf, prompt, 10, [_add_hook(lambda h: h.transformer.h[0], v)])
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, m.generate(prompt, 10, stop_at_eos=False))
    # another vector, another prompt length, more tokens: the same compiled step
    before = C.cache_stats()["compilations"]
    for vector, p, n in [(-v, prompt, 10), (2 * v, rng_tokens(14, 9), 6), (v, rng_tokens(15, 3), 4)]:  # <= 16 slots
        m.generate(p, n, edit=steer(vector), stop_at_eos=False)
    assert C.cache_stats()["compilations"] == before


def _zero_output_hook(module_of):
    def register(hf):
        return module_of(hf).register_forward_hook(lambda module, args, out: torch.zeros_like(out))
    return register


def test_an_edit_naming_a_head_among_other_sites_acts_on_the_head(gpt2):
    # An edit is applied to the step built with per-head nodes: on the fused step the list of
    # sites would match 'h1.mlp' alone and skip 'h1.attn.head2' without a word (this test fails
    # if generate builds an edited step fused).
    hf, m = gpt2
    prompt = rng_tokens(20, 6)  # a prompt whose tokens the head's ablation changes (many do not)

    def zero(sites):
        return lambda c: c.update(sites, lambda n: C.Array(np.zeros(n.shape), name=f"{n.name}.zero"))

    got = m.generate(prompt, 10, edit=zero(["h1.attn.head2", "h1.mlp"]), stop_at_eos=False)
    want = _hf_generate(hf, prompt, 10, [_zero_head_hook(lambda h: h.transformer.h[1].attn.c_proj, 2, 8),
                                         _zero_output_hook(lambda h: h.transformer.h[1].mlp)])
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, m.generate(prompt, 10, edit=zero(["h1.mlp"]), stop_at_eos=False))


def test_a_kept_step_program_serves_only_the_circuit_it_was_built_for(gpt2, monkeypatch):
    # Step programs are kept under the hash of the circuit an edit returns, never under the
    # function: the same function returning another circuit (its vector changed in place, a head
    # ablation switched on) gets a program of its own, each result equal to its torch hook.
    from circuits.models import generate as G

    hf, m = gpt2
    built = []
    real = G.StepProgram.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(G.StepProgram, "__init__", counted)
    prompt = rng_tokens(19, 5)
    v = np.random.default_rng(3).normal(size=32) * 3
    state = {"head": False}

    def edit(c):
        c = c.update("h0", lambda n: C.Add(n, C.Array(v, name="steer")))
        return interp.ablate(c, "h1.attn.head2") if state["head"] else c

    steer = lambda: _add_hook(lambda h: h.transformer.h[0], v)  # noqa: E731
    first = m.generate(prompt, 8, edit=edit, stop_at_eos=False)
    np.testing.assert_array_equal(first, _hf_generate(hf, prompt, 8, [steer()]))
    assert len(built) == 1
    np.testing.assert_array_equal(m.generate(prompt, 8, edit=edit, stop_at_eos=False), first)
    assert len(built) == 1  # the same circuit: the kept program
    v *= -1  # the closure's vector changed in place
    turned = m.generate(prompt, 8, edit=edit, stop_at_eos=False)
    np.testing.assert_array_equal(turned, _hf_generate(hf, prompt, 8, [steer()]))
    assert not np.array_equal(turned, first) and len(built) == 2
    state["head"] = True
    headless = m.generate(prompt, 8, edit=edit, stop_at_eos=False)
    np.testing.assert_array_equal(headless, _hf_generate(
        hf, prompt, 8, [steer(), _zero_head_hook(lambda h: h.transformer.h[1].attn.c_proj, 2, 8)]))
    assert not np.array_equal(headless, turned) and len(built) == 3


def test_position_masked_edit_acts_at_absolute_positions(gpt2):
    hf, m = gpt2
    prompt = rng_tokens(16, 5)
    v = np.random.default_rng(1).normal(size=32) * 4
    at = [2, 7]  # one position in the prompt, one the generation computes

    def edit(c):
        mask = position_mask(c, at, context=m.context, dtype="float64")
        return c.update("h0", lambda n: C.Add(n, C.Einsum.from_spec("s,d->sd", mask, C.Array(v, name="v"))))

    got = m.generate(prompt, 8, edit=edit, stop_at_eos=False)
    want = _hf_generate(hf, prompt, 8, [_add_hook(lambda h: h.transformer.h[0], v, positions=set(at))])
    np.testing.assert_array_equal(got, want)
    # the same edit on the full circuit: greedy decoding of the edited circuit, token by token
    seq = list(prompt)
    for _ in range(8):
        seq.append(int(np.argmax(C.evaluate(edit(m.circuit(np.array(seq))), dtype="float64")[-1])))
    np.testing.assert_array_equal(got, seq)


def _greedy_full(m, prompt, n, edit):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(C.evaluate(edit(m.circuit(np.array(seq))), dtype="float64")[-1])))
    return np.array(seq)


def test_a_patch_and_a_spliced_sae_apply_to_every_step(gpt2):
    from circuits.interp.sae import SAE

    _, m = gpt2
    prompt = rng_tokens(17, 4)
    w2 = np.random.default_rng(2).normal(size=(32, 128)) * 0.3
    patch = lambda c: interp.patch(c, "h1.mlp", {"h1.mlp.c_fc.weight": w2.astype(np.float32)})  # noqa: E731
    got = m.generate(prompt, 6, edit=patch, stop_at_eos=False)
    np.testing.assert_array_equal(got, _greedy_full(m, prompt, 6, patch))
    assert not np.array_equal(got, m.generate(prompt, 6, stop_at_eos=False))
    sae = SAE.random(32, 64, "standard", seed=0)
    spliced = lambda c: interp.splice(c, "h0", sae)  # noqa: E731
    np.testing.assert_array_equal(m.generate(prompt, 6, edit=spliced, stop_at_eos=False),
                                  m.generate(prompt, 6, stop_at_eos=False))  # an error node: the value unchanged
    off = lambda c: interp.ablate(interp.splice(c, "h0", sae), "h0.sae.acts")  # noqa: E731
    np.testing.assert_array_equal(m.generate(prompt, 6, edit=off, stop_at_eos=False), _greedy_full(m, prompt, 6, off))


def test_bad_edits_and_arguments_are_refused(gpt2):
    _, m = gpt2
    with pytest.raises(C.CircuitError, match="edit must return a circuit"):
        m.generate([1, 2, 3], 2, edit=lambda c: None)
    with pytest.raises(C.CircuitError, match="Symbol"):
        m.generate([1, 2, 3], 2, edit=lambda c: c.update("h0", lambda n: C.Add(n, C.Symbol((32,), name="v"))))
    with pytest.raises(C.CircuitError, match="max_new_tokens"):
        m.generate([1, 2, 3], -1)
    with pytest.raises(C.CircuitError, match=r"\[0, 331\)"):
        m.generate([1, VOCAB], 2)
    with pytest.raises(C.CircuitError, match="absolute positions"):
        position_mask(m.circuit([1, 2]), [-1], context=m.context)
