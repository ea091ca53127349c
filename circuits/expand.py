"""Expansion (rust_circuit's ``Expander``): replace nodes — Symbols above all — by nodes of
another shape, and re-derive every shape above them.

A replacement may have **extra leading axes** (a batch: every node above gains them, aligned on
the right where several meet, equal where they overlap) and **other sizes** on its own axes (a
symbolic size ``0s`` becoming concrete, or any size where the nodes above allow it: an Index
that takes a fixed slice of a changed axis refuses).  Each node type says how it is rebuilt
over expanded children (``_RULES``); the walk is one toposort, never recursive (a Module's
body is expanded again per module nesting level, no deeper).  A Module stays a Module, its
gained axes outside its own batch axes: an argument's gained axes move into its Symbol.

This is how modules are inlined (``substitute_module``, ``substitute_all_modules``) and how a
``DiscreteVar`` is evaluated: replaced by a batch of its samples (``sample``).

>>> import numpy as np
>>> from circuits import Symbol, Einsum, Array, evaluate
>>> x = Symbol((3,), name='x')
>>> y = Einsum.from_spec('i,i->', x, x, name='sq')
>>> xs = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name='xs')
>>> big = expand(y, {x: xs})
>>> big.shape, evaluate(big).tolist()
((2,), [5.0, 50.0])
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from .errors import CircuitError, ShapeError
from .nodes import Add, Array, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag
from .nodes.discrete_var import DiscreteVar
from .nodes.module import Module, ModuleSpec, map_sizes
from .nodes.scatter import Scatter
from .nodes.symbolic_shape import SetSymbolicShape
from .shapes import shape_text
from .traversal import toposort

__all__ = ["expand", "Expander", "substitute_module", "substitute_all_modules", "sample",
           "ExpandError"]


class ExpandError(ShapeError):
    """A node cannot follow its children's new shapes (a fixed slice of a changed axis, batch
    axes that disagree, a function that cannot be batched...)."""


def expand(root: Circuit, replacements: Mapping, size_map: "Mapping | None" = None) -> Circuit:
    """``root`` with each node of ``replacements`` (node -> new node) replaced and every shape
    above re-derived; ``size_map`` (symbolic size -> size) also resizes the leaves that carry a
    symbolic size.  See the module docstring.

    >>> from circuits import Symbol, Add, Scalar
    >>> from circuits.shapes import symbolic_size
    >>> x = Symbol((symbolic_size(0),), name='x')
    >>> expand(Add(x, Scalar(1.0)), {x: Symbol((4, 5), name='x')}).shape
    (4, 5)
    """
    return expand_with_map(root, replacements, size_map)[0]


def expand_with_map(root: Circuit, replacements: Mapping, size_map: "Mapping | None" = None):
    """``expand``, and the map it built: old node hash -> (new node, batch axes it gained)."""
    size_map = dict(size_map or {})
    table = {}
    for old, new in replacements.items():
        if not isinstance(old, Circuit) or not isinstance(new, Circuit):
            raise CircuitError("expand: replacements map circuit nodes to circuit nodes")
        if len(new.shape) < len(old.shape):
            raise ExpandError(f"expand: replacement {new.line()} {shape_text(new.shape)} has lower rank than "
                              f"{old.line()} {shape_text(old.shape)}; a replacement may only add leading axes")
        table[old.hash] = new
    done: dict = {}  # old hash -> (new node, number of batch axes it gained)
    for n in toposort(root):
        h = n.hash
        r = table.get(h)
        if r is not None:
            done[h] = (r, len(r.shape) - len(n.shape))
            continue
        if not n.children:
            done[h] = (_leaf(n, size_map), 0)
            continue
        pairs = [done[c.hash] for c in n.children]
        kids = [p[0] for p in pairs]
        if all(k is c for k, c in zip(kids, n.children)):
            done[h] = (n, 0)
            continue
        rule = _RULES.get(type(n))
        if rule is None:
            raise ExpandError(f"expand: no expansion rule for {type(n).__name__}: {n.line()}")
        try:
            if rule is _expand_module:
                new = _expand_module(n, kids, [p[1] for p in pairs], size_map, replacements)
            else:
                new = rule(n, kids, [p[1] for p in pairs], size_map)
        except ExpandError:
            raise
        except CircuitError as e:
            raise ExpandError(f"expand: {n.line()} cannot follow its children's new shapes "
                              f"{', '.join(shape_text(k.shape) for k in kids)}: {e}") from None
        done[h] = (new, len(new.shape) - len(n.shape))
    return done[root.hash][0], done


# ---------------------------------------------------------------------------- per node type
def _leaf(n, size_map):
    if not size_map:
        return n
    shape = map_sizes(n.shape, size_map)
    if shape == n.shape:
        return n
    if type(n) is Scalar:
        return Scalar(n.value, shape, name=n.name)
    if type(n) is Symbol:
        # The Symbol itself stays (an enclosing module may bind it by identity); the sizes it
        # takes here are stated above it, as rust_circuit states them where sizes meet.
        return SetSymbolicShape(n, shape)
    return n


def _batch_of(n, kids, nbs):
    """The merged batch shape of the children (right-aligned, equal where they overlap)."""
    batch: list = []
    for k, nb in zip(kids, nbs):
        mine = k.shape[:nb]
        for j in range(1, nb + 1):
            if j <= len(batch):
                if batch[-j] != mine[-j]:
                    raise ExpandError(
                        f"expand: {n.line()}: the children's batch axes {shape_text(batch)} and "
                        f"{shape_text(mine)} do not broadcast (batch axes align on the right and must be equal)")
            else:
                batch.insert(0, mine[-j])
    return tuple(batch)


def _fresh_names(taken, count):
    out, i = [], 0
    while len(out) < count:
        cand = f"batch{i}"
        if cand not in taken:
            out.append(cand)
        i += 1
    return out


def _insert_units(node, after: int, count: int):
    """``node`` with ``count`` unit axes inserted after its first ``after`` axes."""
    if not count:
        return node
    names = _fresh_names(set(), len(node.shape))
    ins = [(a,) for a in names]
    outs = ins[:after] + [()] * count + ins[after:]
    return Rearrange(node, (tuple(ins), tuple(outs)))


def insert_axes(node, at: int, sizes):
    """``node`` repeated along new axes of ``sizes`` inserted after its first ``at`` axes (``at=0``:
    new leading axes)."""
    if not sizes:
        return node
    names = _fresh_names(set(), len(node.shape) + len(sizes))
    new, old = names[:len(sizes)], names[len(sizes):]
    ins = tuple((a,) for a in old)
    outs = ins[:at] + tuple((a,) for a in new) + ins[at:]
    return Rearrange(node, (ins, outs), **dict(zip(new, sizes)))


def _aligned(n, kids, nbs):
    """Children of a broadcasting node (Add, an elementwise function) made to broadcast batch
    against batch and core against core: unit axes between a child's batch and core axes."""
    batch = _batch_of(n, kids, nbs)
    core = max(len(k.shape) - nb for k, nb in zip(kids, nbs))
    out = []
    for k, nb in zip(kids, nbs):
        missing = core - (len(k.shape) - nb)
        out.append(_insert_units(k, nb, missing) if nb and missing else k)
    return out, batch


