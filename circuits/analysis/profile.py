"""Where evaluation time goes: per named node self time, total time and calls, on CPU or GPU.

``profile(circuit, inputs)`` cuts the circuit into **segments**, one per named computed node (and
the root): a segment is its head node and the unnamed nodes only it uses (an unnamed node that
several segments use heads a segment of its own).  Each segment is lowered and compiled on its
own (``Program`` with the other heads' values given, the backend's compile cache, so segments of
one structure, e.g. every head of every layer, share compiled code) and run in toposort order,
each timed from its call until its result is ready (``block_until_ready``: on a GPU this is the
device time plus one dispatch).  A warm-up run compiles everything first; the timed runs reuse it.

- **self time** of a named node: the time of its segment: the node and the unnamed work only it
  needs, with its named inputs already computed.
- **total time**: the self times of every segment it depends on (its subtree), each counted once.
- **calls**: how many times the segment ran (``repeat``).

What this means for fused XLA code, honestly: one plain ``evaluate`` compiles the whole circuit as
one XLA program that fuses across names (an elementwise op into the matmul before it, a softmax
into its exp), so a node's cost in the fused program is not separable.  The profile measures a
slightly different program, cut at every name: each named value is materialised, and each
segment pays one dispatch.  ``wall_seconds`` (the timed run) against ``plain_seconds``
(``baseline=True`` runs the plain compiled evaluation as well) shows what the cutting costs; on
the seed model it is within 20% (BENCHMARKS.md).  Self times therefore say which named node is
expensive, not how long it takes inside the fused program.

>>> import numpy as np, circuits as C
>>> x = C.Symbol((64, 64), name='x')
>>> h = C.GeneralFunction('exp', C.Einsum.from_spec('ab,bc->ac', x, x, name='xx'), name='h')
>>> p = C.profile(C.Add(h, x, name='out'), {'x': np.eye(64)})
>>> [(r.node.name, r.depth, r.calls) for r in p.rows]
[('out', 0, 1), ('h', 1, 1), ('xx', 2, 1)]
>>> p['out'].total_seconds >= p['h'].total_seconds >= p['xx'].total_seconds > 0
True
"""

from __future__ import annotations

import html
import time
from typing import Mapping, Sequence

import numpy as np

from ..backend import Lowered, Program, float_dtype, precision
from ..backend import compile as compile_circuit
from ..errors import CircuitError, EvaluationError
from ..nodes import Circuit

__all__ = ["profile", "Profile", "ProfileRow"]

MAX_TREE_DEPTH = 32  # deeper rows print at this indentation (an 88-layer residual chain nests deeply)


def _format_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f}s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f}ms"
    return f"{s * 1e6:.3f}us"


class ProfileRow:
    """One named node (or shared unnamed node) of a profile: ``self_seconds``, ``total_seconds``,
    ``calls``, and ``depth`` in the tree of named nodes."""

    __slots__ = ("node", "self_seconds", "total_seconds", "calls", "depth", "label")

    def __init__(self, node, self_seconds, total_seconds, calls, depth, label):
        self.node, self.self_seconds, self.total_seconds = node, self_seconds, total_seconds
        self.calls, self.depth, self.label = calls, depth, label

    def __repr__(self):
        return (f"<ProfileRow {self.label}: self {_format_seconds(self.self_seconds)}, total "
                f"{_format_seconds(self.total_seconds)}, calls {self.calls}>")


def _segments(program: Program, roots: Sequence[Circuit]):
    """Segment heads in toposort order (named computed nodes, roots, and unnamed nodes that
    several segments use), and for each head the slots of the other heads its segment reads."""
    nodes = program.nodes
    computed = [i for i, n in enumerate(nodes) if type(n) not in Lowered.ARGUMENT_TYPES]
    consumers: dict[int, list[int]] = {}
    for i in computed:
        for j in program.child_slots[i]:
            consumers.setdefault(j, []).append(i)
    root_slots = set(program.outputs)
    seg_of: dict[int, int] = {}
    for i in reversed(computed):
        if i in root_slots or nodes[i].name is not None:
            seg_of[i] = i
            continue
        owners = {seg_of[p] for p in consumers.get(i, ())}
        seg_of[i] = owners.pop() if len(owners) == 1 else i
    heads = [i for i in computed if seg_of[i] == i]
    reads: dict[int, dict[int, None]] = {h: {} for h in heads}
    for i in computed:
        for j in program.child_slots[i]:
            if seg_of.get(j) == j:  # a head's value, computed by its own segment
                reads[seg_of[i]][j] = None
    return heads, reads


