"""The node protocol every circuit node follows.

Every node has ``name``, ``children`` (a tuple), ``shape`` (a tuple of ints), ``dtype`` (a numpy
dtype name), a structural ``hash`` fixed at construction and ``with_children``. Nodes are
immutable and interned: building a node equal to a live one returns that one, so identical
subtrees are stored once and equality is a comparison of 16-byte hashes, never a walk.

Identity, in one place:

- ``a == b`` means same hash: same type, payload, children (by hash, in order) and name.  The
  hash covers everything a node carries that matters to a computation, so equal nodes are
  interchangeable.  In particular an Array's identity includes its shape, its dtype and whether
  it has a value: a placeholder and the valued Array it stands for *print* identically but are
  different nodes (``!=``), so every "did this change?" check, every table keyed by hash and the
  intern table keep them apart (see ``circuits.nodes.leaves.Array``).
- ``a is b`` follows from ``a == b`` while both are alive: the intern table (hash -> weak
  reference) hands back the live node.  The one exception is a node that may not stand for an
  equal one (``_interchangeable_with``: a GeneralFunction whose function was re-registered under
  the same name, and parents over such nodes); "unchanged" in ``with_children`` is therefore
  ``is``, child by child.
- Interning is thread-safe: looking a hash up is one dict read and inserting a new node one
  atomic ``setdefault``; replacing or forgetting an entry happens under a lock that re-checks
  the table.  Threads building the same node concurrently all get one object.

Constructors validate (shapes, axes, bounds, dtypes) and raise ``ShapeError``/``CircuitError``
naming the node; they never simplify — simplification is ``rewrites``' job.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import struct
import threading
import weakref
from typing import ClassVar, NamedTuple

from ..errors import CircuitError, ParseError, ShapeError, escape_char
from ..hashing import node_hash, type_prefix
from ..shapes import shape_text


class _Ref(weakref.ref):
    """A weak reference that remembers its interning key (a C-level subclass: much cheaper to
    make than ``WeakValueDictionary``'s ``KeyedRef``, which runs Python ``__new__``/``__init__``)."""

    __slots__ = ("key",)


# Interning table: node hash -> weak reference to the live node, so dropping a circuit frees it.
_INTERNED: "dict[bytes, _Ref]" = {}
# A new key is inserted with one atomic ``setdefault`` (no lock: two threads that both missed
# the table get one winner).  Every other change (replacing an entry, removing a dead node's)
# is a check-then-write and happens under this lock, so that a dead node's removal cannot delete
# the entry of its successor.  Reentrant because a weak reference callback (``_forget``) can run
# in the thread that holds it, when building a node frees another.
_INTERN_LOCK = threading.RLock()
_SAME_NAME = object()  # with_children keeps the node's name


def _forget(ref, _table=_INTERNED, _lock=_INTERN_LOCK):
    # Called when an interned node dies; a newer node may already hold the key.  Under the lock:
    # between the check and the delete another thread could insert a new node under this key.
    with _lock:
        if _table.get(ref.key) is ref:
            del _table[ref.key]


@contextlib.contextmanager
def bulk_build():
    """Pause CPython's cyclic garbage collector while very many nodes are built (a parser, a
    model builder).  Nodes never need it: a node refers only to nodes built before it, so they
    cannot form reference cycles and are freed by reference counting alone.  The collector's
    passes over a heap that grows by hundreds of thousands of nodes otherwise cost about a third
    of the build time.  The previous state is restored on exit.

    >>> from circuits import Scalar, Add
    >>> with bulk_build():
    ...     total = Scalar(0.0)
    ...     for i in range(1, 4):
    ...         total = Add(total, Scalar(float(i)))
    >>> total.count_nodes()
    7
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _free_or_none(node: "Circuit"):
    """The Symbols below ``node`` when known (``_free``): none below an Array or a Scalar."""
    free = node._free
    if free is None and not node.children and node.type_name != "Symbol":
        return ()
    return free


class _PrettyHook:
    """``Circuit._repr_pretty_``, the hook of IPython's and hypothesis' pretty printers: a node
    prints as its text (``str(node)``).  A descriptor rather than a method because the two
    printers look the hook up differently: IPython on the class, calling it with the node
    (``type(node)._repr_pretty_(node, p, cycle)``), hypothesis on the printed object itself
    (``obj._repr_pretty_(p, cycle)``).  When that object is a node *class* (a test argument
    ``node_type=DiscreteVar``), a plain method came back unbound, missed its ``cycle``, and the
    TypeError hid the test's own failure behind hypothesis' FlakyStrategyDefinition; here a
    class prints as its dotted name.  (No example here: doctest would collect it twice, as this
    class's and as ``Circuit._repr_pretty_``'s; tests/testing/test_failure_reports.py has them.)
    """

    def __get__(self, node, cls=None):
        if node is not None:
            return lambda p, cycle: _pretty_node(node, p)

        def pretty(*args):
            if len(args) == 3:  # IPython: (node, printer, cycle)
                return _pretty_node(args[0], args[1])
            args[0].text(f"{cls.__module__}.{cls.__qualname__}")  # hypothesis, on the class: (printer, cycle)
        return pretty


def _pretty_node(node, p):
    from ..text.printer import to_text

    p.text(to_text(node, depth=6, max_lines=400, max_line_chars=1000))


_PAYLOAD_COPIERS: dict = {}  # node class -> function copying its own __slots__ to a new node


def _payload_copier(cls):
    """A function ``(src, dst)`` setting ``dst``'s payload (``cls.__slots__``, the class's own
    fields) from ``src``'s: one attribute-getter call and plain stores, not a getattr/setattr
    pair per field."""
    slots = (cls.__slots__,) if isinstance(cls.__slots__, str) else tuple(cls.__slots__)
    if not slots:
        return lambda src, dst: None
    if len(slots) == 1:
        (attr,) = slots
        get = operator.attrgetter(attr)
        return lambda src, dst: setattr(dst, attr, get(src))
    get = operator.attrgetter(*slots)

    def copy(src, dst):
        for attr, value in zip(slots, get(src)):
            setattr(dst, attr, value)

    return copy


# C-level getters: map() with these avoids a Python frame per list comprehension.
shape_of = operator.attrgetter("shape")
dtype_of = operator.attrgetter("dtype")
hash_of = operator.attrgetter("hash")

_new_object = object.__new__
# First 8 bytes of a node hash as a signed little-endian int: the Python hash of the node.
_unpack_int64 = struct.Struct("<q").unpack_from


class Circuit:
    """Base class of every node.  See the module docstring for the protocol.

    Example (the text format shows a node and its children):

    >>> from circuits import Array, Einsum
    >>> import numpy as np
    >>> x = Array(np.ones((2, 3), np.float32), name='x')
    >>> y = Einsum.from_spec('ab->b', x, name='y')
    >>> print(y.to_text())   # doctest: +ELLIPSIS
    'y' Einsum ab->b
      'x' [2,3] Array ...
    """

    __slots__ = ("name", "children", "shape", "dtype", "hash", "_int_hash", "_blind_hash", "_free", "_kernel_part",
                 "__weakref__")

    # Set by subclasses.
    type_name: ClassVar[str] = "Circuit"
    prints_shape: ClassVar[bool] = False
    # Whether the node's payload, shape and dtype depend on its children only through their
    # shapes and dtypes: ``with_children`` then copies them instead of validating again
    # (a variant rebuilds every ancestor of what it changed).  The payload is the class's own
    # ``__slots__``.  A class may make it a method of the node instead (GeneralFunction: not for
    # a gather, whose index values are checked when it is built).
    rebuilds_by_shape: ClassVar = False

    name: str | None
    children: tuple["Circuit", ...]
    shape: tuple[int, ...]
    dtype: str
    hash: bytes

    # ------------------------------------------------------------------ construction
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._hash_prefix = type_prefix(cls.type_name)

    def __new__(cls, *args, **kwargs):
        # _setup validates and ends with ``return self._set_common(...)``: the interned node.
        return _new_object(cls)._setup(*args, **kwargs)

    # No __init__: all the work happens in __new__ (so an equal live node can be returned
    # instead), and object.__init__ accepts the arguments when __new__ is overridden.

    def _setup(self, *args, **kwargs) -> "Circuit":  # pragma: no cover - abstract
        """Validate the arguments, set the payload fields, and finish with
        ``return self._set_common(children, shape, dtype, name)``."""
        raise NotImplementedError

    def _set_common(self, children, shape, dtype, name) -> "Circuit":
        """Set the fields every node has, then intern: returns the live node equal to this one
        (``self`` when there is none)."""
        if name is not None and type(name) is not str and not isinstance(name, str):
            raise CircuitError(f"a node's name must be a str or None, got {name!r}")
        self.children = children
        self.shape = shape
        self.dtype = dtype
        self.name = name
        # The recipe is circuits.hashing.node_hash (check() re-hashes through it).
        n = len(children)
        if n == 1:
            kids = children[0].hash
        elif n:
            kids = b"".join(map(hash_of, children))
        else:
            kids = b""
        h = node_hash(self._hash_prefix, self._payload_bytes(), kids, name)
        ref = _INTERNED.get(h)
        if ref is not None:
            existing = ref()
            if existing is not None and existing._interchangeable_with(self):
                return existing
        self.hash = h
        self._int_hash = _unpack_int64(h)[0]
        self._blind_hash = None
        self._free = None  # the Symbols below, filled on demand (circuits.backend.tiers.op_by_op)
        self._kernel_part = None  # what its op kernel is keyed by (circuits.backend.tiers.op_by_op)
        mine = _Ref(self, _forget)
        mine.key = h
        # One atomic insert-if-absent: of threads racing to build this node, one wins.
        if _INTERNED.setdefault(h, mine) is not mine:
            return self._intern_taken(h, mine)
        return self

    def _intern_taken(self, h, mine) -> "Circuit":
        """The key is held: by an equal node another thread just built, by a dead node not yet
        forgotten, or by one that may not stand for this one.  Under the lock: the live node if
        it may stand for this one, else this one replaces the entry."""
        with _INTERN_LOCK:
            ref = _INTERNED.get(h)
            if ref is not None:
                existing = ref()
                if existing is not None and existing._interchangeable_with(self):
                    return existing
            _INTERNED[h] = mine
            return self

    def _interchangeable_with(self, other) -> bool:
        """Whether the live interned node may stand for ``other`` (same hash).  Equal hashes
        normally mean interchangeable nodes; GeneralFunction overrides this for a function
        re-registered under the same name, and so a parent may stand for another only over the
        very same children (or leaves that may stand for theirs): else a parent over the old
        function could come back for one over the new.  One level only, never recursive."""
        for mine, theirs in zip(self.children, other.children):
            if mine is not theirs and (mine.children or not mine._interchangeable_with(theirs)):
                return False
        return True

    # ------------------------------------------------------------------ payload (subclasses)
    # The defaults below are those of a type without payload (Add, DiscreteVar): a class with
    # payload fields of its own (``__slots__``) defines every one of them itself, as the
    # node-type test checks, so that no payload is left out of a hash, a line or a rebuild.
    def _payload_bytes(self) -> bytes:
        """Bytes identifying the payload (hash input), excluding children and name (none by default)."""
        return b""

    def _structure_bytes(self) -> bytes:
        """The payload as the name-blind structure hash sees it: ``_payload_bytes`` except where
        a node carries something that is identity but not structure (an Array's having a value)."""
        return self._payload_bytes()

    def payload_text(self) -> str:
        """The payload as the text format writes it (``qc,kc,,qk->qk``, ``[0,:,:]``, ...; nothing by default)."""
        return ""

    def _rebuild(self, children: tuple["Circuit", ...], name: str | None) -> "Circuit":
        """A node of this type with this payload over ``children`` and named ``name``, built by
        the constructor (so validated).  The one rebuild method: ``with_children`` and ``rename``
        both call it; a leaf refuses children.  By default the constructor over the children."""
        return type(self)(*children, name=name)

    # ------------------------------------------------------------------ text (the parser's side)
    # How many children a line of this type may have: (least, most or None).  The parser checks
    # it (a leaf line with an indented line under it is refused while reading).
    child_count: ClassVar[tuple] = (0, None)
    # Whether an int index reaching this node reaches its children unchanged (Index, Rearrange...).
    passes_index: ClassVar[bool] = False
    # Whether its child lines after the first carry rust_circuit's child info (``! 'sym' ftt``:
    # a Module's arguments); ``from_payload`` then gets ``[(node, flags)]`` as its payload.
    takes_child_info: ClassVar[bool] = False

    @classmethod
    def parse_payload(cls, text: "str | None"):
        """The payload of a printed line (the text after the type word; None when there is
        none) as the value ``from_payload`` takes.  Raises ``ParseError`` with its column counted
        within ``text`` (the parser places it on the line).  Independent of children and store,
        so the parser reads each distinct payload once.  By default a line carries nothing after
        the type word."""
        return no_payload(cls, text, f"nothing after {cls.type_name!r}")

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None) -> "Circuit":
        """The node a printed line describes: ``payload`` from ``parse_payload``, the children
        (a list), the name and the printed shape (None where not printed; the parser checks it
        against the node's own afterwards), and a ``ParseContext``.  Raises ``ParseError`` for
        the line (columns within the payload) or the constructor's ``CircuitError``.  By default
        the constructor over the children."""
        return cls(*children, name=name)

    @classmethod
    def index_children(cls, payload, n_children: int, is_index: bool):
        """Positions of the children that hold int indices (the parser gives a placeholder or a
        Symbol printed without dtype ``int64`` there): a gather's index argument, or every child
        of a node that passes an index through unchanged when this node is one (``is_index``)."""
        return range(n_children) if is_index and cls.passes_index else ()

    # ------------------------------------------------------------------ expansion
    def expanded(self, children, gained, size_map, replacements=None) -> "Circuit":
        """This node rebuilt over ``children``, its children after expansion (``circuits.expand``),
        each of which gained ``gained[i]`` leading batch axes and may have other sizes; ``size_map``
        maps symbolic sizes to sizes (a leaf is called with no children when it is non-empty);
        ``replacements`` are the expansion's own (a Module expands its body with them).  Every
        node type defines it (the checklist in ``circuits.nodes``); raise ``ExpandError`` (or the
        constructor's ``CircuitError``) when the node cannot follow."""
        from .expansion import ExpandError

        raise ExpandError(f"expand: no expansion rule for {type(self).__name__}: {self.line()}")

    # ------------------------------------------------------------------ protocol
    def with_children(self, children, name=_SAME_NAME) -> "Circuit":
        """This node over new children (validated); ``self`` when they are the very same
        children (``is``: an equal child can be a node that may not stand for this one's, see
        ``_interchangeable_with``).  ``name`` renames it in the same step (a copy renamed is
        built once, not twice)."""
        children = tuple(children)
        old = self.children
        if name is _SAME_NAME:
            name = self.name
        if len(children) != len(old):
            return self._rebuild(children, name)
        # Plain loops, not all(): a node has a few children and this is the hot path of every
        # variant (it rebuilds each ancestor of what it changed).
        same = True
        for a, b in zip(children, old):
            if a is not b:
                same = False
                break
        if same:
            return self.rename(name)
        cls = type(self)
        rule = cls.__dict__.get("rebuilds_by_shape")
        if not rule or (rule is not True and not rule(self)):
            return self._rebuild(children, name)
        free = self._free
        for a, b in zip(children, old):
            if a is b:
                continue
            if not isinstance(a, Circuit) or a.shape != b.shape or a.dtype != b.dtype:
                return self._rebuild(children, name)
            if free is not None and _free_or_none(a) is not b._free:
                free = None
        # Children of the same shapes and dtypes: what the constructor derived from them (the
        # payload as validated, the shape, the dtype) holds as it is.
        new = _new_object(cls)
        copy = _PAYLOAD_COPIERS.get(cls)
        if copy is None:
            copy = _PAYLOAD_COPIERS[cls] = _payload_copier(cls)
        copy(self, new)
        new = new._set_common(children, self.shape, self.dtype, name)
        if new._kernel_part is None:  # same op over same shapes: the same kernel
            new._kernel_part = self._kernel_part
        if new._free is None and free is not None:
            new._free = free  # children over the same Symbols: the same Symbols
        return new

    def rename(self, name: str | None) -> "Circuit":
        """This node with another name (a different node: names are part of identity)."""
        if name == self.name:
            return self
        return self._rebuild(self.children, name)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def structure_hash(self) -> bytes:
        """Name-blind structural hash: equal for circuits that differ only in names."""
        if self._blind_hash is None:
            from ..traversal import fill_structure_hashes

            fill_structure_hashes(self)
        return self._blind_hash

    # ------------------------------------------------------------------ identity
    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, Circuit):
            return NotImplemented
        return self.hash == other.hash

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        return self._int_hash

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError(
            "circuits are not pickled (pickle can execute code when loaded); "
            "use circuits.save(circuit, path) and circuits.load(path)"
        )

    # ------------------------------------------------------------------ display
    def line(self) -> str:
        """This node's line in the text format, without serial number or children."""
        return format_line(self.type_name, self.name, self.payload_text(),
                           self.shape if self.prints_shape else None)

    def __repr__(self):
        return f"<{self.line()}{'' if self.prints_shape else ' ' + shape_text(self.shape)}>"

    def to_text(self, **options) -> str:
        """The text format of this circuit (see ``circuits.text``); default options reproduce the
        seed file byte for byte."""
        from ..text.printer import to_text

        return to_text(self, **options)

    def __str__(self):
        from ..text.printer import to_text

        return to_text(self, depth=6, max_lines=400, max_line_chars=1000)

    def _repr_html_(self):
        from ..text.html import to_html

        return to_html(self)

    _repr_pretty_ = _PrettyHook()

    # ------------------------------------------------------------------ conveniences
    def evaluate(self, inputs=None, **options):
        """``circuits.evaluate(self, inputs, **options)``."""
        from ..backend import evaluate

        return evaluate(self, inputs, **options)

    def toposort(self):
        """Distinct nodes of this circuit, children before parents (iterative)."""
        from ..traversal import toposort

        return toposort(self)

    def count_nodes(self) -> int:
        from ..traversal import count_nodes

        return count_nodes(self)

    # Selection: each method is its ``circuits.select`` function with the same signature and
    # defaults (tests/select/test_select_spelling.py checks they stay identical).
    def get(self, matcher, *, require: bool = True) -> list["Circuit"]:
        """Distinct nodes matching ``matcher`` (children first); ``circuits.select.get``."""
        from ..select import get

        return get(self, matcher, require=require)

    def get_unique(self, matcher) -> "Circuit":
        """The one node matching ``matcher``; ``circuits.select.get_unique``."""
        from ..select import get_unique

        return get_unique(self, matcher)

    def update(self, matcher, fn, *, require: bool = True) -> "Circuit":
        """This circuit with every matching node ``n`` replaced by ``fn(n)`` (only the affected
        ancestors are rebuilt); ``circuits.select.update``."""
        from ..select import update

        return update(self, matcher, fn, require=require)

    def paths(self, matcher, *, require: bool = True, limit: int = 1000) -> list[list["Circuit"]]:
        """Root-to-node paths to the matching nodes (at most ``limit``); ``circuits.select.paths``."""
        from ..select import paths

        return paths(self, matcher, require=require, limit=limit)


