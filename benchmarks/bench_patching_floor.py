"""The floor under GPT-2 small's 144-head activation patching over a batch: the matmuls its plan
cannot skip, each timed alone through XLA.

``python -m benchmarks.bench_patching_floor``.

The 144 variants (``patch(c, 'h<l>.attn.head<h>', {tokens: corrupt})``, 8 prompts x 32 tokens,
GPT-2 small with random weights) are lined up with the clean circuit as ``sweep`` lines them up
(``circuits.backend.tiers.variants``): a node of the clean circuit has one row per distinct
variant node computing its operation over other children.  Every row of a product with a weight
(the unembedding, the MLP's two matmuls, QKV, each head's output projection) is work no plan can
skip: every layer above a patched head changes at every position, and the loss reads every
position's log-softmax over the whole vocabulary.  Each such product is timed alone through XLA
at the shape the sweep runs it (rows of one call x prompts x positions; a layer's heads' output
projections as one product over the heads stacked, as the sweep computes them), best of 7; the
floor is the sum of rows x time a row.  The unembedding is timed as the sweep computes it inside
the loss's kernel (``circuits.backend.lower.picked_log_softmax``): ``VOCAB_BLOCK`` columns of the
weight at a time, each block's logits only summed, the group's rows a call.  It leaves out every
other step (layer norms, gelu, softmax, the log-softmax, attention's own small products), so the
sweep's real time is above it.
Compare with the patching row of ``bench_gpt2_first`` (TransformerLens's ``patching`` module on
the same weights).
"""

from __future__ import annotations

import time

import numpy as np

PROMPTS, TOKENS, LAYERS, HEADS = 8, 32, 12, 12


def _times(fn, *args, runs: int = 7) -> tuple:
    """(best, median) seconds of ``runs`` calls after one."""
    fn(*args).block_until_ready()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - t)
    return min(times), float(np.median(times))


def plan_rows():
    """``({weight shape: (rows, flops a row, einsum spec, activation shape)}, other products'
    flops)`` from the sweep's alignment of the 144 variants with the clean circuit."""
    from circuits import Einsum, Symbol
    from circuits.backend.tiers.variants import _Group, _Partners
    from circuits.interp import patch
    from circuits.models import gpt2, tokens_symbol
    from circuits.models.gpt2 import random_gpt2_weights
    from circuits.traversal import toposort

    config = dict(n_embd=768, n_head=HEADS, n_layer=LAYERS, vocab_size=50257, n_positions=1024,
                  activation_function="gelu_new")
    sym = tokens_symbol(TOKENS)
    c = gpt2(config, random_gpt2_weights(config), sym, loss=True, split_heads=True)
    corrupt = Symbol((TOKENS,), name="corrupt_tokens", dtype="int64")
    variants = [patch(c, f"h{l}.attn.head{h}", {"toks_int_var": corrupt}) for l in range(LAYERS) for h in range(HEADS)]
    order = toposort(c)
    group = _Group(c, order, _Partners(), "float32", variants, None)
    weights: dict = {}
    other = 0
    const: dict = {}  # whether a node depends on no input (a weight, or a view of one)
    for n in order:
        const[n.hash] = type(n) is not Symbol and all(const[ch.hash] for ch in n.children)
        if type(n) is not Einsum or n.hash not in group.by_partner:
            continue
        sizes = {}
        for axes, child in zip(n.in_axes, n.children):
            sizes.update(zip(axes, child.shape))
        out = set(n.out_axes)
        if all(x in out for x in sizes):
            continue  # sums nothing: elementwise work
        flops = 2 * PROMPTS * int(np.prod(list(sizes.values())))
        rows = len(group.by_partner[n.hash])
        weight = [ch for ch in n.children if const[ch.hash]]
        if len(n.children) == 2 and len(weight) == 1:
            w = weight[0].shape
            a = next(ch for ch in n.children if not const[ch.hash])
            got = weights.get(w)
            weights[w] = ((got[0] if got else 0) + rows, flops, n.spec, a.shape)
        else:
            other += rows * flops
    return weights, other


