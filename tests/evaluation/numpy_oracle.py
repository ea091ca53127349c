"""A plain-numpy evaluator (float64), written independently of the JAX lowering: the oracle the
evaluation tests compare against."""

from __future__ import annotations

import math

import einops
import numpy as np

from circuits import Add, Array, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag, toposort
from circuits.nodes.einsum import AXIS_LETTERS


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logsumexp(x):
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


# The numpy meaning of every function circuits.functions registers itself.
NUMPY_FUNCTIONS = {
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
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_new": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x * _sigmoid(x),
    "square": lambda x: x * x,
    "pow": lambda x, y: np.power(x, y),
    "softmax": _softmax,
    "log_softmax": lambda x: x - _logsumexp(x)[..., None],
    "logsumexp": _logsumexp,
    "max": lambda x: x.max(axis=-1),
    "min": lambda x: x.min(axis=-1),
    "mean": lambda x: x.mean(axis=-1),
    "last_dim_size": lambda x: np.full(x.shape[:-1], float(x.shape[-1])),
}


def gen_index(name: str, x, idx):
    """``gen_index_at_<d>[_batch_x][_c]`` by loops over numpy indexing."""
    parts = name[len("gen_index_at_"):].split("_")
    d = int(parts[0])
    batch_x = "batch" in name
    checked = name.endswith("_c")
    idx = np.asarray(idx)
    b = idx.ndim if batch_x else 0
    ax = x.ndim + d if d < 0 else b + d
    n = x.shape[ax]
    if batch_x:
        out = np.empty(x.shape[:ax] + x.shape[ax + 1:], dtype=np.float64)
        for pos in np.ndindex(*idx.shape):
            i = int(idx[pos])
            bad = (i < 0 or i >= n) if checked else not -n <= i < n
            row = x[pos]
            out[pos] = np.nan if bad else np.take(row, i, axis=ax - b)
        return out
    flat = idx.reshape(-1)
    cols = []
    for i in flat:
        i = int(i)
        bad = (i < 0 or i >= n) if checked else not -n <= i < n
        cols.append(np.full(x.shape[:ax] + x.shape[ax + 1:], np.nan) if bad else np.take(x, i, axis=ax))
    stacked = np.stack(cols, axis=ax) if cols else np.zeros(x.shape[:ax] + (0,) + x.shape[ax + 1:])
    return stacked.reshape(x.shape[:ax] + idx.shape + x.shape[ax + 1:])


def _index(node: Index, x):
    pos = 0
    for entry in node.full_index():
        if isinstance(entry, slice):
            x = x[(slice(None),) * pos + (entry,)]
            pos += 1
        elif isinstance(entry, np.ndarray):
            x = np.take(x, entry, axis=pos)
            pos += 1
        else:
            x = np.take(x, entry, axis=pos)
    return x


def _rearrange(node: Rearrange, x):
    out_names = {a for g in node.out_groups for a in g}

    def side(groups, drop_missing):
        words = []
        for g in groups:
            names = [a for a in g if not (drop_missing and a not in out_names)]
            if len(g) == 1 and names:
                words.append(names[0])
            elif not names:
                words.append("1")  # a unit axis, or a size-1 axis only on the left
            else:
                words.append("(" + " ".join(names) + ")")
        return " ".join(words)

    in_names = {a for g in node.in_groups for a in g}
    sizes = {k: v for k, v in node.sizes if k in in_names & out_names or k not in in_names}
    pattern = f"{side(node.in_groups, True)} -> {side(node.out_groups, False)}"
    return einops.repeat(x, pattern, **sizes)


def numpy_evaluate(root, inputs=None):
    """Float64 numpy value of ``root`` (ints stay ints); ``inputs`` keyed by Symbol name."""
    inputs = inputs or {}
    env = {}
    for n in toposort(root):
        kids = [env[c.hash] for c in n.children]
        t = type(n)
        if t is Array:
            v = np.asarray(n.value)
            env[n.hash] = v.astype(np.float64) if v.dtype.kind == "f" or str(v.dtype) == "bfloat16" else v
        elif t is Scalar:
            env[n.hash] = np.full(n.shape, n.value, dtype=np.float64)
        elif t is Symbol:
            v = np.asarray(inputs[n.name])
            env[n.hash] = v.astype(np.float64) if n.dtype.startswith("float") else v
        elif t is Einsum:
            if not kids:
                env[n.hash] = np.float64(1.0)
                continue
            # np.einsum takes ASCII letters only: number the ids in order of appearance
            letter = {a: AXIS_LETTERS[i] for i, a in enumerate(sorted({a for t_ in n.in_axes for a in t_}))}
            spec = ",".join("".join(letter[a] for a in t_) for t_ in n.in_axes)
            spec += "->" + "".join(letter[a] for a in n.out_axes)
            env[n.hash] = np.einsum(spec, *[np.asarray(k, dtype=np.float64) for k in kids])
        elif t is Add:
            total = np.float64(0.0)
            for k in kids:
                total = total + k
            env[n.hash] = np.broadcast_to(total, n.shape)
        elif t is GeneralFunction:
            name = n.function.name
            if name.startswith("gen_index_at_"):
                env[n.hash] = gen_index(name, kids[0], kids[1])
            else:
                env[n.hash] = NUMPY_FUNCTIONS[name](*kids)
        elif t is Index:
            env[n.hash] = _index(n, kids[0])
        elif t is Rearrange:
            env[n.hash] = _rearrange(n, kids[0])
        elif t is Concat:
            env[n.hash] = np.concatenate(kids, axis=n.axis)
        elif t is Tag:
            env[n.hash] = kids[0]
        else:
            raise TypeError(f"oracle has no rule for {t.__name__}")
    return np.asarray(env[root.hash])
