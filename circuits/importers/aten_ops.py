"""The ATen op -> circuit converters of the torch.export importer: one small function per op,
found through one table (``CONVERTERS``, keyed by the op's name without its overload: ``'add'``
serves ``aten.add.Tensor`` and ``aten.add.Scalar``).

A converter gets a ``Site`` (the node's readable name and how to turn a folded constant into a
node) and the op's arguments, in which every tensor is a ``Circuit`` or a ``Const`` (a value known
at import time: masks, rotary tables, position ids) and everything else is as torch.export wrote
it (ints, floats, lists, None).  It returns a circuit (or a tuple of them, for ``split``), or
raises ``Unsupported`` with the reason when it meets an argument it does not handle.  Ops whose
tensor arguments are all constants never reach a converter: the importer runs them in torch.

How ops map onto nodes: matmuls and products are Einsums; view, permute, unsqueeze and expand are
Rearranges; slice and select are Indexes; embedding and tensor indexing are gen_index gathers;
elementwise functions are GeneralFunctions of the registry (``where`` included); sums and means
are Einsums with a scalar factor.

This module imports no torch: converters see only the arguments' values.
"""

from __future__ import annotations

import math
import string

import numpy as np

from ..dtypes import is_float
from ..functions import gen_index_name
from ..nodes import Add, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar
from ..shapes import broadcast_shapes


class Unsupported(Exception):
    """An op, or one of its argument variants, that the importer cannot convert (the message says
    which); the importer collects every one before it raises."""


class Const:
    """A tensor whose value is known at import time (a torch tensor), with the name of where it
    came from (a buffer's key, or the op that computed it).  Made into an Array only where a
    circuit node needs it."""

    __slots__ = ("tensor", "name", "node", "origin")

    def __init__(self, tensor, name, origin=None):
        # origin: (converter, args, kwargs) when the value is a view of another constant.
        self.tensor, self.name, self.node, self.origin = tensor, name, None, origin

    @property
    def shape(self):
        return tuple(self.tensor.shape)


class Site:
    """Where a converter works: ``name`` for its result, ``part(s)`` for the nodes it makes on the
    way (``<name>.<s>``), ``node(v)`` to turn an argument into a circuit node."""

    __slots__ = ("name", "_materialize")

    def __init__(self, name, materialize):
        self.name, self._materialize = name, materialize

    def part(self, suffix: str) -> str:
        return f"{self.name}.{suffix}" if self.name else suffix

    def node(self, value) -> Circuit:
        if isinstance(value, Circuit):
            return value
        if isinstance(value, Const):
            return self._materialize(value)
        if isinstance(value, (bool, int, float)):
            return Scalar(float(value))
        raise Unsupported(f"an argument of type {type(value).__name__} where a tensor was expected")


CONVERTERS: dict = {}


def converts(*names):
    """Register the decorated function as the converter of these ops (by overload packet name)."""

    def add(fn):
        for n in names:
            CONVERTERS[n] = fn
        return fn

    return add


# ---------------------------------------------------------------------------- axis helpers
_LETTERS = string.ascii_lowercase + string.ascii_uppercase


def _axis_names(n: int, start: int = 0) -> list:
    if start + n > len(_LETTERS):
        raise Unsupported(f"a tensor of rank {n} (at most {len(_LETTERS)} axes)")
    return list(_LETTERS[start:start + n])


def _dim(d: int, rank: int) -> int:
    if not -max(rank, 1) <= d < max(rank, 1):
        raise Unsupported(f"dimension {d} for a tensor of rank {rank}")
    return d % max(rank, 1)


def _rearrange(x: Circuit, left, right, name, **sizes) -> Circuit:
    return Rearrange(x, f"{' '.join(left)} -> {' '.join(right)}", name=name, **sizes)