def _expand_add(n, kids, nbs, size_map):
    kids, _ = _aligned(n, kids, nbs)
    return Add(*kids, name=n.name)


def _expand_einsum(n, kids, nbs, size_map):
    batch = _batch_of(n, kids, nbs)
    b = len(batch)
    used = {a for axes in n.in_axes for a in axes} | set(n.out_axes)
    start = max(used, default=-1) + 1
    ids = tuple(range(start, start + b))
    in_axes = tuple(ids[b - nb:] + tuple(axes) for axes, nb in zip(n.in_axes, nbs))
    return Einsum(*kids, in_axes=in_axes, out_axes=ids + tuple(n.out_axes), name=n.name)


def _expand_function(n, kids, nbs, size_map):
    f = n.function
    if any(nbs):
        if f.core_ndim is None and not f.elementwise:
            if getattr(f, "index_arg", None) is not None and not any(
                    nb for i, nb in enumerate(nbs) if i != f.index_arg):
                pass  # a gather batched only in its indices: the rule below re-derives it
            else:
                raise ExpandError(f"expand: {n.line()}: function {f.name} cannot be batched "
                                  "(it does not map leading axes one to one)")
        elif len(kids) > 1:
            kids, _ = _aligned(n, kids, nbs)
    return GeneralFunction(f, *kids, name=n.name)


