"""Rules as data, rule sets that compose, and the trace of what fired.

A **rule** is a named pure function ``node -> node | None`` (``None``: does not apply) with a
docstring and a before/after example in the text format, declared with ``@rule``.  Rules never
recurse into children: *strategies* (``rewrites.strategies``: ``bottom_up``, ``top_down``,
``once``, ``at_root``, ``fixpoint``, ``normalize``) decide where and how often rules run, and
``apply(strategy, circuit, trace=None)`` runs one.

>>> from circuits import Add, Symbol
>>> @rule(on=Add, example=("'s' Add\\n  'x' [2] Symbol", "'x' [2] Symbol"))
... def drop_single_term(node):
...     '''An Add of one child is that child.'''
...     if len(node.children) == 1 and node.children[0].shape == node.shape:
...         return node.children[0]
...     return None
>>> from rewrites.strategies import apply, bottom_up
>>> x = Symbol((2,), name='x')
>>> apply(bottom_up(drop_single_term), Add(Add(x), name='s')) is x
True

**Names.**  One rule decides which name a rewritten node carries (``name_result``): the node
that replaces ``N`` takes ``N``'s name unless it already has a name of its own (the rule named
it, or it is an existing named node); Arrays and Symbols are never renamed.  New intermediate
nodes a rule builds are unnamed.

**Firing.**  Every driver fires rules one way, ``Run.fire``: call the rule, check that its result
is a node of the same shape and dtype (else ``RewriteError`` naming the rule), name it by
``name_result``, and record it in the ``Trace``.
"""

from __future__ import annotations

import collections
import functools
from typing import Callable, Iterable, Iterator

from circuits.errors import RewriteError
from circuits.nodes import Array, Circuit, Einsum, Symbol

__all__ = ["Rule", "RuleSet", "rule", "rules_of", "when", "Run", "Trace", "TraceEntry", "name_result",
           "check_result"]


class Rule:
    """A named pure rewrite ``node -> node | None``.

    ``on``: the node classes it looks at (the drivers call it only on those; ``None`` = all).
    ``example``: ``(before_text, after_text)`` — applying the rule once at the root of the parsed
    ``before`` and printing gives ``after`` (this is run as a test).
    ``example_options``: for a rule with parameters (keyword arguments after the node), those the
    example is run with (``rule.with_options(**rule.example_options)``).
    """

    def __init__(self, fn: Callable, *, name: str | None = None, example=None, on=None, doc=None,
                 example_options=None):
        self.fn = fn
        self.name = name or fn.__name__
        self.doc = doc if doc is not None else (fn.__doc__ or "").strip()
        if example is not None:
            before, after = example
            example = (str(before), str(after))
        self.example = example
        if on is not None and not isinstance(on, tuple):
            on = (on,)
        self.on = on
        self.example_options = dict(example_options or {})

    def with_options(self, **options) -> "Rule":
        """The same rule called with these keyword arguments (same name, docs and example).

        >>> from circuits import Add, Symbol
        >>> @rule(on=Add)
        ... def keep_first(node, *, k=1):
        ...     '''The first ``k`` terms only (wrong on purpose).'''
        ...     return Add(*node.children[:k])
        >>> x = Symbol((2,), name='x')
        >>> len(keep_first.with_options(k=2)(Add(x, x, x)).children)
        2
        """
        return Rule(functools.partial(self.fn, **options), name=self.name, example=self.example, on=self.on,
                    doc=self.doc, example_options=self.example_options)

    def __call__(self, node: Circuit):
        return self.fn(node)

    def applies_to(self, cls) -> bool:
        return self.on is None or issubclass(cls, self.on)

    # A rule is also a one-rule set, so anything that takes rules takes a single rule.
    def __iter__(self) -> Iterator["Rule"]:
        yield self

    def __len__(self):
        return 1

    def __add__(self, other):
        return RuleSet(self) + other

    def __radd__(self, other):
        return rules_of(other) + RuleSet(self)

    def __repr__(self):
        return f"<rule {self.name}>"

    @property
    def summary(self) -> str:
        """First line of the docstring."""
        return self.doc.splitlines()[0] if self.doc else ""


