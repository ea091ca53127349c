"""rewrites: rules, rule sets and strategies that transform circuits.

Rules are named pure functions ``node -> node | None`` (``rewrites.rules``); strategies say
where and how often they run (``bottom_up``, ``top_down``, ``once``, ``at_root``, ``fixpoint``,
``normalize``, ``dynamic``); ``apply(strategy, circuit, trace)`` runs one; ``simp`` runs the
default value-preserving set to a fixpoint; ``optimize`` runs a schedule of strategies that
makes a circuit faster to evaluate; ``check`` (``circuits.check``) validates a whole circuit.
Step limits are ``max_steps`` everywhere (see ``rewrites.strategies`` for what a step is).

>>> import rewrites
>>> from circuits import Add, Scalar, Symbol
>>> x = Symbol((2,), name='x')
>>> rewrites.simp(Add(Add(x, Scalar(0.0)), name='y'))
<'x' [2] Symbol>
"""

from circuits.check import check

from . import rules
from .engine import Rule, RuleSet, Trace, TraceEntry, name_result, rule, rules_of, when
from .heads import batch_heads
from .optimize import optimize
from .push_modules import push_down_modules
from .simplify import default_rules, simp
from .strategies import Strategy, apply, at_root, bottom_up, dynamic, fixpoint, normalize, once, seq, top_down

__all__ = [
    "Rule", "RuleSet", "rule", "rules_of", "when", "Trace", "TraceEntry", "name_result",
    "Strategy", "apply", "bottom_up", "top_down", "once", "at_root", "fixpoint", "normalize", "seq", "dynamic",
    "simp", "default_rules", "optimize", "check", "rules", "batch_heads", "push_down_modules",
]