class Profile:
    """What ``profile`` measured: ``rows`` (``ProfileRow`` in tree order), ``value`` (the
    circuit's value, numpy, from the last timed run), ``device``,
    ``wall_seconds`` (the timed runs), ``plain_seconds`` (one plain compiled evaluation, with
    ``baseline=True``, else None), ``segments``; ``str(p)`` is the tree table, ``p.by_name()``
    sums over nodes sharing a name, ``p._repr_html_()`` the notebook table."""

    def __init__(self, rows, device, wall_seconds, plain_seconds, repeat, value=None):
        self.rows = rows
        self.value = value
        self.device = device
        self.wall_seconds = wall_seconds
        self.plain_seconds = plain_seconds
        self.repeat = repeat
        self.segments = len(rows)
        self.self_seconds = sum(r.self_seconds for r in rows)

    def __getitem__(self, key) -> ProfileRow:
        """The row of a node, or of the one node bearing a name."""
        if isinstance(key, Circuit):
            hits = [r for r in self.rows if r.node.hash == key.hash]
        else:
            hits = [r for r in self.rows if r.node.name == key]
        if len(hits) != 1:
            what = "no profiled node" if not hits else f"{len(hits)} profiled nodes"
            raise CircuitError(f"profile: {what} for {key!r}; give the node itself, or see p.by_name()")
        return hits[0]

    def _columns(self):
        dev = self.device
        return ("Node", f"Self {dev} total", f"{dev} total", "Number of Calls")

    def _tree_rows(self):
        out = []
        n = len(self.rows)
        for k, r in enumerate(self.rows):
            d = min(r.depth, MAX_TREE_DEPTH)
            if d == 0:
                prefix = ""
            else:
                last = k + 1 >= n or self.rows[k + 1].depth < r.depth
                prefix = "│" * (d - 1) + ("└── " if last else "├── ")
            out.append((prefix + r.label, _format_seconds(r.self_seconds), _format_seconds(r.total_seconds),
                        str(r.calls)))
        return out

    def table(self) -> str:
        """The tree table (seed 003's layout)."""
        head = self._columns()
        rows = self._tree_rows()
        widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(4)]
        lines = [" | ".join(h.ljust(w) for h, w in zip(head, widths)),
                 "-|-".join("-" * w for w in widths)]
        lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
        foot = f"{self.segments} segments, timed run {_format_seconds(self.wall_seconds)}"
        if self.plain_seconds is not None:
            foot += f"; one plain compiled evaluation {_format_seconds(self.plain_seconds)} " \
                    f"(x{self.wall_seconds / max(self.plain_seconds, 1e-12):.2f})"
        return "\n".join(lines) + "\n" + foot

    def by_name(self) -> str:
        """Self time summed over the nodes of each name (``a.q`` of every head together), the
        costliest first; calls count every node."""
        agg: dict = {}
        for r in self.rows:
            s, c = agg.get(r.label, (0.0, 0))
            agg[r.label] = (s + r.self_seconds, c + r.calls)
        rows = sorted(agg.items(), key=lambda kv: -kv[1][0])
        head = ("Name", f"Self {self.device} total", "Number of Calls")
        body = [(k, _format_seconds(s), str(c)) for k, (s, c) in rows]
        widths = [max(len(head[i]), *(len(r[i]) for r in body)) for i in range(3)]
        lines = [" | ".join(h.ljust(w) for h, w in zip(head, widths)), "-|-".join("-" * w for w in widths)]
        return "\n".join(lines + [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in body])

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(h)}</th>" for h in self._columns())
        body = "".join(
            "<tr>" + f"<td style='text-align:left;padding-left:{min(r.depth, MAX_TREE_DEPTH)}em'>{esc(r.label)}</td>"
            + "".join(f"<td>{esc(c)}</td>" for c in (_format_seconds(r.self_seconds),
                                                     _format_seconds(r.total_seconds), str(r.calls)))
            + "</tr>" for r in self.rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    def __str__(self):
        return self.table()

    def __repr__(self):
        return (f"<Profile on {self.device}: {self.segments} segments, self {_format_seconds(self.self_seconds)}, "
                f"wall {_format_seconds(self.wall_seconds)}>")


def profile(circuit: Circuit, inputs: Mapping | None = None, *, dtype="float32", repeat: int = 1,
            baseline: bool = False) -> Profile:
    """Time every named node of ``circuit`` (see the module docstring for what the times mean).

    ``inputs`` binds Symbols as for ``evaluate``; ``repeat`` timed runs follow one warm-up run
    (which compiles); ``baseline=True`` also times one plain compiled evaluation
    (``plain_seconds``) for comparison.

    >>> import numpy as np, circuits as C
    >>> x = C.Symbol((3,), name='x')
    >>> p = C.profile(C.GeneralFunction('exp', x, name='e'), {'x': np.zeros(3)}, repeat=2)
    >>> p['e'].calls, p.device in ('CPU', 'GPU', 'TPU')
    (2, True)
    """
    if not isinstance(circuit, Circuit):
        raise CircuitError(f"profile: give a circuit, got {circuit!r}")
    if int(repeat) < 1:
        raise EvaluationError(f"profile: repeat={repeat}: give a positive number of timed runs")
    import jax

    fdt = float_dtype(dtype)
    whole = Lowered(circuit, fdt).program
    with precision(fdt):
        heads, reads = _segments(whole, [circuit])
        position = {whole.nodes[i].hash: k for k, i in enumerate(heads)}
        plans = []
        for i in heads:
            node = whole.nodes[i]
            # the other heads it reads are given (only those: a set of every head per segment
            # would make a circuit of many names quadratic)
            segment = Lowered(node, fdt, given=[whole.nodes[j].hash for j in reads[i]])
            prog = segment.program
            given = {prog.nodes[s].hash: None for s in prog.given_slots}
            args = segment.bind(inputs, given=given)
            slots = [(k, position[prog.nodes[s].hash]) for k, s in enumerate(prog.arg_slots) if s in prog.given_slots]
            fn = segment.function("jit")
            plans.append((fn, args, slots))
        # a segment's value is dropped after the last segment that reads it
        last_reader = {}
        for k, (_, _, slots) in enumerate(plans):
            for _, j in slots:
                last_reader[j] = k

        def run(times):
            values: list = [None] * len(plans)
            for k, (fn, args, slots) in enumerate(plans):
                if slots:
                    args = list(args)
                    for pos, j in slots:
                        args[pos] = values[j]
                start = time.perf_counter()
                out = fn(args)[0]
                out.block_until_ready()
                if times is not None:
                    times[k] += time.perf_counter() - start
                values[k] = out
                for _, j in slots:
                    if last_reader[j] == k:
                        values[j] = None
            return values[-1]

        run(None)  # compiles every segment
        times = [0.0] * len(plans)
        start = time.perf_counter()
        for _ in range(int(repeat)):
            value = run(times)
        wall = (time.perf_counter() - start) / int(repeat)
        plain = None
        if baseline:
            f = compile_circuit(circuit, dtype=fdt)
            f(inputs)
            start = time.perf_counter()
            f(inputs)
            plain = time.perf_counter() - start
    rows = _tree(whole, heads, plans, times, int(repeat))
    device = jax.devices()[0].platform.upper()
    return Profile(rows, device, wall, plain, int(repeat), np.asarray(value))


def _tree(whole: Program, heads, plans, times, repeat) -> list[ProfileRow]:
    """Rows in tree order: a pre-order walk of the segment graph from the root, children in the
    order their values are read, each segment shown once (at its first occurrence)."""
    n = len(heads)
    kids = [[j for _, j in slots] for _, _, slots in plans]
    reach = [0] * n  # bitset of the segments each one depends on, itself included
    for k in range(n):
        bits = 1 << k
        for j in kids[k]:
            bits |= reach[j]
        reach[k] = bits
    # each total sums the times under its bitset's ones (unpacked by numpy: a chain of n named
    # nodes has n^2/2 of them)
    weights, size = np.asarray(times, np.float64), (n + 7) // 8
    total = [float(weights @ np.unpackbits(np.frombuffer(bits.to_bytes(size, "little"), np.uint8),
                                           count=n, bitorder="little"))
             for bits in reach]
    rows: list[ProfileRow] = []
    seen = set()
    stack = [(n - 1, 0)]
    while stack:
        k, depth = stack.pop()
        if k in seen:
            continue
        seen.add(k)
        node = whole.nodes[heads[k]]
        label = repr(node.name) if node.name is not None else f"<{node.line()}>"
        rows.append(ProfileRow(node, times[k], total[k], repeat, depth, label))
        for j in reversed(list(dict.fromkeys(kids[k]))):
            if j not in seen:
                stack.append((j, depth + 1))
    for k in range(n):  # segments the root does not read (none in one circuit; kept for safety)
        if k not in seen:
            node = whole.nodes[heads[k]]
            rows.append(ProfileRow(node, times[k], total[k], repeat, 0, repr(node.name)))
    return rows
