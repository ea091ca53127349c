"""Text format speed: print and parse a ~100,000-node circuit, in nodes per second.

Run: ``.venv/bin/python -m benchmarks.bench_text``.  Target: >= 100,000 nodes/s for printing and
for parsing.

Baselines, run in the same process, are the floors each side cannot go below:
- printing: one ``node.line()`` per distinct node joined by newlines (no indentation, serials or
  references), i.e. the cost of producing the lines at all;
- parsing: building the same nodes directly with their constructors, children first (no text),
  i.e. the cost of the validating constructors the parser must call.
Both baselines run with the garbage collector paused, as the printer and parser do.

The circuit is transformer-like: blocks of attention-style heads on a residual stream, with
shared weights, repeated names (so serials), unnamed nodes and references; it is deep enough
(thousands of levels) that the printer writes definition blocks too.
"""

from __future__ import annotations

import sys

import numpy as np

from circuits import Add, Array, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, toposort
from circuits.text import parse, to_text
from circuits.text.printer import gc_paused

from .common import interleaved_medians, interleaved_times, medians_of, report


def make_circuit(target_nodes: int = 100_000, heads: int = 16):
    """A residual stream of attention-like blocks with about ``target_nodes`` distinct nodes."""
    rng = np.random.default_rng(0)
    weights = Array(rng.standard_normal((8, 16, 16)).astype(np.float32), name="w")
    h = Symbol((4, 16), name="x")
    count = 2
    block = 0
    while count < target_nodes:
        terms = [h]
        for k in range(heads):
            wk = Index(weights, (k % 8, slice(None), slice(None)), name=f"b{block}.w{k}")
            q = Einsum.from_spec("sd,ed->se", h, wk, name="q")
            p = GeneralFunction("softmax", q, name="p")
            r = Rearrange(p, "s (a b) -> s a b", a=4)
            rr = Rearrange(r, "s a b -> s (a b)", name="merged")
            terms.append(Add(rr, Scalar(0.5 * k, (16,)), Index(h, (slice(None, None, -1),))))
        h = Add(*terms, name=f"b{block}.resid")
        block += 1
        count += heads * 6 + 2  # (the reversed residual is one node shared by the heads)
    return h


def joined_lines(nodes):
    """The baseline for printing: each distinct node's line, joined."""
    with gc_paused():
        return "\n".join([m.line() for m in nodes])


def rebuild(nodes):
    """The baseline for parsing: every node built again from its payload, children first."""
    with gc_paused():
        return _rebuild(nodes)


def _rebuild(nodes):
    new = {}
    for n in nodes:
        kids = [new[c.hash] for c in n.children]
        t = n.type_name
        if t == "Array":
            out = Array.placeholder(n.shape, n.content_hash, name=n.name)
        elif t == "Scalar":
            out = Scalar(n.value, n.shape, name=n.name)
        elif t == "Symbol":
            out = Symbol(n.shape, name=n.name, dtype=n.dtype, uuid=n.uuid)
        elif t == "Einsum":
            out = Einsum(*kids, in_axes=n.in_axes, out_axes=n.out_axes, name=n.name)
        elif t == "Add":
            out = Add(*kids, name=n.name)
        elif t == "GeneralFunction":
            out = GeneralFunction(n.function, *kids, name=n.name)
        elif t == "Index":
            out = Index(kids[0], n.index, name=n.name)
        elif t == "Rearrange":
            out = Rearrange(kids[0], (n.in_groups, n.out_groups), name=n.name, **dict(n.given_sizes))
        else:  # pragma: no cover - the benchmark circuit has no other types
            raise AssertionError(t)
        new[n.hash] = out
    return new[nodes[-1].hash]


def cpu_medians(fns, runs):
    """Median CPU time (``time.process_time``) of each function, runs interleaved: on a shared
    machine this is steadier than wall time, which counts the time other processes run."""
    return medians_of(interleaved_times(fns, runs=runs, warmup=0, cpu=True)[1])


def main(runs: int = 5, target: int = 100_000):
    circuit = make_circuit(target)
    nodes = toposort(circuit)
    n = len(nodes)
    text = to_text(circuit)
    # (no store: the parsed weights are placeholders, which print alike but are other nodes)
    assert to_text(parse(text)) == text
    fns = {
        "print": lambda: to_text(circuit),
        "lines": lambda: joined_lines(nodes),
        "parse": lambda: parse(text),
        "build": lambda: rebuild(nodes),
    }
    times = interleaved_medians(fns, runs=runs, warmup=1)
    cpu = cpu_medians(fns, runs=runs)

    def row(key):
        return (f"{times[key] * 1e3:8.1f} ms  {n / times[key]:>10,.0f} nodes/s   "
                f"(CPU {cpu[key] * 1e3:7.1f} ms  {n / cpu[key]:>10,.0f} nodes/s)")

    rows = [
        ("distinct nodes", f"{n:,}"),
        ("text", f"{text.count(chr(10)) + 1:,} lines, {len(text) / 1e6:.1f} MB, "
                 f"{text.count(chr(10) + '~')} definition blocks"),
        ("print", row("print")),
        ("baseline: node.line() joined", row("lines")),
        ("print / baseline", f"{times['print'] / times['lines']:8.2f}   (CPU {cpu['print'] / cpu['lines']:.2f})"),
        ("parse", row("parse")),
        ("baseline: constructors only", row("build")),
        ("parse / baseline", f"{times['parse'] / times['build']:8.2f}   (CPU {cpu['parse'] / cpu['build']:.2f})"),
    ]
    report(f"text format, {n:,}-node circuit (Python {sys.version.split()[0]})", rows)


if __name__ == "__main__":
    main()
