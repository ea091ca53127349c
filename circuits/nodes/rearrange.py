"""Rearrange: split, merge, permute and repeat axes with an einops-style spec."""

from __future__ import annotations

import re

from ..errors import CircuitError, ParseError
from ..shapes import INT64_MAX, read_size, size_text
from .base import Circuit, check_children, shape_error
from .caching import small_cache
from .expansion import fresh_names

_TOKEN = re.compile(r"\s*(\(|\)|[A-Za-z_][A-Za-z0-9_]*|1|->)")


def _parse_side(text: str, spec: str):
    groups, current, pos = [], None, 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise CircuitError(
                f"rearrange spec {spec!r}: cannot read {text[pos:].strip()!r} "
                "(axis names, '(' ')' groups and '1' for a unit axis)"
            )
        tok = m.group(1)
        pos = m.end()
        if tok == "(":
            if current is not None:
                raise CircuitError(f"rearrange spec {spec!r}: nested parentheses")
            current = []
        elif tok == ")":
            if current is None:
                raise CircuitError(f"rearrange spec {spec!r}: unbalanced ')'")
            groups.append(tuple(current))
            current = None
        elif tok == "->":
            raise CircuitError(f"rearrange spec {spec!r}: more than one '->'")
        else:
            entry = () if tok == "1" else (tok,)
            if current is None:
                groups.append(entry)
            else:
                current.extend(entry)
        while pos < len(text) and text[pos] == " ":
            pos += 1
    if current is not None:
        raise CircuitError(f"rearrange spec {spec!r}: unbalanced '('")
    return tuple(groups)


@small_cache(maxsize=4096)
def parse_rearrange_spec(spec: str):
    """``'a (b c) -> b a c'`` -> ((('a',), ('b', 'c')), (('b',), ('a',), ('c',)))."""
    if spec.count("->") != 1:
        raise CircuitError(f"rearrange spec {spec!r} needs exactly one '->' (like 'a (b c) -> b a c')")
    lhs, rhs = spec.split("->")
    ins, outs = _parse_side(lhs, spec), _parse_side(rhs, spec)
    for side, groups in (("left", ins), ("right", outs)):
        names = [n for g in groups for n in g]
        if len(set(names)) != len(names):
            raise CircuitError(f"rearrange spec {spec!r}: an axis name is repeated on the {side}")
    return ins, outs


_RUST_TOKEN = re.compile(r"\(|\)|->|[^\s()]+")
_RUST_AXIS = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::([0-9][0-9*s]*))?$")
_RUST_SIZE = re.compile(r"[0-9][0-9*s]*$")  # 4, and symbolic sizes: 1s, 2*1s


def from_rust_spec(text: str):
    """rust_circuit's Rearrange spec in ours: ``'(a:2 b) -> a:2 b'`` -> ``('(a b) -> a b',
    {'a': 2})``; ``()`` is a unit axis (our ``1``) and a bare size is an axis of that size with
    no name (``'() a -> 4 (a 2)'``: each such axis gets a name ``_0``, ``_1``... of its own).

    >>> from_rust_spec('() a -> 4 (a 2)')
    ('1 a -> _0 (a _1)', {'_0': 4, '_1': 2})
    """
    sizes: dict = {}
    out = []
    fresh = 0
    for tok in _RUST_TOKEN.findall(text):
        if tok in ("(", ")", "->"):
            if tok == ")" and out and out[-1] == "(":
                out[-1] = "1"
            else:
                out.append(tok)
            continue
        if _RUST_SIZE.match(tok):
            if tok == "1":
                out.append("1")
                continue
            while f"_{fresh}" in text:
                fresh += 1
            name, size = f"_{fresh}", _rust_size(tok, text)
            fresh += 1
        else:
            m = _RUST_AXIS.match(tok)
            if m is None:
                raise CircuitError(f"rearrange spec {text!r}: cannot read {tok!r} (an axis name, "
                                   "name:size, a size, '(' ')' or '->')")
            name, size = m.group(1), m.group(2)
            if size is None:
                out.append(name)
                continue
            size = _rust_size(size, text)
            if sizes.get(name, size) != size:
                raise CircuitError(f"rearrange spec {text!r}: axis {name} has sizes {sizes[name]} and {size}")
        sizes[name] = size
        out.append(name)
    spec = " ".join(out).replace("( ", "(").replace(" )", ")")
    return spec, sizes


def _rust_size(tok: str, text: str) -> int:
    """A size inside a rust spec: ``4``, or a symbolic size (``1s``, ``2*1s``)."""
    if tok.isdigit():
        return int(tok)
    try:
        return read_size(tok)
    except ValueError:
        raise CircuitError(f"rearrange spec {text!r}: cannot read the size {tok!r} (like 4, 1s or 2*1s)") from None