def _expand_index(n, kids, nbs, size_map):
    (kid,), (nb,) = kids, nbs
    old = n.children[0].shape
    full = n.full_index()
    for axis, (e, before, after) in enumerate(zip(full, old, kid.shape[nb:])):
        if before != after and not (type(e) is slice and e == slice(None)):
            raise ExpandError(f"expand: {n.line()} indexes axis {axis} with a fixed entry, but that axis "
                              f"changed size from {before} to {after}; only ':' follows a changed axis")
    return Index(kid, (slice(None),) * nb + full, name=n.name)


def _expand_scatter(n, kids, nbs, size_map):
    (kid,), (nb,) = kids, nbs
    old = n.children[0].shape
    for axis, (e, before, after) in enumerate(zip(n.index, old, kid.shape[nb:])):
        if before != after and e != slice(None):
            raise ExpandError(f"expand: {n.line()} writes axis {axis} at a fixed slice, but that axis "
                              f"changed size from {before} to {after}")
    shape = kid.shape[:nb] + tuple(
        a if e == slice(None) else s for e, s, a in zip(n.index, map_sizes(n.shape, size_map), kid.shape[nb:]))
    return Scatter(kid, (slice(None),) * nb + n.index, shape, name=n.name)


def _expand_rearrange(n, kids, nbs, size_map):
    (kid,), (nb,) = kids, nbs
    taken = {a for g in n.in_groups + n.out_groups for a in g}
    names = tuple((a,) for a in _fresh_names(taken, nb))
    groups = (names + n.in_groups, names + n.out_groups)
    given = dict(n.given_sizes)
    try:
        return Rearrange(kid, groups, name=n.name, **given)
    except CircuitError:
        conformed = _conform_sizes(n.in_groups, kid.shape[nb:], given)
        if conformed is None or conformed == given:
            raise
        return Rearrange(kid, groups, name=n.name, **conformed)


def _conform_sizes(in_groups, shape, given):
    """The sizes a Rearrange's spec gives, conformed to a new input shape as rust_circuit's
    expander does: in each input group, the given sizes whose product still divides the new axis
    are kept (in order) and the others left to be inferred (so ``(a:1s b:3)`` over ``3*0s`` makes
    ``a`` 0s).  None when the ranks differ or a group would have two sizes to infer."""
    if len(in_groups) != len(shape):
        return None
    out = dict(given)
    for g, size in zip(in_groups, shape):
        kept, unknown = 1, 0
        for a in g:
            v = out.get(a)
            if v is not None and size % (kept * v) == 0:
                kept *= v
            else:
                out.pop(a, None)
                unknown += 1
        if unknown > 1:
            return None
    return out


def _expand_concat(n, kids, nbs, size_map):
    batch = _batch_of(n, kids, nbs)
    b = len(batch)
    kids = [insert_axes(k, 0, batch[: b - nb]) for k, nb in zip(kids, nbs)]
    return Concat(*kids, axis=n.axis + b, name=n.name)


def _expand_tag(n, kids, nbs, size_map):
    return Tag(kids[0], n.uuid, name=n.name)


def _expand_module(n, kids, nbs, size_map, replacements=None):
    # The module stays (rust's expand of a Module).  Axes an argument gains move behind its own
    # batch axes into its Symbol, which gains them too; the body is expanded again from the
    # original, with those Symbols and the same replacements, so that its gained axes line up
    # with theirs; the module's own batch axes then go back behind the gained ones.
    body = kids[0]
    if any(nbs[1:]):
        specs, args, renames = gains_into_symbols(n, kids[1:])
        table = {k: v for k, v in (replacements or {}).items() if k not in renames}
        table.update(renames)
        body = expand(n.body, table, size_map)
        out = Module(ModuleSpec(body, specs, check_all_inputs_used=False), *args, name=n.name)
    else:
        out = n._rebuild(tuple(kids), n.name)
    gained = len(body.shape) - len(n.body.shape)
    return move_axes_behind(out, len(out.shape) - len(body.shape), gained)


