"""Index: ints, slices (kept exactly as written) and 1-d int arrays, applied axis by axis."""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

import numpy as np

from ..errors import CircuitError, ParseError
from ..hashing import pack_ints as _pack_ints
from ..shapes import INT64_MAX, INT64_MIN, decimal_int
from .base import Circuit, check_children, shape_error
from .expansion import fixed_entries_follow


def _slice_text(s: slice) -> str:
    def part(v):
        return "" if v is None else str(v)

    text = f"{part(s.start)}:{part(s.stop)}"
    if s.step is not None:
        text += f":{s.step}"
    return text


def index_entry_text(entry) -> str:
    if isinstance(entry, slice):
        return _slice_text(entry)
    if isinstance(entry, np.ndarray):
        return "[" + ",".join(str(int(v)) for v in entry) + "]"
    return str(entry)


def index_text(index) -> str:
    """``(0, slice(None), slice(None))`` -> ``[0,:,:]``."""
    return "[" + ",".join(index_entry_text(e) for e in index) + "]"


class TensorRef(NamedTuple):
    """rust_circuit's index tensor literal ``t<hash prefix> [n]`` (how it prints an Index by a
    tensor): the 1-d int tensor of length ``n`` whose hash starts with ``prefix``, looked up in
    the parser's store when the Index is built."""

    prefix: str
    length: int


_TENSOR_REF = re.compile(r"t([0-9a-fA-F]+)\s*\[\s*([0-9]+)\s*\]")


def read_index(text: str) -> tuple:
    """An Index payload as printed -> the index, slices as written (ParseError otherwise, its
    column counted within ``text``).  rust_circuit's index tensors ``t<hash> [n]`` read as
    ``TensorRef``s (``Index.from_payload`` looks them up in the store).

    >>> read_index("[[1,3],:-2,::2]")
    (array([1, 3]), slice(None, -2, None), slice(None, None, 2))
    >>> read_index("[t292d9fdb22 [6],0]")
    (TensorRef(prefix='292d9fdb22', length=6), 0)
    """
    def bad(what, offset=0, expected="an index like [0,:,:], [1:-1], [::2] or [[1,3,5],:]"):
        return ParseError(f"cannot read the index {text}: {what}", column=offset + 1, expected=expected)

    if text is None:
        raise ParseError("Index needs its index", expected="an index like [0,:,:]")
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        raise bad("it must be in [ ]")
    inner = text[1:-1]
    entries = []
    pos = 0
    if inner.strip():
        while True:
            if inner[pos:pos + 1] == "[":
                close = inner.find("]", pos)
                if close < 0:
                    raise bad("an int list's '[' is never closed", pos + 1)
                body = inner[pos + 1:close].strip()
                try:
                    values = [decimal_int(v) for v in body.split(",")] if body else []
                except ValueError:
                    raise bad(f"[{body}] is not a list of ints", pos + 1) from None
                if any(not -(1 << 63) <= v < 1 << 63 for v in values):
                    raise bad(f"an index in [{body[:60]}{'...' if len(body) > 60 else ''}] is beyond a 64-bit int; "
                              "an axis is never that long", pos + 1)
                entry = np.array(values, dtype=np.int64)
                entry.flags.writeable = False  # (shared by every node the parser builds from it)
                entries.append(entry)
                pos = close + 1
                if inner[pos:].strip()[:1] not in ("", ","):
                    raise bad("expected ',' after an int list", pos + 1)
                pos = inner.find(",", pos)
            elif inner[pos:].lstrip(" ")[:1] == "t":
                m = _TENSOR_REF.match(inner, len(inner) - len(inner[pos:].lstrip(" ")))
                if m is None:
                    raise bad(f"{inner[pos:].split(',')[0].strip()!r} is not an index tensor", pos + 1,
                              "rust's index tensor t<hash> [n], like t292d9fdb22 [6]")
                entries.append(TensorRef(m.group(1).lower(), int(m.group(2))))
                pos = m.end()
                if inner[pos:].strip()[:1] not in ("", ","):
                    raise bad("expected ',' after an index tensor", pos + 1)
                pos = inner.find(",", pos)
            else:
                comma = inner.find(",", pos)
                part = inner[pos:] if comma < 0 else inner[pos:comma]
                entries.append(_read_entry(part, bad, pos + 1))
                pos = comma
            if pos < 0:
                break
            pos += 1
    return tuple(entries)


