"""The shipped induction model and a GPT-2-shaped model as TransformerLens ``HookedTransformer``s
with our weights, for the side-by-side benchmarks (``bench_autocircuit``, ``bench_latency_tl``).

TransformerLens and auto-circuit live in their own environment (they pin numpy < 2 and old
``datasets``), never in the project's ``.venv``; ``require()`` stops with the recipe when they
are missing.  The environment used for BENCHMARKS.md (Python 3.11, CPU; the pins other than the
issue's are what jax 0.10.2's numpy >= 2 needs)::

    python3.11 -m venv /work/ac-env
    /work/ac-env/bin/pip install torch==2.13.0 "transformer-lens<3" "datasets<2.20" "pyarrow<16"
    /work/ac-env/bin/pip install auto-circuit==1.0.1 --no-deps
    /work/ac-env/bin/pip install ordered-set plotly einops blobfile word2word
    /work/ac-env/bin/pip install vscode-tqdm --no-deps
    /work/ac-env/bin/pip install -e . jax==0.10.2 jaxlib==0.10.2   # this repository: numpy 2
    /work/ac-env/bin/pip install "pandas>=2.2.3,<2.3" pyarrow==17.0.0  # numpy-2 builds

then, from a worktree root: ``/work/ac-env/bin/python -m benchmarks.bench_autocircuit``.
"""

from __future__ import annotations

import sys

import numpy as np

ENV_RECIPE = __doc__[__doc__.index("    python3.11"): __doc__.index("then, from")].rstrip()


SKIPPED = 77  # the exit status of a benchmark that cannot run here (``run_all`` skips it)


def require(*modules: str) -> None:
    """Exit (status ``SKIPPED``) with the environment recipe when one of ``modules`` does not
    import."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            main = getattr(sys.modules["__main__"], "__spec__", None)
            module = main.name if main is not None else "benchmarks.<name>"
            print(f"{name} is not importable here ({e}). This benchmark runs in its own environment "
                  f"(never the project's .venv); build it with:\n\n{ENV_RECIPE}\n\nand run it as "
                  f"`/work/ac-env/bin/python -m {module}` from a worktree root.", file=sys.stderr)
            raise SystemExit(SKIPPED)


def hooked_induction(weights: dict, *, edges: bool = False):
    """The seed architecture in TransformerLens, exactly: attention only, LayerNorm before each
    layer and the unembedding, positions added to the normalised stream for queries and keys
    only (``positional_embedding_type='shortformer'``), no biases.  ``edges=True`` turns on what
    auto-circuit's edge graph needs (``use_attn_result``, ``use_split_qkv_input``).

    Input: the seed layout's positions, ``tokens[:-2]``; ``model(tokens[:-2])[0]`` equals
    ``attn_only(weights, tokens, logits=True)``."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    heads, head_size, d_model = weights["a0.w.q"].shape
    layers = 0
    while f"a{layers}.w.q" in weights:
        layers += 1
    cfg = HookedTransformerConfig(
        n_layers=layers, d_model=d_model, n_ctx=weights["t.w.pos_embeds"].shape[0], d_head=head_size,
        n_heads=heads, d_vocab=weights["t.w.tok_embeds"].shape[0], attn_only=True, normalization_type="LN",
        positional_embedding_type="shortformer", default_prepend_bos=False, device="cpu", seed=0,
        use_attn_result=edges, use_split_qkv_input=edges)
    model = HookedTransformer(cfg)
    t = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in weights.items()}
    sd = model.state_dict()
    for k in sd:
        if k.endswith(("b_Q", "b_K", "b_V", "b_O", "b_U")):
            sd[k] = torch.zeros_like(sd[k])
    sd["embed.W_E"] = t["t.w.tok_embeds"]
    sd["pos_embed.W_pos"] = t["t.w.pos_embeds"]
    for l in range(layers):
        sd[f"blocks.{l}.ln1.w"], sd[f"blocks.{l}.ln1.b"] = t[f"a{l}.ln.w.scale"], t[f"a{l}.ln.w.bias"]
        for k in "qkv":  # ours [heads, head_size, d_model] -> TL [heads, d_model, head_size]
            sd[f"blocks.{l}.attn.W_{k.upper()}"] = t[f"a{l}.w.{k}"].transpose(1, 2)
        sd[f"blocks.{l}.attn.W_O"] = t[f"a{l}.w.o"].transpose(1, 2)  # [heads, head_size, d_model]
    sd["ln_final.w"], sd["ln_final.b"] = t["final.ln.w.scale"], t["final.ln.w.bias"]
    sd["unembed.W_U"] = t["t.w.unembed"].T
    model.load_state_dict(sd)
    return model.eval()


def hooked_gpt2(hf_model, **cfg):
    """A ``transformers`` GPT-2 as a TransformerLens ``HookedTransformer`` with the same weights
    (TransformerLens' own conversion, without folding or centring, so hooks see the HF values)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf_model.config
    tl_cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions, d_head=c.n_embd // c.n_head,
        n_heads=c.n_head, d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, act_fn="gelu_new",
        normalization_type="LN", eps=c.layer_norm_epsilon, default_prepend_bos=False, device="cpu",
        seed=0, **cfg)
    model = HookedTransformer(tl_cfg)
    model.load_state_dict(convert_gpt2_weights(hf_model, tl_cfg), strict=False)
    return model.eval()
