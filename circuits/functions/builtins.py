"""The built-in functions, each registered with everything known about it: lowering, shape rule,
sympy form, NaN propagation and value bounds.

>>> from circuits.functions import lookup
>>> spec = lookup('log_softmax')
>>> spec.core_ndim, spec.propagates_nan, spec.sympy([0, 0])
(1, True, [-log(2), -log(2)])
"""

from __future__ import annotations

import math

from .registry import (
    Bounds,
    FunctionSpec,
    drop_last,
    float_dtype,
    needs_rank,
    per_element,
    per_row,
    register,
    register_elementwise,
    same_shape,
)


def _jnp():
    import jax.numpy as jnp

    return jnp


def _jax():
    import jax

    return jax


def _sympy():
    import sympy

    return sympy


def _sym(name):
    def f(*args):
        return getattr(_sympy(), name)(*args)

    return f


def _gelu_new(x):
    jnp = _jnp()
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _sympy_sigmoid(x):
    return 1 / (1 + _sympy().exp(-x))


def _sympy_rsqrt(x):
    return 1 / _sympy().sqrt(x)


# ---------------------------------------------------------------------------- numpy counterparts
# The same functions on numpy arrays (``FunctionSpec.numpy``): a first call computes with them
# while the JAX kernels compile in the background.  Python floats keep a float32 argument float32.
def _np():
    import numpy

    return numpy


def _erf(x):
    from scipy.special import erf  # jax's own dependency; imported only where gelu is computed

    return erf(x).astype(x.dtype, copy=False)


def _np_sigmoid(x):
    return 1.0 / (1.0 + _np().exp(-x))


def _np_shifted(x):
    np = _np()
    if x.dtype.kind != "f":
        x = x.astype(np.float32)
    return x - x.max(axis=-1, keepdims=True)


def _np_softmax(x):
    e = _np().exp(_np_shifted(x))
    return e / e.sum(axis=-1, keepdims=True)


def _np_log_softmax(x):
    shifted = _np_shifted(x)
    return shifted - _np().log(_np().exp(shifted).sum(axis=-1, keepdims=True))


def _np_logsumexp(x):
    np = _np()
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], -np.inf, x.dtype)
    peak = x.max(axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    return (np.log(np.exp(x - peak).sum(axis=-1, keepdims=True)) + peak)[..., 0]


def _np_last_dim_size(x):
    np = _np()
    return np.full(x.shape[:-1], x.shape[-1], dtype=x.dtype if x.dtype.kind == "f" else np.float32)


_NUMPY = {
    "exp": lambda x: _np().exp(x),
    "log": lambda x: _np().log(x),
    "sin": lambda x: _np().sin(x),
    "cos": lambda x: _np().cos(x),
    "tanh": lambda x: _np().tanh(x),
    "sqrt": lambda x: _np().sqrt(x),
    "abs": lambda x: _np().abs(x),
    "rsqrt": lambda x: 1.0 / _np().sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
    "sigmoid": _np_sigmoid,
    "relu": lambda x: _np().maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_new": lambda x: 0.5 * x * (1.0 + _np().tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x * _np_sigmoid(x),
    "square": lambda x: x * x,
    "step": lambda x: (x > 0).astype(x.dtype),
    "log_exp_p_1": lambda x: _np().logaddexp(x, 0.0).astype(x.dtype, copy=False),
    "gaussian_pdf": lambda x: _np().exp(-0.5 * x * x) / math.sqrt(2 * math.pi),
    "gaussian_cdf": lambda x: 0.5 * (1 + _erf(x / math.sqrt(2))),
    "logit": lambda x: _np().log(x / (1 - x)),
    "softmax": _np_softmax,
    "log_softmax": _np_log_softmax,
    "logsumexp": _np_logsumexp,
    "max": lambda x: x.max(axis=-1),
    "min": lambda x: x.min(axis=-1),
    "mean": lambda x: x.mean(axis=-1),
    "last_dim_size": _np_last_dim_size,
    "pow": lambda x, y: _np().power(x, y),
}


# Their vector-Jacobian products (``FunctionSpec.numpy_grad``: ``(x, y, g) -> g * f'(x)``), as JAX
# differentiates the ``jax`` lowerings below: relu's tie at 0 takes half (``jnp.maximum``), abs
# takes +1 at 0, max / min give the entry ``argmax`` / ``argmin`` picks.  A first gradient
# computes with them while the backward kernels compile (``circuits.backend.lower.numpy_vjp``).
def _last(v):
    return v[..., None]


def _np_softmax_grad(x, y, g):
    return y * (g - (g * y).sum(axis=-1, keepdims=True))


def _np_log_softmax_grad(x, y, g):
    np = _np()
    out = np.exp(np.broadcast_to(y, g.shape))
    out *= -g.sum(axis=-1, keepdims=True)
    out += g
    return out


def _np_logsumexp_grad(x, y, g):
    return _last(g) * _np().exp(x - _last(y))


def _np_picked_grad(arg):
    def grad(x, y, g):
        np = _np()
        at = _last(getattr(np, arg)(x, axis=-1))
        hot = (np.arange(x.shape[-1]) == at).astype(g.dtype)
        return hot * _last(g)

    return grad


def _np_gelu_grad(x, y, g):
    cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    return g * (cdf + x * _np().exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))


