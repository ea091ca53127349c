"""SAEs: every architecture against a numpy version written here (SAELens's formulas), the SAELens
on-disk layout written by hand here (6.x and pre-6.0 configs), and clear errors."""

import json

import attrs
import numpy as np
import pytest
from safetensors.numpy import save_file

from circuits.errors import CircuitError, ShapeError
from circuits.interp import SAE, load_sae, save_sae
from circuits.interp.sae import ARCHITECTURES


# ---------------------------------------------------------------------------- the numpy oracle
def np_normalise(x, mode):
    if mode == "none":
        return x, lambda y: y
    if mode == "constant_norm_rescale":
        c = np.sqrt(x.shape[-1]) / np.linalg.norm(x, axis=-1, keepdims=True)
        return x * c, lambda y: y / c
    mu = x.mean(-1, keepdims=True)
    sd = (x - mu).std(-1, ddof=1, keepdims=True)
    return (x - mu) / (sd + 1e-5), lambda y: y * sd + mu


def np_encode(sae, x):
    t = {k: np.asarray(v, np.float64) if isinstance(v, np.ndarray) else v for k, v in attrs_dict(sae).items()}
    xn, _ = np_normalise(x, sae.normalize_activations)
    z = xn - t["b_dec"] if sae.apply_b_dec_to_input and not sae.is_transcoder else xn
    a = sae.architecture
    if a == "gated":
        g = z @ t["W_enc"] + t["b_gate"]
        m = z @ (t["W_enc"] * np.exp(t["r_mag"])) + t["b_mag"]
        return (g > 0) * np.maximum(m, 0)
    w_enc, b_enc = t["W_enc"], t["b_enc"]
    if a in ("topk", "abstopk") and sae.rescale_acts_by_decoder_norm:
        n = np.linalg.norm(t["W_dec"], axis=1)
        w_enc, b_enc = w_enc * n, b_enc * n
    h = z @ w_enc + b_enc
    if a in ("standard", "transcoder", "skip_transcoder"):
        return np.maximum(h, 0)
    if a.startswith("jumprelu"):
        return np.maximum(h, 0) * (h > t["threshold"])
    key = np.abs(h) if a == "abstopk" else h
    idx = np.argsort(-key, axis=-1, kind="stable")[..., : sae.k]
    mask = np.zeros_like(h)
    np.put_along_axis(mask, idx, 1.0, axis=-1)
    return (h if a == "abstopk" else np.maximum(h, 0)) * mask


def np_decode(sae, f, x):
    t = {k: np.asarray(v, np.float64) if isinstance(v, np.ndarray) else v for k, v in attrs_dict(sae).items()}
    w_dec = t["W_dec"]
    if sae.architecture in ("topk", "abstopk") and sae.rescale_acts_by_decoder_norm:
        w_dec = w_dec / np.linalg.norm(w_dec, axis=1, keepdims=True)
    y = f @ w_dec + t["b_dec"]
    if sae.is_transcoder:
        return y + (x @ t["W_skip"].T if "skip" in sae.architecture else 0)
    _, undo = np_normalise(x, sae.normalize_activations)
    return undo(y)


def attrs_dict(sae):
    return {k: getattr(sae, k) for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold", "b_gate", "b_mag", "r_mag",
                                         "W_skip")}


VARIANTS = [
    ("standard", {}), ("standard", {"apply_b_dec_to_input": False}),
    ("standard", {"normalize_activations": "constant_norm_rescale"}),
    ("standard", {"normalize_activations": "layer_norm"}),
    ("topk", {"k": 3}), ("topk", {"k": 3, "rescale_acts_by_decoder_norm": True}), ("abstopk", {"k": 4}),
    ("jumprelu", {}), ("gated", {}),
    ("transcoder", {}), ("skip_transcoder", {}), ("jumprelu_transcoder", {}), ("jumprelu_skip_transcoder", {}),
]


