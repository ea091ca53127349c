"""Pushing modules down (rust_circuit's ``ModulePusher``): a Module is moved from above its body
towards the leaves, so it wraps less.

Walking a Module's body from the top, with the module's arguments bound to its Symbols:

- a bound Symbol becomes its argument;
- a node that uses none of the bound Symbols stays as it is, outside any module (rust's
  "eliminate modules with no inputs" and "remove unused inputs");
- a node where the ``traversal`` stops is wrapped in a Module binding just the Symbols it uses
  (``flatten_modules=True``: one Module for all the enclosing modules' arguments; ``False``: one
  per enclosing module, the outermost outside);
- a Module met in the body is pushed too, its arguments bound on top of the enclosing ones.
  Where both it and an enclosing module batch their arguments (extra leading axes), the batch
  axes are laid out as nesting means them, outer ones first: its batch axes are repeated into
  the enclosing arguments between their batch axes and their own (rust's ``fuse_modules``);
- a Module that ``skip_module`` matches is walked like any node (and refused when it rebinds a
  Symbol that is bound already).  Where its arguments gain enclosing batch axes, those move
  into its Symbols (behind the arguments' own batch axes) and the module stays one Module;
- any other node is rebuilt over its pushed children (shapes re-derived where an argument has
  batch axes or other sizes: ``circuits.expand``).

Pushed all the way (``traversal=None``), this is ``circuits.substitute_all_modules`` (rust's
``substitute_all``) up to names.  Names
follow rust's default namer: a node rebuilt inside modules ``m1`` (innermost) ... ``mk`` is named
``'<its name> bind:m1,...,mk'`` (no name when it or a module has none); the node that replaces a
Module takes the module's name (``'<module> bind:...'`` when it sits in other modules), unless it
is an argument or a node of the body passed through unchanged, which keep theirs.

>>> from circuits import parse
>>> c = parse('''
... 'b' Module
...   'outer' Add
...     'add' Add
...       'x' [] Symbol
...       'x'
...     'w' [] Scalar 2
...   'my_arg' [] Scalar 3 ! 'x'
... ''')
>>> print(push_down_modules(c).to_text())
'b' Add
  'add bind:b' Add
    'my_arg' [] Scalar 3
    'my_arg'
  'w' [] Scalar 2
>>> print(push_down_modules(c, traversal='add').to_text())
'b' Add
  'add bind:b' Module
    'add' Add
      'x' [] Symbol
      'x'
    'my_arg' [] Scalar 3 ! 'x'
  'w' [] Scalar 2
"""

from __future__ import annotations

import uuid as _uuid
from typing import Callable

from circuits.errors import CircuitError
from circuits.expand import expand
from circuits.nodes import Circuit, Module, ModuleSpec, Symbol
from circuits.nodes.expansion import expand_with_map, insert_axes, move_axes_behind
from circuits.nodes.module import gains_into_symbols, map_sizes
from circuits.select import as_matcher
from circuits.traversal import toposort, trampoline

__all__ = ["push_down_modules", "default_namer", "PushDownModuleError"]


class PushDownModuleError(CircuitError):
    """A module cannot be pushed further (a skipped module rebinds a Symbol bound outside it)."""


def default_namer(bind_name: str = "bind") -> Callable:
    """rust's ``default_nested_module_namer``: ``namer(node, modules)`` (modules innermost
    first) -> ``'<name> bind:m1,m2'``; the node's own name when there are no modules; None
    when the node or a module has no name.

    >>> from circuits import Scalar
    >>> default_namer()(Scalar(1.0, name='w'), [Module(ModuleSpec(Scalar(1.0), []), name='m')])
    'w bind:m'
    """

    def namer(node, modules):
        if not modules:
            return node.name
        if node.name is None or any(m.name is None for m in modules):
            return None
        return f"{node.name} {bind_name}:{','.join(m.name for m in modules)}"

    return namer


