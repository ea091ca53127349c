"""Module: rust_circuit's function abstraction — a body circuit over argument Symbols, applied to
argument nodes.

A ``ModuleSpec`` is a body (any circuit) and its argument specs (``ModuleArgSpec``: the Symbol
an argument binds, and three flags).  A ``Module`` node applies a spec to arguments; its
children are ``(body, *arguments)``, as in rust_circuit, so generic traversals see the body once
however many times the module is applied, and a model writes a layer norm, an attention block
or an MLP once.  ``substitute()`` inlines it: the body with every argument Symbol replaced by its
argument and every shape above re-derived (the expansion walk, ``circuits.nodes.expansion``,
public as ``circuits.expand``).  Evaluation lowers modules that way.

Arguments may differ from their Symbols in two ways, as rust's:

- **batching**: an argument with extra leading axes (``batchable``) batches the whole module:
  its output gets those leading axes (arguments' batch axes align on the right and must agree);
- **symbolic sizes**: a Symbol's size written ``0s`` (``circuits.shapes.symbolic_size``) takes
  the argument's size, everywhere in the body.  A concrete size that differs is an error unless
  the argument spec allows it (``expandable`` and not ``ban_non_symbolic_size_expand``).

The text format writes each argument's child line with ``! `` and the Symbol (its identifier if
printed already, else its line) and, when the flags are not all true, the three flags ``ftt``
(batchable, expandable, ban_non_symbolic_size_expand):

>>> from circuits import parse, evaluate
>>> m = parse('''
... 'double' Module
...   'body' Add
...     'x' [0s] Symbol
...     'x'
...   'arg' [3] Scalar 1.5 ! 'x'
... ''')
>>> m.shape, evaluate(m).tolist(), m.substitute().to_text()
((3,), [3.0, 3.0, 3.0], "'double' Add\\n  'arg' [3] Scalar 1.5\\n  'arg'")
"""

from __future__ import annotations

import attrs

from ..errors import CircuitError
from ..shapes import SYMBOLIC_BASE, SYMBOLIC_SIZES, is_symbolic, shape_text, symbolic_factors
from .base import Circuit, check_children, no_payload, quote_name, shape_error
from .expansion import expand, insert_axes, move_axes_behind
from .leaves import Symbol


def _bool(value):
    return bool(value)


@attrs.frozen
class ModuleArgSpec:
    """One argument of a module: the Symbol it binds in the body and how an argument may differ
    from it (see the module docstring).

    >>> ModuleArgSpec(Symbol((2,), name='x'), batchable=False).flags
    'ftt'
    """

    symbol: Symbol
    batchable: bool = attrs.field(default=True, converter=_bool)
    expandable: bool = attrs.field(default=True, converter=_bool)
    ban_non_symbolic_size_expand: bool = attrs.field(default=True, converter=_bool)

    def __attrs_post_init__(self):
        if not isinstance(self.symbol, Symbol):
            raise CircuitError(
                f"a module argument binds a Symbol, got {self.symbol!r}; make one with Symbol(shape, name=...)")

    @property
    def flags(self) -> str:
        """rust's terse flags: ``t``/``f`` for batchable, expandable, ban_non_symbolic_size_expand."""
        return "".join("t" if f else "f" for f in (self.batchable, self.expandable,
                                                     self.ban_non_symbolic_size_expand))

    def reshaped(self, shape) -> "ModuleArgSpec":
        """This spec binding its Symbol with another shape (the same name, dtype and uuid), as
        expansion and module pushing resize a bound Symbol.

        >>> ModuleArgSpec(Symbol((2,), name='x')).reshaped((3, 2)).symbol.shape
        (3, 2)
        """
        s = self.symbol
        return attrs.evolve(self, symbol=Symbol(tuple(shape), name=s.name, dtype=s.dtype, uuid=s.uuid))

    @classmethod
    def from_flags(cls, symbol, flags: str = "ttt") -> "ModuleArgSpec":
        if len(flags) != 3 or set(flags) - {"t", "f"}:
            raise CircuitError(f"module argument flags are three of t/f (like 'ftt'), got {flags!r}")
        return cls(symbol, *(c == "t" for c in flags))


