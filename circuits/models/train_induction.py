"""Train the shipped two-layer induction model: ``python -m circuits.models.train_induction``.

The model is the seed's attention-only transformer (``models.attn_only`` builds it from the
weights) at a small size: vocabulary 64 (token 0 is BOS), d_model 64, 2 layers of 4 heads of 16,
context 32 positions.  The forward pass trained here (``loss_per_position``) is the seed's
computation written in ``jax.numpy``; after training, the script checks that
``C.evaluate(attn_only(weights, tokens))`` gives the same per-position losses.

The task is where induction heads must form.  Each training sequence is ``BOS``, then random
tokens (1..63), with one random segment ``A`` (length drawn from 4..16) repeated right after
itself at a random offset: ``BOS n n n A A n n ...``.  The random offset matters: on plain
``[BOS, A, A]`` halves, layer 0 learns a positional shortcut and layer 1 stays unused.  The model
is evaluated on ``[BOS, A, A]`` with ``A`` random of length 16 (``induction_tokens``): the first
occurrence is unpredictable (loss ≈ ln 63 ≈ 4.14), the repeat is predicted by induction.

Optimiser: AdamW (β = 0.9, 0.99; weight decay 0.1 on the matrices), learning rate 3e-3 with a
linear warmup and a cosine decay, batch 32; the batches are drawn from ``jax.random`` keys
folded from the seed and the step, so a run is deterministic given its seed.  Steps run in
compiled chunks (``lax.scan``) under a progress bar.

``python -m circuits.models.train_induction --out PATH`` writes the loss circuit
``attn_only(weights, tokens_symbol(34))`` with ``C.save``: the shipped file
``circuits/models/data/induction.circuit`` is that file, and ``induction_weights()`` reads the
weights back out of it by name.

The shipped file was made by ``python -m circuits.models.train_induction`` (seed 0, 16,000 steps,
batch 32): 176 s on a shared 2-core CPU; final training loss 3.10 (most positions hold noise);
on 256 sequences ``[BOS, A, A]`` the first half's loss is 4.16 (ln 63 = 4.14) and the repeated
half's 0.071; the circuit's loss matches the training forward to 1.4e-6.

>>> w = train(steps=2, seed=0, batch=4, progress_bar=False)
>>> sorted(w)[:3], w['a0.w.q'].shape
(['a0.ln.w.bias', 'a0.ln.w.scale', 'a0.w.k'], (4, 16, 64))
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..progress import progress
from .attn_only import random_weights
from .blocks import LN_EPS, NEG_INF, causal_mask
from .induction import BOS, CONTEXT, FIRST_HALF, REPEATED_HALF, SEQ_LEN, VOCAB, WEIGHTS_FILE, induction_tokens

CONFIG = dict(vocab=VOCAB, d_model=64, n_heads=4, head_size=16, n_layers=2, context=CONTEXT)

DEFAULTS = dict(steps=16000, batch=32, lr=3e-3, weight_decay=0.1, warmup=500, seed=0,
                min_repeat=4, max_repeat=16)


# ---- the seed's forward pass in jax.numpy -------------------------------------------------------

def _layer_norm(x, scale, bias):
    mean_subbed = x - x.mean(-1, keepdims=True)
    var = (mean_subbed * mean_subbed).mean(-1, keepdims=True)
    return mean_subbed * jax.lax.rsqrt(var + LN_EPS) * scale + bias


def loss_per_position(params: dict, tokens):
    """Per-position loss ``[..., positions]`` of the seed's model on ``tokens`` ``[..., positions + 2]``:
    what ``C.evaluate(attn_only(params, tokens))`` computes, in ``jax.numpy``."""
    inputs, targets = tokens[..., :-2], tokens[..., 1:-1]
    n = inputs.shape[-1]
    mask = params["t.a.c.causal_mask"][:n, :n]
    resid = params["t.w.tok_embeds"][inputs]
    pos = params["t.w.pos_embeds"][:n]
    layer = 0
    while f"a{layer}.w.q" in params:
        norm = _layer_norm(resid, params[f"a{layer}.ln.w.scale"], params[f"a{layer}.ln.w.bias"])
        qk_input = norm + pos
        q = jnp.einsum("...qd,hcd->...hqc", qk_input, params[f"a{layer}.w.q"])
        k = jnp.einsum("...kd,hcd->...hkc", qk_input, params[f"a{layer}.w.k"])
        v = jnp.einsum("...kd,hcd->...hkc", norm, params[f"a{layer}.w.v"])
        scores = jnp.einsum("...hqc,...hkc->...hqk", q, k) * jax.lax.rsqrt(float(q.shape[-1])) * mask
        scores = scores + NEG_INF * (1.0 - mask)
        probs = jax.nn.softmax(scores, axis=-1)
        comb_v = jnp.einsum("...hqk,...hkc->...hqc", probs, v)
        resid = jnp.einsum("...hqc,hdc->...qd", comb_v, params[f"a{layer}.w.o"]) + resid
        layer += 1
    final = _layer_norm(resid, params["final.ln.w.scale"], params["final.ln.w.bias"])
    logits = final @ params["t.w.unembed"].T
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


# ---- data --------------------------------------------------------------------------------------

def training_batch(key, batch: int, *, vocab: int = CONFIG["vocab"], seq_len: int = SEQ_LEN,
                   min_repeat: int = 4, max_repeat: int = 16):
    """``[batch, seq_len]`` int32: BOS, random tokens, one segment repeated once at a random offset."""
    k_noise, k_len, k_start = jax.random.split(key, 3)
    noise = jax.random.randint(k_noise, (batch, seq_len), 1, vocab)
    length = jax.random.randint(k_len, (batch, 1), min_repeat, max_repeat + 1)
    # The repeat starts after BOS and ends by token seq_len - 2 (the last target): start in 1..seq_len-1-2L.
    start = 1 + jnp.floor(jax.random.uniform(k_start, (batch, 1)) * (seq_len - 1 - 2 * length)).astype(jnp.int32)
    j = jnp.arange(seq_len)[None, :]
    second = (j >= start + length) & (j < start + 2 * length)
    tokens = jnp.take_along_axis(noise, jnp.where(second, j - length, j), axis=1)
    return tokens.at[:, 0].set(BOS)


# ---- optimiser ---------------------------------------------------------------------------------

def learning_rate(step, *, steps: int, lr: float, warmup: int):
    """Linear warmup to ``lr`` over ``warmup`` steps, then a cosine decay to 0 at ``steps``."""
    step = jnp.asarray(step, jnp.float32)
    warm = lr * (step + 1) / warmup
    frac = jnp.clip((step - warmup) / max(steps - warmup, 1), 0.0, 1.0)
    return jnp.where(step < warmup, warm, 0.5 * lr * (1 + jnp.cos(math.pi * frac)))


def _adamw_update(params, grads, m, v, step, rate, *, weight_decay, b1=0.9, b2=0.99, eps=1e-8):
    t = step.astype(jnp.float32) + 1
    out_p, out_m, out_v = {}, {}, {}
    for k in params:
        g = grads[k]
        out_m[k] = b1 * m[k] + (1 - b1) * g
        out_v[k] = b2 * v[k] + (1 - b2) * g * g
        update = (out_m[k] / (1 - b1**t)) / (jnp.sqrt(out_v[k] / (1 - b2**t)) + eps)
        decay = weight_decay if params[k].ndim >= 2 else 0.0
        out_p[k] = params[k] - rate * (update + decay * params[k])
    return out_p, out_m, out_v


def initial_weights(seed: int) -> dict[str, np.ndarray]:
    """The starting point: ``random_weights`` at the induction model's sizes, plus the causal mask."""
    c = CONFIG
    w = random_weights(seed, vocab=c["vocab"], d_model=c["d_model"], n_heads=c["n_heads"],
                       head_size=c["head_size"], n_layers=c["n_layers"], max_positions=c["context"])
    return w


