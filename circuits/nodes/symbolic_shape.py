"""SetSymbolicShape: rust_circuit's identity node that states its child's shape with symbolic
sizes (``0s``), so a module body written for any size can be built from a concrete example."""

from __future__ import annotations

from ..hashing import pack_ints as _pack_ints
from ..shapes import SYMBOLIC_BASE, is_symbolic, shape_text
from .base import Circuit, check_children, no_payload, shape_error
from .module import map_sizes


class SetSymbolicShape(Circuit):
    """Its child, with the shape ``shape``: each size equals the child's, or one of the two is
    symbolic (``circuits.shapes.symbolic_size``): a size stated, or a symbolic one fixed; the
    value is the child's.

    >>> from circuits import Symbol
    >>> from circuits.shapes import symbolic_size
    >>> SetSymbolicShape(Symbol((3, 4), name='x'), (symbolic_size(0), 4)).line()
    '[0s,4] SetSymbolicShape'
    """

    __slots__ = ()
    type_name = "SetSymbolicShape"
    prints_shape = True
    child_count = (1, 1)

    def _setup(self, child, shape, name=None):
        (child,) = check_children("SetSymbolicShape", name, (child,))
        shape = tuple(int(s) for s in shape)
        if len(shape) != len(child.shape):
            raise shape_error("SetSymbolicShape", name, "", (child,),
                              f"shape {shape_text(shape)} has rank {len(shape)} but the child has {shape_text(child.shape)}",
                              shape=shape)
        for axis, (s, n) in enumerate(zip(shape, child.shape)):
            if s != n and not (s >= SYMBOLIC_BASE and is_symbolic(s)) and not (n >= SYMBOLIC_BASE and is_symbolic(n)):
                raise shape_error("SetSymbolicShape", name, "", (child,),
                                  f"axis {axis}: size {s} differs from the child's {n} and neither is symbolic",
                                  shape=shape)
        return self._set_common((child,), shape, child.dtype, name)

    @classmethod
    def parse_payload(cls, text):
        return no_payload(cls, text, "'[0s,4] SetSymbolicShape'")

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        if shape is None:
            from ..errors import ParseError

            raise ParseError("a SetSymbolicShape line needs its shape", expected="a shape like [0s,4]")
        return cls(children[0], shape, name=name)

    def _payload_bytes(self):
        return _pack_ints(self.shape)

    def expanded(self, children, gained, size_map, replacements=None):
        """The stated sizes mapped through ``size_map`` behind the gained batch axes; dropped
        when it no longer states anything (rust drops it too)."""
        (kid,), (nb,) = children, gained
        shape = kid.shape[:nb] + map_sizes(self.shape, size_map)
        if shape == kid.shape and self.name is None:
            return kid
        return SetSymbolicShape(kid, shape, name=self.name)

    def _rebuild(self, children, name):
        (child,) = children
        return SetSymbolicShape(child, self.shape, name=name)