def _np_gelu_new_grad(x, y, g):
    # 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh(c (x + a x^3)); in place (eight
    # temporaries the size of an MLP's hidden layer took 21 ms on GPT-2's 8 x 32 x 3072)
    np = _np()
    c, a = math.sqrt(2.0 / math.pi), 0.044715
    if x.ndim == 0:  # numpy's arithmetic on a 0-d array gives scalars, which take no out=
        return _np_gelu_new_grad(x.reshape(1), y, g).reshape(np.shape(g))
    x2 = x * x
    t = x2 * a
    t += 1.0
    t *= x
    t *= c
    np.tanh(t, out=t)
    slope = x2
    slope *= 3 * a * c
    slope += c
    slope *= x
    slope *= 0.5
    slope *= 1.0 - t * t
    t += 1.0
    t *= 0.5
    t += slope
    t = t * g if t.shape != np.broadcast_shapes(t.shape, g.shape) else np.multiply(t, g, out=t)
    return t


def _np_silu_grad(x, y, g):
    s = _np_sigmoid(x)
    return g * (s * (1.0 + x * (1.0 - s)))


_NUMPY_GRAD = {
    "exp": lambda x, y, g: g * y,
    "log": lambda x, y, g: g / x,
    "sin": lambda x, y, g: g * _np().cos(x),
    "cos": lambda x, y, g: -g * _np().sin(x),
    "tanh": lambda x, y, g: g * (1.0 - y * y),
    "sqrt": lambda x, y, g: g * (0.5 / y),
    "abs": lambda x, y, g: _np().where(x >= 0, g, -g),
    "rsqrt": lambda x, y, g: g * (-0.5 * (y / x)),
    "reciprocal": lambda x, y, g: -g / (x * x),
    "sigmoid": lambda x, y, g: g * (y * (1.0 - y)),
    "relu": lambda x, y, g: g * _np().where(x > 0, 1.0, _np().where(x == 0, 0.5, 0.0)).astype(x.dtype),
    "gelu": _np_gelu_grad,
    "gelu_new": _np_gelu_new_grad,
    "silu": _np_silu_grad,
    "square": lambda x, y, g: g * (2.0 * x),
    "step": lambda x, y, g: _np().zeros_like(g * x),
    "log_exp_p_1": lambda x, y, g: g * _np_sigmoid(x),
    "gaussian_pdf": lambda x, y, g: g * (-x * y),
    "gaussian_cdf": lambda x, y, g: g * (_np().exp(-0.5 * x * x) / math.sqrt(2 * math.pi)),
    "logit": lambda x, y, g: g / (x * (1.0 - x)),
    "softmax": _np_softmax_grad,
    "log_softmax": _np_log_softmax_grad,
    "logsumexp": _np_logsumexp_grad,
    "max": _np_picked_grad("argmax"),
    "min": _np_picked_grad("argmin"),
    "mean": lambda x, y, g: _np().broadcast_to(_last(g) / x.shape[-1], g.shape + x.shape[-1:]),
    "last_dim_size": lambda x, y, g: _np().zeros(g.shape + x.shape[-1:], x.dtype),
}


# ---------------------------------------------------------------------------- bounds
def _monotone(f):
    """Bounds of an increasing function."""
    return lambda x: (f(x[0]), f(x[1]))


def _constant(lo, hi):
    return lambda x: (lo, hi)


def _abs_bounds(x):
    lo, hi = x
    if lo <= 0 <= hi:
        return 0.0, max(-lo, hi)
    return min(abs(lo), abs(hi)), max(abs(lo), abs(hi))


def _at_least(floor):
    """Bounds of a function above ``floor`` and below max(x, 0) (gelu, silu: x times a weight
    in (0, 1))."""
    return lambda x: (floor, max(x[1], 0.0))


