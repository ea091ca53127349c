"""The DAG builder behind ``circuits.testing.dags``.

Shape first, then a node of that shape.  Each built node carries an interval bounding its values
(exact for leaves, interval arithmetic above), so that functions needing positive or bounded
arguments only get such children and every node stays within ``MAGNITUDE_CAP``.  A composite
that breaks its caller's bounds is replaced by a leaf; built nodes go to a pool that later draws
reuse, which is where the sharing comes from.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from ..errors import ShapeError
from ..functions import GenIndex, lookup
from ..nodes import (
    Add,
    Array,
    Concat,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Module,
    ModuleArgSpec,
    ModuleSpec,
    Rearrange,
    Scalar,
    Scatter,
    SetSymbolicShape,
    Symbol,
    Tag,
)
from ..nodes.einsum import format_spec
from ..shapes import broadcast_shapes, symbolic_size
from ..traversal import toposort
from .strategies import (
    MAGNITUDE_CAP,
    POSITIVE_MIN,
    EinsumSpec,
    _index_to,
    _rearrange_plan,
    arrays,
    einsum_specs,
    int_arrays,
)


class Options(NamedTuple):
    shape: st.SearchStrategy
    types: tuple
    functions: tuple
    max_nodes: int
    max_depth: int
    names: st.SearchStrategy
    dtype: str
    root_types: tuple | None


class Need(NamedTuple):
    """What the caller needs of a node's values."""

    positive: bool = False
    max_mag: float = MAGNITUDE_CAP

    def ok(self, iv) -> bool:
        lo, hi = iv
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return False
        if max(abs(lo), abs(hi)) > self.max_mag:
            return False
        return not self.positive or lo >= POSITIVE_MIN


ANY = Need()
POSITIVE = Need(positive=True)

_SCALARS = (1.0, -1.0, 0.5, 2.0, 0.0, -0.5, 1.5)
_POSITIVE_SCALARS = (1.0, 0.5, 2.0, 1.5)


def _round(v):
    # Scalars print in positional notation: keep them short.
    return round(v, 3)
_MAX_ELEMENTS = 512


def _imul(a, b):
    products = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return min(products), max(products)


def _hull(ivs):
    return min(i[0] for i in ivs), max(i[1] for i in ivs)


def _function_kind(spec) -> str | None:
    """How a function is drawn, read off its spec: ``'unary'`` (elementwise, one argument),
    ``'binary'`` (elementwise, two broadcasting arguments), ``'rows'`` (on the last axis, same
    shape: softmax), ``'reduction'`` (drops the last axis: logsumexp), or None (not drawable)."""
    if spec.elementwise and spec.num_args == (1, 1):
        return "unary"
    if spec.bounds is None:
        return None
    if spec.elementwise and spec.num_args == (2, 2):
        return "binary"
    if spec.core_ndim == 1 and spec.num_args == (1, 1):
        probe = (2, 3)
        try:
            out = tuple(spec.shape_rule([probe]))
        except ShapeError:
            return None
        if out == probe:
            return "rows"
        if out == probe[:-1]:
            return "reduction"
    return None


def _can_be_positive(spec) -> bool:
    b = spec.bounds
    return b is not None and (b.positive or b.keeps_positive)


