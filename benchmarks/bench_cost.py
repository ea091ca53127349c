"""``circuits.cost`` and ``circuits.profile``: how long the analyses take, and what profiling adds.

Run: ``.venv/bin/python -m benchmarks.bench_cost``.  Targets (issue 12): ``cost`` of the seed
model ≤ 50 ms; of an 88-layer placeholder decode step of the seed-002 architecture < 10 s (report
included); ``profile`` adds ≤ 20% over one plain compiled evaluation of the seed model.

The 88-layer circuit is a stand-in built here from node constructors (placeholder Arrays, the KV
cache as Symbols) until the Llama/Mistral builder lands: d 12288, 96 query / 8 KV heads of 128,
SwiGLU FFN 28672, vocabulary 32768, one decode step against a cache of ``context`` positions.
"""

from __future__ import annotations

import time

import numpy as np

import circuits as C
from circuits.models import attn_only, random_weights

from .common import interleaved_medians, median_time, report

_HASH = "0" * 24


def _w(shape, name):
    return C.Array.placeholder(shape, _HASH, name=name)


def _rms_norm(x, scale, name):
    d = x.shape[-1]
    ms = C.Einsum.from_spec("a,a,->", x, x, C.Scalar(1.0 / d), name=f"{name}.ms")
    r = C.GeneralFunction("rsqrt", C.Add(ms, C.Scalar(1e-5), name=f"{name}.ms_eps"), name=f"{name}.rsqrt")
    return C.Einsum.from_spec("a,,a->a", x, r, scale, name=name)


def _rope(x, cos, sin, name):
    # x [heads, 128]: rotate halves (x1 cos - x2 sin, x2 cos + x1 sin)
    h = x.shape[-1] // 2
    x1 = C.Index(x, (slice(None), slice(0, h)))
    x2 = C.Index(x, (slice(None), slice(h, None)))
    a = C.Add(C.Einsum.from_spec("hd,d->hd", x1, cos), C.Einsum.from_spec("hd,d,->hd", x2, sin, C.Scalar(-1.0)))
    b = C.Add(C.Einsum.from_spec("hd,d->hd", x2, cos), C.Einsum.from_spec("hd,d->hd", x1, sin))
    return C.Concat(a, b, axis=1, name=name)