def _sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def _pow_bounds(base, exponent):
    corners = [b ** e for b in base for e in exponent]
    return min(corners), max(corners)


def _elementwise(name, jax_fn, sympy=None, bounds=None, *, propagates_nan=True, **kw):
    register_elementwise(name, jax_fn, sympy=sympy, bounds=bounds, propagates_nan=propagates_nan,
                         numpy=_NUMPY.get(name), numpy_grad=_NUMPY_GRAD.get(name), **kw)


_elementwise("exp", lambda x: _jnp().exp(x), _sym("exp"), Bounds(_monotone(math.exp), arg_max=4.0, positive=True),
             cost=per_element(exp=1))
_elementwise("log", lambda x: _jnp().log(x), _sym("log"), Bounds(_monotone(math.log), arg_positive=True),
             cost=per_element(log=1))
_elementwise("sin", lambda x: _jnp().sin(x), _sym("sin"), Bounds(_constant(-1.0, 1.0)),
             cost=per_element(sin=1))
_elementwise("cos", lambda x: _jnp().cos(x), _sym("cos"), Bounds(_constant(-1.0, 1.0)),
             cost=per_element(cos=1))
_elementwise("tanh", lambda x: _jnp().tanh(x), _sym("tanh"), Bounds(_monotone(math.tanh)),
             cost=per_element(tanh=1))
_elementwise("sqrt", lambda x: _jnp().sqrt(x), _sym("sqrt"),
             Bounds(_monotone(math.sqrt), arg_positive=True, positive=True),
             cost=per_element(sqrt=1))
_elementwise("abs", lambda x: _jnp().abs(x), _sym("Abs"), Bounds(_abs_bounds),
             cost=per_element(cmp=1))
_elementwise("rsqrt", lambda x: _jax().lax.rsqrt(x), _sympy_rsqrt,
             Bounds(lambda x: (1 / math.sqrt(x[1]), 1 / math.sqrt(x[0])), arg_positive=True, positive=True),
             cost=per_element(sqrt=1, div=1))
_elementwise("reciprocal", lambda x: 1.0 / x, lambda x: 1 / x,
             Bounds(lambda x: (1 / x[1], 1 / x[0]), arg_positive=True, positive=True),
             cost=per_element(div=1))
_elementwise("sigmoid", lambda x: _jax().nn.sigmoid(x), _sympy_sigmoid,
             Bounds(_monotone(_sigmoid), arg_max=4.0, positive=True),
             cost=per_element(exp=1, add=1, div=1))
_elementwise("relu", lambda x: _jnp().maximum(x, 0), lambda x: _sympy().Max(x, 0),
             Bounds(lambda x: (max(x[0], 0.0), max(x[1], 0.0))),
             cost=per_element(cmp=1))
_elementwise("gelu", lambda x: _jax().nn.gelu(x, approximate=False), bounds=Bounds(_at_least(-0.2)),
             description="exact gelu, x * Phi(x)",
             cost=per_element(erf=1, add=1, mul=3))
_elementwise("gelu_new", _gelu_new, bounds=Bounds(_at_least(-0.2)), description="tanh-approximated gelu (GPT-2)",
             cost=per_element(tanh=1, add=2, mul=6))
_elementwise("silu", lambda x: _jax().nn.silu(x), lambda x: x * _sympy_sigmoid(x), Bounds(_at_least(-0.3)),
             cost=per_element(exp=1, add=1, div=1, mul=1))
_elementwise("square", lambda x: x * x, lambda x: x**2,
             Bounds(lambda x: tuple(v * v for v in _abs_bounds(x)), arg_max=50.0),
             cost=per_element(mul=1))
# rust_circuit's elementwise functions that torch names otherwise.
_elementwise("step", lambda x: (x > 0).astype(x.dtype), lambda x: _sympy().Piecewise((1, x > 0), (0, True)),
             Bounds(_constant(0.0, 1.0)), description="1 where x > 0, else 0 (rust_circuit's step)",
             cost=per_element(cmp=1), propagates_nan=False)  # step(nan) is 0: nan > 0 is false
_elementwise("log_exp_p_1", lambda x: _jax().nn.softplus(x), lambda x: _sympy().log(_sympy().exp(x) + 1),
             Bounds(_monotone(lambda v: math.log1p(math.exp(min(v, 700.0)))), positive=True),
             description="log(exp(x) + 1), softplus", cost=per_element(exp=1, log=1, add=1))
