"""What a circuit costs before it runs: FLOPs by kind, bytes read and written, peak memory.

``cost(circuit)`` walks the circuit once (no tensor is read: placeholder Arrays work, so a
123B-parameter architecture is analysed without weights) and counts, per node:

- **FLOPs by kind** (``mul``, ``add``, ``div``, ``exp``, ``log``, ``sqrt``, ``sin``, ``cos``,
  ``tanh``, ``erf``, ``pow``, ``cmp``).  An Einsum is counted step by step along the plan the
  backend runs (``circuits.backend.lower.einsum.einsum_steps``: per-operand sums first, then pairwise
  ``dot_general`` contractions in opt_einsum's order): a contraction of ``left`` and ``right``
  over axes ``K`` with result ``R`` does ``|R|·|K|`` multiplies and ``|R|·(|K|-1)`` adds; a sum
  of ``n`` entries down to ``m`` does ``n - m`` adds.  Another order would count differently
  (``(AB)C`` vs ``A(BC)``): these are the backend's numbers.  An Add of ``k`` children does
  ``k - 1`` adds per entry.  A GeneralFunction costs what its ``FunctionSpec.cost`` says
  (functions without one are listed in ``unknown_functions``).  Index, Rearrange, Concat and Tag
  move data only.  ``matmul_multiplies`` counts the multiplies of contractions (dots with at
  least one summed axis), the figure usually quoted for a model.
- **Bytes read and written**: an op reads its operands whole, except a gather (Index,
  gen_index), which reads the entries it selects (and its indices); it writes its result.
  Arrays, Scalars and Symbols are inputs (``input_bytes``) and cost nothing themselves.
- **Memory**: ``peak_bytes`` is the largest sum of live temporaries when the nodes are computed
  one by one in the backend's order (toposort, as ``evaluate(mode='ops')`` runs them), each
  freed after its last use (``circuits.backend.lower.memory``); ``memory_order`` is an order that
  lowers it (each node's children computed biggest-need-first, Sethi-Ullman style, or the
  backend's order if that is no worse), with peak ``memory_order_peak_bytes``.  Compiled code
  (XLA) fuses and plans its own buffers: treat these as the op-by-op upper estimate.

Values are counted at ``dtype`` (float32 by default), as ``evaluate`` computes them.

>>> import numpy as np, circuits as C
>>> x = C.Symbol((4, 8), name='x')
>>> w = C.Array.placeholder((8, 3), '0' * 24, name='w')
>>> c = C.cost(C.GeneralFunction('exp', C.Einsum.from_spec('ab,bc->ac', x, w, name='xw'), name='y'))
>>> c.flops_by_kind            # 4*3*8 multiplies, 4*3*7 adds, 12 exps
{'mul': 96, 'add': 84, 'exp': 12}
>>> c.bytes_read, c.bytes_written, c.peak_bytes
(272, 96, 96)
>>> print(c.table())
#  node  op                   shape  flops  read   write  live
0  'xw'  Einsum ab,bc->ac     [4,3]  180    224 B  48 B   48 B
1  'y'   GeneralFunction exp  [4,3]  12     48 B   48 B   96 B
"""

from __future__ import annotations

from typing import Sequence

from ..backend import Lowered, einsum_steps, einsum_temp_bytes, float_dtype, live_bytes, value_bytes
from ..errors import CircuitError
from ..nodes import Add, Circuit, Einsum, GeneralFunction, Index, Tag
from ..shapes import shape_text
from ..text.html import escape
from ..traversal import toposort

INPUT_TYPES = Lowered.ARGUMENT_TYPES  # Arrays, Scalars and Symbols: inputs, not computed

__all__ = ["cost", "Cost", "NodeCost", "KINDS", "format_bytes"]

# The order kinds are listed in (others a function's cost rule names come after, sorted).
KINDS = ("mul", "add", "div", "exp", "log", "sqrt", "sin", "cos", "tanh", "erf", "pow", "cmp")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def format_bytes(n: float) -> str:
    """``n`` bytes for reading: ``'300 B'``, ``'1.50 KiB'``, ``'64.13 GiB'``.

    >>> format_bytes(300), format_bytes(1536), format_bytes(3 * 2**30)
    ('300 B', '1.50 KiB', '3.00 GiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _format_count(n: int) -> str:
    return str(n) if n < 10**6 else f"{n:.4g}"


class NodeCost:
    """The cost of one node: ``flops`` (kind -> count), ``bytes_read``, ``bytes_written``,
    ``temp_bytes`` (its own intermediates), ``live_bytes`` (memory in use at its step of the
    backend's order) and ``index`` (that step)."""

    __slots__ = ("node", "index", "flops", "bytes_read", "bytes_written", "temp_bytes", "live_bytes",
                 "matmul_multiplies")

    def __init__(self, node, index, flops, bytes_read, bytes_written, temp_bytes, matmul_multiplies):
        self.node = node
        self.index = index
        self.flops = flops
        self.bytes_read = bytes_read
        self.bytes_written = bytes_written
        self.temp_bytes = temp_bytes
        self.live_bytes = 0
        self.matmul_multiplies = matmul_multiplies

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())

    def __repr__(self):
        return (f"<NodeCost {self.node.line()}: {self.flops}, read {self.bytes_read}, "
                f"write {self.bytes_written}, live {self.live_bytes}>")