def is_rust_spec(text: str) -> bool:
    """Whether a spec is in rust_circuit's form (sizes inside it, ``()`` units) rather than ours."""
    return ":" in text or "()" in text or re.search(r"(?<![A-Za-z0-9_=])(?!1\b)[0-9]+\b", text) is not None


def to_rust_spec(ins, outs, sizes) -> str:
    """Our spec as rust_circuit writes it: every given size inside the spec (``a:2``), unit axes
    ``()`` (rust's parser reads this back to the same rearrangement).

    >>> to_rust_spec((('h', 'd'), ('s',)), (('h',), ('s',), ('d',), ()), {'h': 2})
    '(h:2 d) s -> h:2 s d ()'
    """
    def side(groups):
        words = []
        for g in groups:
            names = [f"{a}:{size_text(sizes[a])}" if a in sizes else a for a in g]
            words.append(names[0] if len(g) == 1 else "(" + " ".join(names) + ")")  # () for a unit
        return " ".join(words)

    return f"{side(ins)} -> {side(outs)}".strip()


def _side_text(groups) -> str:
    out = []
    for g in groups:
        if len(g) == 1:
            out.append(g[0])
        elif not g:
            out.append("1")
        else:
            out.append("(" + " ".join(g) + ")")
    return " ".join(out)


def format_rearrange_spec(ins, outs) -> str:
    """The spec as printed: ``'a (b c) -> b a c'``; an empty side leaves no stray space
    (``'->'`` over a scalar, ``'a ->'``), so no printed line ends with a space."""
    lhs, rhs = _side_text(ins), _side_text(outs)
    return f"{lhs} -> {rhs}" if lhs and rhs else (f"{lhs} ->" if lhs else f"-> {rhs}" if rhs else "->")


class _SpecMismatch(Exception):
    """A spec that does not fit the child (message only; the node adds its line)."""


# Group specs already in normal form (tuples of tuples of str), so rebuilding a node skips the
# conversion: a spec found here is its own normal form.
_NORMAL_GROUPS: dict = {}


@small_cache(maxsize=4096)
def _solve(ins, outs, given, child_shape):
    """Every axis size and the output shape of a rearrangement of a child of ``child_shape``
    (cached: circuits repeat the same few rearrangements many times)."""
    known = dict(given)
    for k, v in given:
        if v < 0:
            raise _SpecMismatch(f"size {k}={v} is negative")
    if len(ins) != len(child_shape):
        raise _SpecMismatch(f"the left side has {len(ins)} axes but the child has shape {list(child_shape)}")
    for g, n in zip(ins, child_shape):
        unknown = [a for a in g if a not in known]
        prod = 1
        for a in g:
            if a in known:
                prod *= known[a]
        if len(unknown) > 1:
            raise _SpecMismatch(
                f"group ({' '.join(g)}) has several unknown sizes; give all but one, e.g. {unknown[0]}=..."
            )
        if unknown:
            if prod == 0 or n % prod:
                raise _SpecMismatch(f"axis of size {n} cannot split into ({' '.join(g)}) with {dict(known)}")
            known[unknown[0]] = n // prod
        elif prod != n:
            raise _SpecMismatch(f"group ({' '.join(g) or '1'}) has size {prod} but the axis has size {n}")
    in_names = {a for g in ins for a in g}
    out_names = {a for g in outs for a in g}
    for a in in_names - out_names:
        if known[a] != 1:
            raise _SpecMismatch(f"axis {a} (size {known[a]}) is on the left only; only size-1 axes can be dropped")
    for a in out_names - in_names:
        if a not in known:
            raise _SpecMismatch(f"new axis {a} needs its size, e.g. {a}=4")
    unused = set(dict(given)) - in_names - out_names
    if unused:
        raise _SpecMismatch(f"size given for {', '.join(sorted(unused))}, which the spec does not use")
    shape = []
    for g in outs:
        prod = 1
        for a in g:
            prod *= known[a]
        if prod > INT64_MAX:
            raise _SpecMismatch(f"output axis {g} would have size {prod}, over 2**63 - 1")
        shape.append(prod)
    return tuple(sorted(known.items())), tuple(shape)