def _read_entry(part, bad, offset):
    if ":" not in part:
        try:
            return decimal_int(part)
        except ValueError:
            raise bad(f"{part.strip()!r} is not an int or a slice", offset) from None
    bounds = part.split(":")
    if len(bounds) > 3:
        raise bad(f"{part.strip()!r} has more than two ':'", offset)
    try:
        values = [None if not b.strip() else decimal_int(b) for b in bounds]
    except ValueError:
        raise bad(f"{part.strip()!r} is not a slice of ints", offset) from None
    if len(values) == 3 and values[2] == 0:
        raise bad("a slice step cannot be 0", offset)
    return slice(*values)


def _plain_slice(e) -> bool:
    """A slice already in normal form (int or None bounds, nonzero step)."""
    if type(e) is not slice:
        return False
    start, stop, step = e.start, e.stop, e.step
    return ((start is None or (type(start) is int and INT64_MIN <= start <= INT64_MAX))
            and (stop is None or (type(stop) is int and INT64_MIN <= stop <= INT64_MAX))
            and (step is None or (type(step) is int and step != 0 and INT64_MIN <= step <= INT64_MAX)))


def _normalize_entry(entry, what):
    if type(entry) is int or _plain_slice(entry):
        return entry  # already normal (slices are immutable)
    if isinstance(entry, slice):
        for v in (entry.start, entry.stop, entry.step):
            if v is not None and not isinstance(v, (int, np.integer)):
                raise CircuitError(f"{what}: slice bounds must be ints or None, got {entry!r}")
        if entry.step == 0:
            raise CircuitError(f"{what}: slice step cannot be 0")
        conv = lambda v: None if v is None else int(v)  # noqa: E731
        bounds = (conv(entry.start), conv(entry.stop), conv(entry.step))
        for v in bounds:
            if v is not None and not INT64_MIN <= v <= INT64_MAX:
                raise CircuitError(f"{what}: slice bound {v} is beyond a 64-bit int; an axis has at "
                                   "most 2**63 - 1 entries, so a bound that size selects the same")
        return slice(*bounds)
    if isinstance(entry, (bool, np.bool_)):
        raise CircuitError(f"{what}: a bool is not an index; use an int, a slice or an int array")
    if isinstance(entry, (int, np.integer)):
        return int(entry)
    if isinstance(entry, Circuit):
        raise CircuitError(
            f"{what}: an index entry cannot be a circuit node; to gather by computed ints use "
            "GeneralFunction('gen_index_at_0', x, idx)"
        )
    arr = np.asarray(entry)
    if arr.dtype.kind == "f":
        raise CircuitError(f"{what}: a float array is not an index; give ints (dtype {arr.dtype})")
    if arr.dtype.kind not in "iu" and arr.size:
        raise CircuitError(f"{what}: index entry {entry!r} is not an int, slice or int array")
    if arr.ndim != 1:
        raise CircuitError(f"{what}: array index entries must be 1-d, got shape {list(arr.shape)}")
    arr = arr.astype(np.int64)
    arr.flags.writeable = False
    return arr


def _tensor(ref: TensorRef, context):
    """The int tensor an index tensor literal names, from the parser's store."""
    store = getattr(context, "store", None)
    full = None
    if store is not None:
        try:
            full = store.find(ref.prefix)
        except CircuitError as e:
            raise ParseError(str(e), column=1, expected="a longer hash prefix, unique in the store") from None
    if full is None:
        raise ParseError(
            f"the index tensor t{ref.prefix} [{ref.length}] is not in the store"
            + ("" if store is not None else " (no store= was given)"), column=1,
            expected=f"parse(..., store=) with the tensor t{ref.prefix}, or its {ref.length} ints written "
                     "inline: [[i0,i1,...],...]")
    value = np.asarray(store.get(full))
    if value.shape != (ref.length,) or (value.dtype.kind not in "iu" and value.size):
        raise ParseError(
            f"the tensor t{ref.prefix} is {value.dtype} of shape {list(value.shape)}, not {ref.length} ints",
            column=1, expected=f"a 1-d int tensor of length {ref.length}")
    return value


