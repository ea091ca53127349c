"""Leaf nodes: Array (a tensor or a placeholder for one), Scalar (a constant) and Symbol (a free
input bound at evaluation).

Placeholders.  A *placeholder* Array is a promise of a tensor: shape, dtype and (a prefix of) its
content hash, no value.  Parsing text without a store (or with one that lacks the tensor) makes
placeholders; ``circuits.bind`` and ``circuits.fill_random`` replace them by valued Arrays.  An
Array's identity (its node hash, hence ``==``, ``hash()`` and the intern table) covers its printed
content hash, its shape, its dtype and **whether it has a value**:

- a placeholder and the valued Array it stands for print the same line but are different nodes
  (``!=``), so binding the true values to a parsed circuit really changes it, and parsing never
  hands back a live valued Array for a placeholder line (or the reverse);
- two placeholders of the same hash and shape but different dtypes are different nodes;
- two placeholders that agree on all of that are the same node even when one knows the full
  64-digit hash and the other only the printed prefix (the live one is returned);
- the name-blind ``structure_hash`` ignores whether a value is there (a placeholder circuit and
  its bound twin sort their operands alike), and compiled code never depends on it (the compile
  cache key sees only an Array's shape and dtype).

>>> import numpy as np
>>> from circuits import parse, bind
>>> w = Array(np.ones((2,), np.float32), name='w')
>>> p = parse(w.to_text())
>>> p.is_placeholder, p.to_text() == w.to_text(), p == w
(True, True, False)
>>> bind(p, {'w': np.ones((2,), np.float32)}) is w
True
"""

from __future__ import annotations

import math
import struct
import uuid as uuid_module

import numpy as np

from ..dtypes import DEFAULT_FLOAT, DTYPES, ITEMSIZE, normalize_dtype
from ..errors import CircuitError, ParseError, StoreError
from ..hashing import PRINTED_HASH_HEX
from ..hashing import content_hash as compute_content_hash
from ..hashing import pack_ints as _pack_ints
from ..shapes import INT64_MAX, MAX_ALLOC_ENV, check_allocation, max_alloc_bytes, shape_text
from ..shapes import _human_bytes as human_bytes
from .base import Circuit, ParseContext, convert_payload, quote_name

_HEX = set("0123456789abcdef")
_HEX_ANY_CASE = frozenset("0123456789abcdefABCDEF")