def _reshape_groups(ins, outs):
    """One Rearrange spec (left, right, sizes) taking shape ``ins`` to ``outs``, or None when the
    reshape regroups several axes into several others (then it takes two steps)."""
    left, right, sizes, names = [], [], {}, iter(_LETTERS)
    i = j = 0
    while i < len(ins) or j < len(outs):
        in_unit = i < len(ins) and ins[i] == 1
        out_unit = j < len(outs) and outs[j] == 1
        if in_unit and out_unit:
            n = next(names)
            left.append(n), right.append(n)
            i, j = i + 1, j + 1
        elif in_unit:
            left.append("1")
            i += 1
        elif out_unit:
            right.append("1")
            j += 1
        else:
            if i >= len(ins) or j >= len(outs):
                return None
            gi, gj, pi, pj = [i], [j], ins[i], outs[j]
            i, j = i + 1, j + 1
            while pi != pj:
                if pi < pj and i < len(ins):
                    pi, gi, i = pi * ins[i], gi + [i], i + 1
                elif pj < pi and j < len(outs):
                    pj, gj, j = pj * outs[j], gj + [j], j + 1
                else:
                    return None
            if len(gi) > 1 and len(gj) > 1:
                return None
            group = [next(names) for _ in (gj if len(gi) == 1 else gi)]
            if len(group) == 1:
                left.append(group[0]), right.append(group[0])
            elif len(gi) == 1:
                left.append("(" + " ".join(group) + ")")
                right.extend(group)
                sizes.update({n: outs[k] for n, k in zip(group[1:], gj[1:])})
            else:
                left.extend(group)
                right.append("(" + " ".join(group) + ")")
    return left, right, sizes


def reshape(x: Circuit, shape, name) -> Circuit:
    """``x`` reshaped (torch's view/reshape: row-major) as one Rearrange where one suffices."""
    shape = list(shape)
    if shape.count(-1) == 1:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = x.numel // known if known else 0
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != x.numel:
        raise Unsupported(f"reshape of shape {list(x.shape)} to {list(shape)}")
    if shape == x.shape:
        return x
    groups = _reshape_groups(x.shape, shape)
    if groups is not None:
        left, right, sizes = groups
        return _rearrange(x, left, right, name, **sizes)
    flat = reshape(x, (x.numel,), f"{name}.flat")
    return reshape(flat, shape, name)


def _broadcast(shapes):
    out = broadcast_shapes(shapes)
    if out is None:
        raise Unsupported(f"shapes {', '.join(str(list(s)) for s in shapes)} that do not broadcast")
    return tuple(out)


def _aligned(x: Circuit, out_shape, name):
    """``x`` with its broadcast unit axes dropped, and its einsum axis ids among ``out_shape``'s."""
    off = len(out_shape) - x.ndim
    drop = [k for k in range(x.ndim) if x.shape[k] == 1 and out_shape[off + k] != 1]
    if drop:
        names = _axis_names(x.ndim)
        x = _rearrange(x, ["1" if k in drop else n for k, n in enumerate(names)],
                       [n for k, n in enumerate(names) if k not in drop], name)
    return x, tuple(off + k for k in range(x.ndim + len(drop)) if k not in drop)


def product(site: Site, *factors, name=None) -> Circuit:
    """The broadcasting elementwise product of the factors, as one Einsum."""
    nodes = [site.node(f) for f in factors]
    out = _broadcast([n.shape for n in nodes])
    children, axes = [], []
    for k, n in enumerate(nodes):
        child, ids = _aligned(n, out, site.part(f"b{k}"))
        children.append(child), axes.append(ids)
    return Einsum(*children, in_axes=tuple(axes), out_axes=tuple(range(len(out))), name=name or site.name)


def _negate(site: Site, x, name) -> Circuit:
    x = site.node(x)
    if isinstance(x, Scalar):
        return Scalar(-x.value, x.shape, name=name)
    return product(site, x, -1.0, name=name)


def _scaled(site: Site, x, alpha, name):
    return x if alpha == 1 else product(site, x, float(alpha), name=name)


def _number(value):
    """A Python number for a 0-d constant (torch passes some scalars as tensors)."""
    if isinstance(value, Const) and value.tensor.dim() == 0:
        return value.tensor.item()
    return value


# ---------------------------------------------------------------------------- identities and casts
@converts("contiguous", "clone", "alias", "detach", "lift_fresh_copy", "lift_fresh")
def _identity(site, x, *args, **kwargs):
    return x


@converts("dropout", "feature_dropout", "alpha_dropout")
def _dropout(site, x, p=0.5, train=False):
    if train and p > 0:
        raise Unsupported("dropout in training mode (call module.eval() before importing)")
    return x