def train(*, steps: int = DEFAULTS["steps"], batch: int = DEFAULTS["batch"], lr: float = DEFAULTS["lr"],
          weight_decay: float = DEFAULTS["weight_decay"], warmup: int = DEFAULTS["warmup"],
          seed: int = DEFAULTS["seed"], min_repeat: int = DEFAULTS["min_repeat"],
          max_repeat: int = DEFAULTS["max_repeat"], chunk: int = 250, progress_bar: bool | None = None,
          log: list | None = None) -> dict[str, np.ndarray]:
    """Train from ``initial_weights(seed)``; returns the weights (float32 numpy, the seed's names,
    with ``'t.a.c.causal_mask'``).  ``log``, when given, receives ``(step, mean training loss)``
    after each compiled chunk of ``chunk`` steps."""
    warmup = min(warmup, max(steps // 4, 1))
    params = {k: jnp.asarray(v) for k, v in initial_weights(seed).items()}
    mask = jnp.asarray(causal_mask(CONFIG["context"]))
    zeros = {k: jnp.zeros_like(v) for k, v in params.items()}
    root = jax.random.PRNGKey(seed)

    def loss_fn(p, tokens):
        return loss_per_position(dict(p, **{"t.a.c.causal_mask": mask}), tokens).mean()

    def one_step(state, step):
        p, m, v = state
        tokens = training_batch(jax.random.fold_in(root, step), batch,
                                min_repeat=min_repeat, max_repeat=max_repeat)
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens)
        rate = learning_rate(step, steps=steps, lr=lr, warmup=warmup)
        p, m, v = _adamw_update(p, grads, m, v, step, rate, weight_decay=weight_decay)
        return (p, m, v), loss

    @jax.jit
    def run_chunk(state, first_step, n_steps_mask):
        # A fixed-size scan (one compilation); steps past the end are masked out.
        def body(s, i):
            new, loss = one_step(s, first_step + i)
            keep = i < n_steps_mask
            s = jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), new, s)
            return s, jnp.where(keep, loss, 0.0)
        state, losses = jax.lax.scan(body, state, jnp.arange(chunk))
        return state, losses.sum() / jnp.maximum(n_steps_mask, 1)

    state = (params, zeros, dict(zeros))
    done = 0
    with progress(total=steps, desc="training induction model", enabled=progress_bar) as bar:
        while done < steps:
            n = min(chunk, steps - done)
            state, mean_loss = run_chunk(state, jnp.int32(done), jnp.int32(n))
            done += n
            mean_loss = float(mean_loss)
            bar.update(n)
            bar.set_postfix(loss=f"{mean_loss:.3f}")
            if log is not None:
                log.append((done, mean_loss))
    out = {k: np.asarray(v, np.float32) for k, v in state[0].items()}
    out["t.a.c.causal_mask"] = causal_mask(CONFIG["context"])
    return out


