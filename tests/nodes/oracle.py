"""An independent reference evaluator: plain numpy (and einops for Rearrange), float64, one node at
a time in toposort order.  It shares nothing with ``circuits.backend`` but the node classes."""

from __future__ import annotations

import math

import einops
import numpy as np

from circuits import Add, Array, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag
from circuits.nodes.einsum import AXIS_LETTERS
from circuits.traversal import toposort


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logsumexp(x):
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


_erf = np.vectorize(math.erf, otypes=[np.float64])

UNARY = {
    "exp": np.exp,
    "log": np.log,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_new": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x * _sigmoid(x),
    "square": lambda x: x * x,
    "step": lambda x: (x > 0).astype(x.dtype),
    "log_exp_p_1": lambda x: np.log(np.exp(x) + 1.0),
    "gaussian_pdf": lambda x: np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi),
    "gaussian_cdf": lambda x: 0.5 * (1.0 + _erf(x / math.sqrt(2.0))),
    "logit": lambda x: np.log(x / (1.0 - x)),
    "softmax": _softmax,
    "log_softmax": lambda x: x - _logsumexp(x)[..., None],
    "logsumexp": _logsumexp,
    "max": lambda x: x.max(axis=-1),
    "min": lambda x: x.min(axis=-1),
    "mean": lambda x: x.mean(axis=-1),
    "last_dim_size": lambda x: np.full(x.shape[:-1], float(x.shape[-1])),
}


def gen_index(name: str, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``gen_index_at_<d>[_batch_x][_no_batch_index][_c]`` by explicit loops (slow, obviously
    right), with rust_circuit's layouts: plain puts the index's axes first, ``_batch_x`` batches
    x's leading axes with the index's, ``_no_batch_index`` puts the index's axes where axis d was."""
    body = name[len("gen_index_at_"):]
    batch = "_batch_x" in body
    batch_index = "_no_batch_index" not in body
    checked = body.endswith("_c")
    d = int(body.split("_")[0])
    idx = np.asarray(idx, dtype=np.int64)
    q = idx.ndim
    if batch and batch_index:
        ax = x.ndim + d if d < 0 else q + d
        out = np.empty(x.shape[:ax] + x.shape[ax + 1:])
        for pos in np.ndindex(*out.shape):
            b = pos[:q]
            i = int(idx[b])
            src = pos[:ax] + (i,) + pos[ax:]
            out[pos] = _gather_one(x, src, ax, i, checked)
        return out
    ax = x.ndim + d if d < 0 else d
    if batch_index:  # index axes first
        out = np.empty(idx.shape + x.shape[:ax] + x.shape[ax + 1:])
        for pos in np.ndindex(*out.shape):
            i = int(idx[pos[:q]])
            rest = pos[q:]
            src = rest[:ax] + (i,) + rest[ax:]
            out[pos] = _gather_one(x, src, ax, i, checked)
        return out
    out = np.empty(x.shape[:ax] + idx.shape + x.shape[ax + 1:])
    for pos in np.ndindex(*out.shape):
        i = int(idx[pos[ax: ax + q]])
        src = pos[:ax] + (i,) + pos[ax + q:]
        out[pos] = _gather_one(x, src, ax, i, checked)
    return out


def _gather_one(x, src, ax, i, checked):
    n = x.shape[ax]
    if checked and not 0 <= i < n:
        return np.nan
    if not -n <= i < n:
        return np.nan
    return x[src]


def index_outer(x: np.ndarray, index) -> np.ndarray:
    """Apply an Index entry tuple axis by axis (outer indexing)."""
    axis = 0
    for e in index:
        if isinstance(e, slice):
            x = x[(slice(None),) * axis + (e,)]
            axis += 1
        elif isinstance(e, np.ndarray):
            x = np.take(x, e, axis=axis)
            axis += 1
        else:
            x = np.take(x, e, axis=axis)
    return x


def rearrange(x: np.ndarray, node: Rearrange) -> np.ndarray:
    """The node's rearrangement via einops: drop left-only (size-1) axes with a reduce, then
    rearrange/repeat into the output."""
    sizes = dict(node.sizes)
    ins, outs = node.in_groups, node.out_groups
    out_names = {a for g in outs for a in g}
    in_names = {a for g in ins for a in g}

    def side(groups):
        return " ".join("(" + " ".join(g) + ")" if len(g) != 1 else g[0] for g in groups) if groups else ""

    lhs = side(ins).replace("()", "1")
    kept = [a for g in ins for a in g if a in out_names]
    mid = " ".join(kept)
    x = np.asarray(einops.reduce(x, f"{lhs} -> {mid}", "sum", **{a: sizes[a] for a in in_names}))
    rhs = side(outs).replace("()", "1")
    new = {a: sizes[a] for a in out_names - in_names}
    return np.asarray(einops.repeat(x, f"{mid} -> {rhs}", **new))


def einsum(node: Einsum, values) -> np.ndarray:
    if not values:
        return np.array(1.0)
    ids = sorted({a for t in node.in_axes for a in t})
    letter = {a: AXIS_LETTERS[i] for i, a in enumerate(ids)}
    spec = ",".join("".join(letter[a] for a in t) for t in node.in_axes)
    spec += "->" + "".join(letter[a] for a in node.out_axes)
    return np.einsum(spec, *values)


def node_value(node, values, inputs=None) -> np.ndarray:
    """The value of one node given its children's values (float64)."""
    return np.asarray(_node_value(node, values, inputs))


def _node_value(node, values, inputs):
    t = type(node)
    if t is Array:
        v = node.numpy()
        return v.astype(np.float64) if v.dtype.kind == "f" else v
    if t is Scalar:
        return np.full(node.shape, node.value, dtype=np.float64)
    if t is Symbol:
        v = np.asarray(inputs[node])
        return v.astype(np.float64) if v.dtype.kind == "f" else v
    if t is Einsum:
        return einsum(node, [np.asarray(v, np.float64) for v in values])
    if t is Add:
        out = np.zeros(node.shape)
        for v in values:
            out = out + v
        return np.broadcast_to(out, node.shape)
    if t is GeneralFunction:
        name = node.function.name
        if name.startswith("gen_index_at_"):
            return gen_index(name, np.asarray(values[0], np.float64), values[1])
        if name == "pow":
            return np.power(values[0], values[1])
        return UNARY[name](np.asarray(values[0], np.float64))
    if t is Index:
        return index_outer(values[0], node.index)
    if t is Rearrange:
        return rearrange(values[0], node)
    if t is Concat:
        return np.concatenate([np.asarray(v, np.float64) for v in values], axis=node.axis)
    if t is Tag:
        return values[0]
    raise NotImplementedError(t)


def evaluate(circuit, inputs=None) -> np.ndarray:
    """Reference value of a whole circuit, each distinct node once."""
    env = {}
    for node in toposort(circuit):
        env[node] = node_value(node, [env[c] for c in node.children], inputs)
    return np.asarray(env[circuit], dtype=np.float64)