@converts("to", "_to_copy", "type_as")
def _to(site, x, *args, **kwargs):
    target = kwargs.get("dtype")
    for a in args:
        if hasattr(a, "is_floating_point") and not isinstance(a, (Const, Circuit)):
            target = a  # a torch.dtype
        elif isinstance(a, (Const, Circuit)):
            target = a.tensor.dtype if isinstance(a, Const) else a.dtype
    if target is None:
        return x
    name = str(target).replace("torch.", "")
    if name == x.dtype or (is_float(name) and is_float(x.dtype)):
        # Floats compute in the evaluation's one precision (float32 by default).
        return x
    raise Unsupported(f"a cast of a computed {x.dtype} tensor to {name}")


# ---------------------------------------------------------------------------- elementwise arithmetic
@converts("add")
def _add(site, a, b, alpha=1):
    b = _scaled(site, b, alpha, site.part("scaled"))
    return Add(site.node(a), site.node(b), name=site.name)


@converts("sub")
def _sub(site, a, b, alpha=1):
    neg = _negate(site, _scaled(site, b, alpha, site.part("scaled")), site.part("neg"))
    return Add(site.node(a), neg, name=site.name)


@converts("rsub")
def _rsub(site, a, b, alpha=1):
    return _sub(site, b, a, alpha)


@converts("neg")
def _neg(site, x):
    return _negate(site, x, site.name)


@converts("mul")
def _mul(site, a, b):
    return product(site, _number(a), _number(b))


@converts("div")
def _div(site, a, b, rounding_mode=None):
    if rounding_mode is not None:
        raise Unsupported(f"division with rounding_mode={rounding_mode!r}")
    b = _number(b)
    if isinstance(b, (int, float)):
        return product(site, a, 1.0 / b)
    recip = GeneralFunction("reciprocal", site.node(b), name=site.part("reciprocal"))
    return product(site, _number(a), recip)


@converts("pow")
def _pow(site, base, exponent):
    return GeneralFunction("pow", site.node(_number(base)), site.node(_number(exponent)), name=site.name)


def _unary(function):
    def convert(site, x):
        return GeneralFunction(function, site.node(x), name=site.name)

    convert.__name__ = f"_{function}"
    return convert


for _op, _fn in {"rsqrt": "rsqrt", "tanh": "tanh", "relu": "relu", "silu": "silu", "sigmoid": "sigmoid",
                 "exp": "exp", "log": "log", "sqrt": "sqrt", "sin": "sin", "cos": "cos", "abs": "abs",
                 "reciprocal": "reciprocal", "square": "square"}.items():
    CONVERTERS[_op] = _unary(_fn)


@converts("gelu")
def _gelu(site, x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"gelu with approximate={approximate!r}")
    return GeneralFunction("gelu" if approximate == "none" else "gelu_new", site.node(x), name=site.name)


@converts("where")
def _where(site, condition, x, y):
    return GeneralFunction("where", site.node(condition), site.node(_number(x)), site.node(_number(y)),
                           name=site.name)


@converts("masked_fill")
def _masked_fill(site, x, mask, value):
    return GeneralFunction("where", site.node(mask), site.node(_number(value)), site.node(x), name=site.name)


# ---------------------------------------------------------------------------- reductions and normalisation
def _reduce(site, x, dims, keepdim, scale, name):
    x = site.node(x)
    dims = range(x.ndim) if dims is None or list(dims) == [] else dims
    dims = sorted({_dim(d, x.ndim) for d in dims})
    n = math.prod(x.shape[d] for d in dims)
    kept = tuple(k for k in range(x.ndim) if k not in dims)
    factors = [x] + ([Scalar(1.0 / n if scale else 1.0)] if scale else [])
    axes = (tuple(range(x.ndim)),) + (((),) if scale else ())
    total = Einsum(*factors, in_axes=axes, out_axes=kept, name=name if not keepdim else f"{name}.reduced")
    if keepdim:
        return reshape(total, [1 if k in dims else x.shape[k] for k in range(x.ndim)], name)
    return total


@converts("mean")
def _mean(site, x, dims=None, keepdim=False, dtype=None):
    return _reduce(site, x, dims, keepdim, True, site.name)


@converts("sum")
def _sum(site, x, dims=None, keepdim=False, dtype=None):
    return _reduce(site, x, dims, keepdim, False, site.name)


