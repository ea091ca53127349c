"""``optimize(circuit)``: value-preserving rewrites that make a circuit faster to evaluate.

Run it on request, before compiling.  It is a schedule (``schedule()``): strategies over rule
sets whose rules live in ``rewrites.rules``, run in order:

1. fold constants (``last_dim_size`` of anything, elementwise functions of Scalars, an Index of a
   Scalar): ``normalize(FOLD_RULES)``;
2. move gathers and Indexes towards the leaves (``rewrites.rules.gather``, ``rewrites.rules.index``),
   so that only the entries that are used are computed — above all, **a gather of a log_softmax
   becomes the gathered logit minus the logsumexp**, so the full log-probability tensor is never
   formed.  Each pass is top-down, rewriting every node until no rule applies at it before
   visiting its children, so an Index keeps moving down in the same pass; passes repeat until
   nothing changes.  A node read by several parents is not pushed into: its full value is needed
   anyway, and a pushed copy would be computed besides (except by a gather of at most
   ``SMALL_GATHER`` of its entries);
3. clean up (fuse and drop Rearranges, fold again), then nest every Einsum of three or more
   operands in the cheapest pairwise order (``rewrites.rules.contraction``).

A large ``logsumexp`` of an Einsum (a language model's normaliser over its vocabulary) is left as
it is: the backend computes it chunk by chunk itself where nothing else reads the Einsum
(``circuits.backend.lower.fusion``), with chunks measured for the machine, so the optimized circuit
runs the same code as ``compile`` of the original there (a rewrite's own ``Concat`` of chunks was
slower: BENCHMARKS.md, issue 24).  ``rewrites.rules.chunking.chunk_logsumexp`` stays in the
catalogue for a circuit that should print its chunks.

Every step keeps the value exactly (up to float rounding); the result prints, saves and
evaluates like any circuit.

>>> import numpy as np
>>> from circuits import Array, GeneralFunction
>>> z = Array(np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32), name='logits')
>>> toks = Array(np.array([2, 0]), name='toks')
>>> ll = GeneralFunction('gen_index_at_0_batch_x_c', GeneralFunction('log_softmax', z), toks, name='ll')
>>> print(optimize(ll).to_text())
'll' Add
  0 GeneralFunction gen_index_at_0_batch_x_c
    'logits' [2,3] Array cd7bd2a3eea30e1c2fc72103
    'toks' [2] Array 21c55e9330d45dbb6376016b
  1 Einsum a,->a
    2 GeneralFunction logsumexp
      'logits'
    3 [] Scalar -1
>>> bool(np.allclose(optimize(ll).evaluate(), ll.evaluate()))
True
"""

from __future__ import annotations

from typing import Callable

from circuits.nodes import Circuit
from circuits.traversal import parents_map

from .engine import RuleSet, Trace, when
from .rules.contraction import contraction_order
from .rules.functions import fold_function_of_scalars, fold_last_dim_size
from .rules.gather import gather_of_log_softmax, push_gather_through_einsum, push_gather_through_function
from .rules.index import PUSH_RULES, fold_index_of_scalar, fuse_index_index, gen_index_parts
from .rules.rearrange import fuse_rearrange_rearrange, remove_identity_rearrange
from .strategies import Strategy, apply, at_root, bottom_up, dynamic, fixpoint, normalize, seq, top_down

__all__ = ["optimize", "schedule", "OPTIMIZE_RULES"]

FOLD_RULES = RuleSet(fold_last_dim_size, fold_function_of_scalars, fold_index_of_scalar, name="fold")
#: Rules that move gathers and Indexes down; each reaches into the node's first child.
PUSH_DOWN_RULES = RuleSet(gather_of_log_softmax, push_gather_through_function, push_gather_through_einsum,
                          fuse_index_index, *PUSH_RULES, name="push_down")
CLEANUP_RULES = RuleSet(fuse_rearrange_rearrange, remove_identity_rearrange, name="cleanup")
OPTIMIZE_RULES = FOLD_RULES + PUSH_DOWN_RULES + CLEANUP_RULES + RuleSet(contraction_order)

#: A gather whose result has at most this fraction of its input's entries is pushed into the
#: input even when the input is shared: recomputing only the gathered entries costs that fraction.
SMALL_GATHER = 1 / 16
#: Rewrites at one node in one push-down pass before ``RewriteLoopError``.
MAX_STEPS_AT_A_NODE = 100


def _reads_alone(root: Circuit) -> Callable[[Circuit], bool]:
    """Whether no node of ``root`` but this one reads the node's first child (a node built since
    by a rule has no other reader)."""
    parents = parents_map(root)
    return lambda node: not node.children or len(parents.get(node.children[0].hash, ())) < 2


def push_down(root: Circuit) -> Strategy:
    """One push-down pass over ``root``: top-down, each node rewritten by ``PUSH_DOWN_RULES``
    until none applies, but only into a child no other node reads, or by a small gather."""
    alone = _reads_alone(root)

    def small_gather(node):
        return (not alone(node) and gen_index_parts(node) is not None
                and node.numel <= SMALL_GATHER * node.children[0].numel)

    rules = when(alone, PUSH_DOWN_RULES) + when(small_gather, push_gather_through_einsum)
    return top_down(fixpoint(at_root(RuleSet(rules, name="push_down")), max_steps=MAX_STEPS_AT_A_NODE))


def schedule(max_steps: int = 20) -> Strategy:
    """The strategies ``optimize`` runs, in order (see the module docstring); ``max_steps``:
    push-down passes (a step of ``fixpoint`` is one pass) before ``RewriteLoopError``."""
    return seq(
        normalize(FOLD_RULES),
        fixpoint(dynamic(push_down), max_steps=max_steps),
        normalize(RuleSet(CLEANUP_RULES, FOLD_RULES, name="cleanup + fold")),
        bottom_up(contraction_order),
    )


def optimize(circuit: Circuit, *, trace: Trace | None = None, max_steps: int = 20, where=None,
             stop_at=None) -> Circuit:
    """``circuit`` rewritten to evaluate faster, with the same value: ``schedule(max_steps)`` (see
    the module docstring).  Pass a ``rewrites.Trace`` to see which rules fired where;
    ``where`` / ``stop_at`` (matchers) scope it to a region as in ``rewrites.apply``.

    >>> import numpy as np
    >>> from circuits import Array, Einsum
    >>> a, b, c = (Array(np.ones(s, np.float32)) for s in [(2, 30), (30, 40), (40,)])
    >>> optimize(Einsum.from_spec('ab,bc,c->a', a, b, c)).payload_text()
    'ab,b->a'
    """
    return apply(schedule(max_steps), circuit, trace, where=where, stop_at=stop_at)
