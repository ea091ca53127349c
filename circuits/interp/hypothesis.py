"""Causal-scrubbing hypotheses: a tree of claims mapped onto a circuit's paths.

A ``Claim`` names a *site* (a matcher: a node name, ``Glob``, ``Name('a.k').below('b1.a.head2')``,
...), the input *feature* that is all that matters along its paths, and its child claims.  The
root claim's site is the circuit's output.  A child claim owns the paths that run from its
parent's site down to its own site (and on to the inputs), except paths through one of its
``avoid`` nodes; a path belongs to the first child site it meets.  Paths below a claim that no
child claims are *unclaimed*: their inputs are resampled at random (``other='random'``, the
default) or kept on the claim's own datum (``other='exact'``).

A ``Feature`` is a function of the dataset giving one value (or a row of values) per datum; a
claim's datum is drawn among the data that agree with its parent's datum on it.  ``EXACT`` (the
whole datum: the child sees its parent's datum) is the default; ``RANDOM`` (no information: any
datum) makes a claim say that its paths do not matter at all.

>>> from circuits.interp import Claim, Feature
>>> hyp = Claim('out', children=[Claim('h', feature=Feature.tokens([0, 1]), avoid='skip')])
>>> print(hyp)
Claim 'out' [exact] other=random
└ Claim 'h' [tokens[0, 1]] avoid skip
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import CircuitError
from ..select import Matcher, as_matcher

__all__ = ["Claim", "Feature", "EXACT", "RANDOM"]

OTHER_CHOICES = ("random", "exact")


class Feature:
    """A function of the dataset that a claim's datum must share with its parent's datum.

    ``fn(data)`` gets the dataset (``{input name: array [rows, *shape]}``) and returns an array
    with one entry (or one row of entries) per datum; two data agree on the feature when their
    entries are equal.  Build one from a function, or with ``Feature.tokens(positions)`` (the
    input's values at these positions), ``Feature.equality()`` (which positions hold equal
    values), ``EXACT`` or ``RANDOM``.

    >>> import numpy as np
    >>> data = {'toks': np.array([[1, 2, 1], [3, 4, 3], [5, 5, 6]])}
    >>> Feature.equality().classes(data, 'c').tolist()
    [0, 0, 1]
    >>> Feature.tokens([1]).classes(data, 'c').tolist()
    [0, 1, 2]
    >>> Feature.tokens([0]).classes({'toks': np.array([[4], [2], [4]])}, 'c').tolist()
    [0, 1, 0]
    >>> Feature(lambda d: d['toks'][:, 0] % 2, name='first is odd').classes(data, 'c').tolist()
    [0, 0, 0]
    """

    def __init__(self, fn: Callable[[Mapping[str, np.ndarray]], np.ndarray] | None, name: str,
                 *, kind: str = "function"):
        self.fn = fn
        self.name = name
        self.kind = kind  # 'exact', 'random' or 'function'

    def __repr__(self):
        return self.name

    @classmethod
    def tokens(cls, positions, input: str | None = None) -> "Feature":
        """Data agree when ``input`` (default: the only input) holds equal values at ``positions``
        (an int, a list of ints or a slice)."""
        label = f"{input}" if input else "tokens"
        shown = positions if not isinstance(positions, slice) else _slice_text(positions)
        shown = ", ".join(map(str, shown)) if isinstance(shown, (list, tuple)) else shown

        def fn(data):
            arr = _the_input(data, input)
            return arr[:, _check_positions(positions, arr.shape)]

        return cls(fn, f"{label}[{shown}]")

    @classmethod
    def equality(cls, input: str | None = None) -> "Feature":
        """Data agree when the same pairs of positions of ``input`` hold equal values (the
        token-equality pattern: which tokens repeat where, not which tokens they are)."""

        def fn(data):
            arr = _the_input(data, input)
            flat = arr.reshape(arr.shape[0], -1)
            return (flat[:, :, None] == flat[:, None, :]).reshape(arr.shape[0], -1)

        return cls(fn, "token equality" + (f" of {input}" if input else ""))

    def classes(self, data: Mapping[str, np.ndarray], claim: str) -> np.ndarray:
        """Class ids ``[rows]`` (int): equal ids for data that agree on the feature.  Errors name
        ``claim``."""
        rows = _rows_of(data)
        if self.kind == "exact":
            return np.arange(rows)
        if self.kind == "random":
            return np.zeros(rows, dtype=np.int64)
        try:
            values = np.asarray(self.fn(data))
        except (IndexError, KeyError, ValueError, TypeError) as e:
            if isinstance(e, CircuitError):
                raise CircuitError(f"claim {claim!r}: feature {self.name}: {e}") from None
            raise CircuitError(f"claim {claim!r}: feature {self.name} failed on the inputs "
                               f"({', '.join(f'{k} {list(v.shape)}' for k, v in data.items())}): {e}") from e
        if values.ndim == 0 or values.shape[0] != rows:
            raise CircuitError(
                f"claim {claim!r}: feature {self.name} gave shape {list(values.shape)}; it must give one "
                f"value (or one row of values) per datum: a leading axis of {rows}")
        # class ids by each row's bytes (np.unique over rows sorts whole rows: far slower)
        flat = np.ascontiguousarray(values.reshape(rows, -1))
        ids: dict[bytes, int] = {}
        return np.fromiter((ids.setdefault(r.tobytes(), len(ids)) for r in flat), np.int64, rows)


class _FeatureError(CircuitError, IndexError):
    pass


def _slice_text(s: slice) -> str:
    a = "" if s.start is None else s.start
    b = "" if s.stop is None else s.stop
    return f"{a}:{b}" + ("" if s.step is None else f":{s.step}")


def _rows_of(data: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(data.values())).shape[0])


def _the_input(data: Mapping[str, np.ndarray], name: str | None) -> np.ndarray:
    if name is None:
        if len(data) != 1:
            raise _FeatureError(f"the inputs are {sorted(data)}: name one (input=...)")
        return np.asarray(next(iter(data.values())))
    if name not in data:
        raise _FeatureError(f"no input {name!r}; the inputs are {sorted(data)}")
    return np.asarray(data[name])


def _check_positions(positions, shape):
    length = shape[1] if len(shape) > 1 else 0
    if isinstance(positions, slice):
        if len(range(*positions.indices(length))) == 0:
            raise _FeatureError(f"positions {_slice_text(positions)} select nothing of an input of "
                                f"{length} positions (shape per datum {list(shape[1:])})")
        return positions
    pos = np.atleast_1d(np.asarray(positions))
    if pos.dtype.kind not in "iu" or pos.ndim != 1:
        raise _FeatureError(f"positions must be ints or a slice, got {positions!r}")
    bad = [int(p) for p in pos if not -length <= p < length]
    if bad:
        raise _FeatureError(f"positions {bad} are out of range for an input of {length} positions "
                            f"(shape per datum {list(shape[1:])})")
    return pos


def _show(matcher: Matcher) -> str:
    """A matcher as claims print it: a single exact name bare, anything else described."""
    names = getattr(matcher, "names", None)
    if isinstance(names, frozenset) and len(names) == 1:
        return next(iter(names))
    return matcher.describe()


EXACT = Feature(None, "exact", kind="exact")
RANDOM = Feature(None, "random", kind="random")


class Claim:
    """One node of a causal-scrubbing hypothesis: the paths to ``site`` matter, and only through
    ``feature`` of the input; ``children`` refine the paths below ``site``.

    - ``site``: a matcher (a node name, a node, or a ``circuits.select`` matcher), matched over
      the whole circuit; the claim owns the paths from its parent's site to a matching node.
    - ``feature``: ``EXACT`` (default), ``RANDOM``, a ``Feature`` or a function of the dataset.
    - ``avoid``: matchers; paths through these nodes (before reaching ``site``) are not claimed.
    - ``other``: what the unclaimed paths below ``site`` see: ``'random'`` (resampled, default)
      or ``'exact'`` (this claim's own datum).
    - ``name``: how reports and errors call it (default: the site's description).

    Claims are immutable and print as a tree:

    >>> print(Claim('loss', children=[Claim('head', feature=RANDOM)], other='exact'))
    Claim 'loss' [exact] other=exact
    └ Claim 'head' [random]
    """

    __slots__ = ("site", "feature", "children", "avoid", "other", "name")

    def __init__(self, site, feature=EXACT, children: Sequence["Claim"] = (), *, avoid=(), other: str = "random",
                 name: str | None = None):
        matcher = as_matcher(site)
        if feature is None:
            feature = RANDOM
        elif not isinstance(feature, Feature):
            if not callable(feature):
                raise CircuitError(f"Claim {site!r}: feature must be EXACT, RANDOM, a Feature or a function "
                                   f"of the dataset, got {feature!r}")
            feature = Feature(feature, getattr(feature, "__name__", "feature"))
        if isinstance(avoid, (str, Matcher)) or not isinstance(avoid, (list, tuple)):
            avoid = (avoid,)
        if other not in OTHER_CHOICES:
            raise CircuitError(f"Claim {site!r}: other={other!r}; use one of {OTHER_CHOICES}")
        children = tuple(children)
        for c in children:
            if not isinstance(c, Claim):
                raise CircuitError(f"Claim {site!r}: children must be Claims, got {c!r}")
        object.__setattr__(self, "site", matcher)
        object.__setattr__(self, "feature", feature)
        object.__setattr__(self, "children", children)
        object.__setattr__(self, "avoid", tuple(as_matcher(a) for a in avoid))
        object.__setattr__(self, "other", other)
        object.__setattr__(self, "name", name if name is not None else _show(matcher))

    def __setattr__(self, key, value):
        raise AttributeError("Claim is immutable: build a new one")

    def line(self) -> str:
        """This claim's line in the printed tree."""
        parts = [f"Claim {self.name!r}", f"[{self.feature.name}]"]
        if self.avoid:
            parts.append("avoid " + ", ".join(_show(a) for a in self.avoid))
        if self.children:
            parts.append(f"other={self.other}")
        return " ".join(parts)

    def walk(self) -> list[tuple["Claim", "Claim | None", int]]:
        """``(claim, parent, depth)`` for every claim of the tree, in depth-first order."""
        out, stack = [], [(self, None, 0)]
        while stack:
            claim, parent, depth = stack.pop()
            out.append((claim, parent, depth))
            stack.extend((c, claim, depth + 1) for c in reversed(claim.children))
        return out

    def __str__(self):
        lines = []
        tree = self.walk()
        # ancestors' "is last child" flags decide the rails drawn on each line
        last_flags: list[bool] = []
        for i, (claim, parent, depth) in enumerate(tree):
            if depth == 0:
                lines.append(claim.line())
                continue
            is_last = parent.children[-1] is claim
            del last_flags[depth - 1:]
            rails = "".join("  " if last else "│ " for last in last_flags)
            lines.append(rails + ("└ " if is_last else "├ ") + claim.line())
            last_flags.append(is_last)
        return "\n".join(lines)

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        import html

        return f"<pre>{html.escape(str(self))}</pre>"