def no_payload(cls, text, expected: str) -> None:
    """``parse_payload`` of a type whose lines carry nothing after the type word: None, or the
    ``ParseError`` naming the stray text."""
    if text is not None:
        raise ParseError(f"{cls.type_name} takes no payload, got {text!r}", column=1, expected=expected)


def convert_payload(cls, text, convert, missing: str, wrong: str, expected: str):
    """``convert(text)`` for a payload that is one value (a number, an axis, a uuid), else the
    ``ParseError`` saying that it is missing or what it is not."""
    if text is None:
        raise ParseError(f"{cls.type_name} needs {missing}", expected=expected)
    try:
        return convert(text)
    except ValueError:
        raise ParseError(f"{text!r} is not {wrong}", column=1, expected=expected) from None


class ParseContext(NamedTuple):
    """What ``from_payload`` may need beyond its line: the tensor store Arrays are looked up in
    (None: placeholders), and the dtype of a leaf whose line does not print one (``int64`` for
    the int indices of a gather, else ``float32``)."""

    store: object = None
    default_dtype: str = "float32"
    random: object = None  # a leaves.RandomTensors for rust_circuit's random Arrays ('Array rand')


def quote_name(name: str) -> str:
    r"""A name in the text format: single-quoted, with backslash escapes for ``'``, ``\`` and
    every character that is not printable (``\n``, ``\t``, ``\x1b``, ``\u202e``...), so that
    printed text, errors and the notebook view never carry a raw control, escape, bell or
    right-to-left character.  The parser reads the escapes back: the name round-trips exactly.

    >>> print(quote_name("it's"), quote_name("bell\x07"), quote_name("\u202eevil"))
    'it\'s' 'bell\x07' '\u202eevil'
    """
    if name.isprintable() and "\\" not in name and "'" not in name:
        return f"'{name}'"
    return "'" + "".join(map(escape_char, name)) + "'"


