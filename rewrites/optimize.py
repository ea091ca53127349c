"""``optimize(circuit)``: value-preserving rewrites that make a circuit faster to evaluate.

Run it on request, before compiling.  In order:

1. fold constants (``last_dim_size`` of anything, elementwise functions of Scalars, an Index of a
   Scalar);
2. move gathers and Indexes towards the leaves, so that only the entries that are used are
   computed — above all, **a gather of a log_softmax becomes the gathered logit minus the
   logsumexp**, so the full log-probability tensor is never formed (the per-token loss of a
   language model reads one log-probability per position out of ``[positions, vocab]``).
   A node read by several parents is not pushed into: its full value is needed anyway, and a
   pushed copy would be computed besides;
3. nest every Einsum of three or more operands in the cheapest pairwise order (opt_einsum);
4. compute a large ``logsumexp`` of an Einsum (a language model's normaliser over its vocabulary)
   chunk by chunk along the reduced axis — ``logsumexp`` of the chunks' ``logsumexp`` — so the
   full logit matrix is never held in memory at once (each chunk stays in cache).

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

from circuits.errors import CircuitError
from circuits.functions import gen_index_name
from circuits.nodes import Add, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar
from circuits.traversal import deep_map, toposort

from .engine import RuleSet, Trace, check_result, name_result, rule
from .rules.contraction import contraction_order
from .rules.functions import fold_function_of_scalars, fold_last_dim_size
from .rules.index import PUSH_RULES, fold_index_of_scalar, fuse_index_index, gen_index_parts
from .rules.rearrange import fuse_rearrange_rearrange, remove_identity_rearrange
from .strategies import apply, bottom_up, normalize

__all__ = ["optimize", "gather_of_log_softmax", "push_gather_through_function", "push_gather_through_einsum",
           "chunk_logsumexp",
           "OPTIMIZE_RULES"]

# Functions f with f(NaN ...) = NaN: a checked gather's out-of-range NaN survives the swap.
_NAN_PROPAGATING = frozenset((
    "exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "rsqrt", "reciprocal", "sigmoid", "relu",
    "gelu", "gelu_new", "silu", "square", "softmax", "log_softmax", "logsumexp", "max", "min", "mean",
))


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
    picked = GeneralFunction(g.name, z, idx)
    lse = GeneralFunction("logsumexp", z)
    if g.layout != "batch" and idx.shape:
        # The gathered axes sit where z's last axis was (or first): give logsumexp unit axes there.
        lead = " ".join(f"a{i}" for i in range(len(lse.shape)))
        units = " ".join("1" for _ in idx.shape)
        spec = f"{lead} -> {units} {lead}" if g.layout == "first" else f"{lead} -> {lead} {units}"
        lse = Rearrange(lse, spec.strip())
    ids = tuple(range(len(lse.shape)))
    neg_lse = Einsum(lse, Scalar(-1.0), in_axes=(ids, ()), out_axes=ids)
    out = Add(picked, neg_lse)
    return out if out.shape == node.shape and out.dtype == node.dtype else None


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
    if g.checked and spec.name not in _NAN_PROPAGATING:
        return None
    (z,) = f.children
    leading = len(z.shape) - core
    if ax >= leading or len(f.shape) < leading:
        return None
    # The gathered axis keeps its position counted from the front; counted from the back it
    # moves with the difference between the ranks of z and f(z).
    new_d = g.d if g.d >= 0 else ax - len(z.shape)
    out = GeneralFunction(spec, GeneralFunction(gen_index_name(new_d, g.batch_x, g.checked, g.batch_index), z, idx))
    return out if out.shape == node.shape and out.dtype == node.dtype else None


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
    holders = [i for i, axes in enumerate(z.in_axes) if v in axes]
    if len(holders) != 1 or z.in_axes[holders[0]].count(v) != 1:
        return None
    (h,) = holders
    axes = z.in_axes[h]
    p = axes.index(v)
    if batch:
        idx_ids = z.out_axes[: len(idx.shape)]
    else:
        fresh = max((a for t in z.in_axes for a in t), default=-1) + 1
        idx_ids = tuple(range(fresh, fresh + len(idx.shape)))
    # The index's axes replace the operand's axis where it is (the plain form at p = 0).
    gathered = GeneralFunction(gen_index_name(p, False, g.checked, batch_index=p == 0), z.children[h], idx)
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
    return out if out.shape == node.shape and out.dtype == node.dtype else None


#: A gather whose result has at most this fraction of its input's entries is pushed into the
#: input even when the input is shared: recomputing only the gathered entries costs that fraction.
SMALL_GATHER = 1 / 16

#: An Einsum feeding a logsumexp is split when it has at least this many entries ...
CHUNK_MIN_ENTRIES = 1 << 21
#: ... into chunks of about this many entries (small enough to stay in a CPU's cache).
CHUNK_ENTRIES = 1 << 19
_MAX_CHUNKS = 64


@rule(on=GeneralFunction, example=(
    "'lse' GeneralFunction logsumexp\n  'z' Einsum sh,vh->sv\n    'x' [3,4] Symbol\n    'w' [6,4] Symbol",
    "'lse' GeneralFunction logsumexp\n  0 Concat 1\n    1 Rearrange a0 -> a0 1\n"
    "      2 GeneralFunction logsumexp\n        3 Einsum sh,vh->sv\n"
    "          'x' [3,4] Symbol\n          4 [3,4] Index [0:3]\n"
    "            'w' [6,4] Symbol\n    5 Rearrange a0 -> a0 1\n"
    "      6 GeneralFunction logsumexp\n        7 Einsum sh,vh->sv\n          'x'\n"
    "          8 [3,4] Index [3:6]\n            'w'",
))
def chunk_logsumexp(node, *, chunks: int | None = None):
    """``logsumexp`` over the last axis of an Einsum whose last axis comes from one operand only
    (logits = activations times an unembedding) is the ``logsumexp`` of the per-chunk
    ``logsumexp`` s, the operand sliced along that axis.  Same value; no chunk is large.  Fires on
    Einsums of at least ``CHUNK_MIN_ENTRIES`` entries unless ``chunks`` is given (as in the
    example, which splits in two)."""
    if node.function.name != "logsumexp":
        return None
    (z,) = node.children
    if not isinstance(z, Einsum) or not z.out_axes:
        return None
    v = z.out_axes[-1]
    holders = [i for i, axes in enumerate(z.in_axes) if v in axes]
    if len(holders) != 1 or z.in_axes[holders[0]].count(v) != 1:
        return None
    n = z.shape[-1]
    if chunks is None:
        if z.numel < CHUNK_MIN_ENTRIES:
            return None
        chunks = min(_MAX_CHUNKS, -(-z.numel // CHUNK_ENTRIES), n)
    if chunks < 2:
        return None
    (h,) = holders
    w = z.children[h]
    pos = z.in_axes[h].index(v)
    size = -(-n // chunks)
    lead = " ".join(f"a{i}" for i in range(len(z.shape) - 1)) if len(z.shape) > 1 else ""
    parts = []
    for start in range(0, n, size):
        sel = (slice(None),) * pos + (slice(start, min(start + size, n)),)
        piece = z.with_children(z.children[:h] + (Index(w, sel),) + z.children[h + 1:]).rename(None)
        lse = GeneralFunction("logsumexp", piece)
        parts.append(Rearrange(lse, f"{lead} -> {lead} 1".strip() if lead else " -> 1"))
    out = GeneralFunction("logsumexp", Concat(*parts, axis=len(z.shape) - 1))
    return out if out.shape == node.shape and out.dtype == node.dtype else None


def _chunk_pass(root: Circuit, trace: Trace | None) -> Circuit:
    """Apply ``chunk_logsumexp`` where the Einsum has no other parent (else the full logits are
    computed anyway and chunking only adds work)."""
    counts = _parent_counts(root)

    def visit(node):
        if not (isinstance(node, GeneralFunction) and node.function.name == "logsumexp"):
            return None
        if counts.get(node.children[0].hash, 1) != 1:
            return None
        out = chunk_logsumexp.fn(node)
        if out is None:
            return None
        check_result(chunk_logsumexp.name, node, out)
        out = name_result(node, out)
        if trace is not None:
            trace.record(chunk_logsumexp.name, node, out)
        return out

    return deep_map(root, visit)


FOLD_RULES = RuleSet(fold_last_dim_size, fold_function_of_scalars, fold_index_of_scalar, name="fold")
#: Rules that move gathers and Indexes down; applied only into nodes with one parent.
PUSH_DOWN_RULES = RuleSet(gather_of_log_softmax, push_gather_through_function, push_gather_through_einsum,
                          fuse_index_index,
                          *PUSH_RULES, name="push_down")
CLEANUP_RULES = RuleSet(fuse_rearrange_rearrange, remove_identity_rearrange, name="cleanup")
OPTIMIZE_RULES = FOLD_RULES + PUSH_DOWN_RULES + CLEANUP_RULES + RuleSet(contraction_order)


def _parent_counts(root: Circuit) -> dict[bytes, int]:
    counts: dict[bytes, int] = {root.hash: 1}
    for node in toposort(root):
        for c in set(node.children):
            counts[c.hash] = counts.get(c.hash, 0) + 1
    return counts


def _rewrite_top(node: Circuit, counts: dict, trace: Trace | None) -> Circuit:
    """Push-down rules at ``node`` until none applies.  A rule reaches into the node's first
    child, so it may fire only when that child has no other parent (a node a rule has just
    built has none)."""
    for _ in range(_MAX_STEPS_AT_A_NODE):
        if not node.children:
            return node
        rules = PUSH_DOWN_RULES.for_type(type(node))
        if counts.get(node.children[0].hash, 1) != 1:
            if gen_index_parts(node) is None or node.numel > SMALL_GATHER * node.children[0].numel:
                return node
            rules = (push_gather_through_einsum,)
        for r in rules:
            out = r.fn(node)
            if out is None or out == node:
                continue
            check_result(r.name, node, out)
            out = name_result(node, out)
            if trace is not None:
                trace.record(r.name, node, out)
            node = out
            break
        else:
            return node
    return node


_MAX_STEPS_AT_A_NODE = 100


def _push_down_pass(root: Circuit, trace: Trace | None) -> Circuit:
    """One top-down pass: each node is rewritten at the top first, then its children are visited,
    so an Index pushed below a node keeps moving down in the same pass (a 50,000-deep chain
    takes one pass).  Iterative, each distinct node once."""
    counts = _parent_counts(root)
    done: dict[bytes, Circuit] = {}
    started: set[bytes] = set()
    stack: list = [(root, None)]
    while stack:
        node, top = stack.pop()
        h = node.hash
        if top is not None:  # all of top's children are done: rebuild it over them
            done[h] = top.with_children(tuple(done[c.hash] for c in top.children))
            continue
        if h in done or h in started:
            continue
        started.add(h)
        top = _rewrite_top(node, counts, trace)
        if not top.children:
            done[h] = top
            continue
        stack.append((node, top))
        for c in reversed(top.children):
            if c.hash not in done:
                stack.append((c, None))
    return done[root.hash]


def optimize(circuit: Circuit, *, trace: Trace | None = None, max_passes: int = 20) -> Circuit:
    """``circuit`` rewritten to evaluate faster, with the same value (see the module docstring).
    Pass a ``rewrites.Trace`` to see which rules fired where.

    >>> import numpy as np
    >>> from circuits import Array, Einsum
    >>> a, b, c = (Array(np.ones(s, np.float32)) for s in [(2, 30), (30, 40), (40,)])
    >>> optimize(Einsum.from_spec('ab,bc,c->a', a, b, c)).payload_text()
    'ab,b->a'
    """
    c = apply(normalize(FOLD_RULES), circuit, trace)
    for _ in range(max_passes):
        nxt = _push_down_pass(c, trace)
        if nxt == c:
            break
        c = nxt
    c = apply(normalize(CLEANUP_RULES + FOLD_RULES), c, trace)
    c = apply(bottom_up(contraction_order), c, trace)
    return _chunk_pass(c, trace)
