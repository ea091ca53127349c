"""Constant folding of GeneralFunctions: functions of Scalars, and ``last_dim_size``.

An elementwise function of Scalars is a Scalar of the output shape, its value computed once in
float64 by the function's own JAX lowering (``fold_function_of_scalars``, defined with the other
Scalar rules in ``rewrites.rules.scalars`` and collected here).  ``last_dim_size`` depends only
on its argument's shape, so it folds whatever the argument is — the LayerNorm of the seed
computes its hidden size this way.

>>> from circuits import GeneralFunction, Symbol
>>> fold_last_dim_size(GeneralFunction('last_dim_size', Symbol((300, 256), name='x'))).line()
'[300] Scalar 256'
"""

from __future__ import annotations

from circuits.nodes import GeneralFunction, Scalar

from ..engine import RuleSet, rule
from .scalars import fold_function_of_scalars

__all__ = ["fold_last_dim_size", "fold_function_of_scalars", "RULES"]


@rule(on=GeneralFunction, example=(
    "'n' GeneralFunction last_dim_size\n  'x' [2,5] Symbol",
    "'n' [2] Scalar 5",
))
def fold_last_dim_size(node):
    """``last_dim_size`` of anything is a Scalar holding the length of its last axis."""
    if node.function.name != "last_dim_size" or node.dtype != "float32":
        return None  # a Scalar is float32; folding a float64 size would change the node's dtype
    return Scalar(float(node.children[0].shape[-1]), node.shape)


RULES = RuleSet(fold_last_dim_size, fold_function_of_scalars, name="functions")