def rule(fn=None, *, example=None, on=None, name=None, example_options=None):
    """Declare a rule: ``@rule(on=Add, example=(before, after))`` over ``def name(node): ...``.

    The rule's name is the function's name and its documentation the docstring.

    >>> from circuits import Einsum
    >>> @rule(on=Einsum)
    ... def never(node):
    ...     '''Never applies.'''
    ...     return None
    >>> never.name, never.summary
    ('never', 'Never applies.')
    """

    def wrap(f):
        r = Rule(f, name=name, example=example, on=on, example_options=example_options)
        r.__module__, r.__qualname__ = f.__module__, f.__qualname__
        return r

    return wrap if fn is None else wrap(fn)


class RuleSet:
    """An ordered, composable collection of rules (``a + b``); the first rule that applies to a
    node wins.  Iterating gives the rules.

    >>> from circuits import Add
    >>> a = Rule(lambda n: None, name='a', on=Add)
    >>> b = Rule(lambda n: None, name='b')
    >>> [r.name for r in a + b], len(RuleSet(a) + RuleSet(a, b))
    (['a', 'b'], 2)
    """

    __slots__ = ("rules", "name", "_dispatch")

    def __init__(self, *rules, name: str | None = None):
        flat: list[Rule] = []
        seen: set[int] = set()
        for r in rules:
            for one in rules_of(r) if not isinstance(r, Rule) else (r,):
                if id(one) not in seen:  # the same rule twice would only be tried twice
                    seen.add(id(one))
                    flat.append(one)
        self.rules = tuple(flat)
        self.name = name
        self._dispatch: dict[type, tuple[Rule, ...]] = {}

    def for_type(self, cls) -> tuple[Rule, ...]:
        """The rules that look at nodes of class ``cls``, in order (cached)."""
        found = self._dispatch.get(cls)
        if found is None:
            found = self._dispatch[cls] = tuple(r for r in self.rules if r.applies_to(cls))
        return found

    def __iter__(self):
        return iter(self.rules)

    def __len__(self):
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(f"no rule named {name!r} in this set; it has {', '.join(r.name for r in self.rules)}")

    def __contains__(self, item):
        if isinstance(item, str):
            return any(r.name == item for r in self.rules)
        return any(r is item for r in self.rules)

    def __add__(self, other):
        return RuleSet(self, other)

    def __radd__(self, other):
        return RuleSet(rules_of(other), self)

    def without(self, *names: str) -> "RuleSet":
        """This set less the rules with these names."""
        return RuleSet(*[r for r in self.rules if r.name not in names], name=self.name)

    def __repr__(self):
        label = f"{self.name}: " if self.name else ""
        return f"<RuleSet {label}{', '.join(r.name for r in self.rules)}>"


def rules_of(x) -> RuleSet:
    """A RuleSet from a Rule, a RuleSet or an iterable of them."""
    if isinstance(x, RuleSet):
        return x
    if isinstance(x, Rule):
        return RuleSet(x)
    if isinstance(x, Iterable) and not isinstance(x, (str, bytes)):
        return RuleSet(*x)
    raise TypeError(f"expected a rule, a RuleSet or an iterable of rules, got {type(x).__name__}")


def when(predicate: Callable[[Circuit], bool], rules) -> RuleSet:
    """``rules`` that fire only at nodes where ``predicate(node)`` holds (same names and docs): for
    a condition that is not the rule's own, e.g. one about the circuit around the node.

    >>> from circuits import Add, Symbol
    >>> from rewrites.rules import flatten_add
    >>> x = Symbol((2,), name='x')
    >>> guarded, = when(lambda n: n.name != 'keep', flatten_add)
    >>> guarded.name, guarded(Add(Add(x, x), name='keep')), len(guarded(Add(Add(x, x))).children)
    ('flatten_add', None, 2)
    """

    def guard(r: Rule) -> Rule:
        fn = r.fn

        def guarded(node, **options):
            return fn(node, **options) if predicate(node) else None

        return Rule(guarded, name=r.name, on=r.on, doc=r.doc, example=r.example,
                    example_options=r.example_options)

    return RuleSet(*[guard(r) for r in rules_of(rules)])


# ---------------------------------------------------------------------------- names and checks
def name_result(before: Circuit, after: Circuit) -> Circuit:
    """The naming rule of every rewrite: the node replacing ``before`` takes its name unless it
    has one already; Arrays and Symbols are never renamed.

    >>> from circuits import Add, Symbol, Scalar
    >>> x = Symbol((2,), name='x')
    >>> name_result(Add(x, name='s'), Add(x, x)).name
    's'
    >>> name_result(Add(x, name='s'), x).name      # a Symbol keeps its own name
    'x'
    """
    if after.name is None and before.name is not None and not isinstance(after, (Array, Symbol)):
        return after.rename(before.name)
    return after