def _last_axis_function(site, function, x, dim):
    x = site.node(x)
    dim = _dim(dim, x.ndim)
    if dim == x.ndim - 1 or x.ndim == 0:
        return GeneralFunction(function, x, name=site.name)
    names = _axis_names(x.ndim)
    moved = names[:dim] + names[dim + 1:] + [names[dim]]
    inner = GeneralFunction(function, _rearrange(x, names, moved, site.part("moved")), name=site.part(function))
    return _rearrange(inner, moved, names, site.name)


@converts("softmax", "_softmax")
def _softmax(site, x, dim, *rest):
    return _last_axis_function(site, "softmax", x, dim)


@converts("log_softmax", "_log_softmax")
def _log_softmax(site, x, dim, *rest):
    return _last_axis_function(site, "log_softmax", x, dim)


def _normalize(site, x, normalized_shape, weight, bias, eps, center):
    """Layer norm (``center``) or RMS norm over the last ``len(normalized_shape)`` axes."""
    x = site.node(x)
    k = len(normalized_shape)
    ids = tuple(range(x.ndim))
    lead, norm_ids = ids[:x.ndim - k], ids[x.ndim - k:]
    inv_n = Scalar(1.0 / math.prod(normalized_shape), name=site.part("inv_n"))
    if center:
        neg_mean = Einsum(x, Scalar(-1.0), inv_n, in_axes=(ids, (), ()), out_axes=lead, name=site.part("neg_mean"))
        x = Add(x, _rearrange(neg_mean, _axis_names(len(lead)), _axis_names(len(lead)) + ["1"] * k,
                              site.part("neg_mean.keep")), name=site.part("centered"))
    var = Einsum(x, x, inv_n, in_axes=(ids, ids, ()), out_axes=lead, name=site.part("var"))
    scale = GeneralFunction("rsqrt", Add(var, Scalar(float(eps), name=site.part("eps")), name=site.part("var_p_eps")),
                            name=site.part("rsqrt"))
    children, axes = [x, scale], [ids, lead]
    if weight is not None:
        children.append(site.node(weight)), axes.append(norm_ids)
    y = Einsum(*children, in_axes=tuple(axes), out_axes=ids, name=site.name if bias is None else site.part("scaled"))
    return y if bias is None else Add(y, site.node(bias), name=site.name)