class Builder:
    def __init__(self, draw, opts: Options):
        self.draw = draw
        self.opts = opts
        self.types = set(opts.types)
        self.pool: list[tuple] = []  # (node, interval)
        self.height: dict = {}  # node -> longest path down to a leaf
        # node -> whether a DiscreteVar is at or below it.  Sampling (circuits.expand.sample) gives
        # a variable a leading axis of samples, and expand batches a gather only in its indices:
        # while ``gathered`` is positive (building a gather's gathered argument) no variable is
        # drawn or reused, so that every drawn circuit can be sampled.
        self.has_var: dict = {}
        self.gathered = 0
        self.budget = opts.max_nodes
        self.can_be_positive = Array in self.types or Scalar in self.types
        # name -> (spec, kind), in the order given (not set order): examples replay across processes.
        self.functions = {}
        for f in dict.fromkeys(opts.functions):
            if f == "gen_index":
                continue
            spec = lookup(f)
            kind = _function_kind(spec)
            if kind is None:
                from hypothesis.errors import InvalidArgument

                raise InvalidArgument(
                    f"function {f!r} cannot be drawn: only elementwise functions and functions on the "
                    "last axis (core_ndim=1) of one argument can, and all but elementwise ones of one "
                    "argument must declare bounds on their values (FunctionSpec.bounds)")
            b = spec.bounds
            if (not self.can_be_positive and b is not None
                    and any(b.arg(i)[0] for i in range(spec.num_args[0]))):
                continue  # nothing could give it the positive arguments it needs
            self.functions[f] = (spec, kind)
        self.gather = "gen_index" in opts.functions

    # ------------------------------------------------------------------ entry
    def build(self, shape, depth, need=ANY, root_types=None):
        draw = self.draw
        is_root = depth == self.opts.max_depth and not self.pool
        if not is_root:
            fits = [b for b in self.pool
                    if b[0].shape == shape and need.ok(b[1]) and self.height[b[0]] <= depth and self._reusable(b)]
            if fits and (self.budget <= 0 or draw(st.booleans())):
                return draw(st.sampled_from(fits))
        kinds = self._kinds(shape, need, root_types)
        composite = [k for k in kinds if k not in (Array, Scalar, Symbol)]
        # Leaves get likelier deeper down; the root is rarely one.
        leaf_percent = 0 if is_root else 5 + 25 * (self.opts.max_depth - depth) // max(self.opts.max_depth, 1)
        leafy = depth <= 0 or self.budget <= 0 or (leaf_percent and draw(st.integers(0, 99)) < leaf_percent)
        if not composite or (leafy and len(composite) < len(kinds)):
            return self.leaf(shape, need, [k for k in kinds if k in (Array, Scalar, Symbol)])
        self.budget -= 1
        # GeneralFunctions three times as likely as each other type: there are many functions, of
        # four kinds, and their arguments hold the broadcasting sums that rewrites get wrong.
        kind = draw(st.sampled_from([k for k in composite for _ in range(3 if k is GeneralFunction else 1)]))
        built = getattr(self, "make_" + kind.__name__.lower())(shape, max(depth - 1, 0), need)
        if built is None or not need.ok(built[1]):
            if root_types is not None:
                from hypothesis import reject

                reject()
            return self.leaf(shape, need)
        self._add_to_pool(built)
        return built

    def _add_to_pool(self, built):
        node = built[0]
        self.height[node] = 1 + max((self.height.get(c, 0) for c in node.children), default=-1)
        self.has_var[node] = type(node) is DiscreteVar or any(self.has_var.get(c, False) for c in node.children)
        self.pool.append(built)

    def _reusable(self, built) -> bool:
        return not (self.gathered and self.has_var[built[0]])

    def _kinds(self, shape, need, root_types):
        kinds = [t for t in (root_types or self.opts.types)]
        if self.gathered:
            kinds = [k for k in kinds if k is not DiscreteVar]
        if need.positive:
            kinds = [k for k in kinds if k is not Symbol]
        if not shape:
            kinds = [k for k in kinds if k is not Concat]
        if 0 in shape:
            # Empty tensors: keep to the node types whose rules need no values.
            kinds = [k for k in kinds if k in (Array, Scalar, Symbol, Add, Einsum, Tag, Module, SetSymbolicShape)]
        if math.prod(shape) > _MAX_ELEMENTS:
            kinds = [k for k in kinds if k not in (Einsum, Rearrange, Index, Concat)]
        return kinds

    def name(self):
        return self.draw(self.opts.names)

    # ------------------------------------------------------------------ leaves
    def leaf(self, shape, need, kinds=None):
        draw = self.draw
        if kinds is None:
            kinds = [k for k in (Array, Scalar, Symbol) if k in self.types]
            if need.positive:
                kinds = [k for k in kinds if k is not Symbol] or [Array]
        kind = draw(st.sampled_from(kinds))
        self.budget -= 1
        if kind is Array:
            value = draw(arrays(shape, self.opts.dtype, positive=need.positive))
            node = Array(value, name=self.name())
            # An empty array has no values: any bound holds.
            iv = (float(value.min()), float(value.max())) if value.size else (1.0, 1.0)
        elif kind is Scalar:
            if need.positive:
                values = st.sampled_from(_POSITIVE_SCALARS) | st.floats(0.5, 1.5).map(_round)
            else:
                values = st.sampled_from(_SCALARS) | st.floats(-1.5, 1.5).map(_round)
            v = draw(values)
            node = Scalar(v, shape, name=self.name())
            iv = (v, v)
        else:
            node = Symbol(shape, name=self.name(), dtype=self.opts.dtype)
            iv = (-1.5, 1.5)
        built = (node, iv)
        self._add_to_pool(built)
        return built

    # ------------------------------------------------------------------ composites
    def _pool_pick(self, need, fits_shape, depth):
        """A pool node (with its interval) whose shape passes ``fits_shape``, or None: drawing
        children from nodes built elsewhere in the circuit is what makes it a DAG."""
        fits = [b for b in self.pool
                if fits_shape(b[0].shape) and need.ok(b[1]) and self.height[b[0]] <= depth and self._reusable(b)]
        if fits and self.draw(st.booleans()):
            return self.draw(st.sampled_from(fits))
        return None

    def make_einsum(self, shape, depth, need):
        draw = self.draw
        shared = self._pool_pick(Need(need.positive), lambda s: len(s) <= 4, depth)
        if shared is not None:
            spec = draw(_einsum_around(shape, shared[0].shape))
        else:
            spec = draw(einsum_specs(shape, max_operands=3 if shape else 2))
        if any(math.prod(s) > _MAX_ELEMENTS for s in spec.input_shapes):
            return None
        kids = [self.build(s, depth, Need(need.positive)) for s in spec.input_shapes[shared is not None:]]
        if shared is not None:
            position = draw(st.integers(0, len(kids)))
            kids.insert(position, shared)
            spec = _move_first(spec, position)
        iv = (1.0, 1.0)
        for _, civ in kids:
            iv = _imul(iv, civ)
        sizes = {}
        for t, s in zip(spec.in_axes, spec.input_shapes):
            sizes.update(zip(t, s))
        count = math.prod(n for a, n in sizes.items() if a not in spec.out_axes)
        iv = (iv[0] * count, iv[1] * count)
        node = Einsum(*(k[0] for k in kids), in_axes=spec.in_axes, out_axes=spec.out_axes, name=self.name())
        return node, iv

    def make_add(self, shape, depth, need, *, broadcast=False):
        """A sum of terms broadcasting to ``shape``; ``broadcast=True``: one term of the full
        shape and one or two of fewer axes (a function's argument, see ``_argument``)."""
        draw = self.draw
        child_shapes = []
        if broadcast:
            n = draw(st.integers(2, 3))
            for _ in range(n - 1):
                # mostly keeping the last axes, whole (a term that varies along the axis a function
                # works on), now and then none
                drop = draw(st.integers(1, len(shape) - 1)) if len(shape) > 1 and draw(
                    st.integers(0, 3)) < 3 else len(shape)
                kept = shape[drop:]
                child_shapes.append(tuple(1 if i < len(kept) - 1 and draw(st.integers(0, 5)) == 5 else d
                                          for i, d in enumerate(kept)))
            child_shapes.insert(draw(st.integers(0, n - 1)), tuple(shape))
        else:
            n = draw(st.integers(0 if shape == () else 1, 3))
            for _ in range(n):
                drop = draw(st.integers(0, len(shape)))
                s = [1 if draw(st.integers(0, 3)) == 0 else d for d in shape[drop:]]
                child_shapes.append(tuple(s))
            if n and broadcast_shapes(child_shapes) != tuple(shape):
                child_shapes[draw(st.integers(0, n - 1))] = tuple(shape)
        # Each term within its share of the bound, so that the sum keeps it (a softmax's argument
        # is bounded: a sum of unbounded terms would be replaced by a leaf).
        term = Need(need.positive, need.max_mag / (n + 1))
        kids = [self.build(s, depth, term) for s in child_shapes]
        shared = self._pool_pick(term, lambda s: _broadcasts_to(s, shape), depth)
        if shared is not None:
            kids.insert(draw(st.integers(0, len(kids))), shared)
        iv = (sum(k[1][0] for k in kids), sum(k[1][1] for k in kids))
        return Add(*(k[0] for k in kids), name=self.name()), iv

    def _argument(self, shape, depth, need):
        """A function's argument: most of the time a broadcasting sum (``scores + bias``, ``x - mean``:
        terms of fewer axes), where a rewrite can lose track of which axes a term varies along —
        a rule that drops a lower-rank term inside a softmax is wrong, inside an ``exp`` too."""
        if Add in self.types and shape and depth > 0 and self.budget > 0 and self.draw(st.integers(0, 3)):
            self.budget -= 1
            built = self.make_add(shape, depth - 1, need, broadcast=True)  # the sum is a level itself
            if need.ok(built[1]):
                self._add_to_pool(built)
                return built
        return self.build(shape, depth, need)

    def make_generalfunction(self, shape, depth, need):
        draw = self.draw
        # A function on the last axis over one entry is a constant (softmax: 1, whatever its
        # argument): drawn there only now and then.
        rows = bool(shape) and (shape[-1] != 1 or draw(st.integers(0, 3)) == 0)
        choices = [f for f, (_, kind) in self.functions.items() if rows or kind != "rows"]
        if need.positive:
            choices = [f for f in choices if _can_be_positive(self.functions[f][0])]
        # The kind first (elementwise, on the last axis, a reduction, a gather), then a function of
        # it.  The few functions on the last axis, where broadcasting meets the function (a term
        # constant along that axis may go, another may not), are drawn twice as often as all the
        # elementwise ones together, and over a matrix or more (terms of fewer axes that still
        # vary along the last) six times as often.
        by_kind = {}
        for f in choices:
            by_kind.setdefault(self.functions[f][1], []).append(f)
        if self.gather:
            by_kind["gather"] = ["gen_index"]
        if not by_kind:
            return None
        core = 6 if len(shape) >= 2 else 2
        kinds = [k for k in by_kind for _ in range(core if k in ("rows", "reduction") else 1)]
        f = draw(st.sampled_from(by_kind[draw(st.sampled_from(kinds))]))
        if f == "gen_index":
            return self.make_gather(shape, depth, need)
        spec, kind = self.functions[f]
        b = spec.bounds
        if b is None:  # an elementwise function that says nothing about its values
            x, _ = self._argument(shape, depth, Need(False, 4.0))
            return GeneralFunction(f, x, name=self.name()), (-MAGNITUDE_CAP / 10, MAGNITUDE_CAP / 10)

        def arg_need(i):
            positive, max_mag = b.arg(i)
            max_mag = MAGNITUDE_CAP if max_mag is None else max_mag
            if need.positive and not positive:
                if b.keeps_positive:
                    positive = True
                else:
                    # Small arguments keep a positive result (softmax's smallest entry, exp's)
                    # away from 0.
                    max_mag = min(max_mag, 2.0)
            return Need(positive, max_mag)

        if kind == "binary":
            drop = draw(st.integers(0, len(shape)))
            shapes = [shape, shape[drop:]]
            if draw(st.booleans()):
                shapes.reverse()
            built = [self.build(s, depth, arg_need(i)) for i, s in enumerate(shapes)]
            iv = b.image(*(civ for _, civ in built))
            return GeneralFunction(f, *(x for x, _ in built), name=self.name()), iv
        if kind == "reduction":
            n = draw(st.integers(1, 3)) if draw(st.integers(0, 3)) == 0 else draw(st.integers(2, 3))
            x, civ = self._argument(shape + (n,), depth, arg_need(0))
        else:
            x, civ = self._argument(shape, depth, arg_need(0))
            n = shape[-1] if kind == "rows" else None
        iv = b.image(civ) if n is None else b.image(civ, n=n)
        return GeneralFunction(f, x, name=self.name()), iv

    def make_gather(self, shape, depth, need):
        draw = self.draw
        m = draw(st.integers(1, 4))
        checked = draw(st.booleans())
        layout = draw(st.sampled_from(("first", "at", "batch")))
        if layout == "first":
            # plain (rust_circuit's): out = idx.shape + x.shape without axis ax
            r = draw(st.integers(0, len(shape)))
            idx_shape, rest = shape[:r], shape[r:]
            ax = draw(st.integers(0, len(rest)))
            x_shape = rest[:ax] + (m,) + rest[ax:]
            d = ax if draw(st.booleans()) else ax - len(x_shape)
            fname = GenIndex(d, False, True, checked).name
        elif layout == "at":
            # _no_batch_index: out = x[:ax] + idx.shape + x[ax+1:]
            ax = draw(st.integers(0, len(shape)))
            r = draw(st.integers(0, len(shape) - ax))
            x_shape = shape[:ax] + (m,) + shape[ax + r:]
            idx_shape = shape[ax:ax + r]
            d = ax if draw(st.booleans()) else ax - len(x_shape)
            fname = GenIndex(d, False, False, checked).name
        else:
            # batched: x[:r] == idx.shape, out = x without axis ax (ax >= r)
            r = draw(st.integers(0, len(shape)))
            ax = draw(st.integers(r, len(shape)))
            x_shape = shape[:ax] + (m,) + shape[ax:]
            idx_shape = shape[:r]
            d = ax - r if draw(st.booleans()) else ax - len(x_shape)
            fname = GenIndex(d, True, True, checked).name
        if math.prod(x_shape) > _MAX_ELEMENTS:
            return None
        self.gathered += 1
        try:
            x, iv = self.build(x_shape, depth, Need(need.positive))
        finally:
            self.gathered -= 1
        if Symbol in self.types and draw(st.integers(0, 3)) == 0:
            idx = Symbol(idx_shape, name=draw(st.sampled_from(("toks", "idx", None))), dtype="int64")
        else:
            low = 0 if checked else -m
            idx = Array(draw(int_arrays(idx_shape, low, m)), name=self.name())
        return GeneralFunction(fname, x, idx, name=self.name()), iv

    def make_index(self, shape, depth, need):
        child_shape, index = _index_to(self.draw, shape)
        if math.prod(child_shape) > _MAX_ELEMENTS:
            return None
        x, iv = self.build(child_shape, depth, need)
        return Index(x, index, name=self.name()), iv

    def make_rearrange(self, shape, depth, need):
        plan = _rearrange_plan(self.draw, shape, fixed_is_input=False)
        x, iv = self.build(plan.input_shape, depth, need)
        return Rearrange(x, plan.spec, name=self.name(), **plan.sizes), iv

    def make_concat(self, shape, depth, need):
        draw = self.draw
        axis = draw(st.integers(0, len(shape) - 1))
        total = shape[axis]
        cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=min(2, total - 1)))) if total > 1 else []
        bounds = [0, *cuts, total]
        kids = []
        for lo, hi in zip(bounds, bounds[1:]):
            s = list(shape)
            s[axis] = hi - lo
            kids.append(self.build(tuple(s), depth, need))
        written_axis = axis - len(shape) if draw(st.booleans()) else axis
        node = Concat(*(k[0] for k in kids), axis=written_axis, name=self.name())
        return node, _hull([k[1] for k in kids])

    def make_tag(self, shape, depth, need):
        x, iv = self.build(shape, depth, need)
        return Tag(x, uuid=self.draw(st.uuids()), name=self.name()), iv


    def make_module(self, shape, depth, need):
        """A module applied to one argument: its body ``Add(x, Scalar)`` or ``exp``-free
        elementwise form over a Symbol ``x`` of the output's trailing axes (sizes sometimes
        symbolic), the argument carrying the leading axes as a batch."""
        draw = self.draw
        b = draw(st.integers(0, len(shape)))
        core = shape[b:]
        symbolic = draw(st.booleans())
        sym_shape = tuple(symbolic_size(i) for i in range(len(core))) if symbolic else core
        x = Symbol(sym_shape, name=draw(st.sampled_from(["x", "arg", "m.input"])), dtype=self.opts.dtype,
                   uuid=draw(st.uuids()))
        v = _round(draw(st.floats(0.5, 1.5) if need.positive else st.floats(-1.5, 1.5)))
        body = Add(x, Scalar(v, sym_shape, name=self.name()), name=self.name())
        arg, iv = self.build(shape, depth, Need(need.positive and v < 0 and False))
        if need.positive and iv[0] + v <= 0:
            return None
        spec = ModuleSpec(body, [ModuleArgSpec(x, batchable=True, expandable=True)])
        return Module(spec, arg, name=self.name()), (iv[0] + v, iv[1] + v)

    def make_scatter(self, shape, depth, need):
        if need.positive:
            return None
        draw = self.draw
        index, block = [], []
        for n in shape:
            lo = draw(st.integers(0, n))
            hi = draw(st.integers(lo, n))
            index.append(slice(lo, hi))
            block.append(hi - lo)
        x, iv = self.build(tuple(block), depth, need)
        return Scatter(x, tuple(index), shape, name=self.name()), _hull([iv, (0.0, 0.0)])

    def make_setsymbolicshape(self, shape, depth, need):
        x, iv = self.build(shape, depth, need)
        return SetSymbolicShape(x, shape, name=self.name()), iv

    def make_discretevar(self, shape, depth, need):
        """A variable over a few samples, with probabilities an Array that sums to 1."""
        draw = self.draw
        n = draw(st.integers(1, 3))
        values, iv = self.build((n, *shape), depth, need)
        weights = np.asarray(draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)), np.float64)
        probs = Array((weights / weights.sum()).astype(self.opts.dtype), name=self.name())
        return DiscreteVar(values, probs, name=self.name()), iv


