"""Shape helpers shared by nodes, functions and the backend: broadcasting, printing, int tuples.

A leaf module: it imports nothing from the rest of the package.

>>> broadcast_shapes([(3, 1), (4,)]), shape_text((300, 256)), broadcast_shapes([(2,), (3,)]) is None
((3, 4), '[300,256]', True)
"""

from __future__ import annotations


def broadcast_shapes(shapes):
    """numpy's right-aligned broadcast of several shapes, or None if they do not broadcast."""
    if shapes:
        first = shapes[0]
        for s in shapes:
            if s != first:
                break
        else:
            return first if type(first) is tuple else tuple(first)
    rank = 0
    for s in shapes:
        if len(s) > rank:
            rank = len(s)
    out = [1] * rank
    for s in shapes:
        for i, n in enumerate(s, rank - len(s)):
            if n == 1:
                continue
            if out[i] == 1:
                out[i] = n
            elif out[i] != n:
                return None
    return tuple(out)


def shape_text(shape) -> str:
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


def int_tuple(values) -> tuple:
    """``values`` as a tuple of ints (the same object when it already is one)."""
    if type(values) is tuple:
        for v in values:
            if type(v) is not int:
                break
        else:
            return values
    return tuple(int(v) for v in values)