class _Frame:
    """One enclosing module: the Module, its argument specs, and its arguments pushed (``flat``:
    with every enclosing module applied; ``base``: pushed with no module bound, for nesting)."""

    __slots__ = ("module", "specs", "flat", "base", "key", "batched", "rename")

    def __init__(self, module, specs, flat, base, outer_key, rename=False):
        self.module, self.specs, self.flat, self.base = module, specs, flat, base
        # batched by its own arguments (not by batch axes that enclosing modules gave them)
        self.batched = bool(module.batch_shape) and not rename
        # ``rename``: not a module being pushed but a skipped one whose Symbols stand for their
        # forms with the enclosing batch axes in front (``flat``: those Symbols); a node where
        # pushing stops takes them by substitution, not by a module of its own
        self.rename = rename
        self.key = (outer_key, module.hash, rename, tuple(a.hash for a in flat))

    def with_flat(self, flat, outer_key):
        return _Frame(self.module, self.specs, flat, self.base, outer_key, self.rename)


def push_down_modules(circuit: Circuit, traversal=None, *, skip_module=None, flatten_modules: bool = True,
                      namer: "Callable | None" = None, remove_unused_inputs: bool = True,
                      elim_no_input_modules: bool = True) -> Circuit:
    """``circuit`` with its Modules pushed down (see the module docstring).  Value-preserving.

    ``traversal``: where pushing stops — None (all the way down: every module inlined), an int
    ``k`` (rust's ``new_traversal(end_depth=k)``: nodes ``k`` levels below the root are wrapped),
    or a matcher (anything ``circuits.select`` takes; rust's ``term_early_at``: matching nodes
    are wrapped, not entered).  ``skip_module``: a matcher of Modules left in place.
    ``namer(node, modules)``: the name of a rebuilt node (``default_namer()``).
    Where pushing stops, a module keeps only the arguments the node uses
    (``remove_unused_inputs``) and none is made when it uses none (``elim_no_input_modules``);
    both ``False`` is rust's ``ModulePusher.noop_callback()``: each module keeps every argument.

    >>> from circuits import parse
    >>> c = parse("'m' Module\\n  'y' Add\\n    'x' [2] Symbol\\n    'c' [2] Scalar 1\\n  'a' [2] Scalar 5 ! 'x'")
    >>> print(push_down_modules(c).to_text())
    'm' Add
      'a' [2] Scalar 5
      'c' [2] Scalar 1
    """
    if not isinstance(circuit, Circuit):
        raise TypeError(f"push_down_modules takes a circuit node, got {type(circuit).__name__}")
    pusher = _Pusher(circuit, traversal, skip_module, flatten_modules, namer, remove_unused_inputs,
                     elim_no_input_modules)
    return trampoline(pusher.visit, pusher.key, (circuit, (), 0))[0]


def _bound_in(frames) -> dict:
    """Symbol hash -> (spec, pushed argument) of every Symbol the enclosing ``frames`` bind
    (outermost first: an inner binding overrides)."""
    out = {}
    for f in frames:
        for spec, arg in zip(f.specs, f.flat):
            out[spec.symbol.hash] = (spec, arg)
    return out