# ---------------------------------------------------------------------------- counting
def _einsum_flops(node: Einsum) -> tuple[dict, int]:
    if not node.children:
        return {}, 0
    steps, sizes = einsum_steps(node.in_axes, node.out_axes, tuple(c.shape for c in node.children))
    mul = add = matmul = 0
    for step in steps:
        kind = step.kind
        if kind == "sum":
            add += _numel([sizes[a] for a in step.operands[0]]) - _numel([sizes[a] for a in step.result])
        elif kind == "dot":
            out = _numel([sizes[a] for a in step.result])
            k = _numel([sizes[a] for a in step.contract])
            mul += out * k
            add += out * (k - 1)
            if step.contract:
                matmul += out * k
        elif kind == "mul":
            mul += _numel([sizes[a] for a in step.result])
    return {k: v for k, v in (("mul", mul), ("add", add)) if v}, matmul


def _node_cost(node: Circuit, index: int, fdt: str, unknown: set) -> NodeCost:
    t = type(node)
    out_bytes = value_bytes(node, fdt)
    read = sum(value_bytes(c, fdt) for c in node.children)
    flops: dict = {}
    matmul = 0
    temp = 0
    if t is Einsum:
        flops, matmul = _einsum_flops(node)
        temp = einsum_temp_bytes(node, fdt)
    elif t is Add:
        n = len(node.children)
        if n > 1:
            flops = {"add": (n - 1) * _numel(node.shape)}
    elif t is GeneralFunction:
        spec = node.function
        if spec.cost is None:
            unknown.add(spec.name)
        else:
            flops = {k: int(v) for k, v in spec.cost([c.shape for c in node.children], node.shape).items() if v}
        if spec.gather is not None:  # reads the entries it selects and its indices
            read = out_bytes + value_bytes(node.children[spec.index_arg], fdt)
    elif t is Index:
        read = out_bytes
    elif t is Tag:
        read = 0
    return NodeCost(node, index, flops, read, out_bytes, temp, matmul)


def _memory_order(order: list, roots: Sequence[Circuit], fdt: str, temps: dict) -> list:
    """Each node's computed children visited biggest ``need - size`` first (Sethi-Ullman: the
    child whose evaluation needs the most memory runs while the fewest results are held), as an
    iterative post-order walk.  ``need`` treats the DAG as a tree (shared nodes counted once per
    use), a heuristic: the caller keeps whichever order has the lower simulated peak."""
    need: dict = {}
    size: dict = {}
    for n in order:  # toposort: children first
        h = n.hash
        size[h] = value_bytes(n, fdt)
        kids = [c for c in n.children if c.hash in size]
        kids.sort(key=lambda c: need[c.hash] - size[c.hash], reverse=True)
        held = peak = 0
        for c in kids:
            peak = max(peak, held + need[c.hash])
            held += size[c.hash]
        need[h] = max(peak, held + size[h] + temps.get(h, 0))
    computed = set(size)
    done: set = set()
    out = []
    for root in roots:
        if root.hash not in computed or root.hash in done:
            continue
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            h = n.hash
            if h in done:
                continue
            if expanded:
                done.add(h)
                out.append(n)
                continue
            stack.append((n, True))
            kids = [c for c in n.children if c.hash in computed and c.hash not in done]
            kids.sort(key=lambda c: need[c.hash] - size[c.hash], reverse=True)
            for c in reversed(kids):  # the first to run goes on top
                stack.append((c, False))
    return out


