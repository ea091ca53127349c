"""Benchmark: building (so validating, hashing and interning) 100,000-node circuits.

Run: ``python -m benchmarks.bench_build [--nodes 100000] [--repeat 5]``.

Two graphs of ``--nodes`` distinct nodes: ``chain`` (Add and GeneralFunction over Scalars, 100,000
deep) and ``layered`` (Einsum, Rearrange, Index, GeneralFunction, Add per layer: a wide,
transformer-like mix).  For each it prints nodes/s (best of ``--repeat`` runs, process CPU time,
so other load on a shared machine distorts it less), the same inside ``bulk_build()`` (the cyclic
garbage collector paused: nodes never form cycles), bytes per live node (tracemalloc, in a separate
run so tracing does not distort the timing), and the ratio against a hand-written baseline run in
the same process: the same number of plain tuples each carrying a blake2b digest over its type,
payload, child digest and name — the least a hash-consed node must do.  Targets: >= 200,000
nodes/s and <= 1 KiB per node.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import time
import tracemalloc

import numpy as np

from circuits import Add, Array, Einsum, GeneralFunction, Index, Rearrange, Scalar
from circuits.nodes.base import bulk_build


def chain(n: int):
    """x -> Add(x, Scalar) -> tanh/exp/sigmoid -> ...: ``n`` nodes, one deep chain."""
    x = Array(np.ones((4,), np.float32), name="x")
    fns = ("exp", "tanh", "sigmoid")
    nodes = 1
    i = 0
    while nodes < n:
        if i % 2:
            x = GeneralFunction(fns[i % 3], x, name=f"f{i}")
            nodes += 1
        else:
            x = Add(x, Scalar(float(i)), name=f"a{i}")
            nodes += 2
        i += 1
    return x


def layered(n: int):
    """Per layer: an Einsum, a Rearrange and an Index of it, a relu and a residual Add with a
    Scalar: six new nodes over a few shared Arrays."""
    w = Array(np.ones((8, 8), np.float32), name="w")
    x = Array(np.ones((8,), np.float32), name="x0")
    nodes = 2
    i = 0
    outs = []
    while nodes < n:
        h = Einsum.from_spec("ab,b->a", w, x, name=f"h{i}")
        r = Rearrange(h, "(p q) -> q p", p=2, name=f"r{i}")
        outs.append(Index(r, (slice(None), 1), name=f"s{i}"))
        g = GeneralFunction("relu", h, name=f"g{i}")
        x = Add(g, x, Scalar(1e-5 * i), name=f"x{i + 1}")
        nodes += 6
        i += 1
    return x, outs


def baseline(n: int):
    """Plain tuples (type, payload, children, shape, dtype, name, digest), each digest a blake2b
    over type, payload, the child's digest and the name."""
    blake2b = hashlib.blake2b
    prev = ("Array", b"0" * 24, (), (4,), "float32", "x", blake2b(b"x", digest_size=16).digest())
    for i in range(1, n):
        name = f"f{i}"
        digest = blake2b(b"GeneralFunction\0exp\0" + prev[6] + name.encode(), digest_size=16).digest()
        prev = ("GeneralFunction", b"exp", (prev,), (4,), "float32", name, digest)
    return prev


def best_time(fn, n, repeat, paused=False):
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        if paused:
            with bulk_build():
                out = fn(n)
        else:
            out = fn(n)
        best = min(best, time.process_time() - t0)
        del out
    return best


def bytes_per_node(fn, n):
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    out = fn(n)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del out
    return used / n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    n = args.nodes
    t_base = best_time(baseline, n, args.repeat)
    print(f"python {sys.version.split()[0]}, {n:,} nodes, best of {args.repeat} (process CPU time)")
    print(f"  baseline (tuples + blake2b)  {n / t_base:>9,.0f} nodes/s  {bytes_per_node(baseline, n):5.0f} B/node")
    for label, fn in (("chain", chain), ("layered", layered)):
        t = best_time(fn, n, args.repeat)
        t_paused = best_time(fn, n, args.repeat, paused=True)
        print(f"  {label:8s}                     {n / t:>9,.0f} nodes/s  {bytes_per_node(fn, n):5.0f} B/node"
              f"  {t / t_base:4.2f}x baseline time;  in bulk_build(): {n / t_paused:,.0f} nodes/s")


if __name__ == "__main__":
    main()