def main() -> None:
    import jax
    import jax.numpy as jnp

    from circuits.backend.lower.picked_log_softmax import VOCAB_BLOCK
    from circuits.backend.tiers.variants import CACHE_BYTES, ROWS, _rows_a_call

    weights, other = plan_rows()
    # the group's bound on a CPU (``_Group._cap``): rows of its biggest value that fits CACHE_BYTES
    fits = [b for b in (_out_bytes(a, w, spec) for w, (_, _, spec, a) in weights.items()) if b <= CACHE_BYTES]
    cap = _rows_a_call(max(fits), ROWS, CACHE_BYTES) if fits else ROWS
    rng = np.random.default_rng(0)
    total_s, total_median, total_flops = 0.0, 0.0, 0
    print(f"GPT-2 small, 144 head patches over {PROMPTS} prompts x {TOKENS} tokens: the products with a weight")
    for w, (rows, flops, spec, a) in sorted(weights.items(), key=lambda kv: -kv[1][0] * kv[1][1]):
        out = spec.split("->")[1]
        a_spec, w_spec = _operands(spec, a)
        label = str(w)
        if w == (64, 768):  # one head's W_O: computed as one product over a layer's heads stacked
            rows //= HEADS
            flops *= HEADS
            a, w, a_spec, w_spec, label = (TOKENS, HEADS * 64), (HEADS * 64, 768), "sc", "cd", f"heads x {w}"
        spec = f"RP{a_spec},{w_spec}->RP{out}"
        row_bytes = _out_bytes(a, w, f"{a_spec},{w_spec}->{out}")
        if row_bytes > CACHE_BYTES:  # the logits: a block at a time
            per_call = cap
            vocab = w_spec.index(out[-1])
            fn = _blocked(spec, vocab, w[vocab], VOCAB_BLOCK)
            label += f" in blocks of {VOCAB_BLOCK}"
        else:
            per_call = _rows_a_call(row_bytes, cap)
            fn = jax.jit(lambda x, y, s=spec: jnp.einsum(s, x, y))
        x = jnp.asarray(rng.standard_normal((per_call, PROMPTS, *a), dtype=np.float32))
        y = jnp.asarray(rng.standard_normal(w, dtype=np.float32))
        t, med = (v / per_call for v in _times(fn, x, y))
        total_s += rows * t
        total_median += rows * med
        total_flops += rows * flops
        print(f"  {label:32s} {rows:5d} rows, {per_call:2d} a call: {flops / t / 1e9:6.1f} GFLOP/s best, "
              f"{flops / med / 1e9:6.1f} median: {rows * t:5.1f} / {rows * med:5.1f} s")
    print(f"floor: {total_s:.1f} s at the best rates, {total_median:.1f} s at the median ones, for "
          f"{total_flops / 1e12:.2f} TFLOP of products with a weight ({other / 1e12:.3f} TFLOP of other "
          f"products not counted)")


def _blocked(spec: str, axis: int, size: int, block: int):
    """The product ``spec`` over ``block`` entries of the weight's ``axis`` at a time (and the last
    partial block), each block's result summed: the unembedding as the loss's kernel makes it."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    full = size // block

    def fn(x, y):
        def step(acc, i):
            return acc + jnp.sum(jnp.einsum(spec, x, lax.dynamic_slice_in_dim(y, i * block, block, axis))), None

        acc, _ = lax.scan(step, jnp.zeros((), x.dtype), jnp.arange(full))
        if size > full * block:
            acc = acc + jnp.sum(jnp.einsum(spec, x, lax.slice_in_dim(y, full * block, size, axis=axis)))
        return acc

    return jax.jit(fn)


def _operands(spec: str, a: tuple) -> tuple:
    """``(activation's axes, weight's axes)`` of a two-operand einsum ``spec``."""
    lhs, rhs = spec.split("->")[0].split(",")
    return (lhs, rhs) if len(lhs) == len(a) else (rhs, lhs)


def _out_bytes(a: tuple, w: tuple, spec: str) -> int:
    """Bytes of one row of the product's result over the prompts."""
    a_spec, w_spec = _operands(spec, a)
    sizes = dict(zip(a_spec, a)) | dict(zip(w_spec, w))
    return 4 * PROMPTS * int(np.prod([sizes[x] for x in spec.split("->")[1]]))


if __name__ == "__main__":
    main()