class _Pusher:
    """One ``push_down_modules`` call: its options, what it knows of the circuit (the Symbols
    under each node, where pushing stops, which modules it skips) and ``visit``, the walk as a
    recursion that ``circuits.traversal.trampoline`` runs on an explicit stack (results memoized
    per node, innermost frame and, for ``traversal=k``, depth: see ``key``)."""

    def __init__(self, circuit, traversal, skip_module, flatten_modules, namer, remove_unused_inputs,
                 elim_no_input_modules):
        self.namer = default_namer() if namer is None else namer
        order = toposort(circuit)
        self.symbols = _symbols_below(order)
        self.end_depth = traversal if isinstance(traversal, int) and not isinstance(traversal, bool) else None
        self.stop = (set() if traversal is None or self.end_depth is not None
                     else as_matcher(traversal).matches(circuit, order))
        self.skip = set() if skip_module is None else as_matcher(skip_module).matches(circuit, order)
        self.flatten = flatten_modules
        self.remove_unused = remove_unused_inputs
        self.elim_no_input = elim_no_input_modules
        self.trim = remove_unused_inputs and elim_no_input_modules
        self.origin: dict = {}  # a body node rebuilt with its module's sizes -> the node it was (for stop and skip)

    def key(self, node, frames, depth):
        """What a result depends on: the node, the innermost frame (which names all the enclosing
        ones) and, when pushing stops at a depth, the depth."""
        return (node.hash, frames[-1].key if frames else None, depth if self.end_depth is not None else None)

    def keep(self, pairs, used):
        """The (spec, argument) pairs a module made where pushing stops keeps."""
        return [(sp, a) for sp, a in pairs if sp.symbol.hash in used] if self.remove_unused else list(pairs)

    def concrete_spec(self, module):
        specs, body, done = _concrete_spec(module)
        for old, (new, _) in done.items():
            if new.hash != old:
                self.origin[new.hash] = self.origin.get(old, old)
        return specs, body

    def syms_of(self, node):
        s = self.symbols.get(node.hash)
        if s is None:  # a node built here (nested wrapping): walk it
            s = frozenset(n.hash for n in toposort(node) if type(n) is Symbol)
        return s

    def name(self, node, frames):
        """The name of ``node`` rebuilt inside ``frames`` (``namer``, innermost module first)."""
        return self.namer(node, [f.module for f in reversed(frames)])

    def finalize(self, node, frames):
        """``node`` where pushing stops: wrapped in the modules whose Symbols it uses."""
        flat = self.flatten
        if any(f.rename for f in frames):
            # inside a skipped module whose arguments took enclosing batch axes: one flat Module
            # (nested ones could not place those axes)
            used = self.syms_of(node)
            renames = {s.symbol: a for f in frames if f.rename for s, a in zip(f.specs, f.flat)
                       if s.symbol.hash in used}
            frames, flat = tuple(f for f in frames if not f.rename), True
            if renames:
                return _finalize_renamed(node, renames, frames, _bound_in(frames), used, self.namer)
        if not frames:
            return node, False
        if flat:
            used = self.syms_of(node)
            pairs = self.keep(_bound_in(frames).values(), used)
            if not any(sp.symbol.hash in used for sp, _ in pairs) and self.elim_no_input:
                return node, False
            spec = ModuleSpec(node, [s for s, _ in pairs], check_all_inputs_used=False)
            return Module(spec, *(a for _, a in pairs), name=self.name(node, frames)), True
        out, created = node, False
        for i in range(len(frames) - 1, -1, -1):  # innermost module first; the outer ones wrap it
            f = frames[i]
            used = self.syms_of(out)
            pairs = self.keep(zip(f.specs, f.base), used)
            have = 0
            if any(sp.symbol.hash in used for sp, _ in pairs) or not self.elim_no_input:
                out = Module(ModuleSpec(out, [s for s, _ in pairs], check_all_inputs_used=False),
                             *(a for _, a in pairs), name=self.name(node, frames[i:]))
                created, have = True, len(out.batch_shape)
            batch = f.module.batch_shape
            if f.batched and have < len(batch) and any(g.batched for g in frames[:i]):
                # an enclosing module batches too: all of this one's batch axes must be there,
                # behind the enclosing ones (the layout ``_fuse_batch`` gives the flat arguments)
                out, created = insert_axes(out, 0, batch[:len(batch) - have]), True
        return out, created

    def visit(self, node, frames, depth):
        """A generator (see ``trampoline``): yields ``(child, frames, depth)`` requests, receives
        their ``(result, created)``, returns its own ``(result, created)``."""
        h = node.hash
        if frames and self.trim and not any(k in self.syms_of(node) for k in _bound_in(frames)):
            frames = ()  # nothing here depends on the enclosing modules
        if self.end_depth is not None and depth >= self.end_depth or h in self.stop or self.origin.get(h) in self.stop:
            return self.finalize(node, frames)
        if type(node) is Symbol and frames:
            hit = _bound_in(frames).get(h)
            if hit is not None:
                return hit[1], False
        skipped = h in self.skip or self.origin.get(h) in self.skip
        if type(node) is Module and not skipped:
            return (yield from self.push_module(node, frames, depth))
        if type(node) is Module and frames:
            bound = _bound_in(frames)
            for a in node.spec.arg_specs:
                if a.symbol.hash in bound:
                    raise PushDownModuleError(
                        f"cannot push a module past the skipped module {node.line()}: it binds "
                        f"{a.symbol.line()}, which an enclosing module binds too; do not skip it, or stop "
                        "the traversal above it")
        kids = []
        for c in node.children:
            kids.append((yield (c, frames, depth + 1))[0])
        if all(k is c for k, c in zip(kids, node.children)):
            return node, False
        if type(node) is Module and any(k.shape != c.shape for k, c in zip(kids, node.children)):
            return (yield from self.widen_skipped(node, kids, frames, depth))
        return _rebuild(node, kids).rename(self.name(node, frames)), True

    def push_module(self, node, frames, depth):
        """``visit`` of a Module being pushed: its arguments pushed, then its body inside one
        more frame."""
        outer_key = frames[-1].key if frames else None
        flat = []
        for a in node.args:
            flat.append((yield (a, frames, depth + 1))[0])
        base = flat
        if frames and not self.flatten:
            base = []
            for a in node.args:
                base.append((yield (a, (), depth + 1))[0])
        specs, body = self.concrete_spec(node)
        if node.batch_shape and any(f.batched for f in frames):
            # Batch axes from two levels of modules (rust's fuse_modules): this module's
            # batch axes go between an enclosing argument's batch axes and its own, and this
            # module's arguments that gained enclosing batch axes get all of its own.
            frames, flat = _fuse_batch(frames, specs, node.args, flat, node.batch_shape)
            outer_key = frames[-1].key
        frame = _Frame(node, specs, flat, base, outer_key)
        out, created = yield (body, tuple(frames) + (frame,), depth + 1)
        n = len(node.shape)
        if out.shape[len(out.shape) - n:] != node.shape:  # batch axes of arguments it does not use
            out, created = _broadcast_front(out, node.shape), True
        if created:
            out = out.rename(self.name(node, frames))
        return out, created

    def widen_skipped(self, node, kids, frames, depth):
        """``visit`` of a skipped module whose arguments or body gain the enclosing batch axes
        (rust's expand of a Module): each argument's gained axes move behind its own batch axes
        into its Symbol, the body is pushed again with those Symbols, and the module's own batch
        axes go back behind the gained ones."""
        specs, args, renames = gains_into_symbols(node, kids[1:])
        rename = _Frame(node, [a for a in node.spec.arg_specs if a.symbol in renames], list(renames.values()),
                        list(renames.values()), frames[-1].key if frames else None, rename=True)
        body = (yield (node.body, tuple(frames) + (rename,), depth + 1))[0]
        mod = Module(ModuleSpec(body, specs, check_all_inputs_used=False), *args, name=node.name)
        gained = len(body.shape) - len(node.body.shape)
        out = move_axes_behind(mod, len(mod.batch_shape), gained) if gained and mod.batch_shape else mod
        return out.rename(self.name(node, frames)), True