def mistral_decode_step(n_layers=88, d=12288, n_q=96, n_kv=8, head=128, ffn=28672, vocab=32768, context=4096):
    """The seed-002 architecture's decode step as a placeholder circuit: logits [vocab] of one token."""
    group = n_q // n_kv
    x = C.Einsum.from_spec("v,vd->d", C.Symbol((vocab,), name="token_one_hot"), _w((vocab, d), "tok_embd"),
                           name="inp_embd")
    cos, sin = C.Symbol((head // 2,), name="rope_cos"), C.Symbol((head // 2,), name="rope_sin")
    for l in range(n_layers):
        p = f"blk.{l}"
        n = _rms_norm(x, _w((d,), f"{p}.attn_norm.weight"), f"{p}.attn_norm")
        q = C.Einsum.from_spec("d,hkd->hk", n, _w((n_q, head, d), f"{p}.attn_q.weight"), name=f"{p}.q")
        k = C.Einsum.from_spec("d,hkd->hk", n, _w((n_kv, head, d), f"{p}.attn_k.weight"), name=f"{p}.k")
        v = C.Einsum.from_spec("d,hkd->hk", n, _w((n_kv, head, d), f"{p}.attn_v.weight"), name=f"{p}.v")
        q, k = _rope(q, cos, sin, f"{p}.q_rope"), _rope(k, cos, sin, f"{p}.k_rope")
        kc = C.Concat(C.Symbol((n_kv, context, head), name=f"cache_k_l{l}"),
                      C.Rearrange(k, "h d -> h 1 d"), axis=1, name=f"{p}.k_all")
        vc = C.Concat(C.Symbol((n_kv, context, head), name=f"cache_v_l{l}"),
                      C.Rearrange(v, "h d -> h 1 d"), axis=1, name=f"{p}.v_all")
        qg = C.Rearrange(q, "(g q) d -> g q d", g=n_kv, name=f"{p}.q_grouped")
        s = C.Einsum.from_spec("gqd,gkd,->gqk", qg, kc, C.Scalar(head ** -0.5), name=f"{p}.kq")
        a = C.GeneralFunction("softmax", s, name=f"{p}.kq_soft_max")
        o = C.Einsum.from_spec("gqk,gkd->gqd", a, vc, name=f"{p}.kqv")
        out = C.Einsum.from_spec("gqd,gqde->e", o, _w((n_kv, group, head, d), f"{p}.attn_output.weight"),
                                 name=f"{p}.kqv_out")
        x = C.Add(x, out, name=f"{p}.ffn_inp")
        n = _rms_norm(x, _w((d,), f"{p}.ffn_norm.weight"), f"{p}.ffn_norm")
        gate = C.GeneralFunction("silu", C.Einsum.from_spec("d,fd->f", n, _w((ffn, d), f"{p}.ffn_gate.weight")),
                                 name=f"{p}.ffn_silu")
        up = C.Einsum.from_spec("d,fd->f", n, _w((ffn, d), f"{p}.ffn_up.weight"), name=f"{p}.ffn_up")
        down = C.Einsum.from_spec("f,f,df->d", gate, up, _w((d, ffn), f"{p}.ffn_down.weight"), name=f"{p}.ffn_out")
        x = C.Add(x, down, name=f"{p}.l_out")
    n = _rms_norm(x, _w((d,), "output_norm.weight"), "result_norm")
    return C.Einsum.from_spec("d,vd->v", n, _w((vocab, d), "output.weight"), name="result_output")


def analytic_matmul_multiplies(n_layers=88, d=12288, n_q=96, n_kv=8, head=128, ffn=28672, vocab=32768, context=4096):
    t = context + 1
    per_layer = d * n_q * head + 2 * d * n_kv * head + 2 * n_q * t * head + n_q * head * d + 3 * d * ffn
    norms = (2 * n_layers + 1) * d  # each RMSNorm's sum of squares is a contraction too
    return n_layers * per_layer + 2 * vocab * d + norms  # + embedding (one-hot matmul) and unembedding


def main():
    w = random_weights(0)
    seed = attn_only(w, np.random.default_rng(0).integers(0, 50259, 302))
    C.cost(seed)  # imports and einsum plans
    seed_cost = median_time(lambda: C.cost(seed), runs=10)
    topo = median_time(lambda: C.toposort(seed), runs=10)

    t = time.perf_counter()
    big = mistral_decode_step()
    built = time.perf_counter() - t
    t = time.perf_counter()
    big_cost = C.cost(big)
    text = str(big_cost)
    analysed = time.perf_counter() - t
    assert big_cost.matmul_multiplies == analytic_matmul_multiplies(), (big_cost.matmul_multiplies,)

    f = C.compile(seed)
    f()
    C.profile(seed)  # compiles every segment
    timed = {}

    def prof():
        timed["wall"] = C.profile(seed).wall_seconds

    med = interleaved_medians({"plain": lambda: f(), "profile": prof}, runs=5, warmup=1)
    plain = med["plain"]
    report("cost and profile (CPU)", [
        ("cost(seed model)", f"{seed_cost * 1e3:.1f} ms ({seed_cost / topo:.1f}x its toposort; target <= 50 ms)"),
        ("88-layer decode step: nodes", f"{len(big_cost)} computed, build {built:.2f} s"),
        ("88-layer decode step: cost + full report", f"{analysed:.2f} s ({len(text) // 1024} KiB of text; target < 10 s)"),
        ("88-layer matmul multiplies", f"{big_cost.matmul_multiplies:.6g} = analytic"),
        ("profile timed run / plain compiled evaluation", f"{timed['wall'] / plain:.2f}x (target <= 1.20)"),
    ])


if __name__ == "__main__":
    main()