def make(arch, kw, seed=0, d_in=6, d_sae=20):
    kw = dict(kw)
    k = kw.pop("k", None)
    d_out = 5 if "transcoder" in arch else None
    sae = SAE.random(d_in, d_sae, arch, k=k, d_out=d_out, seed=seed, dtype="float64", **kw)
    if "rescale_acts_by_decoder_norm" in kw:  # decoder rows of norms != 1, so the rescaling matters
        sae = attrs.evolve(sae, W_dec=sae.W_dec * np.linspace(0.5, 2.0, d_sae)[:, None])
    return sae


@pytest.mark.parametrize("arch,kw", VARIANTS, ids=[f"{a}-{'-'.join(map(str, k.values())) or 'default'}" for a, k in VARIANTS])
def test_encode_decode_match_numpy(arch, kw):
    sae = make(arch, kw)
    x = np.random.default_rng(1).standard_normal((3, 4, 6))
    f = sae.encode(x)
    want = np_encode(sae, x)
    assert f.shape == (3, 4, 20)
    np.testing.assert_allclose(f, want, atol=1e-12)
    assert (want != 0).any() and (want == 0).any()  # the activation really is sparse here
    np.testing.assert_allclose(sae.decode(f, x=x), np_decode(sae, want, x), atol=1e-12)


def test_repr_names_sizes_and_hooks_not_tensors():
    topk = attrs.evolve(make("topk", {"k": 3}), hook_name="blocks.1.hook_resid_pre")
    assert repr(topk) == "<SAE topk k=3 6 -> 20 latents -> 6 at 'blocks.1.hook_resid_pre', float64>"
    tc = attrs.evolve(make("transcoder", {}), hook_name="blocks.0.ln2.hook_normalized", hook_name_out="blocks.0.hook_mlp_out")
    assert repr(tc) == ("<SAE transcoder 6 -> 20 latents -> 5 at 'blocks.0.ln2.hook_normalized' -> "
                        "'blocks.0.hook_mlp_out', float64>")


def test_jumprelu_threshold_is_strict():
    sae = SAE.random(2, 3, "jumprelu", dtype="float64", apply_b_dec_to_input=False)
    sae = SAE(architecture="jumprelu", W_enc=np.eye(2, 3), W_dec=np.eye(3, 2), b_dec=np.zeros(2), b_enc=np.zeros(3),
              threshold=np.array([0.5, 0.5, 0.5]), apply_b_dec_to_input=False, dtype="float64")
    assert sae.encode(np.array([[0.5, 0.75]])).tolist() == [[0.0, 0.75, 0.0]]


def write_saelens_dir(path, cfg, tensors):
    path.mkdir(parents=True, exist_ok=True)
    (path / "cfg.json").write_text(json.dumps(cfg))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path / "sae_weights.safetensors"))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_load_a_saelens_directory_written_by_hand(arch, tmp_path):
    """The files as SAELens 6 writes them (cfg.to_dict() keys, state-dict tensor names)."""
    ref = make(arch, {"k": 3} if "topk" in arch else {}, seed=3)
    cfg = {"architecture": arch, "d_in": ref.d_in, "d_sae": ref.d_sae, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": arch in ("standard", "topk", "abstopk", "jumprelu", "gated"),
           "normalize_activations": "none", "reshape_activations": "none",
           "metadata": {"hook_name": "blocks.0.hook_resid_post", "model_name": "x", "sae_lens_version": "6.5.1"}}
    if "transcoder" in arch:
        cfg["d_out"] = ref.d_out
        cfg["metadata"]["hook_name_out"] = "blocks.0.hook_mlp_out"
    if "topk" in arch:
        cfg.update(k=3, rescale_acts_by_decoder_norm=False)
    write_saelens_dir(tmp_path, cfg, {k: v.astype(np.float32) for k, v in ref.tensors().items()})
    sae = load_sae(tmp_path)
    assert sae.architecture == arch and sae.hook_name == "blocks.0.hook_resid_post" and sae.dtype == "float32"
    x = np.random.default_rng(2).standard_normal((5, ref.d_in)).astype(np.float32)
    np.testing.assert_allclose(sae.encode(x), np_encode(sae, x.astype(np.float64)), atol=1e-4)
    # save_sae writes what load_sae (and SAELens) read back: same cfg keys, same tensors
    save_sae(sae, tmp_path / "again")
    again = load_sae(tmp_path / "again")
    for k, v in sae.tensors().items():
        np.testing.assert_array_equal(getattr(again, k), v)
    written = json.loads((tmp_path / "again" / "cfg.json").read_text())
    assert {k: written[k] for k in ("architecture", "d_in", "d_sae", "apply_b_dec_to_input")} == \
        {k: cfg[k] for k in ("architecture", "d_in", "d_sae", "apply_b_dec_to_input")}