class Rearrange(Circuit):
    """einops-style axis rearrangement: ``Rearrange(x, '(h d) s -> h s d', h=8)``.

    Axes are split and merged with parentheses, permuted by order, and an axis only on the right
    repeats the input (its size must be given); an axis only on the left must have size 1.

    >>> import numpy as np
    >>> from circuits import Array
    >>> x = Array(np.zeros((6, 5), np.float32))
    >>> r = Rearrange(x, '(h d) s -> h s d', h=2)
    >>> r.shape, r.payload_text()
    ((2, 5, 3), '(h d) s -> h s d h=2')
    """

    __slots__ = ("in_groups", "out_groups", "given_sizes", "sizes")
    rebuilds_by_shape = True
    type_name = "Rearrange"
    child_count = (1, 1)
    passes_index = True

    def _setup(self, child, spec, name=None, **sizes):
        (child,) = check_children("Rearrange", name, (child,))
        if isinstance(spec, tuple):
            try:
                ins, outs = _NORMAL_GROUPS[spec]
            except (KeyError, TypeError):  # new, or holding lists (unhashable)
                ins, outs = (tuple(tuple(x) for x in g) for g in spec)
                if len(_NORMAL_GROUPS) < 4096:
                    _NORMAL_GROUPS[(ins, outs)] = (ins, outs)
        else:
            ins, outs = parse_rearrange_spec(spec)
        given = tuple(sorted((str(k), int(v)) for k, v in sizes.items())) if sizes else ()
        self.in_groups, self.out_groups, self.given_sizes = ins, outs, given
        try:
            self.sizes, shape = _solve(ins, outs, given, child.shape)
        except _SpecMismatch as e:
            raise shape_error(
                "Rearrange", name, self._payload_from(ins, outs, given), (child,), str(e)
            ) from None
        return self._set_common((child,), shape, child.dtype, name)

    @staticmethod
    @small_cache(maxsize=4096)
    def _payload_from(ins, outs, given):
        text = format_rearrange_spec(ins, outs)
        if given:
            text += " " + " ".join(f"{k}={size_text(v)}" for k, v in given)  # 2, or symbolic: 1s
        return text

    @property
    def spec(self) -> str:
        return format_rearrange_spec(self.in_groups, self.out_groups)

    def axis_sizes(self) -> dict:
        return dict(self.sizes)

    def _payload_bytes(self):
        return self.payload_text().encode()

    def payload_text(self):
        return self._payload_from(self.in_groups, self.out_groups, self.given_sizes)

    def expanded(self, children, gained, size_map, replacements=None):
        """New batch axes pass through in front; given sizes are conformed to changed axes as
        rust's expander does (``conform_sizes``)."""
        (kid,), (nb,) = children, gained
        taken = {a for g in self.in_groups + self.out_groups for a in g}
        names = tuple((a,) for a in fresh_names(taken, nb))
        groups = (names + self.in_groups, names + self.out_groups)
        given = dict(self.given_sizes)
        try:
            return Rearrange(kid, groups, name=self.name, **given)
        except CircuitError:
            conformed = conform_sizes(self.in_groups, kid.shape[nb:], given)
            if conformed is None or conformed == given:
                raise
            return Rearrange(kid, groups, name=self.name, **conformed)

    def _rebuild(self, children, name):
        (child,) = children
        return Rearrange(child, (self.in_groups, self.out_groups), name=name, **dict(self.given_sizes))

    @classmethod
    def parse_payload(cls, text):
        """The printed payload ``'(h d) s -> h s d h=2'`` -> ``(groups, {'h': 2})``."""
        expected = "a spec like '(h d) s -> h s d h=2'"
        if text is None:
            raise ParseError("Rearrange needs its spec", expected=expected)
        words = text.split()
        sizes = {}
        while words and "=" in words[-1]:  # trailing sizes (h=2), in our specs and in rust's
            k, _, v = words.pop().partition("=")
            try:
                sizes[k] = read_size(v) if v[-1:] == "s" else int(v)
            except ValueError:
                raise ParseError(f"size {k}={v!r} is not an int", column=1,
                                 expected="sizes like h=2 (or symbolic: h=1s)") from None
        spec = " ".join(words)
        if is_rust_spec(spec):  # '() a -> n0 (a n1) n0=4 n1=2': rust's '()' with sizes after it
            try:
                spec, inside = from_rust_spec(spec)
                for k, v in sizes.items():
                    if inside.get(k, v) != v:
                        raise CircuitError(f"rearrange spec {text!r}: axis {k} has sizes {inside[k]} and {v}")
                return parse_rearrange_spec(spec), {**inside, **sizes}
            except CircuitError as e:
                raise ParseError(str(e), column=1, expected="a spec like '(a:2 b) -> b a:2'") from None
        try:
            return parse_rearrange_spec(spec), sizes
        except CircuitError as e:
            raise ParseError(str(e), column=1, expected=expected) from None

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        groups, sizes = payload
        return cls(children[0], groups, name=name, **sizes)


def conform_sizes(in_groups, shape, given):
    """The sizes a Rearrange's spec gives, conformed to a new input shape as rust_circuit's
    expander does: in each input group, the given sizes whose product still divides the new axis
    are kept (in order) and the others left to be inferred (so ``(a:1s b:3)`` over ``3*0s`` makes
    ``a`` 0s).  None when the ranks differ or a group would have two sizes to infer."""
    if len(in_groups) != len(shape):
        return None
    out = dict(given)
    for g, size in zip(in_groups, shape):
        kept, unknown = 1, 0
        for a in g:
            v = out.get(a)
            if v is not None and size % (kept * v) == 0:
                kept *= v
            else:
                out.pop(a, None)
                unknown += 1
        if unknown > 1:
            return None
    return out
