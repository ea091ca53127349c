"""Hand-written PyTorch baselines for the interactive-latency benchmark: what a researcher with
plain torch (no library) runs for one experiment.

- ``TorchAttnOnly``: the seed's attention-only model (the shipped induction model's math), one
  eager forward per experiment, heads batched; a head's output can be zeroed or replaced, and a
  layer-1 head's q, k or v input can read a patched residual stream (exact path patching).
- ``gpt2_head_hooks``: forward pre-hooks on a ``transformers`` GPT-2's ``attn.c_proj`` that
  replace one head's slice of the merged heads: the hook loop TransformerLens users write.
"""

from __future__ import annotations

import numpy as np
import torch


def _ln(x, scale, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    return xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + eps) * scale + bias


class TorchAttnOnly:
    """The seed model in torch (float32, eager): ``loss(tokens, ...)`` is the per-token loss."""

    def __init__(self, weights: dict, n_layers: int = 2, device: str = "cpu"):
        self.device = torch.device(device)
        self.w = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in weights.items()}
        self.n_layers = n_layers

    def _tokens(self, tokens):
        return torch.as_tensor(np.asarray(tokens), device=self.device)

    def _attend(self, l, qk_in, v_in, n):
        w = self.w
        spec = "hsd,hcd->hsc" if qk_in[0].dim() == 3 else "sd,hcd->hsc"
        q = torch.einsum(spec, qk_in[0], w[f"a{l}.w.q"])
        k = torch.einsum(spec if qk_in[1].dim() == 3 else "sd,hcd->hsc", qk_in[1], w[f"a{l}.w.k"])
        v = torch.einsum(spec if v_in.dim() == 3 else "sd,hcd->hsc", v_in, w[f"a{l}.w.v"])
        mask = self.mask[:n, :n]
        scores = torch.einsum("hqc,hkc->hqk", q, k) * q.shape[-1] ** -0.5
        probs = torch.softmax(scores * mask - 10000.0 * (1 - mask), -1)
        return torch.einsum("hqk,hkc,hdc->hqd", probs, v, w[f"a{l}.w.o"])

    @property
    def mask(self):
        return self.w["t.a.c.causal_mask"]

    def _forward(self, tokens, ablate=None, deltas=False):
        """Per-layer head outputs, the final residual, and (``deltas=True``) a zero added to each
        layer's head outputs whose gradient is the metric's gradient with respect to them."""
        w = self.w
        toks = self._tokens(tokens)
        inp = toks[:-2]
        n = inp.shape[0]
        x = w["t.w.tok_embeds"][inp]
        pos = w["t.w.pos_embeds"][:n]
        outs, zeros = [], []
        for l in range(self.n_layers):
            h = _ln(x, w[f"a{l}.ln.w.scale"], w[f"a{l}.ln.w.bias"])
            out = self._attend(l, (h + pos, h + pos), h, n)
            if ablate is not None and ablate[0] == l:
                out = out.clone()
                out[ablate[1]] = 0
            if deltas:
                zeros.append(torch.zeros_like(out, requires_grad=True))
                out = out + zeros[-1]
            outs.append(out)
            x = x + out.sum(0)
        return outs, x, zeros

    @torch.no_grad()
    def head_outputs(self, tokens, ablate=None):
        """Per-layer head outputs ``[heads, positions, d_model]`` and the final residual."""
        outs, x, _ = self._forward(tokens, ablate)
        return outs, x

    def _loss(self, tokens, x):
        w = self.w
        toks = self._tokens(tokens)
        logits = _ln(x, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T
        lp = torch.log_softmax(logits, -1)
        return -lp.gather(1, toks[1:-1, None])[:, 0]

    @torch.no_grad()
    def loss_from(self, tokens, x):
        return self._loss(tokens, x)

    def head_gradients(self, tokens):
        """Head outputs (detached) and d(total loss)/d(head outputs), per layer: one forward and
        one backward pass (what attribution patching needs)."""
        with torch.enable_grad():
            outs, x, zeros = self._forward(tokens, deltas=True)
            grads = torch.autograd.grad(self._loss(tokens, x).sum(), zeros)
        return [o.detach() for o in outs], grads

    @torch.no_grad()
    def ablated_loss(self, tokens, layer, head):
        """One forward with one head's output zeroed."""
        return self.loss_from(tokens, self.head_outputs(tokens, ablate=(layer, head))[1])

    @torch.no_grad()
    def path_patched_loss(self, tokens, corrupted_tokens, sender, receiver_head, role):
        """Exact path patching of layer-0 head ``sender`` into layer-1 head ``receiver_head``'s
        ``role`` ('q', 'k' or 'v') input: the corrupted run, then the patched forward."""
        w = self.w
        corrupted, _ = self.head_outputs(corrupted_tokens)
        toks = self._tokens(tokens)
        inp = toks[:-2]
        n = inp.shape[0]
        x = w["t.w.tok_embeds"][inp]
        pos = w["t.w.pos_embeds"][:n]
        h0 = _ln(x, w["a0.ln.w.scale"], w["a0.ln.w.bias"])
        out0 = self._attend(0, (h0 + pos, h0 + pos), h0, n)
        x1 = x + out0.sum(0)
        patched = x1 + corrupted[0][sender] - out0[sender]
        heads = w["a1.w.q"].shape[0]
        clean_in = _ln(x1, w["a1.ln.w.scale"], w["a1.ln.w.bias"])
        patched_in = _ln(patched, w["a1.ln.w.scale"], w["a1.ln.w.bias"])
        per_head = [clean_in.expand(heads, *clean_in.shape).clone() for _ in range(3)]
        per_head["qkv".index(role)][receiver_head] = patched_in
        out1 = self._attend(1, (per_head[0] + pos, per_head[1] + pos), per_head[2], n)
        return self.loss_from(tokens, x1 + out1.sum(0))


def gpt2_head_hooks(model, layer: int, head: int, replacement: torch.Tensor):
    """Hooks replacing head ``head`` of layer ``layer`` (its slice of ``attn.c_proj``'s input,
    the merged heads) by ``replacement`` ``[positions, head_size]``; returns the handle."""
    attn = model.transformer.h[layer].attn
    size = attn.head_dim

    def hook(module, args):
        merged = args[0].clone()
        merged[0, :, head * size:(head + 1) * size] = replacement
        return (merged,)

    return attn.c_proj.register_forward_pre_hook(hook)


def gpt2_merged_heads(model, tokens) -> list:
    """Every layer's merged head outputs (``attn.c_proj``'s input) ``[positions, d_model]``."""
    cache = []
    handles = [block.attn.c_proj.register_forward_pre_hook(lambda m, a: cache.append(a[0][0].detach().clone()))
               for block in model.transformer.h]
    try:
        with torch.no_grad():
            model(torch.as_tensor(tokens, device=model.device)[None])
    finally:
        for h in handles:
            h.remove()
    return cache


def gpt2_loss(model, tokens):
    """The per-token loss of ``tokens`` (one prompt), no grad: ``[positions - 1]``."""
    device = model.device
    with torch.no_grad():
        logits = model(torch.as_tensor(tokens, device=device)[None]).logits[0]
    return -torch.log_softmax(logits[:-1], -1).gather(1, torch.as_tensor(tokens[1:, None], device=device))[:, 0]


def gpt2_hook_loop(model, tokens, corrupt) -> dict:
    """Activation patching of every head as a TransformerLens user writes it by hand: the corrupted
    run's merged heads, then one forward per head with that head's slice replaced by its
    corrupted value; ``{'h{layer}.attn.head{head}': per-token loss}``."""
    corrupted = gpt2_merged_heads(model, corrupt)
    n_head = model.config.n_head
    size = model.config.n_embd // n_head
    out = {}
    for l in range(model.config.n_layer):
        for h in range(n_head):
            handle = gpt2_head_hooks(model, l, h, corrupted[l][:, h * size:(h + 1) * size])
            try:
                out[f"h{l}.attn.head{h}"] = gpt2_loss(model, tokens).cpu().numpy()
            finally:
                handle.remove()
    return out


def gpt2_head_attribution(model, tokens, corrupt) -> dict:
    """Attribution patching of every head by hand: one clean forward and backward of the summed
    loss with the merged heads kept (hooks), the corrupted run's merged heads, and per head the
    sum of (corrupted - clean) * gradient over its slice; ``{'h{layer}.attn.head{head}': float}``."""
    device = model.device
    corrupted = gpt2_merged_heads(model, corrupt)
    kept = []

    def keep(m, a):
        a[0].retain_grad()
        kept.append(a[0])

    handles = [b.attn.c_proj.register_forward_pre_hook(keep) for b in model.transformer.h]
    try:
        logits = model(torch.as_tensor(tokens, device=device)[None]).logits[0]
        loss = -torch.log_softmax(logits[:-1], -1).gather(1, torch.as_tensor(tokens[1:, None], device=device))[:, 0]
        loss.sum().backward()
    finally:
        for hd in handles:
            hd.remove()
    n_head = model.config.n_head
    size = model.config.n_embd // n_head
    out = {}
    for l in range(model.config.n_layer):
        d = (corrupted[l] - kept[l][0].detach()) * kept[l].grad[0]
        for h in range(n_head):
            out[f"h{l}.attn.head{h}"] = float(d[:, h * size:(h + 1) * size].sum())
    model.zero_grad(set_to_none=True)
    return out
