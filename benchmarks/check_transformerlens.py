"""Agreement with TransformerLens itself (not a timing): the hook names, the logit lens, direct
logit attribution and the patching grids of ``circuits.interp`` against TransformerLens's
``ActivationCache`` and ``patching`` functions on the same weights.

The tests check the same things against hand-written torch hooks and numpy written as
TransformerLens's functions (``tests/interp``), so they run without TransformerLens; this script
closes the loop against the library itself, in its own environment (``benchmarks/tl_models.py``)::

    /work/ac-env/bin/python -m benchmarks.check_transformerlens     # from a worktree root

Two models: the shipped induction model (``hooked_induction``: attention only, shortformer
positions) and a random GPT-2-shaped ``transformers`` model (``hooked_gpt2``: TransformerLens's own
weight conversion, no folding). For each it prints the largest absolute difference of

- every hook TransformerLens's cache and ``run_with_cache`` both have, under its hook name;
- ``logit_lens(layer_norm='freeze')`` against ``cache.apply_ln_to_stack`` of
  ``cache.accumulated_resid()`` (the final LayerNorm's scale from the model's own final residual;
  its weight and bias, the unembedding and its bias applied after), and ``'recompute'`` against
  ``cache.accumulated_resid(apply_ln=True)`` (TransformerLens 2.18 applies ``ln_final`` afresh to
  each stage there) and ``model.ln_final`` applied to each stage;
- ``logit_attribution`` per head against ``cache.stack_head_results(apply_ln=True)`` (embeddings
  and MLPs against ``cache.decompose_resid(apply_ln=True)``), each read through the final
  LayerNorm's weight and ``W_U @ direction``, and the terms' sum against ``direction . logits``;
- (induction model) ``residual_patch_grid``, ``head_patch_grid`` and
  ``head_patch_grid(by_position=False)`` against ``get_act_patch_resid_pre``,
  ``get_act_patch_attn_head_out_by_pos`` and ``get_act_patch_attn_head_out_all_pos``;

and exits 1 if one is above its tolerance (float32 throughout: 1e-3 on logits, 1e-4 elsewhere
relative to the largest value).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from benchmarks.tl_models import require

FAILED: list[str] = []
os.environ.setdefault("TQDM_DISABLE", "1")  # TransformerLens's patching loops' progress bars


def _report(what: str, got, want, tol: float = 1e-4) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        FAILED.append(what)
        print(f"  {what:60s} SHAPE {got.shape} vs {want.shape}")
        return
    gap = float(np.abs(got - want).max()) if got.size else 0.0
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    ok = gap <= tol * scale
    if not ok:
        FAILED.append(what)
    print(f"  {what:60s} {gap:.1e} {'ok' if ok else 'OVER ' + f'{tol * scale:.0e}'}")


def _hooks(ours, tl_cache) -> None:
    from circuits.select.hooks import hook_names

    names = [n for n in hook_names(ours.circuit) if n in tl_cache]
    missing = sorted(set(tl_cache) - set(names))
    for n in names:
        want = tl_cache[n].numpy()
        if n.endswith("hook_attn_scores"):  # masked scores: -10000 here, -inf there (documented)
            masked = np.isneginf(want)
            assert (ours[n][masked] <= -1e4).all(), n
            want = np.where(masked, ours[n], want)
        _report(n, ours[n], want, 1e-4)
    print(f"  {len(names)} hook names compared; TransformerLens hooks we have no node for: {missing}")


def _lens_and_attribution(circuit, inputs, model, cache, tl_logits, direction, labels) -> None:
    import torch

    from circuits.interp import logit_attribution, logit_lens

    torch.set_grad_enabled(False)
    w_u, b_u = model.W_U.detach(), model.b_U.detach()
    w, b = model.ln_final.w.detach(), model.ln_final.b.detach()
    raw = cache.accumulated_resid(apply_ln=False)  # [stages, batch, pos, d]
    frozen_stack = cache.apply_ln_to_stack(raw, layer=None)  # centred, / ln_final.hook_scale: no weight, no bias
    fresh_stack = cache.accumulated_resid(apply_ln=True)  # (TransformerLens 2.18: ln_final applied afresh at the unembed)
    frozen = logit_lens(circuit, inputs, layer_norm="freeze")
    fresh = logit_lens(circuit, inputs, layer_norm="recompute")
    assert len(frozen) == raw.shape[0], (list(frozen), raw.shape)
    for (key, got), stage, r, again in zip(frozen.items(), frozen_stack, raw, fresh_stack):
        _report(f"logit_lens freeze {key!r} (apply_ln_to_stack)", got, ((stage * w + b) @ w_u + b_u).numpy(), 1e-4)
        _report(f"logit_lens recompute {key!r} (accumulated_resid)", fresh[key], (again @ w_u + b_u).numpy(), 1e-4)
        _report(f"logit_lens recompute {key!r} (ln_final)", fresh[key], (model.ln_final(r) @ w_u + b_u).numpy(), 1e-4)
    _report("logit_lens last stage = logits", list(frozen.values())[-1], tl_logits.numpy(), 1e-4)

    dla = logit_attribution(circuit, direction, inputs)
    u = (w[:, None] * w_u) @ torch.from_numpy(direction.astype(np.float32))  # [d]: the readout of a centred, scaled term
    per_head, head_labels = cache.stack_head_results(apply_ln=True, return_labels=True)
    for stack, label in zip(per_head, head_labels):  # 'L0H2'
        layer, head = label[1:].split("H")
        _report(f"logit_attribution {labels['head'].format(l=layer, h=head)!r}", dla[labels['head'].format(l=layer, h=head)],
                (stack @ u).numpy(), 1e-4)
    parts, part_labels = cache.decompose_resid(apply_ln=True, return_labels=True)
    # the embeddings in the residual stream (shortformer positions are not: decompose_resid lists them anyway)
    kept = ("embed",) if model.cfg.positional_embedding_type == "shortformer" else ("embed", "pos_embed")
    embeds = sum(p for p, lab in zip(parts, part_labels) if lab in kept)
    _report("logit_attribution 'embeds'", dla["embeds"], (embeds @ u).numpy(), 1e-4)
    for p, lab in zip(parts, part_labels):
        if lab.endswith("_mlp_out"):
            name = labels["mlp"].format(l=lab.split("_")[0])
            _report(f"logit_attribution {name!r}", dla[name], (p @ u).numpy(), 1e-4)
    total = (tl_logits.numpy() * direction).sum(-1)
    _report(f"logit_attribution: {len(dla)} terms sum to direction . logits", sum(dla.values()), total, 1e-4)
    assert all(v.shape == total.shape for v in dla.values())


def induction() -> None:
    import torch
    from transformer_lens import patching

    from benchmarks.tl_models import hooked_induction
    from circuits.interp import head_patch_grid, residual_patch_grid, run_with_cache
    from circuits.models import attn_only, induction_tokens, induction_weights, tokens_symbol

    print("the shipped induction model (TransformerLens: attn_only, shortformer positions)")
    w = induction_weights()
    toks = induction_tokens(4, seed=0)[:, :32]
    model = hooked_induction(w)
    with torch.no_grad():
        tl_logits, cache = model.run_with_cache(torch.from_numpy(toks))
    logits = attn_only(w, tokens_symbol(32), layout="next_token", logits=True, unique_names=True)
    inputs = {"toks_int_var": toks}
    _hooks(run_with_cache(logits, inputs), cache)
    direction = np.eye(w["t.w.unembed"].shape[0])[7] - np.eye(w["t.w.unembed"].shape[0])[12]
    _lens_and_attribution(logits, inputs, model, cache, tl_logits, direction,
                          {"head": "b{l}.a.head{h}", "mlp": "-"})

    clean = induction_tokens(4, seed=1)[:, :33]
    corrupt = clean.copy()
    corrupt[:, 1:17] = np.random.default_rng(2).integers(1, 64, (4, 16))
    loss = attn_only(w, tokens_symbol(33), layout="next_token", unique_names=True)
    ct, xt = torch.from_numpy(clean[:, :-1]), torch.from_numpy(corrupt[:, :-1])
    targets = torch.from_numpy(corrupt[:, 1:])
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(ct)

    def metric(out):  # the summed per-token loss against the corrupted run's targets, mean over prompts
        logp = torch.log_softmax(out, -1)
        return -logp.gather(-1, targets[..., None])[..., 0].sum(-1).mean()

    src, at = {"toks_int_var": clean}, {"toks_int_var": corrupt}
    with torch.no_grad():
        _report("residual_patch_grid vs get_act_patch_resid_pre", residual_patch_grid(loss, src, inputs=at).mean(0),
                patching.get_act_patch_resid_pre(model, xt, clean_cache, metric).numpy())
        _report("head_patch_grid vs get_act_patch_attn_head_out_by_pos", head_patch_grid(loss, src, inputs=at).mean(0),
                patching.get_act_patch_attn_head_out_by_pos(model, xt, clean_cache, metric).numpy())
        _report("head_patch_grid(by_position=False) vs ..._all_pos",
                head_patch_grid(loss, src, inputs=at, by_position=False).mean(0),
                patching.get_act_patch_attn_head_out_all_pos(model, xt, clean_cache, metric).numpy())


def gpt2_shaped() -> None:
    import torch
    import transformers

    from benchmarks.tl_models import hooked_gpt2
    from circuits.interp import run_with_cache
    from circuits.models.model import Model

    print("a random GPT-2-shaped model (TransformerLens's GPT-2 weight conversion, not folded)")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, n_positions=64, vocab_size=97,
                                  activation_function="gelu_new")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # biases and LayerNorm weights away from their 0 and 1 initial values
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model = hooked_gpt2(hf)
    toks = np.random.default_rng(0).integers(0, 97, (3, 9))
    with torch.no_grad():
        tl_logits, cache = model.run_with_cache(torch.from_numpy(toks))
    m = Model(dict(cfg.to_dict(), model_type="gpt2"), {k: v.detach().numpy() for k, v in hf.state_dict().items()})
    circuit, inputs = m.circuit(toks, prepend_bos=False), m.inputs(toks, prepend_bos=False)  # a batch: Symbol "tokens"
    _hooks(run_with_cache(circuit, inputs), cache)
    direction = np.eye(97)[5] - np.eye(97)[11]
    _lens_and_attribution(circuit, inputs, model, cache, tl_logits, direction,
                          {"head": "h{l}.attn.head{h}", "mlp": "h{l}.mlp"})


def main() -> None:
    require("transformer_lens", "torch", "transformers")
    induction()
    gpt2_shaped()
    print("FAILED: " + ", ".join(FAILED) if FAILED else "all agree")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
