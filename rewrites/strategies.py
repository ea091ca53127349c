"""Strategies: where and how often rules run.  Values, separate from the rules they drive.

- ``bottom_up(rules)``: one pass, children before parents; each node tried once.
- ``top_down(rules)``: one pass, parents before children (the children of a rewritten node are
  those of its replacement).
- ``once(rules)``: the first node (children first) where a rule applies is rewritten, and only it.
- ``at_root(rules)``: the rules tried at the root only.
- ``fixpoint(strategy, max_steps=100)``: repeat until nothing changes; a run that comes back to an
  earlier circuit, or outlives its budget, raises ``RewriteLoopError`` naming the rules.
- ``normalize(rules, max_steps=1_000_000)``: rewrite to a normal form in one memoised pass —
  every node, including those the rules create, is rewritten until no rule applies; the fast way
  to a fixpoint.
- ``seq(a, b, ...)`` (or ``a >> b``): one strategy after another.
- ``dynamic(make)``: the strategy ``make(circuit)`` builds for the circuit it is run on (for
  rules guarded by a fact about the whole circuit, such as how many parents a node has).

``bottom_up`` and ``top_down`` also take a strategy for what to do at each node instead of rules:
``top_down(fixpoint(at_root(rules)))`` rewrites each node until no rule applies at it before
moving on to its children.

**Step limits** are called ``max_steps`` everywhere.  A step of ``fixpoint`` is one run of the
strategy it repeats (one pass over the circuit); a step of ``normalize`` (and of
``rewrites.simp``) is one rewrite, a rule firing.  Running out raises ``RewriteLoopError``
naming the rules that were still firing; no driver stops silently.

Every rule is fired one way (``rewrites.engine.Run.fire``: call, check, name, trace).

Every driver is iterative (an explicit stack; a 50,000-deep chain is fine) and memoised by node
hash, so a node shared by many parents is rewritten once.

>>> from circuits import Add, Symbol
>>> from rewrites.rules import flatten_add
>>> x = Symbol((2,), name='x')
>>> c = Add(Add(Add(x, x), x), x, name='s')
>>> print(apply(normalize(flatten_add), c).to_text())
's' Add
  'x' [2] Symbol
  'x'
  'x'
  'x'
"""

from __future__ import annotations

from circuits.errors import RewriteLoopError
from circuits.nodes import Circuit
from circuits.traversal import replace, toposort

from .engine import RuleSet, Run, Trace, rules_of

__all__ = ["Strategy", "apply", "bottom_up", "top_down", "once", "at_root", "fixpoint", "normalize", "seq",
           "dynamic"]


class Strategy:
    """Base class: ``run(root, state) -> root``, firing rules through ``state.fire``
    (``state`` is the ``rewrites.engine.Run`` of this ``apply``).  ``a >> b`` runs ``a`` then ``b``."""

    def run(self, root: Circuit, state: Run) -> Circuit:  # pragma: no cover - abstract
        raise NotImplementedError

    def __rshift__(self, other: "Strategy") -> "Strategy":
        return seq(self, other)

    def __call__(self, circuit: Circuit, trace: Trace | None = None, *, where=None, stop_at=None) -> Circuit:
        return apply(self, circuit, trace=trace, where=where, stop_at=stop_at)


def apply(strategy, circuit: Circuit, trace: Trace | None = None, *, where=None, stop_at=None) -> Circuit:
    """Run ``strategy`` on ``circuit``; record the firings into ``trace`` if given.

    A bare rule or rule set stands for ``normalize(rules)``.  ``where`` (a matcher: rules fire
    only at matching nodes) and ``stop_at`` (a matcher: those nodes and everything below them
    are kept whole) scope the rewrite to a region (``rewrites.scope``).

    >>> from circuits import Add, Scalar
    >>> from rewrites.rules import fold_add_scalars
    >>> apply(bottom_up(fold_add_scalars), Add(Scalar(1.0), Scalar(2.0), name='three'))
    <'three' [] Scalar 3>
    >>> x = Scalar(1.0, name='x')
    >>> apply(bottom_up(fold_add_scalars), Add(Add(x, x, name='two'), x, name='three'), stop_at='two').line()
    "'three' Add"
    """
    if not isinstance(strategy, Strategy):
        strategy = normalize(rules_of(strategy))
    if not isinstance(circuit, Circuit):
        raise TypeError(f"apply(strategy, circuit): circuit is a {type(circuit).__name__}, not a node")
    if where is not None or stop_at is not None:
        from .scope import run_scoped

        return run_scoped(strategy, circuit, trace, where, stop_at)
    return strategy.run(circuit, Run(trace))


