"""The node protocol every circuit node follows.

Every node has ``name``, ``children`` (a tuple), ``shape`` (a tuple of ints), ``dtype`` (a numpy
dtype name), a structural ``hash`` fixed at construction and ``with_children``. Nodes are
immutable and interned: building a node equal to a live one returns that one, so identical
subtrees are stored once and equality is a comparison of 16-byte hashes, never a walk.

Constructors validate (shapes, axes, bounds, dtypes) and raise ``ShapeError``/``CircuitError``
naming the node; they never simplify — simplification is ``rewrites``' job.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import struct
import weakref
from typing import ClassVar

from ..errors import CircuitError, ShapeError, escape_char
from hashlib import blake2b as _blake2b

from ..hashing import NODE_HASH_BYTES

class _Ref(weakref.ref):
    """A weak reference that remembers its interning key (a C-level subclass: much cheaper to
    make than ``WeakValueDictionary``'s ``KeyedRef``, which runs Python ``__new__``/``__init__``)."""

    __slots__ = ("key",)


# Interning table: node hash -> weak reference to the live node, so dropping a circuit frees it.
_INTERNED: "dict[bytes, _Ref]" = {}


def _forget(ref, _table=_INTERNED):
    # Called when an interned node dies; a newer node may already hold the key.
    if _table.get(ref.key) is ref:
        try:
            del _table[ref.key]
        except KeyError:  # pragma: no cover - removed concurrently
            pass


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


def interned_count() -> int:
    """How many interned nodes are alive."""
    return sum(1 for r in list(_INTERNED.values()) if r() is not None)

# Sizes, slice bounds and axis ids are stored (and hashed) as signed 64-bit ints.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# The largest single tensor the library will allocate (evaluation, fill_random...), in bytes:
# the environment variable CIRCUITS_MAX_ALLOC_BYTES, else 4 GiB.  A request beyond it is refused
# with an error naming the node before anything is allocated.
MAX_ALLOC_ENV = "CIRCUITS_MAX_ALLOC_BYTES"
DEFAULT_MAX_ALLOC_BYTES = 4 << 30


def max_alloc_bytes() -> int:
    """The allocation budget in bytes (see ``MAX_ALLOC_ENV``).

    >>> max_alloc_bytes() > 0
    True
    """
    import os

    text = os.environ.get(MAX_ALLOC_ENV)
    if not text:
        return DEFAULT_MAX_ALLOC_BYTES
    try:
        value = int(text)
    except ValueError:
        raise CircuitError(f"{MAX_ALLOC_ENV}={text!r} is not an int number of bytes") from None
    if value <= 0:
        raise CircuitError(f"{MAX_ALLOC_ENV}={text!r} must be a positive number of bytes")
    return value


_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2,
             "float32": 4, "int32": 4, "uint32": 4, "float64": 8, "int64": 8, "uint64": 8}


def check_allocation(shape, dtype: str, what, error=CircuitError, budget=None) -> None:
    """Raise ``error`` naming ``what`` (a string, or a callable making one) when a tensor of
    this shape and dtype would take more than ``budget`` bytes (default ``max_alloc_bytes()``)."""
    n = _ITEMSIZE.get(dtype, 8)
    for s in shape:
        n *= s
    limit = max_alloc_bytes() if budget is None else budget
    if n > limit:
        if callable(what):
            what = what()
        raise error(
            f"{what} would allocate {_human_bytes(n)} (shape {shape_text(shape)}, {dtype}), over the "
            f"budget of {_human_bytes(limit)}; raise it with the environment variable "
            f"{MAX_ALLOC_ENV}=<bytes> if this is intended, or make the tensor smaller"
        )


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
DEFAULT_FLOAT = "float32"


