"""rewrites: rules, rule sets and strategies that transform circuits.

Rules are named pure functions ``node -> node | None`` (``rewrites.rules``); strategies say
where and how often they run (``bottom_up``, ``top_down``, ``once``, ``at_root``, ``fixpoint``,
``normalize``); ``apply(strategy, circuit, trace)`` runs one; ``simp`` runs the default
value-preserving set to a fixpoint; ``check`` validates a whole circuit.

>>> import rewrites
>>> from circuits import Add, Scalar, Symbol
>>> x = Symbol((2,), name='x')
>>> rewrites.simp(Add(Add(x, Scalar(0.0)), name='y'))
<'x' [2] Symbol>
"""

from . import engine  # noqa: F401  (first: the strategies module imports from it)
from circuits.check import check
from .engine import Rule, RuleSet, Trace, TraceEntry, name_result, rule, rules_of
from .simplify import default_rules, simp
from .strategies import Strategy, apply, at_root, bottom_up, fixpoint, normalize, once, seq, top_down
from . import rules  # noqa: E402

__all__ = [
    "Rule", "RuleSet", "rule", "rules_of", "Trace", "TraceEntry", "name_result",
    "Strategy", "apply", "bottom_up", "top_down", "once", "at_root", "fixpoint", "normalize", "seq",
    "simp", "default_rules", "check", "rules",
]

try:  # rewrites.optimize (contraction order etc.) lives in its own module when present
    from .optimize import optimize  # noqa: F401
except ModuleNotFoundError as _e:
    if _e.name != f"{__name__}.optimize":
        raise
else:
    __all__.append("optimize")