# ---------------------------------------------------------------------------- one-pass strategies
class _AtEachNode(Strategy):
    """A pass that does ``at_node`` (rules: the first that applies; or a strategy run at the node)
    at every node."""

    def __init__(self, at_node):
        self.at_node = at_node if isinstance(at_node, Strategy) else at_root(at_node)

    def rewrite(self, node: Circuit, state: Run) -> Circuit:
        return self.at_node.run(node, state)

    def inner(self) -> str:
        return _names(self.at_node.rules) if isinstance(self.at_node, _AtRoot) else repr(self.at_node)


class _BottomUp(_AtEachNode):
    def run(self, root, state):
        new: dict[bytes, Circuit] = {}
        rewrite = self.rewrite
        for node in toposort(root):
            kids = node.children
            cur = node.with_children(tuple(new[c.hash] for c in kids)) if kids else node
            new[node.hash] = rewrite(cur, state)
        return new[root.hash]

    def __repr__(self):
        return f"bottom_up({self.inner()})"


def bottom_up(rules) -> Strategy:
    """One pass, children before parents: each distinct node is rebuilt over its rewritten
    children and the first applicable rule replaces it (the replacement is not revisited).
    ``rules`` may be a strategy to run at each node instead."""
    return _BottomUp(rules)


class _TopDown(_AtEachNode):
    def run(self, root, state):
        done: dict[bytes, Circuit] = {}
        pending: dict[bytes, tuple] = {}  # node hash -> rules that rewrote it (its children still open)
        rewrite, fired = self.rewrite, state.fired
        stack: list = [root]
        while stack:
            item = stack.pop()
            if type(item) is tuple:  # (original, replacement): replacement's children are done
                orig, rep = item
                kids = rep.children
                done[orig.hash] = rep.with_children(tuple(done[c.hash] for c in kids)) if kids else rep
                del pending[orig.hash]
                continue
            h = item.hash
            if h in done or h in pending:
                continue
            start = len(fired)
            rep = rewrite(item, state)
            pending[h] = tuple(fired[start:])
            stack.append((item, rep))
            for c in reversed(rep.children):
                ch = c.hash
                if ch in pending:
                    names = sorted({n for ns in pending.values() for n in ns})
                    raise RewriteLoopError(
                        f"top_down: a rewrite put {c.line()} below itself (rules {', '.join(names)}); "
                        "a top-down pass would rewrite it forever. Use bottom_up or fix the rule"
                    )
                if ch not in done:
                    stack.append(c)
        return done[root.hash]

    def __repr__(self):
        return f"top_down({self.inner()})"


def top_down(rules) -> Strategy:
    """One pass, parents before children: a node is rewritten first, then the children of its
    replacement are visited (each distinct node once).  ``rules`` may be a strategy to run at
    each node instead (``fixpoint(at_root(rules))``: rewrite the node until no rule applies)."""
    return _TopDown(rules)


class _Once(Strategy):
    def __init__(self, rules):
        self.rules = rules_of(rules)

    def run(self, root, state):
        for node in toposort(root):
            out = state.fire(self.rules, node)
            if out is not None:
                return replace(root, {node: out})
        return root

    def __repr__(self):
        return f"once({_names(self.rules)})"


def once(rules) -> Strategy:
    """One rewrite: the first node, children first, where a rule applies is replaced (everywhere
    it occurs); nothing else changes."""
    return _Once(rules)


class _AtRoot(Strategy):
    def __init__(self, rules):
        self.rules = rules_of(rules)

    def run(self, root, state):
        out = state.fire(self.rules, root)
        return root if out is None else out

    def __repr__(self):
        return f"at_root({_names(self.rules)})"


