"""Gather rules: move a gather (``gen_index_at_*``) towards the leaves.

A gather reads a few entries of its first argument; moved below the node that computes that
argument, it makes that node compute only those entries.  Above all, **a gather of a
log_softmax is the gathered logit minus the logsumexp**, so the full log-probability tensor is
never formed (the per-token loss of a language model reads one log-probability per position out
of ``[positions, vocab]``), and a gather of logits ``x @ w`` is one dot product per position.
Each rule keeps the value exactly, including the NaN a checked gather (``_c``) gives for an
out-of-range index.  These rules make evaluation faster without simplifying, so they are not
part of ``simp``; ``rewrites.optimize`` runs them (never into a node that other nodes read too).

>>> from circuits import GeneralFunction, Symbol
>>> z, t = Symbol((3, 5), name='z'), Symbol((3,), name='t', dtype='int64')
>>> ll = GeneralFunction('gen_index_at_0_batch_x_c', GeneralFunction('log_softmax', z), t)
>>> gather_of_log_softmax(ll).line()
'Add'
"""

from __future__ import annotations

from circuits.backend import gathered_minus_logsumexp
from circuits.errors import CircuitError
from circuits.functions import GenIndex
from circuits.nodes import Einsum, GeneralFunction

from ..engine import RuleSet, rule
from ._common import same_type, sole_holder
from .index import gen_index_parts

__all__ = ["gather_of_log_softmax", "push_gather_through_function", "push_gather_through_einsum", "RULES"]


@rule(on=GeneralFunction, example=(
    "'ll' GeneralFunction gen_index_at_0_batch_x_c\n  'lp' GeneralFunction log_softmax\n"
    "    'z' [3,5] Symbol\n  't' [3] Symbol int64",
    "'ll' Add\n  0 GeneralFunction gen_index_at_0_batch_x_c\n    'z' [3,5] Symbol\n    't' [3] Symbol int64\n"
    "  1 Einsum a,->a\n    2 GeneralFunction logsumexp\n      'z'\n    3 [] Scalar -1",
))
def gather_of_log_softmax(node):
    """A gather along the last axis of ``log_softmax(z)`` is the gather of ``z`` minus
    ``logsumexp(z)`` (broadcast over the index's axes): the log-probabilities are never formed."""
    parts = gen_index_parts(node)
    if parts is None:
        return None
    g, ax = parts
    lsm, idx = node.children
    if not (isinstance(lsm, GeneralFunction) and lsm.function.name == "log_softmax"):
        return None
    (z,) = lsm.children
    if ax != len(z.shape) - 1:
        return None
    out = gathered_minus_logsumexp(GeneralFunction(g.name, z, idx), GeneralFunction("logsumexp", z), g, idx)
    return same_type(node, out)


@rule(on=GeneralFunction, example=(
    "'rows' GeneralFunction gen_index_at_0\n  'p' GeneralFunction softmax\n    'z' [4,5] Symbol\n"
    "  't' [2] Symbol int64",
    "'rows' GeneralFunction softmax\n  0 GeneralFunction gen_index_at_0\n    'z' [4,5] Symbol\n"
    "    't' [2] Symbol int64",
))
def push_gather_through_function(node):
    """A gather along a leading (batch) axis of a one-argument function acting on its last
    axes — elementwise, softmax, logsumexp... — is the function of the gathered argument, so only
    the gathered rows are computed."""
    parts = gen_index_parts(node)
    if parts is None:
        return None
    g, ax = parts
    f, idx = node.children
    if not isinstance(f, GeneralFunction) or len(f.children) != 1:
        return None
    spec = f.function
    core = 0 if spec.elementwise else spec.core_ndim
    if core is None or gen_index_parts(f) is not None:
        return None
    if g.checked and not spec.propagates_nan:
        return None  # the checked gather's out-of-range NaN must survive the swap
    (z,) = f.children
    leading = len(z.shape) - core
    if ax >= leading or len(f.shape) < leading:
        return None
    # The gathered axis keeps its position counted from the front; counted from the back it
    # moves with the difference between the ranks of z and f(z).
    out = GeneralFunction(spec, GeneralFunction(g.moved(ax, len(z.shape), len(idx.shape)).name, z, idx))
    return same_type(node, out)


@rule(on=GeneralFunction, example=(
    "'picked' GeneralFunction gen_index_at_0_batch_x_c\n  'z' Einsum sh,vh->sv\n    'x' [3,4] Symbol\n"
    "    'w' [6,4] Symbol\n  't' [3] Symbol int64",
    "'picked' Einsum sh,sh->s\n  'x' [3,4] Symbol\n  0 GeneralFunction gen_index_at_0_c\n"
    "    'w' [6,4] Symbol\n    't' [3] Symbol int64",
))
def push_gather_through_einsum(node):
    """A gather along an Einsum axis that only one operand carries is the Einsum over that
    operand gathered: the logit of the true token is one dot product per position, not a row of
    the whole logit matrix.  With ``_batch_x`` the index's axes are the Einsum's leading output
    axes, so the gathered operand reads them as the same ids."""
    parts = gen_index_parts(node)
    if parts is None:
        return None
    g, ax = parts
    batch = g.layout == "batch"
    z, idx = node.children
    if not isinstance(z, Einsum):
        return None
    v = z.out_axes[ax]
    h = sole_holder(z, v)
    if h is None:
        return None
    axes = z.in_axes[h]
    p = axes.index(v)
    if batch:
        idx_ids = z.out_axes[: len(idx.shape)]
    else:
        fresh = max((a for t in z.in_axes for a in t), default=-1) + 1
        idx_ids = tuple(range(fresh, fresh + len(idx.shape)))
    # The index's axes replace the operand's axis where it is (the plain form at p = 0).
    gathered = GeneralFunction(GenIndex(p, False, p == 0, g.checked).name, z.children[h], idx)
    in_axes = z.in_axes[:h] + (axes[:p] + idx_ids + axes[p + 1:],) + z.in_axes[h + 1:]
    if batch:
        out_axes = z.out_axes[:ax] + z.out_axes[ax + 1:]
    elif g.layout == "first":
        out_axes = idx_ids + z.out_axes[:ax] + z.out_axes[ax + 1:]
    else:
        out_axes = z.out_axes[:ax] + idx_ids + z.out_axes[ax + 1:]
    try:
        out = Einsum(*z.children[:h], gathered, *z.children[h + 1:], in_axes=in_axes, out_axes=out_axes)
    except CircuitError:  # e.g. more axis ids than an einsum can letter
        return None
    return same_type(node, out)


RULES = RuleSet(gather_of_log_softmax, push_gather_through_function, push_gather_through_einsum, name="gather")