@attrs.frozen
class ModuleSpec:
    """A module's body and argument specs.  ``check_all_inputs_used`` (default, as rust's parser)
    refuses a spec whose body does not contain one of its Symbols.

    >>> from circuits import Add
    >>> x = Symbol((2,), name='x')
    >>> spec = ModuleSpec(Add(x, x), [ModuleArgSpec(x)])
    >>> [a.symbol.name for a in spec.arg_specs]
    ['x']
    """

    body: Circuit
    arg_specs: tuple = attrs.field(converter=tuple)
    check_all_inputs_used: bool = attrs.field(default=True, eq=False)

    def __attrs_post_init__(self):
        if not isinstance(self.body, Circuit):
            raise CircuitError(f"a module body is a circuit node, got {type(self.body).__name__}")
        seen = set()
        for a in self.arg_specs:
            if not isinstance(a, ModuleArgSpec):
                raise CircuitError(f"arg_specs holds ModuleArgSpec values, got {a!r}")
            seen.add(a.symbol.hash)
        if self.check_all_inputs_used and seen:
            present = _hashes_in(self.body, seen)
            missing = [a.symbol for a, used in zip(self.arg_specs, self.are_args_used())
                       if a.symbol.hash not in present or not used]
            if missing:
                raise CircuitError(
                    f"module spec: argument Symbol {missing[0].line()} does not occur in the body "
                    f"{self.body.line()}; bind only Symbols the body uses (or pass check_all_inputs_used=False)")

    @classmethod
    def new_free_symbols(cls, body: Circuit, **flags) -> "ModuleSpec":
        """A spec binding every Symbol of ``body``, in the order a walk from the root meets them.

        >>> from circuits import Add
        >>> spec = ModuleSpec.new_free_symbols(Add(Symbol((2,), name='a'), Symbol((2,), name='b')))
        >>> [a.symbol.name for a in spec.arg_specs]
        ['a', 'b']
        """
        symbols = [n for n in _walk(body) if type(n) is Symbol]
        return cls(body, [ModuleArgSpec(s, **flags) for s in symbols])

    @property
    def symbols(self) -> tuple:
        return tuple(a.symbol for a in self.arg_specs)

    def are_args_used(self) -> list:
        """Which arguments the body can see: a Symbol bound twice is bound by its later argument
        (rust_circuit: later children are "more inner", substituted first), so the earlier one is
        unused.  (Whether the body contains the Symbol at all is not looked at.)

        >>> x = Symbol((), name='x')
        >>> ModuleSpec(x, [ModuleArgSpec(x), ModuleArgSpec(x)], check_all_inputs_used=False).are_args_used()
        [False, True]
        """
        later: set = set()
        used = []
        for a in reversed(self.arg_specs):
            used.append(a.symbol.hash not in later)
            later.add(a.symbol.hash)
        return used[::-1]


def _follow_symbols(arg_specs, body, old_body=None) -> list:
    """The argument specs for a new body: a bound Symbol the body no longer holds is followed to
    the one Symbol of the body that differs from it only in name (what ``strip_names`` or a
    renaming does to it) and that the old body did not hold (a free Symbol that was there all
    along is another Symbol, however alike); otherwise it is kept."""
    wanted = {a.symbol.hash for a in arg_specs}
    present = _hashes_in(body, wanted)
    if len(present) == len(wanted):
        return list(arg_specs)
    before = set() if old_body is None else {n.hash for n in _walk(old_body) if type(n) is Symbol}
    symbols = [n for n in _walk(body) if type(n) is Symbol and n.hash not in wanted and n.hash not in before]
    out = []
    for a in arg_specs:
        sym = a.symbol
        if sym.hash not in present:
            same = [s for s in symbols if (s.shape, s.dtype, s.uuid) == (sym.shape, sym.dtype, sym.uuid)]
            if len(same) == 1:
                a = attrs.evolve(a, symbol=same[0])
        out.append(a)
    return out