def at_root(rules) -> Strategy:
    """The first applicable rule at the root, once; children are not looked at."""
    return _AtRoot(rules)


class _Seq(Strategy):
    def __init__(self, strategies):
        self.strategies = tuple(strategies)

    def run(self, root, state):
        for s in self.strategies:
            root = s.run(root, state)
        return root

    def __repr__(self):
        return " >> ".join(map(repr, self.strategies))


def seq(*strategies) -> Strategy:
    """Run strategies one after another."""
    flat = []
    for s in strategies:
        if not isinstance(s, Strategy):
            raise TypeError(f"seq takes strategies (bottom_up(rules), ...), got {type(s).__name__}")
        flat.extend(s.strategies if isinstance(s, _Seq) else (s,))
    return _Seq(flat)


class _Dynamic(Strategy):
    def __init__(self, make):
        self.make = make

    def run(self, root, state):
        strategy = self.make(root)
        if not isinstance(strategy, Strategy):
            raise TypeError(f"dynamic({self._label()}): it built a {type(strategy).__name__}, not a strategy")
        return strategy.run(root, state)

    def _label(self) -> str:
        return getattr(self.make, "__name__", repr(self.make))

    def __repr__(self):
        return f"dynamic({self._label()})"


def dynamic(make) -> Strategy:
    """The strategy ``make(circuit)`` builds for the circuit it is run on, built afresh each time
    (inside ``fixpoint``: for every pass).  For rules guarded (``rewrites.engine.when``) by a
    fact about the whole circuit, such as how many parents a node has.

    >>> from circuits import Add, Einsum, Symbol
    >>> from circuits.traversal import parents_map
    >>> from rewrites.engine import when
    >>> from rewrites.rules import flatten_add
    >>> def flatten_unshared(root):  # an Add that another node reads too is left whole
    ...     parents = parents_map(root)
    ...     return bottom_up(when(lambda n: len(parents.get(n.children[0].hash, ())) < 2, flatten_add))
    >>> x = Symbol((2,), name='x')
    >>> shared = Add(x, x)
    >>> c = Einsum.from_spec('a,a,a->a', Add(Add(x, x, x), x), Add(shared, x), shared, name='s')
    >>> print(apply(dynamic(flatten_unshared), c).to_text())
    's' Einsum a,a,a->a
      0 Add
        'x' [2] Symbol
        'x'
        'x'
        'x'
      1 Add
        2 Add
          'x'
          'x'
        'x'
      2
    """
    return _Dynamic(make)


# ---------------------------------------------------------------------------- fixpoints
class _Fixpoint(Strategy):
    def __init__(self, strategy, max_steps):
        if not isinstance(strategy, Strategy):
            strategy = bottom_up(strategy)
        self.strategy = strategy
        self.max_steps = max_steps

    def run(self, root, state):
        seen = {root.hash: (0, len(state.fired))}
        cur = root
        for step in range(1, self.max_steps + 1):
            start = len(state.fired)
            nxt = self.strategy.run(cur, state)
            if nxt == cur:
                return cur
            if nxt.hash in seen:
                _, since = seen[nxt.hash]
                names = _unique(state.fired[since:])
                raise RewriteLoopError(
                    f"{self!r} went round in a loop: after {step} passes it came back to an earlier "
                    f"circuit (root {nxt.line()}); the rules {', '.join(names)} undo each other. "
                    "Drop one of them from the rule set"
                )
            seen[nxt.hash] = (step, start)
            cur = nxt
        names = _unique(state.fired[start:])
        raise RewriteLoopError(
            f"{self!r} found no fixpoint within max_steps={self.max_steps} passes; "
            f"the last pass still fired {', '.join(names)}. Raise max_steps or check those rules"
        )

    def __repr__(self):
        return f"fixpoint({self.strategy!r}, max_steps={self.max_steps})"