def _check_shape(shape, what):
    if type(shape) is tuple:
        for s in shape:
            if type(s) is not int or s < 0 or s > INT64_MAX:
                break
        else:
            return shape
    if callable(what):
        what = what()
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise CircuitError(f"{what}: shape must be a sequence of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise CircuitError(f"{what}: shape {list(shape)} has a negative size")
    if any(s > INT64_MAX for s in shape):
        raise CircuitError(f"{what}: shape {list(shape)} has a size over 2**63 - 1 (the most any axis can hold)")
    return shape


_NO_CONTEXT = ParseContext()


def _brief(value, limit: int = 60) -> str:
    """A short repr for a message (a 400-digit int, a long string: cut)."""
    if type(value) is int and abs(value) >= 10 ** limit:
        return f"an int of about {value.bit_length() * 0.30103:.0f} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def as_uuid(value, what) -> uuid_module.UUID:
    """``value`` (a UUID or its text) as a UUID; ``CircuitError`` naming ``what`` (a string or a
    callable making one) when it is not one.

    >>> as_uuid('00000000-0000-0000-0000-000000000001', 'x').int
    1
    """
    if isinstance(value, uuid_module.UUID):
        return value
    try:
        return uuid_module.UUID(str(value))
    except ValueError:
        what = what() if callable(what) else what
        raise CircuitError(f"{what}: uuid {_brief(value)} is not a UUID (32 hex digits, like uuid.uuid4() "
                           "gives)") from None


def _printed_shape(cls, shape):
    if shape is None:
        raise ParseError(f"an {cls.type_name} line needs its shape",
                         expected=f"a shape like [300,256] before {cls.type_name}")
    return shape


def _no_children(leaf, children):
    if children:
        raise CircuitError(f"{leaf.line()}: {leaf.type_name} is a leaf and has no children")


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary: JAX on the
    CPU then uses it in place as the device value (no second copy of the tensor is held)."""
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize * math.prod(shape)
    buf = np.empty(nbytes + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def _aligned_copy(value: np.ndarray) -> np.ndarray:
    """A C-contiguous, 64-byte-aligned copy of ``value`` (see ``aligned_empty``)."""
    out = aligned_empty(value.shape, value.dtype)
    out[...] = value
    return out


def _seal(value: np.ndarray) -> None:
    """Make ``value`` and every array it is a view of read-only: numpy then refuses to make the
    Array's value writeable again through ``value.flags`` (it would through a writeable base)."""
    while isinstance(value, np.ndarray):
        value.flags.writeable = False
        value = value.base


def _jax_memory(value: np.ndarray) -> bool:
    """Whether ``value`` is a view of a ``jax.Array``'s memory (``np.asarray`` of one, or a slice
    of that): immutable as the jax.Array is, and kept alive by the view."""
    while isinstance(value, np.ndarray):
        value = value.base
    return isinstance(value, memoryview) and value.readonly and type(value.obj).__module__.startswith("jax")


def _in_place(value: np.ndarray) -> bool:
    """Whether JAX on the CPU can use ``value`` as its device value without copying it."""
    return value.flags.c_contiguous and value.ctypes.data % 64 == 0

# Stores whose ``get`` reads each tensor into new memory and hands it to the caller alone (the
# library's own readers, registered by ``circuits.io``; exactly these types, not subclasses): the
# parser's Array takes that memory as its own rather than copying it again.
FRESH_VALUE_STORES: set = set()


class Array(Circuit):
    """A literal tensor, identified by the content hash of its dtype, shape and bytes.

    A placeholder Array knows only shape, dtype and hash (``Array.placeholder``): it prints like
    the real one and raises a clear error if evaluated before ``circuits.bind`` or
    ``circuits.fill_random`` give it a value.  It is not equal to the valued Array (see the
    module docstring): having a value is part of an Array's identity, and so is its dtype.

    >>> import numpy as np
    >>> w = Array(np.zeros((2, 3), np.float32), name='w')
    >>> w.line()
    "'w' [2,3] Array 11c2fbfadf4b6d7be92eb9f0"
    """

    __slots__ = ("value", "content_hash")
    type_name = "Array"
    prints_shape = True
    child_count = (0, 0)

    value: "np.ndarray | None"
    content_hash: str

    def _setup(self, value=None, name=None, *, shape=None, dtype=None, content_hash=None, _hashed=None,
               _owned=False):
        # ``_hashed``: the content hash of ``value``, computed by a reader that hashed the bytes
        # as it copied them (a store's verified ``get``); internal, it spares a second pass.
        # ``_owned``: ``value`` is a numpy array the library just allocated and alone holds (a
        # tensor read from a file, a random draw, another Array's value): it is kept, not copied.
        if value is None:
            if shape is None or content_hash is None:
                raise CircuitError(
                    "Array needs a value; a placeholder needs shape= and content_hash= "
                    "(use Array.placeholder(shape, content_hash, name=...))"
                )
            shape = _check_shape(shape, f"Array {quote_name(name) if name else ''}")
            content_hash = str(content_hash).lower()
            if not content_hash or not set(content_hash) <= _HEX:
                raise CircuitError(f"Array {name!r}: content hash {content_hash!r} is not hex digits")
            self.value = None
            self.content_hash = content_hash
            return self._set_common((), shape, normalize_dtype(dtype), name)
        if hasattr(value, "__jax_array__") or type(value).__module__.startswith("jax"):
            host = np.asarray(value)  # a jax.Array is immutable: kept as it is
            stored = value
        else:
            # A numpy value is copied unless the library allocated it and alone holds it, or it
            # is a view of a jax.Array's memory: a read-only view proves nothing (its memory may
            # be written through another name, a file under a memory map rewritten, an owner
            # set writeable again), and an Array's value must stay the bytes its content hash
            # was computed from (issue 33 item 3).
            fresh = _owned
            host = np.asarray(value)
            if host.dtype == np.bool_ and host.size and host.view(np.uint8).max() > 1:
                # A bool array can hold bytes other than 0 and 1 (np.frombuffer, a view): numpy
                # and JAX then compute with the raw byte (True + 0.0 == 2.0).  Normalise to 0/1
                # before hashing, so equal truth values are one Array and evaluate as 0/1.
                host = host.view(np.uint8) != 0
                fresh, _hashed = True, None
            if not (fresh and _in_place(host) or _jax_memory(host)):
                check_allocation(host.shape, normalize_dtype(host.dtype),
                                 lambda: f"Array {quote_name(name) if name else ''} (a private copy of its value)")
                host = _aligned_copy(host)
            _seal(host)
            stored = host
        dtype_name = normalize_dtype(host.dtype)
        if dtype is not None and normalize_dtype(dtype) != dtype_name:
            raise CircuitError(f"Array {name!r}: value has dtype {dtype_name}, not {dtype}")
        self.value = stored
        self.content_hash = _hashed if _hashed is not None else compute_content_hash(host)
        return self._set_common((), tuple(int(s) for s in host.shape), dtype_name, name)

    @classmethod
    def placeholder(cls, shape, content_hash, name=None, dtype=DEFAULT_FLOAT) -> "Array":
        """An Array whose value is not loaded: shape, dtype and (a prefix of) its content hash."""
        return cls(None, name, shape=shape, dtype=dtype, content_hash=content_hash)

    @property
    def is_placeholder(self) -> bool:
        return self.value is None

    @property
    def short_hash(self) -> str:
        return self.content_hash[:PRINTED_HASH_HEX]

    def _payload_bytes(self):
        # "P" or "V": a placeholder is never the valued Array it stands for, so no "did this
        # change?" check or hash-keyed table can confuse them (see the module docstring).
        return (b"P|" if self.value is None else b"V|") + self._structure_bytes()

    def _structure_bytes(self):
        # Shape and dtype are implied by a real array's content hash, but not by a placeholder's
        # (possibly short) hash prefix: keep them in the identity so they can never be confused.
        return self.short_hash.encode() + b"|" + self.dtype.encode() + b"|" + _pack_ints(self.shape)

    def payload_text(self):
        return self.short_hash

    @classmethod
    def parse_payload(cls, text):
        """The printed content hash (any prefix that is unique in the store)."""
        if text is None or text == "rand":
            return None  # rust_circuit's random tensor (no hash, or 'rand'): see from_payload
        if not _HEX_ANY_CASE.issuperset(text):
            raise ParseError(f"{text!r} is not a hex hash", column=1, expected="hex digits (0-9, a-f)")
        return text

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        """The tensor from the context's store (``store.find(prefix)`` then ``store.get``), else
        the store's own placeholder (an optional ``store.placeholder(prefix, shape, name)``), else
        a placeholder of the context's default dtype."""
        shape = _printed_shape(cls, shape)
        context = context or _NO_CONTEXT
        if payload is None:
            return Array(random_tensor(shape, context), name=name, _owned=True)
        store = context.store
        if store is not None:
            digest = payload.lower()
            try:
                full = store.find(digest)
            except StoreError as e:
                raise ParseError(str(e), column=1, expected="a longer hash prefix, unique in the store") from None
            if full is not None:
                # A store that verifies what it hands out (``hashes_verified``) gives the tensor
                # whose content hash is ``full``: it need not be hashed again.
                value = store.get(full)
                verified = getattr(store, "hashes_verified", False) is True and len(full) == 64
                node = Array(value, name=name, _hashed=full if verified else None,
                             _owned=type(store) in FRESH_VALUE_STORES)
                if node.shape != shape:
                    raise ParseError(
                        f"the tensor with this hash has shape {shape_text(node.shape)}, not {shape_text(shape)}",
                        expected=f"shape {shape_text(node.shape)} or another hash")
                return node
            known = getattr(store, "placeholder", None)
            node = None if known is None else known(digest, shape, name)
            if node is not None:
                return node
        return cls.placeholder(shape, payload, name=name, dtype=context.default_dtype)

    def expanded(self, children, gained, size_map, replacements=None):
        """A leaf: an Array keeps its value and shape (a symbolic size in it stays)."""
        return self

    def _rebuild(self, children, name):
        _no_children(self, children)
        if self.value is None:
            return Array.placeholder(self.shape, self.content_hash, name=name, dtype=self.dtype)
        return Array(self.value, name=name, _hashed=self.content_hash, _owned=True)

    def numpy(self) -> np.ndarray:
        """The value as a numpy array (raises for a placeholder)."""
        if self.value is None:
            from ..errors import EvaluationError

            raise EvaluationError(
                f"{self.line()} is a placeholder with no value; give it one with "
                "circuits.bind(circuit, {name: array}) or circuits.fill_random(circuit, seed)"
            )
        return np.asarray(self.value)


_NAN = float("nan")


class RandomTensors:
    """The values of rust_circuit's random Arrays (``Array rand``, or an Array line without a
    hash) in one parse: standard normal, drawn in text order from a generator seeded with
    ``seed`` (the same text parses to the same tensors), and all of them together within the
    allocation budget (``budget``, default ``circuits.shapes.max_alloc_bytes()``), checked
    before anything is allocated: a few bytes of text cannot ask for gigabytes.

    >>> r = RandomTensors(0, budget=1000)
    >>> r.draw((10, 20), "float32").shape
    (10, 20)
    >>> r.draw((100,), "float32")
    Traceback (most recent call last):
    ...
    circuits.errors.ParseError: a random Array [100] (float32, 400 B) would bring this text's random tensors to 1.2 KiB, over the allocation budget of 1000 B; raise it with the environment variable CIRCUITS_MAX_ALLOC_BYTES=<bytes> if this is intended, or give the Array a hash (its tensor from a store)
    """

    # Drawn in pieces of this many values: a float32 tensor never needs a float64 twice its size.
    PIECE = 1 << 20

    def __init__(self, seed=0, budget: int | None = None):
        self.generator = np.random.default_rng(seed)
        self.budget = max_alloc_bytes() if budget is None else int(budget)
        self.used = 0

    def draw(self, shape, dtype: str = "float32") -> np.ndarray:
        dtype = dtype if dtype in ("float16", "float32", "float64", "bfloat16") else "float32"
        what = f"a random Array {shape_text(shape)}"
        check_allocation(shape, dtype, what, ParseError, budget=self.budget)
        nbytes = ITEMSIZE[dtype] * math.prod(shape)
        if self.used + nbytes > self.budget:
            raise ParseError(
                f"{what} ({dtype}, {human_bytes(nbytes)}) would bring this text's random tensors to "
                f"{human_bytes(self.used + nbytes)}, over the allocation budget of {human_bytes(self.budget)}; "
                f"raise it with the environment variable {MAX_ALLOC_ENV}=<bytes> if this is intended, "
                "or give the Array a hash (its tensor from a store)")
        self.used += nbytes
        if dtype == "bfloat16":
            import ml_dtypes

            out = aligned_empty(shape, ml_dtypes.bfloat16)
        else:
            out = aligned_empty(shape, dtype)
        flat = out.reshape(-1)
        n = flat.size
        for start in range(0, n, self.PIECE):  # the values one standard_normal(shape) call gives
            flat[start:start + self.PIECE] = self.generator.standard_normal(min(self.PIECE, n - start))
        return out


def random_tensor(shape, context) -> np.ndarray:
    """What rust_circuit's ``Array rand`` (or an Array line without a hash) stands for: standard
    normal values of the context's dtype (float32 for an int one), drawn from the parse's own
    ``RandomTensors`` (``context.random``), which keeps them all within the allocation budget."""
    source = getattr(context, "random", None)
    if source is None:
        source = RandomTensors(0)
    return source.draw(shape, context.default_dtype)


def format_scalar(value: float) -> str:
    """Shortest positional form that parses back to the same float: 0.00001, -10000, 1."""
    return np.format_float_positional(np.float64(value), unique=True, trim="-")


class Scalar(Circuit):
    """A constant value broadcast to a shape (default ``()``).

    >>> Scalar(1e-5, name='ln.c.eps').line()
    "'ln.c.eps' [] Scalar 0.00001"
    """

    __slots__ = ("value",)
    type_name = "Scalar"
    prints_shape = True
    child_count = (0, 0)

    value: float

    def _setup(self, value, shape=(), name=None):
        try:
            v = value if type(value) is float else float(value)
        except (TypeError, ValueError):
            raise CircuitError(f"Scalar {name!r}: value must be a real number, got {_brief(value)}") from None
        except OverflowError:
            raise CircuitError(f"Scalar {name!r}: {_brief(value)} is beyond float64 (about 1.8e308); give "
                               "float('inf') if that is meant") from None
        if v != v:  # every NaN is the one NaN: the text format prints them all as `nan`
            v = _NAN
        self.value = v
        return self._set_common((), _check_shape(shape, lambda: f"Scalar {name!r}"), DEFAULT_FLOAT, name)

    def _payload_bytes(self):
        return struct.pack("<d", self.value) + _pack_ints(self.shape)

    def payload_text(self):
        return format_scalar(self.value)

    @classmethod
    def parse_payload(cls, text):
        """The printed value: ``1``, ``-10000``, ``0.00001``, ``nan``, ``inf``."""
        return convert_payload(cls, text, float, "its value", "a number",
                               "a number like 1, -10000, 0.00001, nan or inf")

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        return cls(payload, _printed_shape(cls, shape), name=name)

    def expanded(self, children, gained, size_map, replacements=None):
        """A leaf: its symbolic sizes resized by ``size_map``."""
        from .module import map_sizes

        shape = map_sizes(self.shape, size_map)
        return self if shape == self.shape else Scalar(self.value, shape, name=self.name)

    def _rebuild(self, children, name):
        _no_children(self, children)
        return Scalar(self.value, self.shape, name=name)


class Symbol(Circuit):
    """A free input of given shape and dtype, bound at evaluation (tokens, a dataset...).

    Symbols with equal name, shape, dtype and uuid are the same Symbol; give a ``uuid`` to make
    two same-named inputs distinct.

    >>> Symbol((300,), name='tokens', dtype='int64').line()
    "'tokens' [300] Symbol int64"
    """

    __slots__ = ("uuid",)
    type_name = "Symbol"
    prints_shape = True
    child_count = (0, 0)

    uuid: "uuid_module.UUID | None"

    def _setup(self, shape, name=None, dtype=DEFAULT_FLOAT, uuid=None):
        if uuid is not None:
            uuid = as_uuid(uuid, lambda: f"Symbol {name!r}")
        self.uuid = uuid
        return self._set_common((), _check_shape(shape, lambda: f"Symbol {name!r}"), normalize_dtype(dtype), name)

    @classmethod
    def new(cls, shape, name=None, dtype=DEFAULT_FLOAT) -> "Symbol":
        """A Symbol with a fresh random uuid, distinct from every other."""
        return cls(shape, name=name, dtype=dtype, uuid=uuid_module.uuid4())

    def _payload_bytes(self):
        # b"u"/b"-": a uuid's 16 bytes must not read as two shape entries of a Symbol without one
        return self.dtype.encode() + (b"|u" + self.uuid.bytes if self.uuid else b"|-") + _pack_ints(self.shape)

    def payload_text(self):
        parts = []
        if self.dtype != DEFAULT_FLOAT:
            parts.append(self.dtype)
        if self.uuid is not None:
            parts.append(str(self.uuid))
        return " ".join(parts)

    @classmethod
    def parse_payload(cls, text):
        """``[dtype] [uuid]``, either absent: ``(dtype or None, UUID or None)``."""
        dtype, uid = None, None
        if text:
            for word in text.split():
                if word in DTYPES and dtype is None and uid is None:
                    dtype = word
                    continue
                if word == "rand" and uid is None:  # rust_circuit: a fresh random uuid (from_payload)
                    uid = word
                    continue
                try:
                    if uid is not None:
                        raise ValueError(word)
                    uid = uuid_module.UUID(word)
                except ValueError:
                    raise ParseError(f"cannot read {word!r} in a Symbol payload", column=1,
                                     expected=f"an optional dtype ({', '.join(DTYPES)}) then an optional uuid") from None
        return dtype, uid

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        """Without a printed dtype, the context's: a Symbol that indexes a gather is ``int64``
        (rust_circuit prints no dtypes: its loss module's label Symbol is one), any other float32."""
        dtype, uid = payload
        if uid == "rand":
            uid = uuid_module.uuid4()
        return cls(_printed_shape(cls, shape), name=name, dtype=dtype or (context or _NO_CONTEXT).default_dtype, uuid=uid)

    def expanded(self, children, gained, size_map, replacements=None):
        """A leaf: the Symbol itself stays (an enclosing module may bind it by identity); the sizes
        it takes here are stated above it by a ``SetSymbolicShape``, as rust_circuit states them
        where sizes meet."""
        from .module import map_sizes
        from .symbolic_shape import SetSymbolicShape

        shape = map_sizes(self.shape, size_map)
        return self if shape == self.shape else SetSymbolicShape(self, shape)

    def _rebuild(self, children, name):
        _no_children(self, children)
        return Symbol(self.shape, name=name, dtype=self.dtype, uuid=self.uuid)