def normalize_dtype(dtype) -> str:
    """The canonical name of a dtype ('float32', 'int64', ...); raises on unsupported ones."""
    if type(dtype) is str and dtype in DTYPES:
        return dtype
    import numpy as np

    if dtype is None:
        return DEFAULT_FLOAT
    name = str(dtype) if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in DTYPES:
        raise CircuitError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def promote(dtypes) -> str:
    """numpy-style result dtype of combining values of these dtypes (floats win over ints)."""
    import numpy as np

    dtypes = tuple(dtypes)
    if not dtypes:
        return DEFAULT_FLOAT
    first = dtypes[0]
    for d in dtypes:
        if d != first:
            break
    else:
        return first
    if "bfloat16" in dtypes:
        floats = [d for d in dtypes if is_float(d)]
        return "bfloat16" if set(floats) == {"bfloat16"} else max(floats, key=FLOAT_DTYPES.index)
    return np.result_type(*[np.dtype(d) for d in dtypes]).name


def shape_text(shape) -> str:
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


# C-level getters: map() with these avoids a Python frame per list comprehension.
shape_of = operator.attrgetter("shape")
dtype_of = operator.attrgetter("dtype")
hash_of = operator.attrgetter("hash")

_new_object = object.__new__
_INT_STRUCTS: dict[int, struct.Struct] = {}
_COUNTS = [n.to_bytes(4, "little") for n in range(64)]
# First 8 bytes of a node hash as a signed little-endian int: the Python hash of the node.
_unpack_int64 = struct.Struct("<q").unpack_from