def _symbols_below(order) -> dict:
    """node hash -> frozenset of the Symbol hashes under it (one bottom-up pass)."""
    out: dict = {}
    empty = frozenset()
    for n in order:
        if type(n) is Symbol:
            out[n.hash] = frozenset((n.hash,))
            continue
        kids = n.children
        if not kids:
            out[n.hash] = empty
        elif len(kids) == 1:
            out[n.hash] = out[kids[0].hash]
        else:
            s = set()
            for c in kids:
                s |= out[c.hash]
            out[n.hash] = frozenset(s)
    return out


def _concrete_spec(module):
    """The module's argument specs and body with its symbolic sizes made the sizes its
    arguments give them (so that pushing never meets a symbolic size its arguments fixed), and
    ``expand``'s map from the body's nodes to their rebuilt forms."""
    if not module.size_map:
        return module.spec.arg_specs, module.body, {}
    specs, table = [], {}
    for a in module.spec.arg_specs:
        shape = map_sizes(a.symbol.shape, module.size_map)
        if shape != a.symbol.shape:
            was, a = a.symbol, a.reshaped(shape)
            table[was] = a.symbol
        specs.append(a)
    body, done = expand_with_map(module.body, table, module.size_map)
    return tuple(specs), body, done


def _finalize_renamed(node, renames, frames, bound, used, namer):
    """``finalize`` for a node inside a skipped module whose Symbols it uses took the enclosing
    batch axes (``renames``: Symbol -> the Symbol with those axes in front; as rust's
    ``extra_replacements``).  Those axes are now the node's own, so each enclosing argument
    gives up as many of its trailing batch axes to its Symbol, and one Module binds them all
    (whatever ``flatten_modules`` says: nested modules could not place the axes)."""
    extra = max(len(v.shape) - len(k.shape) for k, v in renames.items())
    table, specs, args = dict(renames), [], []
    for h, (s, a) in bound.items():
        if h not in used:
            continue
        nb = len(a.shape) - len(s.symbol.shape)
        k = min(nb, extra)
        if k:
            was, s = s.symbol, s.reshaped(a.shape[nb - k:nb] + s.symbol.shape)
            table[was] = s.symbol
        specs.append(s)
        args.append(a)
    out = expand(node, table)
    if not specs:
        return out, True
    return Module(ModuleSpec(out, specs), *args, name=namer(node, [f.module for f in reversed(frames)])), True