def _broadcasts_to(s, shape):
    if len(s) > len(shape):
        return False
    return all(a == b or a == 1 for a, b in zip(s, shape[len(shape) - len(s):]))


@st.composite
def _einsum_around(draw, shape, fixed_shape):
    """An einsum producing ``shape`` whose first operand has ``fixed_shape``: each of its axes
    becomes an output axis of equal size, a summed axis, or repeats one of its own (a diagonal)."""
    out_ids = list(range(len(shape)))
    sizes = dict(enumerate(shape))
    next_id = len(shape) + draw(st.integers(0, 30))
    first = []
    for n in fixed_shape:
        free_out = [a for a in out_ids if sizes[a] == n and a not in first]
        repeat = [a for a in first if sizes[a] == n]
        options = ["sum"] + (["out"] if free_out else []) + (["diag"] if repeat else [])
        how = draw(st.sampled_from(options))
        if how == "out":
            first.append(draw(st.sampled_from(free_out)))
        elif how == "diag":
            first.append(draw(st.sampled_from(repeat)))
        else:
            sizes[next_id] = n
            first.append(next_id)
            next_id += 1
    rest = [a for a in out_ids if a not in first]
    others = []
    if rest or draw(st.booleans()):
        others.append(list(rest))
        if draw(st.booleans()) and rest:
            split = draw(st.integers(0, len(rest)))
            others = [rest[:split], rest[split:]]
    if not first and not others:
        others.append([])  # see einsum_specs: a lone operand without axes does not print
    in_axes = (tuple(first), *(tuple(draw(st.permutations(t))) for t in others))
    out_axes = tuple(out_ids)
    return EinsumSpec(format_spec(in_axes, out_axes), in_axes, out_axes,
                      tuple(tuple(sizes[a] for a in t) for t in in_axes), tuple(shape))