def check_result(rule_name: str, before: Circuit, after) -> None:
    """Raise ``RewriteError`` unless ``after`` can replace ``before`` (a node, same shape, same dtype)."""
    if not isinstance(after, Circuit):
        raise RewriteError(
            f"rule {rule_name} returned {type(after).__name__} for {before.line()}; "
            "a rule returns a node or None (does not apply)"
        )
    if after.shape != before.shape or after.dtype != before.dtype:
        raise RewriteError(
            f"rule {rule_name} changed a node's shape or dtype, which a rewrite must keep:\n"
            f"    before: {before.line()}  # shape {list(before.shape)}, {before.dtype}\n"
            f"    after:  {after.line()}  # shape {list(after.shape)}, {after.dtype}\n"
            "fix the rule so it returns None where its result would differ"
        )


class Run:
    """The state of one ``apply``: the user's trace (or None) and the names of the rules that
    fired, which loop errors report.  ``fire`` is the one way any driver fires a rule."""

    __slots__ = ("trace", "fired", "allow")

    def __init__(self, trace: "Trace | None" = None, allow: Callable[[Circuit], bool] | None = None):
        self.trace = trace
        self.fired: list[str] = []
        self.allow = allow  # a scope (``apply(..., where=)``): rules fire only where it holds

    def fire(self, rules: RuleSet, node: Circuit) -> Circuit | None:
        """What the first rule of ``rules`` that rewrites ``node`` makes of it, or None; the
        rule's name is then ``self.fired[-1]``.

        The result is checked (a node, same shape, same dtype: else ``RewriteError``), named by
        ``name_result`` and recorded; a rule that returns None, the node itself or an equal node
        has not fired.  Outside the run's scope (``allow``) no rule fires.
        """
        if self.allow is not None and not self.allow(node):
            return None
        cls = type(node)
        # No rule fires at an Einsum with a repeated output axis (``ab->abaa``, writing a
        # diagonal) or just above one: the rules read ``out_axes`` as one axis per id.
        if cls is Einsum and node.writes_diagonal:
            return None
        for k in node.children:
            if type(k) is Einsum and k.writes_diagonal:
                return None
        candidates = rules._dispatch.get(cls)  # the hot path of every driver: no method call
        if candidates is None:
            candidates = rules.for_type(cls)
        for r in candidates:
            out = r.fn(node)
            if out is None or out is node:
                continue
            if not isinstance(out, Circuit) or out.shape != node.shape or out.dtype != node.dtype:
                check_result(r.name, node, out)
            if out.name is None and node.name is not None:
                out = name_result(node, out)
            if out == node:
                continue
            self.fired.append(r.name)
            if self.trace is not None:
                self.trace.record(r.name, node, out)
            return out
        return None


# ---------------------------------------------------------------------------- trace
TraceEntry = collections.namedtuple("TraceEntry", ["rule", "before", "after"])
TraceEntry.__doc__ = """One firing: ``rule`` (its name), the node it saw (``before``, children
already rewritten) and what replaced it (``after``, named by ``name_result``)."""


class Trace:
    """What fired where, in firing order: pass one to ``apply(..., trace=Trace())``.

    >>> from circuits import Add, Symbol
    >>> from rewrites.strategies import apply, bottom_up
    >>> from rewrites.rules import flatten_add
    >>> x = Symbol((2,), name='x')
    >>> t = Trace()
    >>> _ = apply(bottom_up(flatten_add), Add(Add(x, x), x, name='s'), trace=t)
    >>> print(t)
    flatten_add: 's' Add  ->  's' Add
    >>> t.counts()
    Counter({'flatten_add': 1})
    """

    __slots__ = ("entries",)

    def __init__(self):
        self.entries: list[TraceEntry] = []

    def record(self, rule_name: str, before: Circuit, after: Circuit) -> None:
        self.entries.append(TraceEntry(rule_name, before, after))

    def __len__(self):
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, i):
        return self.entries[i]

    def rules(self) -> list[str]:
        """Names of the rules that fired, in order."""
        return [e.rule for e in self.entries]

    def counts(self) -> "collections.Counter[str]":
        return collections.Counter(e.rule for e in self.entries)

    def __str__(self):
        return "\n".join(f"{e.rule}: {e.before.line()}  ->  {e.after.line()}" for e in self.entries)

    def __repr__(self):
        return f"<Trace of {len(self.entries)} rewrites>"
