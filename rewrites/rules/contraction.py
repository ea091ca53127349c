"""Contraction order: nest an n-ary Einsum into the cheapest tree of pairwise Einsums.

opt_einsum chooses the order from the operand shapes alone (``contract_path(..., shapes=True)``),
so the rule never reads a tensor.  Each intermediate keeps the axis ids still needed by the
operands not yet contracted or by the output: the output's axes first, in the output's order (so
the attention scores ``qc,kc,,qk->qk`` nest as ``[q, k]`` products, not as a ``[k, q]`` one that
the backend must transpose back: ``optimize`` made the seed 5% slower than ``compile`` that way),
then the others in order of first appearance.  This rule undoes
``flatten_einsum``, so it is not part of ``simp``; ``rewrites.optimize`` runs it last.

>>> from circuits import Einsum, Symbol
>>> a, b, c = Symbol((2, 30), name='a'), Symbol((30, 40), name='b'), Symbol((40,), name='c')
>>> nested = contraction_order(Einsum.from_spec('ab,bc,c->a', a, b, c))
>>> nested.payload_text(), nested.children[1].payload_text()
('ab,b->a', 'bc,c->b')
"""

from __future__ import annotations

import opt_einsum

from circuits.nodes import Einsum

from ..engine import RuleSet, rule


def contraction_path(node: Einsum) -> list[tuple[int, ...]]:
    """opt_einsum's path for this Einsum (positions in the shrinking operand list, each result
    appended at the end)."""
    letters: dict[int, str] = {}
    for axes in node.in_axes:
        for a in axes:
            letters.setdefault(a, opt_einsum.get_symbol(len(letters)))
    spec = ",".join("".join(letters[a] for a in axes) for axes in node.in_axes)
    spec += "->" + "".join(letters[a] for a in node.out_axes)
    path, _ = opt_einsum.contract_path(spec, *[c.shape for c in node.children], shapes=True,
                                       optimize="auto")
    return [tuple(step) for step in path]


@rule(on=Einsum, example=(
    "'p' Einsum ab,bc,c->a\n  'x' [2,3] Symbol\n  'w' [3,4] Symbol\n  'v' [4] Symbol",
    "'p' Einsum ab,b->a\n  'x' [2,3] Symbol\n  0 Einsum bc,c->b\n    'w' [3,4] Symbol\n    'v' [4] Symbol",
))
def contraction_order(node):
    """An Einsum of three or more operands as nested pairwise Einsums in the order opt_einsum
    finds cheapest for their shapes."""
    if len(node.children) < 3:
        return None
    path = contraction_path(node)
    if len(path) < 2:
        return None
    operands = list(zip(node.children, node.in_axes))
    for step in path:
        picked = [operands[i] for i in step]
        operands = [op for i, op in enumerate(operands) if i not in step]
        if not operands:
            out = node.out_axes
        else:
            needed = set(node.out_axes).union(*[axes for _, axes in operands])
            seen = tuple(dict.fromkeys(a for _, axes in picked for a in axes if a in needed))
            # the output's axes first, in its order (a later product with the intermediate then
            # needs no transpose), then the rest in order of first appearance
            out = tuple(a for a in node.out_axes if a in seen) + tuple(a for a in seen if a not in node.out_axes)
        inner = Einsum(*[c for c, _ in picked], in_axes=[axes for _, axes in picked], out_axes=out)
        operands.append((inner, out))
    (result, axes), = operands
    if axes != node.out_axes:  # pragma: no cover - the last step always produces the output
        result = Einsum(result, in_axes=[axes], out_axes=node.out_axes)
    return result


RULES = RuleSet(contraction_order, name="contraction")