def fixpoint(strategy, max_steps: int = 100) -> Strategy:
    """Repeat ``strategy`` (a rule set means ``bottom_up`` of it) until the circuit stops
    changing; a step is one run of ``strategy``.  ``RewriteLoopError`` names the rules when it
    revisits a circuit or has not stopped changing after ``max_steps`` steps."""
    return _Fixpoint(strategy, max_steps)


class _Await:
    """A node rewritten by ``rule`` whose normal form is that of ``result`` (being normalised)."""

    __slots__ = ("keys", "result", "rule")

    def __init__(self, keys, result, rule):
        self.keys, self.result, self.rule = keys, result, rule


class _Normalize(Strategy):
    def __init__(self, rules, max_steps):
        self.rules = rules_of(rules)
        self.max_steps = max_steps

    def run(self, root, state):
        rules = self.rules
        memo: dict[bytes, Circuit] = {}  # node hash -> its normal form
        active: dict[bytes, _Await] = {}  # nodes whose normal form waits on a rewrite result
        fire, fired_names = state.fire, state.fired
        stack: list = [root]
        steps = 0
        budget = self.max_steps
        append, pop = stack.append, stack.pop
        while stack:
            item = stack[-1]
            if type(item) is _Await:
                pop()
                nf = memo[item.result.hash]
                for k in item.keys:
                    memo[k] = nf
                    active.pop(k, None)
                continue
            h = item.hash
            if h in memo:
                pop()
                continue
            kids = item.children
            cur = item
            if kids:
                missing = False
                for c in reversed(kids):
                    ch = c.hash
                    if ch not in memo:
                        if ch in active:
                            raise self._loop(stack, active[ch], c)
                        missing = True
                        append(c)
                if missing:
                    continue
                cur = item.with_children(tuple([memo[c.hash] for c in kids]))
                if cur is not item and cur.hash in memo:
                    memo[h] = memo[cur.hash]
                    pop()
                    continue
            pop()
            out = fire(rules, cur)
            if out is None:
                memo[h] = cur
                memo[cur.hash] = cur
                continue
            steps += 1
            if budget is not None and steps > budget:
                raise RewriteLoopError(
                    f"normalize({_names(rules)}) fired more than max_steps={budget} rewrites; the last "
                    f"were {', '.join(_unique(fired_names[-50:]))}. Raise max_steps or check those rules"
                )
            oh = out.hash
            if oh in memo:
                memo[h] = memo[cur.hash] = memo[oh]
                continue
            aw = _Await((h, cur.hash) if cur is not item else (h,), out, fired_names[-1])
            if oh in active or oh == h:
                raise self._loop(stack + [aw], active.get(oh, aw), out)
            for k in aw.keys:
                active[k] = aw
            append(aw)
            append(out)
        return memo[root.hash]

    def _loop(self, stack, first: _Await, node):
        """The error for a rewrite that leads back to a node still being rewritten."""
        names, on = [], False
        for item in stack:
            if item is first:
                on = True
            if on and type(item) is _Await:
                names.append(item.rule)
        names = _unique(names) or [first.rule]
        return RewriteLoopError(
            f"normalize: the rules {', '.join(names)} undo each other: rewriting {node.line()} "
            "leads back to itself. Drop one of them from the rule set"
        )

    def __repr__(self):
        return f"normalize({_names(self.rules)})"


def normalize(rules, max_steps: int | None = 1_000_000) -> Strategy:
    """Rewrite to a normal form in one memoised pass: children first, then the first applicable
    rule at the node, and the result normalised in turn, until no rule applies anywhere.

    Each distinct node (original or created) is tried once.  A chain of rewrites that comes back
    to a node still being rewritten raises ``RewriteLoopError`` naming the rules; so does firing
    more than ``max_steps`` rewrites in all (a step is one rewrite).
    """
    return _Normalize(rules, max_steps)


# ---------------------------------------------------------------------------- helpers
def _unique(names):
    out, seen = [], set()
    for n in names:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


def _names(rules: RuleSet) -> str:
    if rules.name:
        return rules.name
    names = [r.name for r in rules]
    return ", ".join(names[:6]) + (f", ... ({len(names)} rules)" if len(names) > 6 else "")