def format_line(type_name: str, name=None, payload: str = "", shape=None, paint=None) -> str:
    """A node's line, ``['name'] [shape] Type [payload]``: the one formatter behind
    ``Circuit.line``, error messages (``describe``), the printer and the notebook view.  ``shape``
    is written when given (not None); ``paint(part, text)``, when given, decorates the two parts,
    ``"name"`` (the quoted name) and ``"body"`` (shape, type and payload): colours, HTML spans.

    >>> format_line("Index", "a0.w.q.head0", "[0,:,:]", (32, 256))
    "'a0.w.q.head0' [32,256] Index [0,:,:]"
    >>> format_line("Add", paint=lambda part, text: f"<{part}:{text}>")
    '<body:Add>'
    """
    body = type_name if shape is None else shape_text(shape) + " " + type_name
    if payload:
        body = body + " " + payload
    if paint is not None:
        body = paint("body", body)
        return body if name is None else paint("name", quote_name(name)) + " " + body
    return body if name is None else quote_name(name) + " " + body


def describe(type_name: str, name, payload: str, children=(), shape=None) -> str:
    """The would-be printed line of a node (for errors raised before the node exists), with its
    children's lines underneath."""
    lines = [format_line(type_name, name, payload, shape)]
    for c in children:
        lines.append("  " + c.line() + ("" if c.prints_shape else "  # shape " + shape_text(c.shape)))
    return "\n".join("    " + l for l in lines)


def shape_error(type_name, name, payload, children, message, fix=None, shape=None) -> ShapeError:
    text = f"{type_name} {quote_name(name) if name else '(unnamed)'}: {message}"
    if fix:
        text += f"; {fix}"
    text += "\n" + describe(type_name, name, payload, children, shape)
    return ShapeError(text)


def check_children(type_name, name, children):
    for c in children:
        if not isinstance(c, Circuit):
            i = next(i for i, c in enumerate(children) if not isinstance(c, Circuit))
            raise CircuitError(
                f"{type_name} {quote_name(name) if name else '(unnamed)'}: child {i} is a "
                f"{type(children[i]).__name__}, not a circuit node; wrap values in Array(...) or Scalar(...)"
            )
    return children if type(children) is tuple else tuple(children)
