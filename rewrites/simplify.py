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

from circuits.nodes import Circuit

from .engine import RuleSet, Trace
from .rules import SIMP_RULES, canonical, functions, index, rearrange
from .strategies import apply, normalize


def default_rules() -> RuleSet:
    """``SIMP_RULES`` plus the ``RULES`` of the Index, Rearrange, canonical-order and function
    folding families."""
    return RuleSet(SIMP_RULES, index.RULES, rearrange.RULES, canonical.RULES, functions.RULES, name="simp")


def simp(circuit: Circuit, *, rules=None, trace: Trace | None = None,
         max_steps: int | None = 1_000_000, where=None, stop_at=None) -> Circuit:
    """``circuit`` simplified by the default value-preserving rules (``default_rules()``, or
    ``rules``) until none applies.  The value is unchanged; names follow
    ``rewrites.engine.name_result``.  ``max_steps``: rewrites (rule firings) in all before
    ``RewriteLoopError``; None for no limit.  ``where`` / ``stop_at`` (matchers) scope it to a
    region: rules fire only at nodes matching ``where``; nodes matching ``stop_at`` and everything
    below them are kept whole (``rewrites.scope``)."""
    return apply(normalize(default_rules() if rules is None else rules, max_steps=max_steps), circuit, trace,
                 where=where, stop_at=stop_at)
