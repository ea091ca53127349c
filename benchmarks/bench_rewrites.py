"""``rewrites.simp`` over a ~100,000-node circuit: distinct input nodes per second.

Run: ``.venv/bin/python -m benchmarks.bench_rewrites [--nodes 100000] [--runs 5]``.
Target: >= 50,000 nodes/s.

The circuit is a deep residual stack (thousands of layers, two branches per layer, sharing the
residual) with the redundancies simp removes: Adds of a Scalar 0, nested and single-term Adds,
Einsums with Scalar 1 operands and identity Einsums, so most nodes are rewritten.

Also timed: simp with only ``rewrites.rules.SIMP_RULES`` (the engine and the simplifying rules,
without the canonical-order rules of ``rewrites.rules.canonical`` that ``simp`` adds).

Baselines, same process, same circuit: ``deep_map`` with an identity function (the cheapest
whole-circuit rebuild: a toposort and one dict lookup per child), and a hand-written
single-purpose simplifier over ``deep_map`` that removes exactly these redundancies with
inline ``isinstance`` tests (what a custom pass without a rule engine costs).
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from circuits import Add, Array, Einsum, GeneralFunction, Scalar, count_nodes, deep_map, toposort
from rewrites import Trace, simp
from rewrites.rules import SIMP_RULES

from .common import interleaved_medians, report


def residual_stack(n_nodes: int, width: int = 8, seed: int = 0):
    """About ``n_nodes`` distinct nodes: layers of two branches over a shared residual."""
    rng = np.random.default_rng(seed)
    weights = [Array(rng.normal(size=(width, width)).astype(np.float32), name=f"w{i}") for i in range(64)]
    zero, one = Scalar(0.0), Scalar(1.0)
    r = Array(rng.normal(size=(4, width)).astype(np.float32), name="embed")
    for i in range(max(1, (n_nodes - len(weights) - 3) // 13)):  # 13 new nodes per layer
        branches = []
        for b in range(2):
            h = Einsum.from_spec("sd,de->se", r, weights[(2 * i + b) % len(weights)], name=f"l{i}.h{b}")
            h = GeneralFunction("tanh", Add(h, zero))                       # a zero term
            h = Einsum.from_spec("se,->se", h, one)                          # a factor of one
            branches.append(Einsum.from_spec("se->se", h))                   # an identity
        r = Add(Add(Add(r, branches[0]), branches[1]), name=f"l{i}.resid")  # nested, single term
    return r


def handwritten_simplify(circuit):
    """The same simplifications as one deep_map with inline tests (no engine, no rule objects)."""

    def step(n):
        t = type(n)
        if t is Add:
            kids = []
            for c in n.children:
                if type(c) is Add and c.name is None:
                    kids.extend(c.children)
                elif not (type(c) is Scalar and c.value == 0.0 and c.shape == ()):
                    kids.append(c)
            if len(kids) == 1 and kids[0].shape == n.shape:
                return kids[0] if kids[0].name or n.name is None else kids[0].rename(n.name)
            if len(kids) != len(n.children) or any(a is not b for a, b in zip(kids, n.children)):
                return Add(*kids, name=n.name)
        elif t is Einsum:
            keep = [(c, ax) for c, ax in zip(n.children, n.in_axes)
                    if not (type(c) is Scalar and c.value == 1.0 and c.shape == ())]
            if len(keep) == 1 and keep[0][1] == n.out_axes:
                c = keep[0][0]
                return c if c.name or n.name is None or type(c) is Array else c.rename(n.name)
            if len(keep) != len(n.children):
                return Einsum(*[c for c, _ in keep], in_axes=[ax for _, ax in keep], out_axes=n.out_axes,
                              name=n.name)
        return None

    return deep_map(circuit, step)


def main(nodes: int = 100_000, runs: int = 5):
    circuit = residual_stack(nodes)
    n = count_nodes(circuit)
    trace = Trace()
    out = simp(circuit, trace=trace)
    hand = handwritten_simplify(circuit)
    # Both remove the same nodes (simp also puts terms and axis ids in canonical order, so the
    # circuits match in size and node kinds, not in identity).
    kinds = lambda c: sorted(collections.Counter(type(x).__name__ for x in toposort(c)).items())  # noqa: E731
    assert kinds(out) == kinds(hand), (kinds(out), kinds(hand))
    t = interleaved_medians(
        {
            "simp": lambda: simp(circuit),
            "simp_core": lambda: simp(circuit, rules=SIMP_RULES),
            "identity": lambda: deep_map(circuit, lambda x: None),
            "hand": lambda: handwritten_simplify(circuit),
        },
        runs=runs,
        warmup=1,
    )
    fired = sum(trace.counts().values())
    report(
        f"rewrites.simp over a residual stack of {n:,} distinct nodes -> {count_nodes(out):,} "
        f"({fired:,} rewrites), median of {runs}",
        [
            ("simp", f"{t['simp']:7.3f} s  {n / t['simp']:10,.0f} nodes/s  (target >= 50,000)"),
            ("simp, rewrites.rules.SIMP_RULES only",
             f"{t['simp_core']:7.3f} s  {n / t['simp_core']:10,.0f} nodes/s"),
            ("deep_map identity", f"{t['identity']:7.3f} s  {n / t['identity']:10,.0f} nodes/s"),
            ("hand-written deep_map simplifier", f"{t['hand']:7.3f} s  {n / t['hand']:10,.0f} nodes/s"),
            ("ratio simp / identity deep_map", f"{t['simp'] / t['identity']:7.2f}"),
            ("ratio simp / hand-written", f"{t['simp'] / t['hand']:7.2f}"),
            ("ratio simp (SIMP_RULES only) / hand-written", f"{t['simp_core'] / t['hand']:7.2f}"),
        ],
    )
    return t


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    main(a.nodes, a.runs)