_pack_slice = struct.Struct("<3q").pack


def _entry_bytes(e) -> bytes:
    t = type(e)
    if t is slice:
        start, stop, step = e.start, e.stop, e.step
        return (b"s" + bytes((start is None, stop is None, step is None))
                + _pack_slice(start or 0, stop or 0, step or 0))
    if t is int:
        return b"i" + _pack_ints((e,))
    return b"a" + _pack_ints((len(e),)) + e.tobytes()


class Index(Circuit):
    """Index a child axis by axis (outer style): an int drops its axis, a slice keeps it as
    written, a 1-d int array selects along it.  Shorter indices are padded with ``:``.

    >>> import numpy as np
    >>> from circuits import Array
    >>> w = Array(np.zeros((8, 32, 256), np.float32), name='a0.w.q')
    >>> Index(w, (0, slice(None), slice(None)), name='a0.w.q.head0').line()
    "'a0.w.q.head0' [32,256] Index [0,:,:]"
    """

    __slots__ = ("index",)
    rebuilds_by_shape = True
    type_name = "Index"
    prints_shape = True
    child_count = (1, 1)
    passes_index = True

    index: tuple

    def _setup(self, child, index, name=None):
        (child,) = check_children("Index", name, (child,))
        if not isinstance(index, tuple):
            index = tuple(index) if isinstance(index, list) else (index,)
        for e in index:
            if type(e) is not int and not _plain_slice(e):
                # Not in normal form (or invalid): rebuild, with the node named in any error.
                what = f"Index {name!r}" if name else "Index"
                index = tuple([_normalize_entry(e, what) for e in index])
                break
        self.index = index

        def fail(message):
            # The payload is only written out for an error message.
            return shape_error("Index", name, index_text(index), (child,), message)

        child_shape = child.shape
        if len(index) > len(child_shape):
            raise fail(f"{len(index)} index entries for a child of rank {len(child_shape)}")
        shape = []
        for axis, (e, n) in enumerate(zip(index, child_shape)):
            t = type(e)
            if t is slice:
                shape.append(len(range(*e.indices(n))))
            elif t is int:
                if not -n <= e < n:
                    raise fail(f"index {e} on axis {axis} is out of range for size {n}")
            else:
                if e.size and (e.min() < -n or e.max() >= n):
                    bad = e[(e < -n) | (e >= n)][0]
                    raise fail(f"index {int(bad)} on axis {axis} is out of range for size {n}")
                shape.append(len(e))
        shape.extend(child_shape[len(index):])
        return self._set_common((child,), tuple(shape), child.dtype, name)

    def full_index(self) -> tuple:
        """The index padded with ``slice(None)`` to the child's rank."""
        return self.index + (slice(None),) * (len(self.children[0].shape) - len(self.index))

    parse_payload = staticmethod(read_index)

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        if any(type(e) is TensorRef for e in payload):
            payload = tuple(_tensor(e, context) if type(e) is TensorRef else e for e in payload)
        return cls(children[0], payload, name=name)

    def _payload_bytes(self):
        return b"".join(map(_entry_bytes, self.index))

    def payload_text(self):
        return index_text(self.index)

    def expanded(self, children, gained, size_map, replacements=None):
        """``:`` over the new batch axes; a fixed entry of an axis that changed size is refused."""
        (kid,), (nb,) = children, gained
        full = self.full_index()
        fixed_entries_follow(self, full, self.children[0].shape, kid.shape[nb:], "indexes")
        return Index(kid, (slice(None),) * nb + full, name=self.name)

    def _rebuild(self, children, name):
        (child,) = children
        return Index(child, self.index, name=name)