_elementwise("gaussian_pdf", lambda x: _jnp().exp(-0.5 * x * x) / math.sqrt(2 * math.pi),
             lambda x: _sympy().exp(-x**2 / 2) / _sympy().sqrt(2 * _sympy().pi),
             Bounds(_constant(0.0, 1 / math.sqrt(2 * math.pi))), description="the standard normal density",
             cost=per_element(exp=1, mul=3))
_elementwise("gaussian_cdf", lambda x: 0.5 * (1 + _jax().scipy.special.erf(x / math.sqrt(2))),
             lambda x: (1 + _sympy().erf(x / _sympy().sqrt(2))) / 2,
             Bounds(_constant(0.0, 1.0)), description="the standard normal distribution function",
             cost=per_element(erf=1, add=1, mul=2))
_elementwise("logit", lambda x: _jnp().log(x / (1 - x)), lambda x: _sympy().log(x / (1 - x)),
             Bounds(_monotone(lambda v: math.log(v / (1 - v))), arg_max=0.99, arg_positive=True),
             description="log(x / (1 - x)), the inverse of sigmoid", cost=per_element(log=1, div=1, add=1))
# nan ** 0 = 1: pow does not propagate NaN.
_elementwise("pow", lambda x, y: _jnp().power(x, y), lambda x, y: x**y,
             Bounds(_pow_bounds, arg_max=(10.0, 2.0), arg_positive=(True, False), positive=True),
             num_args=2, propagates_nan=False, description="x ** y, broadcasting",
             cost=per_element(pow=1))


# ---------------------------------------------------------------------------- last-axis functions
def _last_axis(name, jax_fn, shape_rule, description, sympy, bounds, row_cost, dtype_rule=float_dtype,
               propagates_nan=True):
    register(
        FunctionSpec(
            name=name, shape_rule=needs_rank(1, shape_rule), jax=jax_fn, core_ndim=1,
            dtype_rule=dtype_rule, sympy=sympy, propagates_nan=propagates_nan, bounds=bounds,
            description=description, cost=per_row(row_cost), numpy=_NUMPY.get(name),
            numpy_grad=_NUMPY_GRAD.get(name),
        )
    )


def _shifted_last_axis(x):
    """x - max(x) over the last axis (max held constant for gradients), with lax primitives:
    jax.nn.softmax computes the same but costs ~1 ms to trace (custom_jvp, nested jit), which
    dominates tracing a large circuit."""
    lax = _jax().lax
    x, peak, last = _peak_last_axis(x)
    return lax.sub(x, lax.broadcast_in_dim(peak, x.shape, tuple(range(last)))), last


def _peak_last_axis(x):
    """``(x as float, max(x) over the last axis held constant for gradients, last axis)``."""
    jax = _jax()
    lax = jax.lax
    if not jax.numpy.issubdtype(x.dtype, jax.numpy.floating):
        x = lax.convert_element_type(x, jax.dtypes.canonicalize_dtype(float))
    last = x.ndim - 1
    return x, lax.stop_gradient(lax.reduce_max(x, (last,))), last


# log_softmax sums rows at least this long by a product with a vector of ones: XLA's CPU
# backend runs the sum fused with the exp before it slowly (GPT-2's log-softmax of 4 x 8 x 31
# rows of 50,257 logits: 0.29-0.36 s, against 0.11 s for the exp alone and 0.22-0.25 s with
# the product; softmax's own fusion is faster with the sum, 0.16 s against 0.20-0.25).  Full
# precision: a GPU's default float32 dot is TF32.
LONG_ROWS = 4096


def _sum_last(e, last: int):
    """The sum of ``e`` over its last axis ``last``."""
    jax = _jax()
    lax = jax.lax
    n = e.shape[last]
    if n < LONG_ROWS:
        return lax.reduce_sum(e, (last,))
    ones = jax.numpy.ones((n,), e.dtype)
    return lax.dot_general(e, ones, (((last,), (0,)), ((), ())), precision=lax.Precision.HIGHEST)


def _softmax(x):
    lax = _jax().lax
    shifted, last = _shifted_last_axis(x)
    e = lax.exp(shifted)
    return lax.div(e, lax.broadcast_in_dim(lax.reduce_sum(e, (last,)), e.shape, tuple(range(last))))