def test_pre_6_config(tmp_path):
    ref = make("jumprelu", {}, seed=4)
    cfg = {"d_in": 6, "d_sae": 20, "hook_point": "blocks.1.hook_resid_pre", "activation_fn_str": "relu",
           "apply_b_dec_to_input": True, "normalize_activations": False, "dtype": "torch.float32",
           "architecture": "jumprelu"}
    t = {k: v.astype(np.float32) for k, v in ref.tensors().items()}
    t["log_threshold"] = np.log(t.pop("threshold"))
    write_saelens_dir(tmp_path, cfg, t)
    sae = load_sae(tmp_path)
    assert sae.hook_name == "blocks.1.hook_resid_pre" and sae.normalize_activations == "none"
    np.testing.assert_allclose(sae.threshold, ref.threshold, rtol=1e-6)
    topk_cfg = {"d_in": 6, "d_sae": 20, "hook_point": "h", "activation_fn_str": "topk",
                "activation_fn_kwargs": {"k": 5}}
    std = make("standard", {}, seed=5)
    write_saelens_dir(tmp_path / "t", topk_cfg, {k: v.astype(np.float32) for k, v in std.tensors().items()})
    assert (load_sae(tmp_path / "t").architecture, load_sae(tmp_path / "t").k) == ("topk", 5)


def test_errors(tmp_path):
    ref = make("standard", {})
    write_saelens_dir(tmp_path / "a", {"architecture": "matching_pursuit", "d_in": 6, "d_sae": 20},
                      {k: v.astype(np.float32) for k, v in ref.tensors().items()})
    with pytest.raises(CircuitError, match="matching_pursuit.*not supported"):
        load_sae(tmp_path / "a")
    t = {k: v.astype(np.float32) for k, v in ref.tensors().items() if k != "b_enc"}
    write_saelens_dir(tmp_path / "b", {"architecture": "standard", "d_in": 6, "d_sae": 20}, t)
    with pytest.raises(CircuitError, match="lacks 'b_enc'"):
        load_sae(tmp_path / "b")
    with pytest.raises(CircuitError, match="cfg.json is missing"):
        load_sae(tmp_path / "nowhere")
    write_saelens_dir(tmp_path / "c", {"architecture": "standard", "d_in": 6, "d_sae": 20,
                                       "normalize_activations": "expected_average_only_in"},
                      {k: v.astype(np.float32) for k, v in ref.tensors().items()})
    with pytest.raises(CircuitError, match="scaling factor"):
        load_sae(tmp_path / "c")
    write_saelens_dir(tmp_path / "d", {"architecture": "standard", "d_in": 7, "d_sae": 20},
                      {k: v.astype(np.float32) for k, v in ref.tensors().items()})
    with pytest.raises(ShapeError, match="d_in=7"):
        load_sae(tmp_path / "d")
    with pytest.raises(ShapeError, match="'b_dec' has shape"):
        SAE(architecture="standard", W_enc=ref.W_enc, W_dec=ref.W_dec, b_enc=ref.b_enc, b_dec=np.zeros(3))
    with pytest.raises(CircuitError, match="needs k"):
        SAE(architecture="topk", W_enc=ref.W_enc, W_dec=ref.W_dec, b_enc=ref.b_enc, b_dec=ref.b_dec)
