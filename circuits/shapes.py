"""Shape helpers shared by nodes, functions and the backend: broadcasting, printing, int tuples.

Sizes, slice bounds and axis ids are signed 64-bit ints (``INT64_MIN``..``INT64_MAX``).  The
allocation budget (``max_alloc_bytes``: the environment variable ``CIRCUITS_MAX_ALLOC_BYTES``, else
4 GiB) bounds any single tensor the library allocates; ``check_allocation`` refuses a larger one
with an error naming what asked for it, before anything is allocated.  ``check_budget`` checks a
byte budget someone gives (the value cache's, the compilation cache's on disk).

A leaf module: it imports only ``errors`` and ``dtypes``.

>>> broadcast_shapes([(3, 1), (4,)]), shape_text((300, 256)), broadcast_shapes([(2,), (3,)]) is None
((3, 4), '[300,256]', True)
"""

from __future__ import annotations

import functools
import numbers
import os

from .dtypes import ITEMSIZE
from .errors import CircuitError, EvaluationError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_ALLOC_ENV = "CIRCUITS_MAX_ALLOC_BYTES"
DEFAULT_MAX_ALLOC_BYTES = 4 << 30


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
    for s in shape:
        if s >= SYMBOLIC_BASE:
            return "[" + ",".join(map(size_text, shape)) + "]"
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


# ---------------------------------------------------------------------------- symbolic sizes
# rust_circuit's symbolic sizes (``0s``, ``2*1s``: "some size, to be fixed later") are kept as
# plain ints, as rust keeps them, so every shape stays a tuple of ints and every shape rule works
# unchanged: symbolic size i is the i-th prime above ``SYMBOLIC_BASE`` (10_000: 10007 to 12437,
# the very ints rust_circuit's ``symbolic_sizes()`` gives), and a product such as ``2*0s*1s`` is
# the product of its factors.  Four symbolic factors fit in an int64 (rust writes
# ``0s*0s*1s*3s``); five do not, and ``read_size`` refuses them.  As in rust, a concrete size of
# at least 10007 divisible by one of these primes (10007 itself, 20014...) reads as symbolic:
# it prints as ``0s``, ``2*0s`` and parses back to the same int, so nothing is lost, and a Module
# lets an argument fix it as it fixes any symbolic size.
SYMBOLIC_BASE = 10_000
SYMBOLIC_COUNT = 256


def _primes_above(base, count):
    found, n = [], base + 1
    while len(found) < count:
        if n % 2 and all(n % d for d in range(3, int(n ** 0.5) + 1, 2)):
            found.append(n)
        n += 1
    return tuple(found)


SYMBOLIC_SIZES = _primes_above(SYMBOLIC_BASE, SYMBOLIC_COUNT)
_SYMBOLIC_INDEX = {p: i for i, p in enumerate(SYMBOLIC_SIZES)}


def symbolic_size(i: int, factor: int = 1) -> int:
    """The int standing for ``factor * i s`` (rust's ``2*1s`` is ``symbolic_size(1, 2)``).

    >>> size_text(symbolic_size(0)), size_text(symbolic_size(1, 2)), size_text(7)
    ('0s', '2*1s', '7')
    """
    if not 0 <= i < SYMBOLIC_COUNT:
        raise CircuitError(f"symbolic size {i}s is out of range: 0s to {SYMBOLIC_COUNT - 1}s exist")
    return SYMBOLIC_SIZES[i] * factor


@functools.lru_cache(maxsize=4096)
def symbolic_factors(size: int) -> tuple:
    """``(factor, (i, j, ...))``: a size as its integer factor times symbolic sizes ``is``,
    ``js`` (sorted, repeated for powers); ``(size, ())`` for a concrete size."""
    if size < SYMBOLIC_BASE:
        return size, ()
    rest, found = size, []
    for p in SYMBOLIC_SIZES:
        if rest < p:
            break
        while rest % p == 0:
            found.append(_SYMBOLIC_INDEX[p])
            rest //= p
    return rest, tuple(found)


def is_symbolic(size: int) -> bool:
    """Whether a size holds a symbolic factor."""
    return size >= SYMBOLIC_BASE and bool(symbolic_factors(size)[1])


def size_text(size: int) -> str:
    """A size as the text format writes it: ``300``, ``0s``, ``2*1s``."""
    if size < SYMBOLIC_BASE:
        return str(int(size))
    factor, syms = symbolic_factors(size)
    if not syms:
        return str(int(size))
    parts = [f"{i}s" for i in syms]
    return "*".join(([str(factor)] if factor != 1 else []) + parts)


