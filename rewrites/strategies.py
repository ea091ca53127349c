"""Strategies: where and how often rules run.  Values, separate from the rules they drive.

- ``bottom_up(rules)``: one pass, children before parents; each node tried once.
- ``top_down(rules)``: one pass, parents before children (the children of a rewritten node are
  those of its replacement).
- ``once(rules)``: the first node (children first) where a rule applies is rewritten, and only it.
- ``at_root(rules)``: the rules tried at the root only.
- ``fixpoint(strategy, max_steps=100)``: repeat until nothing changes; a run that comes back to an
  earlier circuit, or outlives its budget, raises ``RewriteLoopError`` naming the rules.
- ``normalize(rules)``: rewrite to a normal form in one memoised pass — every node, including
  those the rules create, is rewritten until no rule applies; the fast way to a fixpoint.
- ``seq(a, b, ...)`` (or ``a >> b``): one strategy after another.

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

from .engine import RuleSet, Trace, check_result, name_result, rules_of

__all__ = ["Strategy", "apply", "bottom_up", "top_down", "once", "at_root", "fixpoint", "normalize", "seq"]


class _Run:
    """Per-apply state: the user's trace (or None) and the names of the rules that fired, which
    loop errors report."""

    __slots__ = ("trace", "fired")

    def __init__(self, trace: Trace | None):
        self.trace = trace
        self.fired: list[str] = []

    def try_rules(self, rules: RuleSet, node: Circuit):
        """The first rule that applies to ``node``: (rule, named result), or None."""
        for r in rules.for_type(type(node)):
            out = r.fn(node)
            if out is None or out is node:
                continue
            if not isinstance(out, Circuit) or out.shape != node.shape or out.dtype != node.dtype:
                check_result(r.name, node, out)
            out = name_result(node, out)
            if out == node:
                continue
            self.fired.append(r.name)
            if self.trace is not None:
                self.trace.record(r.name, node, out)
            return r, out
        return None


class Strategy:
    """Base class: ``run(root, state) -> root``.  ``a >> b`` runs ``a`` then ``b``."""

    def run(self, root: Circuit, state: _Run) -> Circuit:  # pragma: no cover - abstract
        raise NotImplementedError

    def __rshift__(self, other: "Strategy") -> "Strategy":
        return seq(self, other)

    def __call__(self, circuit: Circuit, trace: Trace | None = None) -> Circuit:
        return apply(self, circuit, trace=trace)


def apply(strategy, circuit: Circuit, trace: Trace | None = None) -> Circuit:
    """Run ``strategy`` on ``circuit``; record the firings into ``trace`` if given.

    A bare rule or rule set stands for ``normalize(rules)``.

    >>> from circuits import Add, Scalar
    >>> from rewrites.rules import fold_add_scalars
    >>> apply(bottom_up(fold_add_scalars), Add(Scalar(1.0), Scalar(2.0), name='three'))
    <'three' [] Scalar 3>
    """
    if not isinstance(strategy, Strategy):
        strategy = normalize(rules_of(strategy))
    if not isinstance(circuit, Circuit):
        raise TypeError(f"apply(strategy, circuit): circuit is a {type(circuit).__name__}, not a node")
    return strategy.run(circuit, _Run(trace))


# ---------------------------------------------------------------------------- one-pass strategies
class _BottomUp(Strategy):
    def __init__(self, rules):
        self.rules = rules_of(rules)

    def run(self, root, state):
        new: dict[bytes, Circuit] = {}
        rules = self.rules
        for node in toposort(root):
            kids = node.children
            cur = node.with_children(tuple(new[c.hash] for c in kids)) if kids else node
            fired = state.try_rules(rules, cur)
            new[node.hash] = cur if fired is None else fired[1]
        return new[root.hash]

    def __repr__(self):
        return f"bottom_up({_names(self.rules)})"


def bottom_up(rules) -> Strategy:
    """One pass, children before parents: each distinct node is rebuilt over its rewritten
    children and the first applicable rule replaces it (the replacement is not revisited)."""
    return _BottomUp(rules)


class _TopDown(Strategy):
    def __init__(self, rules):
        self.rules = rules_of(rules)

    def run(self, root, state):
        done: dict[bytes, Circuit] = {}
        pending: dict[bytes, str] = {}  # node hash -> rule that rewrote it (its children still open)
        rules = self.rules
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
            fired = state.try_rules(rules, item)
            rep = item if fired is None else fired[1]
            pending[h] = fired[0].name if fired else ""
            stack.append((item, rep))
            for c in reversed(rep.children):
                ch = c.hash
                if ch in pending:
                    names = sorted({n for n in pending.values() if n})
                    raise RewriteLoopError(
                        f"top_down: a rewrite put {c.line()} below itself (rules {', '.join(names)}); "
                        "a top-down pass would rewrite it forever. Use bottom_up or fix the rule"
                    )
                if ch not in done:
                    stack.append(c)
        return done[root.hash]

    def __repr__(self):
        return f"top_down({_names(self.rules)})"


def top_down(rules) -> Strategy:
    """One pass, parents before children: a node is rewritten first, then the children of its
    replacement are visited (each distinct node once)."""
    return _TopDown(rules)


class _Once(Strategy):
    def __init__(self, rules):
        self.rules = rules_of(rules)

    def run(self, root, state):
        for node in toposort(root):
            fired = state.try_rules(self.rules, node)
            if fired is not None:
                return replace(root, {node: fired[1]})
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
        fired = state.try_rules(self.rules, root)
        return root if fired is None else fired[1]

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
    changing; ``RewriteLoopError`` names the rules when it revisits a circuit or runs out of steps."""
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
        dispatch: dict[type, tuple] = {}
        fired_names = state.fired
        trace = state.trace
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
            # The first rule that applies (inlined _Run.try_rules: this is the hot loop).
            cls = type(cur)
            candidates = dispatch.get(cls)
            if candidates is None:
                candidates = dispatch[cls] = rules.for_type(cls)
            out = None
            for r in candidates:
                out = r.fn(cur)
                if out is None or out is cur:
                    out = None
                    continue
                if not isinstance(out, Circuit) or out.shape != cur.shape or out.dtype != cur.dtype:
                    check_result(r.name, cur, out)
                if out.name is None and cur.name is not None:
                    out = name_result(cur, out)
                if out == cur:
                    out = None
                    continue
                fired_names.append(r.name)
                if trace is not None:
                    trace.record(r.name, cur, out)
                break
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
            aw = _Await((h, cur.hash) if cur is not item else (h,), out, r.name)
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
    more than ``max_steps`` rewrites in all.
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
