"""Rules removing nodes that copy their one child: an Index that selects everything, a Concat
of one child.  (The Add and Einsum cases live with their node: ``add_single_term``,
``einsum_identity``.)"""

from __future__ import annotations

import numpy as np

from circuits.nodes import Concat, Index

from ..engine import RuleSet, rule
from ._common import same_type

__all__ = ["index_select_all", "concat_single", "RULES"]


def _selects_all(entry, size: int) -> bool:
    if isinstance(entry, slice):
        return range(*entry.indices(size)) == range(size)
    if isinstance(entry, np.ndarray):
        return len(entry) == size and bool(np.array_equal(entry % max(size, 1), np.arange(size)))
    return False  # an int drops its axis


@rule(on=Index, example=("'y' [2,3] Index [:,0:3]\n  'w' [2,3] Symbol", "'w' [2,3] Symbol"))
def index_select_all(node):
    """An Index whose every entry selects its whole axis in order (``:``, ``0:n``, ``arange(n)``)
    is its child."""
    child = node.children[0]
    if all(_selects_all(e, n) for e, n in zip(node.full_index(), child.shape)):
        return same_type(node, child)
    return None


@rule(on=Concat, example=("'y' Concat 0\n  'w' [2,3] Symbol", "'w' [2,3] Symbol"))
def concat_single(node):
    """A Concat of one child is that child."""
    if len(node.children) == 1:
        return same_type(node, node.children[0])
    return None


RULES = RuleSet(index_select_all, concat_single, name="identities")