def _pack_ints(values) -> bytes:
    n = len(values)
    packer = _INT_STRUCTS.get(n)
    if packer is None:
        packer = _INT_STRUCTS[n] = struct.Struct(f"<{n}q")
    return packer.pack(*values)


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

    __slots__ = ("name", "children", "shape", "dtype", "hash", "_int_hash", "_blind_hash", "__weakref__")

    # Set by subclasses.
    type_name: ClassVar[str] = "Circuit"
    prints_shape: ClassVar[bool] = False

    name: str | None
    children: tuple["Circuit", ...]
    shape: tuple[int, ...]
    dtype: str
    hash: bytes

    # ------------------------------------------------------------------ construction
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._hash_prefix = cls.type_name.encode() + b"\0"

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
        # The hash input: type, payload, child count and hashes, name (see circuits.hashing).
        n = len(children)
        if n == 1:
            kids = children[0].hash
        elif n:
            kids = b"".join(map(hash_of, children))
        else:
            kids = b""
        h = _blake2b(
            b"".join((
                self._hash_prefix, self._payload_bytes(), b"\0",
                _COUNTS[n] if n < 64 else n.to_bytes(4, "little"), kids,
                b"\0" if name is None else b"\1" + name.encode("utf-8", "surrogatepass"),
            )),
            digest_size=NODE_HASH_BYTES,
        ).digest()
        ref = _INTERNED.get(h)
        if ref is not None:
            existing = ref()
            if existing is not None and existing._interchangeable_with(self):
                return existing
        self.hash = h
        self._int_hash = _unpack_int64(h)[0]
        self._blind_hash = None
        ref = _Ref(self, _forget)
        ref.key = h
        _INTERNED[h] = ref
        return self

    def _interchangeable_with(self, other) -> bool:
        """Whether the live interned node may stand for ``other`` (same hash).  Array overrides
        this so that a node with a value is never replaced by a placeholder of it; for the same
        reason a parent may stand for another only over the very same children (or leaves that
        may stand for theirs): else ``Add(w, s)`` over a valued ``w`` could come back as a live
        ``Add`` over a placeholder of ``w``.  One level only, never recursive."""
        for mine, theirs in zip(self.children, other.children):
            if mine is not theirs and (mine.children or not mine._interchangeable_with(theirs)):
                return False
        return True

    # ------------------------------------------------------------------ payload (subclasses)
    def _payload_bytes(self) -> bytes:
        """Bytes identifying the payload (hash input), excluding children and name."""
        raise NotImplementedError

    def payload_text(self) -> str:
        """The payload as the text format writes it (``qc,kc,,qk->qk``, ``[0,:,:]``, ...)."""
        raise NotImplementedError

    def _rebuild(self, children: tuple["Circuit", ...]) -> "Circuit":
        """A node of this type with this payload and name over new children."""
        raise NotImplementedError

    # ------------------------------------------------------------------ protocol
    def with_children(self, children) -> "Circuit":
        """This node over new children (validated); ``self`` when nothing changed."""
        children = tuple(children)
        old = self.children
        if len(children) == len(old) and all(a is b or a == b for a, b in zip(children, old)):
            return self
        return self._rebuild(children)

    def rename(self, name: str | None) -> "Circuit":
        """This node with another name (a different node: names are part of identity)."""
        if name == self.name:
            return self
        return self._with_name(name)

    def _with_name(self, name):
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def rank(self) -> int:
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
        parts = []
        if self.name is not None:
            parts.append(quote_name(self.name))
        if self.prints_shape:
            parts.append(shape_text(self.shape))
        parts.append(self.type_name)
        payload = self.payload_text()
        if payload:
            parts.append(payload)
        return " ".join(parts)

    def __repr__(self):
        return f"<{self.line()}{'' if self.prints_shape else ' ' + shape_text(self.shape)}>"

    def to_text(self, **options) -> str:
        """The text format of this circuit (see ``circuits.text``); default options reproduce the
        seed file byte for byte."""
        from ..text.printer import to_text

        return to_text(self, **options)

    def __str__(self):
        from ..text.printer import to_text

        return to_text(self, depth=6, max_lines=400)

    def _repr_html_(self):
        from ..text.html import to_html

        return to_html(self)

    def _repr_pretty_(self, p, cycle):
        from ..text.printer import to_text

        p.text(to_text(self, depth=6, max_lines=400))

    # ------------------------------------------------------------------ conveniences
    def evaluate(self, inputs=None, **options):
        """``circuits.evaluate(self, inputs, **options)``."""
        from ..evaluation import evaluate

        return evaluate(self, inputs, **options)

    def toposort(self):
        """Distinct nodes of this circuit, children before parents (iterative)."""
        from ..traversal import toposort

        return toposort(self)

    def count_nodes(self) -> int:
        from ..traversal import count_nodes

        return count_nodes(self)

    # selection (circuits.select): matchers are names, globs, types, predicates, Matcher objects
    def get(self, matcher, *, require: bool = False) -> list["Circuit"]:
        """Distinct nodes matching ``matcher`` (children first); see ``circuits.select``."""
        from ..select import get

        return get(self, matcher, require=require)

    def get_unique(self, matcher) -> "Circuit":
        """The one node matching ``matcher``; SelectionError naming the matcher otherwise."""
        from ..select import get_unique

        return get_unique(self, matcher)

    def update(self, matcher, fn) -> "Circuit":
        """This circuit with every matching node ``n`` replaced by ``fn(n)`` (only the affected
        ancestors are rebuilt)."""
        from ..select import update

        return update(self, matcher, fn)

    def paths(self, matcher, *, limit: int = 1000) -> list[list["Circuit"]]:
        """Root-to-node paths to the matching nodes (at most ``limit``)."""
        from ..select import paths

        return paths(self, matcher, limit=limit)


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


def describe(type_name: str, name, payload: str, children=(), shape=None) -> str:
    """The would-be printed line of a node (for errors raised before the node exists), with its
    children's lines underneath."""
    parts = []
    if name is not None:
        parts.append(quote_name(name))
    if shape is not None:
        parts.append(shape_text(shape))
    parts.append(type_name)
    if payload:
        parts.append(payload)
    lines = [" ".join(parts)]
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


def int_tuple(values) -> tuple:
    """``values`` as a tuple of ints (the same object when it already is one)."""
    if type(values) is tuple:
        for v in values:
            if type(v) is not int:
                break
        else:
            return values
    return tuple(int(v) for v in values)