class SizeOverflow(ValueError):
    """A printed size whose product is larger than a size can be (``read_size``)."""


def read_size(text: str) -> int:
    """One printed size, symbolic sizes included: ``'2*1s'`` -> ``symbolic_size(1, 2)``;
    ValueError when it is none.

    >>> read_size('2*1s') == symbolic_size(1, 2), read_size(' 7 ')
    (True, 7)
    """
    total, symbolic = 1, False
    for part in text.split("*"):
        part = part.strip()
        if part.endswith("s"):
            i = decimal_int(part[:-1])
            if not 0 <= i < SYMBOLIC_COUNT:
                raise ValueError(part)
            total *= SYMBOLIC_SIZES[i]
            symbolic = True
        else:
            n = decimal_int(part)
            if n < 0:
                raise ValueError(part)
            total *= n
    if symbolic and total > INT64_MAX:
        raise SizeOverflow(f"{text.strip()} is larger than a size can be (2**63 - 1); at most four "
                         "symbolic factors fit")
    return total


def decimal_int(s: str) -> int:
    """An int as the text format writes one (a size, an index): ASCII decimal, optionally
    negative, surrounding spaces allowed; ValueError otherwise (``int()`` also takes ``'1_000'``,
    ``'+3'`` and non-ASCII digits)."""
    s = s.strip()
    body = s[1:] if s[:1] == "-" else s
    if not body or not body.isascii() or not body.isdigit():
        raise ValueError(s)
    return int(s)


def int_tuple(values) -> tuple:
    """``values`` as a tuple of ints (the same object when it already is one)."""
    if type(values) is tuple:
        for v in values:
            if type(v) is not int:
                break
        else:
            return values
    return tuple(int(v) for v in values)


def max_alloc_bytes() -> int:
    """The allocation budget in bytes (see the module docstring).

    >>> max_alloc_bytes() > 0
    True
    """
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


def check_allocation(shape, dtype: str, what, error=CircuitError, budget=None) -> None:
    """Raise ``error`` naming ``what`` (a string, or a callable making one) when a tensor of
    this shape and dtype would take more than ``budget`` bytes (default ``max_alloc_bytes()``),
    or could not exist at all: numpy and JAX multiply out the non-zero axes of even an empty
    tensor, and refuse one whose product passes 2**63 bytes.

    >>> check_allocation((0, 2**40), 'float32', 'x')  # empty, and its axes multiply within 2**63
    >>> check_allocation((0, 2**62), 'float32', 'x')
    Traceback (most recent call last):
    circuits.errors.CircuitError: x has shape [0,4611686018427387904]: empty, but its other axes ...
    """
    n = extent = ITEMSIZE.get(dtype, 8)
    for s in shape:
        n *= s
        if s:
            extent *= s
    if not n and extent > INT64_MAX:
        if callable(what):
            what = what()
        raise error(
            f"{what} has shape {shape_text(shape)}: empty, but its other axes multiply to "
            f"{_human_bytes(extent)} ({dtype}), more than any array can address (2**63 bytes); "
            "make the tensor smaller"
        )
    limit = max_alloc_bytes() if budget is None else budget
    if n > limit:
        if callable(what):
            what = what()
        raise error(
            f"{what} would allocate {_human_bytes(n)} (shape {shape_text(shape)}, {dtype}), over the "
            f"budget of {_human_bytes(limit)}; raise it with the environment variable "
            f"{MAX_ALLOC_ENV}=<bytes> if this is intended, or make the tensor smaller"
        )


def check_budget(n, what: str) -> int:
    """A byte budget, checked: a non-negative int (``bool`` and absurd values refused).

    >>> check_budget(1 << 20, 'budget')
    1048576
    >>> check_budget(-1, 'budget')
    Traceback (most recent call last):
    circuits.errors.EvaluationError: budget must be at least 0 bytes (0 keeps nothing), got -1
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):  # numpy's ints are Integral
        raise EvaluationError(f"{what} must be an int number of bytes, got {n!r}")
    n = int(n)
    if n < 0:
        raise EvaluationError(f"{what} must be at least 0 bytes (0 keeps nothing), got {n}")
    if n > 1 << 50:
        raise EvaluationError(f"{what} of {n} bytes is absurd (over a pebibyte); give at most {1 << 50}")
    return n


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