def _move_first(spec, position):
    """The same einsum with its first operand moved to ``position``."""
    def move(seq):
        seq = list(seq)
        seq.insert(position, seq.pop(0))
        return tuple(seq)

    in_axes = move(spec.in_axes)
    return EinsumSpec(format_spec(in_axes, spec.out_axes), in_axes, spec.out_axes,
                      move(spec.input_shapes), spec.shape)


@st.composite
def built_circuits(draw, opts: Options):
    """(circuit, interval) drawn with ``opts``."""
    shape = draw(opts.shape)
    builder = Builder(draw, opts)
    return builder.build(shape, opts.max_depth, ANY, root_types=opts.root_types)


def int_symbol_ranges(circuit) -> dict:
    """int Symbol -> exclusive upper bound that keeps every gen_index gathering by it in range."""
    out = {}
    for node in toposort(circuit):
        if type(node) is not GeneralFunction or node.function.index_arg is None:
            continue
        idx = node.children[node.function.index_arg]
        if type(idx) is not Symbol:
            continue
        x = node.children[0]
        removed = [n for n in _gather_axis_sizes(node, x, idx)]
        out[idx] = min([out.get(idx, 1 << 30), *removed])
    return out


def _gather_axis_sizes(node, x, idx):
    g = node.function.gather
    return [x.shape[g.axis(x.ndim, idx.ndim)]]