# ---------------------------------------------------------------------------- the report object
class Cost:
    """What ``cost(circuit)`` found (see the module docstring for what is counted).

    Totals: ``flops`` (all kinds), ``flops_by_kind``, ``matmul_multiplies``, ``bytes_read``,
    ``bytes_written``, ``input_bytes``, ``peak_bytes`` (backend order), ``memory_order`` and
    ``memory_order_peak_bytes``; per node: ``nodes`` (``NodeCost`` in evaluation order) and
    ``cost[node_or_name]``.  ``str(cost)`` is the full report (totals, then every node with its
    costs and inputs, like a ggml graph dump); ``cost.table()`` a compact table;
    ``cost._repr_html_()`` the notebook view.
    """

    def __init__(self, roots: Sequence[Circuit], fdt: str):
        self.roots = list(roots)
        self.dtype = fdt
        all_nodes = toposort(*self.roots)
        order = [n for n in all_nodes if type(n) not in INPUT_TYPES]
        self.order = order
        self.inputs = [n for n in all_nodes if type(n) in INPUT_TYPES]
        self.input_bytes = sum(value_bytes(n, fdt) for n in self.inputs)
        unknown: set = set()
        self.nodes = [_node_cost(n, i, fdt, unknown) for i, n in enumerate(order)]
        self.unknown_functions = sorted(unknown)
        temps = {nc.node.hash: nc.temp_bytes for nc in self.nodes if nc.temp_bytes}
        live = live_bytes(order, self.roots, fdt, temps)
        for nc, b in zip(self.nodes, live):
            nc.live_bytes = b
        self.peak_bytes = max(live, default=0)
        candidate = _memory_order(order, self.roots, fdt, temps)
        candidate_peak = max(live_bytes(candidate, self.roots, fdt, temps), default=0)
        if candidate_peak < self.peak_bytes:
            self.memory_order, self.memory_order_peak_bytes = candidate, candidate_peak
        else:
            self.memory_order, self.memory_order_peak_bytes = order, self.peak_bytes
        totals: dict = {}
        for nc in self.nodes:
            for k, v in nc.flops.items():
                totals[k] = totals.get(k, 0) + v
        rank = {k: i for i, k in enumerate(KINDS)}
        self.flops_by_kind = {k: totals[k] for k in sorted(totals, key=lambda k: (rank.get(k, len(KINDS)), k))}
        self.flops = sum(totals.values())
        self.matmul_multiplies = sum(nc.matmul_multiplies for nc in self.nodes)
        self.bytes_read = sum(nc.bytes_read for nc in self.nodes)
        self.bytes_written = sum(nc.bytes_written for nc in self.nodes)
        self._by_hash = {nc.node.hash: nc for nc in self.nodes}

    # ------------------------------------------------------------------ lookup
    def __getitem__(self, key) -> NodeCost:
        """The cost of a node, given as a node or by a name that one computed node bears."""
        if isinstance(key, Circuit):
            found = self._by_hash.get(key.hash)
            if found is None:
                raise CircuitError(f"cost: {key.line()} is not a computed node of this circuit (inputs cost nothing)")
            return found
        hits = [nc for nc in self.nodes if nc.node.name == key]
        if len(hits) != 1:
            what = "no computed node" if not hits else f"{len(hits)} computed nodes"
            raise CircuitError(f"cost: {what} named {key!r}; give the node itself (circuit.get(...)) instead")
        return hits[0]

    def __len__(self):
        return len(self.nodes)

    # ------------------------------------------------------------------ text
    def _label(self, node: Circuit) -> str:
        nc = self._by_hash.get(node.hash)
        if node.name is not None:
            return repr(node.name) if nc is None else f"#{nc.index} {node.name!r}"
        return f"#{nc.index}" if nc is not None else node.line()

    def totals(self) -> str:
        """The totals block of the report."""
        roots = ", ".join(r.line() for r in self.roots)
        lines = [
            f"Cost of {roots} ({self.dtype}; {len(self.nodes)} computed nodes, {len(self.inputs)} inputs)",
            f"Size of temporary storage is up to {self.peak_bytes} bytes ({format_bytes(self.peak_bytes)}) "
            f"in the backend's order, {self.memory_order_peak_bytes} bytes "
            f"({format_bytes(self.memory_order_peak_bytes)}) in the memory-aware order.",
            "Total cost:",
            f"  flops: {_format_count(self.flops)}",
        ]
        lines += [f"    {k}: {_format_count(v)}" for k, v in self.flops_by_kind.items()]
        lines += [
            f"  matmul multiplies: {_format_count(self.matmul_multiplies)}",
            f"  read: {format_bytes(self.bytes_read)}",
            f"  write: {format_bytes(self.bytes_written)}",
            f"  inputs: {format_bytes(self.input_bytes)}",
        ]
        if self.unknown_functions:
            lines.append(f"  not counted (no FunctionSpec.cost): {', '.join(self.unknown_functions)}")
        return "\n".join(lines)

    def report(self, max_nodes: int | None = None) -> str:
        """The totals, then every computed node in evaluation order with its costs and inputs
        (at most ``max_nodes`` of them)."""
        out = [self.totals(), ""]
        shown = self.nodes if max_nodes is None else self.nodes[:max_nodes]
        for nc in shown:
            n = nc.node
            out.append(f"#{nc.index} {n.line()}")
            out.append(f"|   {shape_text(n.shape)} {n.dtype}, {format_bytes(nc.bytes_written)}")
            parts = [f"{k} {_format_count(v)}" for k, v in nc.flops.items()]
            parts += [f"read {format_bytes(nc.bytes_read)}", f"live {format_bytes(nc.live_bytes)}"]
            if nc.temp_bytes:
                parts.append(f"temp {format_bytes(nc.temp_bytes)}")
            out.append("|   costs: " + ", ".join(parts))
            for letter, c in zip("xyzwvutsrqponmlkjihgfedcba", n.children):
                out.append(f"|   {letter}: {self._label(c)} {shape_text(c.shape)}")
            out.append("")
        if len(shown) < len(self.nodes):
            out.append(f"... {len(self.nodes) - len(shown)} more nodes (report(max_nodes=None) shows all)")
        return "\n".join(out).rstrip("\n")

    def _rows(self, max_rows, sort):
        rows = list(self.nodes)
        if sort == "flops":
            rows.sort(key=lambda nc: -nc.total_flops)
        elif sort == "bytes":
            rows.sort(key=lambda nc: -(nc.bytes_read + nc.bytes_written))
        elif sort is not None:
            raise CircuitError(f"sort={sort!r}: use None (evaluation order), 'flops' or 'bytes'")
        return rows if max_rows is None else rows[:max_rows]

    def table(self, max_rows: int | None = 50, sort: str | None = None) -> str:
        """One row per computed node: step, name, op, shape, FLOPs, bytes read and written, memory
        live at that step; ``sort='flops'`` or ``'bytes'`` puts the costliest first."""
        head = ("#", "node", "op", "shape", "flops", "read", "write", "live")
        rows = [head]
        for nc in self._rows(max_rows, sort):
            n = nc.node
            op = n.line()
            if n.name is not None:
                op = op.split(" ", 1)[1] if op.startswith(repr(n.name)) else op
            rows.append((str(nc.index), repr(n.name) if n.name else "", op[:40], shape_text(n.shape),
                         _format_count(nc.total_flops), format_bytes(nc.bytes_read),
                         format_bytes(nc.bytes_written), format_bytes(nc.live_bytes)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
        if max_rows is not None and len(self.nodes) > max_rows:
            text += f"\n... {len(self.nodes) - max_rows} more rows (table(max_rows=None))"
        return text

    def _repr_html_(self) -> str:
        esc = escape
        totals = "".join(f"<tr><td>{esc(k)}</td><td>{_format_count(v)}</td></tr>" for k, v in self.flops_by_kind.items())
        head = "".join(f"<th>{h}</th>" for h in ("#", "node", "op", "shape", "flops", "read", "write", "live"))
        body = []
        for nc in self._rows(200, None):
            n = nc.node
            cells = (nc.index, n.name or "", n.line(), shape_text(n.shape), _format_count(nc.total_flops),
                     format_bytes(nc.bytes_read), format_bytes(nc.bytes_written), format_bytes(nc.live_bytes))
            body.append("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in cells) + "</tr>")
        return (
            f"<div><b>{esc(self.totals().splitlines()[0])}</b>"
            f"<table><tr><th>flops</th><td>{_format_count(self.flops)}</td></tr>{totals}"
            f"<tr><th>read</th><td>{format_bytes(self.bytes_read)}</td></tr>"
            f"<tr><th>write</th><td>{format_bytes(self.bytes_written)}</td></tr>"
            f"<tr><th>peak</th><td>{format_bytes(self.peak_bytes)} (memory-aware order: "
            f"{format_bytes(self.memory_order_peak_bytes)})</td></tr></table>"
            f"<table><tr>{head}</tr>{''.join(body)}</table></div>"
        )

    def __str__(self):
        return self.report()

    def __repr__(self):
        return (f"<Cost {len(self.nodes)} nodes: {_format_count(self.flops)} flops, read "
                f"{format_bytes(self.bytes_read)}, write {format_bytes(self.bytes_written)}, "
                f"peak {format_bytes(self.peak_bytes)}>")


def cost(circuit: Circuit | Sequence[Circuit], *, dtype="float32") -> Cost:
    """The cost of evaluating ``circuit`` (or several roots together): FLOPs by kind, bytes read
    and written, peak memory; no tensor is read, so placeholder Arrays are fine.  See the module
    docstring for what is counted and how.

    >>> import circuits as C
    >>> x = C.Symbol((2, 3), name='x')
    >>> c = C.cost(C.Add(x, x, name='twice'))
    >>> c.flops, c.flops_by_kind, c['twice'].bytes_read
    (6, {'add': 6}, 48)
    """
    roots = [circuit] if isinstance(circuit, Circuit) else list(circuit)
    if not roots or not all(isinstance(r, Circuit) for r in roots):
        raise CircuitError(f"cost: give a circuit or a list of circuits, got {circuit!r}")
    return Cost(roots, float_dtype(dtype))
