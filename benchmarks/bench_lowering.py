"""Lowering speed: a ~10,000-node transformer-like circuit to a JAX function, before XLA compiles.

Run: ``.venv/bin/python -m benchmarks.bench_lowering``.  Target: < 1 s for the whole lowering
(``Program`` = toposort + name/value-blind cache key, then the ops, then ``jax.make_jaxpr`` of
the program's function).

Baseline, run in the same process: the same model written by hand as a Python loop of ``jnp``
calls (the same einsum specs, the same functions), traced with ``jax.make_jaxpr``: the cost of
tracing these ops at all.  The ratio is lowering / baseline.

Also printed, as a floor no tracer of this program can go below: tracing a chain of as many
``lax.add`` equations as the lowered jaxpr has (JAX's own cost per equation, which depends
heavily on machine load).
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from circuits import Add, Array, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, toposort
from circuits.backend import evaluate
from circuits.backend.lower.binding import bind_arguments, precision
from circuits.backend.lower.program import Program

from .common import interleaved_medians, report

SEQ, D, HEADS, HEAD_DIM, VOCAB = 8, 16, 4, 4, 32


def make_weights(layers: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    f = lambda *shape: (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)  # noqa: E731
    return {
        "embed": f(VOCAB, D), "unembed": f(D, VOCAB),
        "q": f(layers, HEADS, HEAD_DIM, D), "k": f(layers, HEADS, HEAD_DIM, D),
        "v": f(layers, HEADS, HEAD_DIM, D), "o": f(layers, HEADS, D, HEAD_DIM),
        "mask": np.triu(np.full((SEQ, SEQ), -1e4, np.float32), 1),
    }


def make_circuit(w: dict, layers: int):
    """Embedding, ``layers`` blocks of layer norm + attention heads, unembedding, log-prob of the
    next token: the seed's shape of computation at toy sizes."""
    arrays = {k: Array(v, name=f"w.{k}") for k, v in w.items()}
    tokens = Symbol((SEQ + 1,), name="tokens", dtype="int64")
    x = GeneralFunction("gen_index_at_0_c", arrays["embed"], Index(tokens, (slice(None, -1),)), name="embeds")
    inv_d, eps, scale = Scalar(1.0 / D), Scalar(1e-5), Scalar(1.0 / math.sqrt(HEAD_DIM))
    for layer in range(layers):
        mean = Einsum.from_spec("sd,->s", x, inv_d, name=f"ln{layer}.mean")
        centered = Add(x, Rearrange(Einsum.from_spec("s,->s", mean, Scalar(-1.0)), "s -> s 1"), name=f"ln{layer}.c")
        var = Einsum.from_spec("sd,sd,->s", centered, centered, inv_d, name=f"ln{layer}.var")
        normed = Einsum.from_spec("sd,s->sd", centered, GeneralFunction("rsqrt", Add(var, eps)), name=f"ln{layer}")
        heads = []
        for h in range(HEADS):
            wq, wk, wv, wo = (Index(arrays[k], (layer, h)) for k in "qkvo")
            q = Einsum.from_spec("sd,ed->se", normed, wq, name=f"a{layer}.h{h}.q")
            k = Einsum.from_spec("sd,ed->se", normed, wk, name=f"a{layer}.h{h}.k")
            v = Einsum.from_spec("sd,ed->se", normed, wv, name=f"a{layer}.h{h}.v")
            scores = Add(Einsum.from_spec("qe,ke,->qk", q, k, scale), arrays["mask"], name=f"a{layer}.h{h}.scores")
            probs = GeneralFunction("softmax", scores, name=f"a{layer}.h{h}.probs")
            mixed = Einsum.from_spec("qk,ke->qe", probs, v)
            heads.append(Einsum.from_spec("qe,de->qd", mixed, wo, name=f"a{layer}.h{h}.out"))
        x = Add(x, *heads, name=f"resid{layer}")
    logp = GeneralFunction("log_softmax", Einsum.from_spec("sd,dv->sv", x, arrays["unembed"]), name="logp")
    picked = GeneralFunction("gen_index_at_0_batch_x_c", logp, Index(tokens, (slice(1, None),)), name="picked")
    return Einsum.from_spec("s,->", picked, Scalar(-1.0 / SEQ), name="loss"), tokens