def induction_losses(weights: dict, n: int = 256, seed: int = 1234) -> tuple[float, float]:
    """(first-half, repeated-half) mean loss of ``weights`` on ``n`` sequences ``[BOS, A, A]``."""
    params = {k: jnp.asarray(v) for k, v in weights.items()}
    loss = np.asarray(loss_per_position(params, jnp.asarray(induction_tokens(n, seed))))
    return float(loss[:, FIRST_HALF].mean()), float(loss[:, REPEATED_HALF].mean())


def save_weights(weights: dict, path) -> None:
    """Save ``weights`` as the loss circuit ``attn_only(weights, tokens_symbol(34))`` at ``path``."""
    from ..io.files import save
    from .attn_only import attn_only, tokens_symbol

    save(attn_only(weights, tokens_symbol(SEQ_LEN)), path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument("--batch", type=int, default=DEFAULTS["batch"])
    parser.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    parser.add_argument("--out", type=Path, default=WEIGHTS_FILE)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    log: list = []
    weights = train(steps=args.steps, seed=args.seed, batch=args.batch, lr=args.lr, log=log)
    seconds = time.perf_counter() - start
    first, repeated = induction_losses(weights)
    print(f"trained {args.steps} steps (seed {args.seed}) in {seconds:.0f} s; "
          f"final training loss {log[-1][1]:.3f}")
    print(f"[BOS, A, A] loss: first half {first:.3f} (ln 63 = {math.log(63):.3f}), repeated half {repeated:.3f}")

    from ..backend import evaluate
    from .attn_only import attn_only

    toks = induction_tokens(1, seed=99)[0]
    circuit_loss = evaluate(attn_only(weights, toks))
    forward_loss = np.asarray(loss_per_position({k: jnp.asarray(v) for k, v in weights.items()}, toks))
    gap = float(np.max(np.abs(circuit_loss - forward_loss)))
    print(f"C.evaluate(attn_only(weights, tokens)) vs the training forward: max difference {gap:.2e}")
    if gap > 1e-3:
        raise SystemExit(f"the circuit and the training forward disagree by {gap}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(weights, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