def _fuse_batch(frames, specs, args, flat, batch):
    """Enclosing frames and this module's pushed arguments made to agree on where its batch
    axes ``batch`` go (see rust's ``fuse_modules``): an enclosing argument with leading axes
    gets ``batch`` repeated in front of its Symbol's axes; an argument of this module that
    gained enclosing axes gets the batch axes it lacks repeated behind them."""
    new_frames, outer_key = [], None
    for f in frames:
        new_flat = [a if len(a.shape) == len(s.symbol.shape) else
                    insert_axes(a, len(a.shape) - len(s.symbol.shape), batch)
                    for s, a in zip(f.specs, f.flat)]
        g = f.with_flat(new_flat, outer_key)
        new_frames.append(g)
        outer_key = g.key
    out = []
    for s, old, a in zip(specs, args, flat):
        own = len(old.shape) - len(s.symbol.shape)  # this argument's own batch axes
        gained = len(a.shape) - len(old.shape)
        if gained and own < len(batch):
            a = insert_axes(a, gained, batch[:len(batch) - own])
        out.append(a)
    return tuple(new_frames), out


def _broadcast_front(node, shape):
    """``node`` repeated along the leading axes ``shape`` has and it lacks."""
    extra = len(shape) - len(node.shape)
    if extra < 0 or shape[extra:] != node.shape:
        raise CircuitError(f"push_down_modules: {node.line()} has shape {node.shape}, the module {shape}")
    return insert_axes(node, 0, shape[:extra])


def _rebuild(node, kids):
    """``node`` over new children, its shape re-derived where a child's shape changed (batch
    axes or other sizes, as ``circuits.expand``)."""
    if type(node) is Module or all(k.shape == c.shape for k, c in zip(kids, node.children)):
        return node.with_children(kids)
    holders, table = [], {}
    for c in node.children:
        ph = table.get(c.hash)
        if ph is None:
            ph = Symbol(c.shape, dtype=c.dtype, uuid=_uuid.uuid4())
            table[c.hash] = ph
        holders.append(ph)
    replacements = {}
    for c, k in zip(node.children, kids):
        replacements[table[c.hash]] = k
    return expand(node.with_children(holders), replacements)