def _log_softmax(x):
    lax = _jax().lax
    if x.shape[-1] >= LONG_ROWS:
        # x - (max + log(sum)): the shifted logits are read by the exp alone, so XLA need not
        # write them out, and a gather of the result (a loss picking each target's entry)
        # computes only the entries it picks (GPT-2's loss over 4 x 8 x 31 rows of 50,257:
        # 0.26 s -> 0.14 s on a 2-core CPU).  The total is rounded at the logits' scale.
        x, peak, last = _peak_last_axis(x)
        keep = tuple(range(last))
        e = lax.exp(lax.sub(x, lax.broadcast_in_dim(peak, x.shape, keep)))
        total = lax.add(peak, lax.log(_sum_last(e, last)))
        return lax.sub(x, lax.broadcast_in_dim(total, x.shape, keep))
    shifted, last = _shifted_last_axis(x)
    total = lax.log(_sum_last(lax.exp(shifted), last))
    return lax.sub(shifted, lax.broadcast_in_dim(total, shifted.shape, tuple(range(last))))


def _picked(x, arg):
    """max / min over the last axis as the entry ``jnp.argmax`` / ``argmin`` picks: the same value
    (NaN where a row has one), and the gradient goes to that one entry (the first of tied ones).
    ``jnp.max``'s own gradient finds the maximum again by comparing the operand with the result,
    and in a compiled program XLA may recompute the operand inside that comparison with another
    rounding: no entry equals the maximum any more and the cotangent is lost (found by
    tests/backend/test_batched_grads.py, x + (x + x) + ... over a batch in float64)."""
    jnp = _jnp()
    at = getattr(jnp, arg)(x, axis=-1)
    return jnp.take_along_axis(x, at[..., None], axis=-1)[..., 0]


def _last_dim_size(x):
    jnp = _jnp()
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    return jnp.full(x.shape[:-1], x.shape[-1], dtype=dtype)


# Exact forms of one row (the entries along the last axis).
def _sympy_softmax(row):
    sp = _sympy()
    total = sp.Add(*[sp.exp(u) for u in row])
    return [sp.exp(v) / total for v in row]


def _sympy_logsumexp(row):
    sp = _sympy()
    return sp.log(sp.Add(*[sp.exp(v) for v in row]))


def _sympy_log_softmax(row):
    total = _sympy_logsumexp(row)
    return [v - total for v in row]


def _identity(x, n):
    return x


_last_axis("softmax", _softmax, same_shape, "softmax over the last axis", _sympy_softmax,
           Bounds(lambda x, n: (math.exp(x[0] - x[1]) / n, 1.0), arg_max=20.0, positive=True),
           # max, subtract it, exp, sum, divide (as _softmax lowers it)
           lambda n: {"cmp": n - 1, "add": 2 * n - 1, "exp": n, "div": n})
_last_axis("log_softmax", _log_softmax, same_shape, "log_softmax over the last axis", _sympy_log_softmax,
           Bounds(lambda x, n: (x[0] - x[1] - math.log(n), 0.0), arg_max=20.0),
           # max, subtract it, exp, sum, log, subtract the total (as _log_softmax lowers it)
           lambda n: {"cmp": n - 1, "add": 3 * n - 1, "exp": n, "log": 1})
_last_axis("logsumexp", lambda x: _jax().nn.logsumexp(x, axis=-1), drop_last,
           "log(sum(exp(x))) over the last axis (drops it)", _sympy_logsumexp,
           Bounds(lambda x, n: (x[0] + math.log(n), x[1] + math.log(n)), arg_max=20.0),
           # max, subtract it, exp, sum, log, add the max back (jax.nn.logsumexp)
           lambda n: {"cmp": n - 1, "add": 2 * n, "exp": n, "log": 1})
_last_axis("max", lambda x: _picked(x, "argmax"), drop_last, "max over the last axis (drops it)",
           lambda row: _sympy().Max(*row), Bounds(_identity, keeps_positive=True), lambda n: {"cmp": n - 1},
           dtype_rule=lambda d: d[0])
_last_axis("min", lambda x: _picked(x, "argmin"), drop_last, "min over the last axis (drops it)",
           lambda row: _sympy().Min(*row), Bounds(_identity, keeps_positive=True), lambda n: {"cmp": n - 1},
           dtype_rule=lambda d: d[0])
_last_axis("mean", lambda x: _jnp().mean(x, axis=-1), drop_last, "mean over the last axis (drops it)",
           lambda row: _sympy().Add(*row) / len(row), Bounds(_identity, keeps_positive=True),
           lambda n: {"add": n - 1, "div": 1})
_last_axis("last_dim_size", _last_dim_size, drop_last,
           "the length of the last axis, broadcast over the others (drops it)",
           lambda row: _sympy().Integer(len(row)),
           Bounds(lambda x, n: (float(n), float(n)), arg_max=20.0, positive=True), lambda n: {},
           propagates_nan=False)