def _walk(root):
    """Each distinct node under ``root`` once, in the order a depth-first walk from the root
    meets them (children left to right), with an explicit stack (``circuits.traversal`` sits
    above the nodes package)."""
    seen, stack = set(), [root]
    while stack:
        n = stack.pop()
        if n.hash in seen:
            continue
        seen.add(n.hash)
        yield n
        stack.extend(reversed(n.children))


def _hashes_in(root, wanted) -> set:
    """Which of the ``wanted`` node hashes occur under ``root`` (stops once all are found)."""
    found = set()
    for n in _walk(root):
        if len(found) == len(wanted):
            break
        if n.hash in wanted:
            found.add(n.hash)
    return found


def module_shape(spec: ModuleSpec, args, fail) -> "tuple[tuple, dict, tuple, bool]":
    """``(shape, size_map, batch, needs_expansion)`` of ``spec`` applied to ``args``: the batch
    axes of the arguments (``batch``: right-aligned, equal where they overlap) followed by the
    body's shape with its symbolic sizes replaced (``size_map``: symbolic size -> argument size).
    Where two arguments give one symbolic size (or batch axis) different sizes, a concrete one
    wins over a symbolic one and two symbolic ones are unified to the first (rust_circuit's size
    constraints); two different concrete sizes are an error.  ``fail(message)`` makes the error.
    ``needs_expansion``: a concrete size changed, which only re-deriving the body's shapes can
    follow (``circuits.expand``)."""
    batch: list = []
    candidates: dict = {}
    needs_expansion = False
    for i, (a, arg, used) in enumerate(zip(spec.arg_specs, args, spec.are_args_used())):
        if not used:  # bound again by a later argument: it never reaches the body
            continue
        sym = a.symbol
        extra = len(arg.shape) - len(sym.shape)
        if extra < 0:
            raise fail(f"argument {i} has shape {shape_text(arg.shape)} but its Symbol "
                       f"{quote_name(sym.name or '')} has rank {len(sym.shape)} {shape_text(sym.shape)}")
        if extra and not a.batchable:
            raise fail(f"argument {i} has batch axes {shape_text(arg.shape[:extra])} but its spec is not "
                       "batchable (flags " + a.flags + ")")
        merge_batch(batch, arg.shape[:extra], lambda: fail(
            f"argument {i}'s batch axes {shape_text(arg.shape[:extra])} disagree with the other "
            f"arguments' {shape_text(batch)} (batch axes align on the right)"))
        for s, n in zip(sym.shape, arg.shape[extra:]):
            if s == n:
                continue
            if not a.expandable:
                raise fail(f"argument {i} has shape {shape_text(arg.shape)} but its Symbol has "
                           f"{shape_text(sym.shape)} and is not expandable (flags {a.flags})")
            factor, syms = symbolic_factors(s)
            if len(syms) == 1 and n % factor == 0:  # 2*1s given 22: 1s is 11 (as rust solves it)
                candidates.setdefault(SYMBOLIC_SIZES[syms[0]], []).append(n // factor)
            elif syms or a.ban_non_symbolic_size_expand:
                raise fail(f"argument {i} has size {n} where its Symbol {quote_name(sym.name or '')} "
                           f"has {shape_text((s,))[1:-1]}; give an argument of the Symbol's shape "
                           "(plus leading batch axes), or use symbolic sizes (0s) in the Symbol")
            else:
                needs_expansion = True
    size_map = {}
    for s, values in candidates.items():
        concrete = {v for v in values if not is_symbolic(v)}
        if len(concrete) > 1:
            raise fail(f"symbolic size {shape_text((s,))[1:-1]} is given the sizes {sorted(concrete)} "
                       "by different arguments")
        size_map[s] = concrete.pop() if concrete else values[0]
    batch = tuple(batch)
    return batch + map_sizes(spec.body.shape, size_map), size_map, batch, needs_expansion


def merge_batch(batch: list, new, fail):
    """Merge the batch axes ``new`` into ``batch`` in place (right-aligned; where both have an
    axis they must be equal, or one symbolic: a concrete size wins, else the first)."""
    for k in range(1, len(new) + 1):
        if k <= len(batch):
            old, n = batch[-k], new[-k]
            if old != n:
                if not is_symbolic(n):
                    if not is_symbolic(old):
                        raise fail()
                    batch[-k] = n
        else:
            batch.insert(0, new[-k])


def map_sizes(shape: tuple, size_map: dict) -> tuple:
    """``shape`` with each symbolic size replaced as ``size_map`` says (products factor by factor)."""
    if not size_map:
        return shape
    out = []
    for s in shape:
        if s in size_map:
            out.append(size_map[s])
        elif s >= SYMBOLIC_BASE and is_symbolic(s):
            factor, syms = symbolic_factors(s)
            for j in syms:
                p = SYMBOLIC_SIZES[j]
                factor *= size_map.get(p, p)
            out.append(factor)
        else:
            out.append(s)
    return tuple(out)


class Module(Circuit):
    """A ``ModuleSpec`` applied to arguments (see the module docstring): children
    ``(body, *arguments)``; arguments positional in spec order or by their Symbols' names.

    >>> import numpy as np
    >>> from circuits import Array, Einsum
    >>> x, w = Symbol((3,), name='x'), Symbol((2, 3), name='w')
    >>> spec = ModuleSpec(Einsum.from_spec('ij,j->i', w, x, name='mv'), [ModuleArgSpec(w), ModuleArgSpec(x)])
    >>> batch = Array(np.ones((5, 3), np.float32), name='xs')   # five inputs at once
    >>> m = Module(spec, Array(np.ones((2, 3), np.float32), name='W'), batch, name='layer')
    >>> m.shape, m.substitute().shape
    ((5, 2), (5, 2))
    """

    __slots__ = ("spec", "size_map", "batch_shape")
    type_name = "Module"
    child_count = (1, None)
    takes_child_info = True

    spec: ModuleSpec
    size_map: dict
    batch_shape: tuple

    def _setup(self, spec, *args, name=None, **kwargs):
        if not isinstance(spec, ModuleSpec):
            raise CircuitError(f"Module takes a ModuleSpec first, got {type(spec).__name__}")
        if kwargs:
            if args:
                raise CircuitError("give a Module's arguments either positionally or by name, not both")
            by_name = {a.symbol.name: a for a in spec.arg_specs}
            unknown = set(kwargs) - set(by_name)
            if unknown:
                raise CircuitError(f"Module: no argument Symbol named {sorted(unknown)[0]!r}; the spec binds "
                                   f"{sorted(n for n in by_name if n is not None)}")
            args = tuple(kwargs.get(a.symbol.name) for a in spec.arg_specs)
            if any(a is None for a in args):
                missing = [a.symbol.name for a, v in zip(spec.arg_specs, args) if v is None]
                raise CircuitError(f"Module: no argument given for {missing}")
        args = check_children("Module", name, args)
        children = (spec.body, *args)
        if len(args) != len(spec.arg_specs):
            raise shape_error("Module", name, "", children,
                              f"the spec binds {len(spec.arg_specs)} Symbols but {len(args)} arguments were given")

        def fail(message):
            return shape_error("Module", name, "", children, message)

        shape, self.size_map, self.batch_shape, needs_expansion = module_shape(spec, args, fail)
        self.spec = spec
        if needs_expansion:
            shape = substitute_module_body(spec, args, self.size_map, self.batch_shape).shape
        dtype = spec.body.dtype
        return self._set_common(children, shape, dtype, name)

    @property
    def body(self) -> Circuit:
        return self.children[0]

    @property
    def args(self) -> tuple:
        return self.children[1:]

    def _payload_bytes(self):
        return b"".join(a.symbol.hash + a.flags.encode() for a in self.spec.arg_specs)

    def _structure_bytes(self):
        return b"".join(a.symbol.structure_hash + a.flags.encode() for a in self.spec.arg_specs)

    def payload_text(self):
        return ""

    def child_info(self, i: int):
        """The ``(Symbol, flags)`` the text format writes after child ``i``'s line (None for the body)."""
        if i == 0:
            return None
        a = self.spec.arg_specs[i - 1]
        return a.symbol, a.flags

    @classmethod
    def parse_payload(cls, text):
        return no_payload(cls, text, "'name' Module, then the body line and argument lines with ! 'symbol'")

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        """``payload``: the parser's ``[(symbol, flags)]`` read from the argument lines."""
        specs = [ModuleArgSpec.from_flags(sym, flags) for sym, flags in (payload or ())]
        # An argument Symbol the body does not use prints in full after '!': read it back (rust's
        # parser refuses it by default; what this library prints must parse).
        return cls(ModuleSpec(children[0], specs, check_all_inputs_used=False), *children[1:], name=name)

    def expanded(self, children, gained, size_map, replacements=None):
        """The module stays (rust's expand of a Module).  Axes an argument gains move behind its
        own batch axes into its Symbol, which gains them too; the body is expanded again from the
        original, with those Symbols and the same replacements, so that its gained axes line up
        with theirs; the module's own batch axes then go back behind the gained ones."""
        body = children[0]
        if any(gained[1:]):
            specs, args, renames = gains_into_symbols(self, children[1:])
            table = {k: v for k, v in (replacements or {}).items() if k not in renames}
            table.update(renames)
            body = expand(self.body, table, size_map)
            out = Module(ModuleSpec(body, specs, check_all_inputs_used=False), *args, name=self.name)
        else:
            out = self._rebuild(tuple(children), self.name)
        grew = len(body.shape) - len(self.body.shape)
        return move_axes_behind(out, len(out.shape) - len(body.shape), grew)

    def _rebuild(self, children, name):
        body, *args = children
        if body is self.spec.body:
            spec = self.spec
        else:
            spec = ModuleSpec(body, _follow_symbols(self.spec.arg_specs, body, self.spec.body),
                              check_all_inputs_used=False)
        return Module(spec, *args, name=name)

    def substitute(self) -> Circuit:
        """The body with the arguments in place of their Symbols, every shape re-derived
        (batch axes and symbolic sizes followed); named like this module when it has a name
        (unless the result is a Symbol passed through: renamed, it would be another Symbol).
        Value-preserving: it evaluates to this module's value."""
        out = substitute_module_body(self.spec, self.args, self.size_map, self.batch_shape)
        if out.shape != self.shape and len(out.shape) < len(self.shape) \
                and self.shape[len(self.shape) - len(out.shape):] == out.shape:
            # batch axes of arguments the body does not use: the value repeats along them
            out = insert_axes(out, 0, self.shape[:len(self.shape) - len(out.shape)])
        if out.shape != self.shape:  # a bug in a rule or in Module's shape rule, never the user's
            raise CircuitError(f"substituting {self.line()} gave shape {shape_text(out.shape)}, "
                               f"but the module has {shape_text(self.shape)}")
        if self.name is not None and type(out) is not Symbol:  # a renamed Symbol is another Symbol
            out = out.rename(self.name)
        return out


def substitute_module_body(spec: ModuleSpec, args, size_map, batch) -> Circuit:
    """The body of ``spec`` with the arguments in place of its Symbols (not renamed).  An
    argument whose sizes were unified with another's (see ``module_shape``) is wrapped in a
    ``SetSymbolicShape`` stating the unified sizes."""
    from .symbolic_shape import SetSymbolicShape

    replacements = {}
    for a, arg in zip(spec.arg_specs, args):
        extra = len(arg.shape) - len(a.symbol.shape)
        core = tuple(n if s == n else size_map.get(s, n) for s, n in zip(a.symbol.shape, arg.shape[extra:]))
        target = batch[len(batch) - extra:] + core
        replacements[a.symbol] = arg if target == arg.shape else SetSymbolicShape(arg, target)
    return expand(spec.body, replacements, size_map)


def gains_into_symbols(module: Module, new_args):
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