def gains_into_symbols(module, new_args):
    """For a Module whose arguments gained leading axes (``new_args``): the argument specs,
    arguments and ``{old Symbol: new Symbol}`` with each argument's gained axes moved behind its
    own batch axes and into its Symbol (which gains them in front), as rust expands a Module."""
    specs, args, renames = [], [], {}
    for a, old, new in zip(module.spec.arg_specs, module.args, new_args):
        g = len(new.shape) - len(old.shape)
        if g:
            own = len(old.shape) - len(a.symbol.shape)
            new = move_axes_behind(new, g, own)
            was, a = a.symbol, a.reshaped(new.shape[own:own + g] + a.symbol.shape)
            renames[was] = a.symbol
        specs.append(a)
        args.append(new)
    return specs, args, renames


def move_axes_behind(node, first: int, then: int):
    """``node`` with its first ``first`` axes moved behind the ``then`` axes after them."""
    if not first or not then:
        return node
    names = _fresh_names(set(), len(node.shape))
    moved = names[first:first + then] + names[:first] + names[first + then:]
    return Rearrange(node, (tuple((a,) for a in names), tuple((a,) for a in moved)))


def _expand_set_symbolic(n, kids, nbs, size_map):
    (kid,), (nb,) = kids, nbs
    shape = kid.shape[:nb] + map_sizes(n.shape, size_map)
    if shape == kid.shape and n.name is None:
        return kid  # it states nothing now (rust drops it too)
    return SetSymbolicShape(kid, shape, name=n.name)


def _expand_discrete(n, kids, nbs, size_map):
    return DiscreteVar(*kids, name=n.name)


_RULES: "dict[type, Callable]" = {
    Add: _expand_add,
    Einsum: _expand_einsum,
    GeneralFunction: _expand_function,
    Index: _expand_index,
    Rearrange: _expand_rearrange,
    Concat: _expand_concat,
    Tag: _expand_tag,
    Module: _expand_module,
    Scatter: _expand_scatter,
    SetSymbolicShape: _expand_set_symbolic,
    DiscreteVar: _expand_discrete,
}


# ---------------------------------------------------------------------------- Expander
class Expander:
    """rust_circuit's ``Expander``: pairs of (which nodes, how to replace one) applied by
    ``expand``.  ``which`` is a node, a name, a node type or a predicate; ``how(node)`` returns
    the replacement.

    >>> from circuits import Symbol, Add, Scalar
    >>> c = Add(Symbol((2,), name='a'), Scalar(1.0))
    >>> Expander(('a', lambda s: Symbol((7, 2), name='a'))) (c).shape
    (7, 2)
    """

    def __init__(self, *pairs):
        self.pairs = [(_predicate(which), how) for which, how in pairs]

    def __call__(self, circuit: Circuit) -> Circuit:
        replacements = {}
        for n in toposort(circuit):
            for test, how in self.pairs:
                if test(n):
                    replacements[n] = how(n)
                    break
        return expand(circuit, replacements)


def _predicate(which):
    if isinstance(which, Circuit):
        return lambda n: n == which
    if isinstance(which, str):
        return lambda n: n.name == which
    if isinstance(which, type):
        return lambda n: isinstance(n, which)
    if callable(which):
        return which
    raise TypeError(f"Expander: a pair selects with a node, a name, a type or a predicate, got {which!r}")


# ---------------------------------------------------------------------------- modules
def substitute_module_body(spec: ModuleSpec, args, size_map, batch) -> Circuit:
    """The body of ``spec`` with the arguments in place of its Symbols (not renamed).  An
    argument whose sizes were unified with another's (see ``module_shape``) is wrapped in a
    ``SetSymbolicShape`` stating the unified sizes."""
    replacements = {}
    for a, arg in zip(spec.arg_specs, args):
        extra = len(arg.shape) - len(a.symbol.shape)
        core = tuple(n if s == n else size_map.get(s, n) for s, n in zip(a.symbol.shape, arg.shape[extra:]))
        target = batch[len(batch) - extra:] + core
        replacements[a.symbol] = arg if target == arg.shape else SetSymbolicShape(arg, target)
    return expand(spec.body, replacements, size_map)


