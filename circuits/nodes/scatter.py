"""Scatter: a node written into zeros at slices (rust_circuit's ``Scatter``)."""

from __future__ import annotations

from ..errors import CircuitError
from ..hashing import pack_ints as _pack_ints
from ..shapes import INT64_MAX
from .base import Circuit, check_children, shape_error
from .expansion import fixed_entries_follow
from .index import _entry_bytes, index_text, read_index
from .module import map_sizes


class Scatter(Circuit):
    """A tensor of ``shape``, zero everywhere but at ``index`` (one slice per axis, padded with
    ``:``), where it holds the child: ``out[index] = child``.

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> s = Scatter(Array(np.ones((2,), np.float32)), (slice(1, 3),), (4,))
    >>> s.line(), evaluate(s).tolist()
    ('[4] Scatter [1:3]', [0.0, 1.0, 1.0, 0.0])
    """

    __slots__ = ("index",)
    rebuilds_by_shape = True
    type_name = "Scatter"
    prints_shape = True
    child_count = (1, 1)

    index: tuple

    def _setup(self, child, index, shape, name=None):
        (child,) = check_children("Scatter", name, (child,))
        if not isinstance(index, tuple):
            index = tuple(index) if isinstance(index, list) else (index,)
        try:
            shape = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            raise CircuitError(f"Scatter: shape must be a sequence of ints, got {shape!r}") from None
        text = index_text(index) if all(type(e) is slice for e in index) else repr(index)

        def fail(message):
            return shape_error("Scatter", name, text, (child,), message, shape=shape)

        bad = [n for n in shape if not 0 <= n <= INT64_MAX]
        if bad:
            raise fail(f"shape {list(shape)} has size {bad[0]}: sizes are 0 to 2**63 - 1")

        if len(index) > len(shape):
            raise fail(f"{len(index)} index entries for an output of rank {len(shape)}")
        index = index + (slice(None),) * (len(shape) - len(index))
        normal = []
        for axis, (e, n) in enumerate(zip(index, shape)):
            if type(e) is not slice or e.step not in (None, 1):
                raise fail(f"entry {axis} must be a slice with step 1 (Scatter writes a block), got {e!r}")
            start, stop, _ = e.indices(n)
            stop = max(stop, start)
            normal.append(slice(None) if (start, stop) == (0, n) else slice(start, stop))
        self.index = tuple(normal)
        block = tuple(len(range(*e.indices(n))) for e, n in zip(self.index, shape))
        if block != child.shape:
            raise fail(f"the slices select a block of shape {list(block)} but the child has shape {list(child.shape)}")
        return self._set_common((child,), shape, child.dtype, name)

    def starts(self) -> tuple:
        """The first written position on each axis."""
        return tuple(e.indices(n)[0] for e, n in zip(self.index, self.shape))

    @classmethod
    def parse_payload(cls, text):
        from ..errors import ParseError

        if text is None:
            raise ParseError("Scatter needs its index", expected="slices like [0:2,:]")
        return read_index(text)

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        from ..errors import ParseError

        if shape is None:
            raise ParseError("a Scatter line needs its shape", expected="a shape like [4,3] before Scatter")
        return cls(children[0], payload, shape, name=name)

    def _payload_bytes(self):
        return _pack_ints(self.shape) + b"".join(map(_entry_bytes, self.index))

    def payload_text(self):
        index = self.index
        while index and index[-1] == slice(None):  # trailing ':' as Index prints it: implied
            index = index[:-1]
        return index_text(index)

    def expanded(self, children, gained, size_map, replacements=None):
        """``:`` over the new batch axes; a fixed slice of an axis that changed size is refused."""
        (kid,), (nb,) = children, gained
        fixed_entries_follow(self, self.index, self.children[0].shape, kid.shape[nb:], "writes")
        shape = kid.shape[:nb] + tuple(
            a if e == slice(None) else s
            for e, s, a in zip(self.index, map_sizes(self.shape, size_map), kid.shape[nb:]))
        return Scatter(kid, (slice(None),) * nb + self.index, shape, name=self.name)

    def _rebuild(self, children, name):
        (child,) = children
        return Scatter(child, self.index, self.shape, name=name)