def handwritten(w: dict, tokens, layers: int):
    """The same model as a plain jnp loop (what one would write without circuits)."""
    import jax
    import jax.numpy as jnp

    x = jnp.take(w["embed"], tokens[:-1], axis=0)
    for layer in range(layers):
        mean = jnp.einsum("sd,->s", x, 1.0 / D)
        centered = x + jnp.einsum("s,->s", mean, -1.0)[:, None]
        var = jnp.einsum("sd,sd,->s", centered, centered, 1.0 / D)
        normed = jnp.einsum("sd,s->sd", centered, jax.lax.rsqrt(var + 1e-5))
        out = x
        for h in range(HEADS):
            q = jnp.einsum("sd,ed->se", normed, w["q"][layer, h])
            k = jnp.einsum("sd,ed->se", normed, w["k"][layer, h])
            v = jnp.einsum("sd,ed->se", normed, w["v"][layer, h])
            probs = jax.nn.softmax(jnp.einsum("qe,ke,->qk", q, k, 1.0 / math.sqrt(HEAD_DIM)) + w["mask"], axis=-1)
            out = out + jnp.einsum("qe,de->qd", jnp.einsum("qk,ke->qe", probs, v), w["o"][layer, h])
        x = out
    logp = jax.nn.log_softmax(jnp.einsum("sd,dv->sv", x, w["unembed"]), axis=-1)
    picked = jnp.take_along_axis(logp, tokens[1:, None], axis=1)[:, 0]
    return jnp.einsum("s,->", picked, -1.0 / SEQ)


def lower(circuit, inputs):
    """Everything between a circuit and its jaxpr: Program, ops, tracing."""
    import jax

    program = Program([circuit], "float32")
    args = bind_arguments(program, inputs, "float32")
    with precision("float32"):
        return jax.make_jaxpr(program.skeleton().run)(args)


def add_chain(count: int):
    """The floor: ``count`` trivial equations, traced."""
    import jax
    import jax.lax as lax

    def chain(x):
        for _ in range(count):
            x = lax.add(x, x)
        return x

    return jax.make_jaxpr(chain)(np.ones(4, np.float32))


def main(runs: int = 5, target: int = 10_000):
    import jax

    per_layer = len(toposort(make_circuit(make_weights(2), 2)[0])) - len(toposort(make_circuit(make_weights(1), 1)[0]))
    layers = max(1, -(-(target - 10) // per_layer))
    w = make_weights(layers)
    circuit, tokens = make_circuit(w, layers)
    n = len(toposort(circuit))
    toks = np.random.default_rng(1).integers(0, VOCAB, SEQ + 1)
    inputs = {"tokens": toks}

    # the two agree (eager, so the check costs no XLA compilation of the big program)
    ours = evaluate(circuit, inputs, mode="ops")
    theirs = np.asarray(handwritten(w, toks, layers))
    assert np.allclose(ours, theirs, rtol=1e-4, atol=1e-5), (ours, theirs)

    jw = {k: jax.numpy.asarray(v) for k, v in w.items()}
    jt = jax.numpy.asarray(toks, dtype=jax.numpy.int32)
    eqns = (len(lower(circuit, inputs).eqns), len(jax.make_jaxpr(lambda a, t: handwritten(a, t, layers))(jw, jt).eqns))
    times = interleaved_medians(
        {
            "lower": lambda: lower(circuit, inputs),
            "program": lambda: Program([circuit], "float32"),
            "baseline": lambda: jax.make_jaxpr(lambda a, t: handwritten(a, t, layers))(jw, jt),
            "floor": lambda: add_chain(eqns[0]),
        },
        runs=runs,
        warmup=1,
    )
    cold = time.perf_counter()
    fresh, _ = make_circuit(make_weights(layers, seed=2), layers)
    lower(fresh, inputs)
    cold = time.perf_counter() - cold
    rows = [
        ("distinct nodes", f"{n:,} ({layers} layers x {HEADS} heads)"),
        ("jaxpr equations (ours, baseline)", f"{eqns[0]:,}, {eqns[1]:,}"),
        ("lowering: Program + ops + make_jaxpr", f"{times['lower'] * 1e3:8.1f} ms  (target < 1000 ms)"),
        ("  of which Program (toposort + key)", f"{times['program'] * 1e3:8.1f} ms"),
        ("baseline: hand-written jnp loop, make_jaxpr", f"{times['baseline'] * 1e3:8.1f} ms"),
        ("lowering / baseline", f"{times['lower'] / times['baseline']:8.2f}"),
        ("floor: as many lax.add equations, traced", f"{times['floor'] * 1e3:8.1f} ms"),
        ("lowering / floor", f"{times['lower'] / times['floor']:8.2f}"),
        ("build a new circuit + lower it, once", f"{cold * 1e3:8.1f} ms"),
    ]
    report(f"lowering to JAX, {n:,}-node circuit (Python {sys.version.split()[0]}, jax {jax.__version__})", rows)


if __name__ == "__main__":
    main()