def substitute_module(module: Module) -> Circuit:
    """``module.substitute()``: see ``Module.substitute``."""
    out = substitute_module_body(module.spec, module.args, module.size_map, module.batch_shape)
    if out.shape != module.shape and len(out.shape) < len(module.shape) \
            and module.shape[len(module.shape) - len(out.shape):] == out.shape:
        # batch axes of arguments the body does not use: the value repeats along them
        out = insert_axes(out, 0, module.shape[:len(module.shape) - len(out.shape)])
    if out.shape != module.shape:  # a bug in a rule or in Module's shape rule, never the user's
        raise CircuitError(f"substituting {module.line()} gave shape {shape_text(out.shape)}, "
                           f"but the module has {shape_text(module.shape)}")
    if module.name is not None and type(out) is not Symbol:  # a renamed Symbol is another Symbol
        out = out.rename(module.name)
    return out


def substitute_all_modules(circuit: Circuit, memo: "dict | None" = None) -> Circuit:
    """``circuit`` with every Module inlined (innermost first), in one bottom-up pass; ``memo``
    (a dict, filled) maps each original node's hash to its new node, across calls.

    >>> from circuits import parse
    >>> c = parse("'m' Module\\n  'b' Add\\n    'x' [2] Symbol\\n  'one' [2] Scalar 1 ! 'x'")
    >>> print(substitute_all_modules(c).to_text())
    'm' Add
      'one' [2] Scalar 1
    """
    done: dict = {} if memo is None else memo  # old hash -> new node
    for n in toposort(circuit):
        if n.hash in done:
            continue
        if n.children:
            kids = [done[c.hash] for c in n.children]
            new = n.with_children(kids)
            if type(new) is Module:
                new = substitute_module(new)
        else:
            new = n
        done[n.hash] = new
    return done[circuit.hash]


def has_node_type(circuit: Circuit, types) -> bool:
    return any(isinstance(n, types) for n in toposort(circuit))


# ---------------------------------------------------------------------------- sampling
def sample(circuit: Circuit, num_samples: int, seed: int = 0) -> Circuit:
    """``circuit`` with each ``DiscreteVar`` replaced by ``num_samples`` draws from it, so the
    result has a leading axis of samples (rust_circuit's random sample transform).  Variables
    that share their probabilities node are drawn jointly (the same sample indices: one draw of
    the underlying dataset row), independent ones independently; the draws are seeded.

    >>> import numpy as np
    >>> from circuits import Array, DiscreteVar, Add, evaluate
    >>> v = DiscreteVar(Array(np.array([0., 10.], np.float32)), Array(np.array([.5, .5], np.float32)))
    >>> out = evaluate(sample(Add(v, v), 1000, seed=0))
    >>> out.shape, sorted(set(out.tolist()))
    ((1000,), [0.0, 20.0])
    """
    rng = np.random.default_rng(seed)
    drawn: dict = {}  # probs hash -> sample indices
    replacements: dict = {}
    for n in toposort(circuit):
        if type(n) is not DiscreteVar:
            continue
        values, probs = n.children
        idx = drawn.get(probs.hash)
        if idx is None:
            p = np.asarray(_value_of(probs, n), dtype=np.float64)
            if p.min() < 0 or not np.isclose(p.sum(), 1.0, atol=1e-4):
                raise CircuitError(f"{n.line()}: its probabilities must be >= 0 and sum to 1, got sum {p.sum()}")
            idx = rng.choice(len(p), size=num_samples, p=p / p.sum())
            drawn[probs.hash] = idx
        name = None if n.name is None else n.name + ".samples"
        # Variables inside this one's values are sampled already: then the values carry the
        # sample axis in front, and sample s reads row idx[s] of its own slice (a one-hot einsum).
        sampled = expand(values, replacements) if replacements else values
        if len(sampled.shape) == len(values.shape):
            replacements[n] = Index(sampled, (idx.astype(np.int64),), name=name)
        else:
            onehot = np.zeros((num_samples, len(idx) and values.shape[0]), sampled.dtype if sampled.dtype != "bool" else "float32")
            onehot[np.arange(num_samples), idx] = 1
            rest = tuple(range(2, len(sampled.shape)))
            replacements[n] = Einsum(sampled, Array(onehot, name=None if name is None else name + ".onehot"),
                                     in_axes=((0, 1) + rest, (0, 1)), out_axes=(0,) + rest, name=name)
    return expand(circuit, replacements)


def _value_of(probs, var):
    if type(probs) is Array and not probs.is_placeholder:
        return probs.value
    if type(probs) is Scalar:
        return np.full(probs.shape, probs.value)
    raise CircuitError(f"{var.line()}: its probabilities must be an Array or Scalar to sample from")