@converts("layer_norm")
def _layer_norm(site, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _normalize(site, x, normalized_shape, weight, bias, eps, center=True)


@converts("rms_norm")
def _rms_norm(site, x, normalized_shape, weight=None, eps=None):
    if eps is None:
        eps = float(np.finfo(np.dtype(site.node(x).dtype if site.node(x).dtype != "bfloat16" else "float32")).eps)
    return _normalize(site, x, normalized_shape, weight, None, eps, center=False)


# ---------------------------------------------------------------------------- matrix products
@converts("linear")
def _linear(site, x, weight, bias=None):
    x, w = site.node(x), site.node(weight)
    ids = tuple(range(x.ndim))
    out = x.ndim
    y = Einsum(x, w, in_axes=(ids, (out, ids[-1])), out_axes=ids[:-1] + (out,),
               name=site.name if bias is None else site.part("matmul"))
    return y if bias is None else Add(y, site.node(bias), name=site.name)


def _matmul(site, a, b, name):
    a, b = site.node(a), site.node(b)
    if a.ndim == 0 or b.ndim == 0:
        raise Unsupported("matmul of a 0-d tensor")
    a2 = a if a.ndim > 1 else _rearrange(a, ["k"], ["1", "k"], site.part("row"))
    b2 = b if b.ndim > 1 else _rearrange(b, ["k"], ["k", "1"], site.part("col"))
    batch = _broadcast([a2.shape[:-2], b2.shape[:-2]])
    nb = len(batch)
    i, k, j = nb, nb + 1, nb + 2
    ca, ia = _aligned_batch(a2, batch, site.part("lhs"))
    cb, ib = _aligned_batch(b2, batch, site.part("rhs"))
    out = tuple(range(nb)) + ((i,) if a.ndim > 1 else ()) + ((j,) if b.ndim > 1 else ())
    if a.ndim == 1:
        ca, ia = a, (k,)
    if b.ndim == 1:
        cb, ib = b, (k,)
    else:
        ib = ib + (k, j)
    if a.ndim > 1:
        ia = ia + (i, k)
    return Einsum(ca, cb, in_axes=(ia, ib), out_axes=out, name=name)


def _aligned_batch(x, batch, name):
    """``x`` ([..., m, n]) with its broadcast batch unit axes dropped, and its batch axis ids."""
    off = len(batch) - (x.ndim - 2)
    drop = [k for k in range(x.ndim - 2) if x.shape[k] == 1 and batch[off + k] != 1]
    if drop:
        names = _axis_names(x.ndim)
        x = _rearrange(x, ["1" if k in drop else n for k, n in enumerate(names)],
                       [n for k, n in enumerate(names) if k not in drop], name)
    return x, tuple(off + k for k in range(len(batch) - off) if k not in drop)


@converts("matmul", "mm", "bmm")
def _matmul_op(site, a, b):
    return _matmul(site, a, b, site.name)


@converts("addmm", "baddbmm")
def _addmm(site, bias, a, b, beta=1, alpha=1):
    prod = _scaled(site, _matmul(site, a, b, site.part("matmul")), alpha, site.part("scaled"))
    return Add(site.node(_scaled(site, bias, beta, site.part("bias"))), site.node(prod), name=site.name)


@converts("scaled_dot_product_attention")
def _sdpa(site, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v over the last two axes; masks are constants (folded)."""
    if dropout_p:
        raise Unsupported("scaled_dot_product_attention with dropout_p > 0")
    q, k, v = site.node(q), site.node(k), site.node(v)
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise Unsupported("scaled_dot_product_attention of tensors of different ranks")
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        if not enable_gqa or q.shape[-3] % k.shape[-3]:
            raise Unsupported(f"scaled_dot_product_attention with {q.shape[-3]} query and {k.shape[-3]} key heads")
        names = _axis_names(q.ndim)
        rep = q.shape[-3] // k.shape[-3]
        grouped = names[:-3] + [f"({names[-3]} r)"] + names[-2:]
        k = _rearrange(k, names, grouped, site.part("k_repeated"), r=rep)
        v = _rearrange(v, names, grouped, site.part("v_repeated"), r=rep)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    lead = tuple(range(q.ndim - 2))
    qi, si, ei, vi = q.ndim - 2, q.ndim - 1, q.ndim, q.ndim + 1
    scores = Einsum(q, k, Scalar(scale, name=site.part("scale")), in_axes=(lead + (qi, ei), lead + (si, ei), ()),
                    out_axes=lead + (qi, si), name=site.part("scores"))
    bias = None
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        bias = np.where(np.tril(np.ones((n_q, n_k), bool)), 0.0, -np.inf).astype(np.float32)
    if attn_mask is not None:
        if not isinstance(attn_mask, Const):
            mask = site.node(attn_mask)
            if mask.dtype == "bool":
                raise Unsupported("a computed boolean attention mask (only constant ones)")
            scores = Add(scores, mask, name=site.part("masked"))
        else:
            m = attn_mask.tensor.numpy()
            m = np.where(m, 0.0, -np.inf).astype(np.float32) if m.dtype == bool else m.astype(np.float32)
            bias = m if bias is None else bias + m
    if bias is not None:
        from ..nodes import Array

        scores = Add(scores, Array(bias, name=site.part("mask")), name=site.part("masked"))
    probs = GeneralFunction("softmax", scores, name=site.part("probs"))
    return Einsum(probs, v, in_axes=(lead + (qi, si), lead + (si, vi)), out_axes=lead + (qi, vi), name=site.name)


# ---------------------------------------------------------------------------- shapes: views, permutations
@converts("view", "reshape", "_unsafe_view")
def _view(site, x, shape):
    return reshape(site.node(x), shape, site.name)


@converts("flatten")
def _flatten(site, x, start_dim=0, end_dim=-1):
    x = site.node(x)
    if x.ndim == 0:
        return reshape(x, (1,), site.name)
    s, e = _dim(start_dim, x.ndim), _dim(end_dim, x.ndim)
    return reshape(x, x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:], site.name)


@converts("unflatten")
def _unflatten(site, x, dim, sizes):
    x = site.node(x)
    d = _dim(dim, x.ndim)
    return reshape(x, x.shape[:d] + tuple(sizes) + x.shape[d + 1:], site.name)


@converts("permute")
def _permute(site, x, dims):
    x = site.node(x)
    dims = [_dim(d, x.ndim) for d in dims]
    if dims == list(range(x.ndim)):
        return x
    names = _axis_names(x.ndim)
    return _rearrange(x, names, [names[d] for d in dims], site.name)


@converts("transpose")
def _transpose(site, x, dim0, dim1):
    x = site.node(x)
    dims = list(range(x.ndim))
    a, b = _dim(dim0, x.ndim), _dim(dim1, x.ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return _permute(site, x, dims)


@converts("t")
def _t(site, x):
    x = site.node(x)
    return x if x.ndim < 2 else _transpose(site, x, 0, 1)


@converts("unsqueeze")
def _unsqueeze(site, x, dim):
    x = site.node(x)
    d = _dim(dim, x.ndim + 1)
    return reshape(x, x.shape[:d] + (1,) + x.shape[d:], site.name)


@converts("squeeze")
def _squeeze(site, x, dims=None):
    x = site.node(x)
    dims = range(x.ndim) if dims is None else [dims] if isinstance(dims, int) else dims
    drop = {_dim(d, x.ndim) for d in dims if x.shape[_dim(d, x.ndim)] == 1}
    return reshape(x, tuple(n for k, n in enumerate(x.shape) if k not in drop), site.name)


@converts("expand")
def _expand(site, x, sizes, implicit=False):
    x = site.node(x)
    sizes = list(sizes)
    new = len(sizes) - x.ndim
    if new < 0:
        raise Unsupported(f"expand of shape {list(x.shape)} to {sizes}")
    names = _axis_names(len(sizes))
    left, right, given = [], [], {}
    for k, (n, size) in enumerate(zip(names, sizes)):
        if k < new:
            right.append(n), given.update({n: size})
        elif size in (-1, x.shape[k - new]):
            left.append(n), right.append(n)
        elif x.shape[k - new] == 1:
            left.append("1"), right.append(n), given.update({n: size})
        else:
            raise Unsupported(f"expand of axis {k - new} (size {x.shape[k - new]}) to {size}")
    if not given:
        return x
    return _rearrange(x, left, right, site.name, **given)


@converts("expand_as")
def _expand_as(site, x, other):
    return _expand(site, x, site.node(other).shape)


@converts("repeat")
def _repeat(site, x, repeats):
    x = site.node(x)
    new = len(repeats) - x.ndim
    names = _axis_names(len(repeats))
    reps = _axis_names(len(repeats), len(repeats))
    left = names[new:]
    right, given = [], {}
    for k, (n, r, times) in enumerate(zip(names, reps, repeats)):
        if k < new:
            right.append(n), given.update({n: times})
        elif times == 1:
            right.append(n)
        else:
            right.append(f"({r} {n})"), given.update({r: times})
    return _rearrange(x, left, right, site.name, **given) if given else x


# ---------------------------------------------------------------------------- indexing
@converts("slice")
def _slice(site, x, dim=0, start=None, end=None, step=1):
    x = site.node(x)
    d = _dim(dim, x.ndim)
    n = x.shape[d]
    start, stop, step = slice(start, end, step).indices(n)
    if (start, stop, step) == (0, n, 1):
        return x
    return Index(x, (slice(None),) * d + (slice(start, stop, step),), name=site.name)


@converts("select")
def _select(site, x, dim, index):
    x = site.node(x)
    d = _dim(dim, x.ndim)
    return Index(x, (slice(None),) * d + (int(index) % x.shape[d],), name=site.name)


def _gather(site, x, index, axis, name):
    """``x`` indexed along ``axis`` by an int tensor, its axes where ``axis`` was (numpy's take)."""
    if isinstance(index, Const) and index.tensor.dim() >= 1:
        # Known indices (positions...) stay in the Index's payload: no int Array, no gather.
        values = index.tensor.numpy().astype(np.int64)
        flat = values.reshape(-1) % x.shape[axis]
        if values.ndim == 1:
            return Index(x, (slice(None),) * axis + (flat,), name=name)
        taken = Index(x, (slice(None),) * axis + (flat,), name=f"{name}.flat")
        return reshape(taken, x.shape[:axis] + values.shape + x.shape[axis + 1:], name)
    idx = site.node(index)
    if not idx.dtype.startswith(("int", "uint")):
        raise Unsupported(f"indexing with a {idx.dtype} tensor (only int indices)")
    return GeneralFunction(gen_index_name(axis, False, True, batch_index=axis == 0), x, idx, name=name)


@converts("embedding")
def _embedding(site, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return _gather(site, site.node(weight), indices, 0, site.name)


@converts("index")
def _index(site, x, indices):
    x = site.node(x)
    used = [k for k, i in enumerate(indices) if i is not None]
    if len(used) != 1:
        raise Unsupported("indexing by several index tensors at once (only one, the others ':')")
    (axis,) = used
    index = indices[axis]
    if isinstance(index, Const) and str(index.tensor.dtype) == "torch.bool":
        raise Unsupported("indexing by a boolean mask (its result's shape depends on the values)")
    return _gather(site, x, index, axis, site.name)


@converts("diagonal")
def _diagonal(site, x, offset=0, dim1=0, dim2=1):
    """The diagonal as an Einsum reading one axis id twice; it becomes the last axis."""
    x = site.node(x)
    a, b = _dim(dim1, x.ndim), _dim(dim2, x.ndim)
    if offset:
        x = _slice(site, x, b if offset > 0 else a, abs(offset), None, 1)
    n = min(x.shape[a], x.shape[b])
    for d in (a, b):
        if x.shape[d] != n:
            x = Index(x, (slice(None),) * d + (slice(0, n),), name=site.part(f"square{d}"))
    ids = list(range(x.ndim))
    ids[b] = a
    rest = tuple(k for k in range(x.ndim) if k not in (a, b))
    return Einsum(x, in_axes=(tuple(ids),), out_axes=rest + (a,), name=site.name)


@converts("cat")
def _cat(site, tensors, dim=0):
    nodes = [site.node(t) for t in tensors]
    nodes = [n for n in nodes if not (n.ndim == 1 and n.shape[0] == 0)] or nodes[:1]
    if len(nodes) == 1:
        return nodes[0]
    return Concat(*nodes, axis=_dim(dim, nodes[0].ndim), name=site.name)


@converts("stack")
def _stack(site, tensors, dim=0):
    nodes = [site.node(t) for t in tensors]
    d = _dim(dim, nodes[0].ndim + 1)
    parts = [reshape(n, n.shape[:d] + (1,) + n.shape[d:], site.part(f"item{k}")) for k, n in enumerate(nodes)]
    return Concat(*parts, axis=d, name=site.name)


def _pieces(site, x, d, sizes):
    x = site.node(x)
    out, start = [], 0
    for k, size in enumerate(sizes):
        piece = (slice(None),) * d + (slice(start, start + size),)
        out.append(x if size == x.shape[d] else Index(x, piece, name=site.part(str(k))))
        start += size
    return tuple(out)


@converts("split")
def _split(site, x, split_size, dim=0):
    n = site.node(x).shape[_dim(dim, site.node(x).ndim)]
    if isinstance(split_size, int):
        sizes = [min(split_size, n - s) for s in range(0, n, split_size)] if split_size else [n]
    else:
        sizes = list(split_size)
    return _pieces(site, x, _dim(dim, site.node(x).ndim), sizes)


@converts("split_with_sizes")
def _split_with_sizes(site, x, sizes, dim=0):
    return _pieces(site, x, _dim(dim, site.node(x).ndim), list(sizes))


@converts("chunk")
def _chunk(site, x, chunks, dim=0):
    n = site.node(x).shape[_dim(dim, site.node(x).ndim)]
    size = -(-n // chunks)
    return _split(site, x, size, dim)


@converts("unbind")
def _unbind(site, x, dim=0):
    x = site.node(x)
    d = _dim(dim, x.ndim)
    return tuple(Index(x, (slice(None),) * d + (k,), name=site.part(str(k))) for k in range(x.shape[d]))


def supported_ops() -> list:
    """The names of the ops with a converter (overload packets: ``'add'``, ``'linear'``, ...)."""
    return sorted(CONVERTERS)

