"""``simp``: the default value-preserving rules, run to a fixpoint.

>>> from circuits import Add, Einsum, Scalar, Symbol
>>> x = Symbol((3,), name='x')
>>> c = Add(x, Einsum.from_spec('a,->a', x, Scalar(2.0)), Scalar(0.0), name='y')
>>> print(simp(c).to_text())
'y' Einsum a,->a
  'x' [3] Symbol
  0 [] Scalar 3
"""

from __future__ import annotations

import importlib

from circuits.nodes import Circuit

from .engine import RuleSet, Trace
from .rules import SIMP_RULES
from .strategies import apply, normalize

# Rule modules written alongside this one; each contributes its ``RULES`` when present.
OPTIONAL_RULE_MODULES = (
    "rewrites.rules.index", "rewrites.rules.rearrange", "rewrites.rules.canonical", "rewrites.rules.functions",
)


def default_rules() -> RuleSet:
    """``SIMP_RULES`` plus the ``RULES`` of each optional rule module that can be imported."""
    sets = [SIMP_RULES]
    for name in OPTIONAL_RULE_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # the module exists but something it needs does not: say so
                raise
            continue
        extra = getattr(mod, "RULES", None)
        if extra is not None:
            sets.append(extra)
    return RuleSet(*sets, name="simp")


def simp(circuit: Circuit, *, rules=None, trace: Trace | None = None,
         max_steps: int | None = 1_000_000) -> Circuit:
    """``circuit`` simplified by the default value-preserving rules (``default_rules()``, or
    ``rules``) until none applies.  The value is unchanged; names follow
    ``rewrites.engine.name_result``."""
    return apply(normalize(default_rules() if rules is None else rules, max_steps=max_steps), circuit, trace)
