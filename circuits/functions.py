"""The GeneralFunction registry.

Everything about one function lives in one place: its shape rule, dtype rule, JAX lowering, the
name it prints and parses as, and its algebraic properties (elementwise, linear, how many
trailing axes it acts on so rewrites know which leading axes are batch axes).

Register your own:

>>> import jax.numpy as jnp
>>> spec = register_elementwise('softplus_demo', lambda x: jnp.logaddexp(x, 0.0))
>>> from circuits import GeneralFunction, Scalar
>>> GeneralFunction('softplus_demo', Scalar(0.0, (3,))).line()
'GeneralFunction softplus_demo'
>>> unregister_function('softplus_demo')
"""

from __future__ import annotations

import math
import re
from typing import Callable, Optional

import attrs

from .errors import CircuitError, ShapeError
from .shapes import broadcast_shapes
from .dtypes import DEFAULT_FLOAT, is_float, is_int, promote

Shape = tuple


@attrs.frozen
class FunctionSpec:
    """One GeneralFunction: how it computes its shape and dtype, how it lowers to JAX.

    - ``shape_rule(shapes) -> shape`` raises ``ShapeError`` (message only) on bad input.
    - ``jax(*arrays) -> array`` the lowering (arrays are jax arrays).
    - ``core_ndim``: the function acts on the last ``core_ndim`` axes of each argument and maps
      leading axes one to one (0 = elementwise, 1 = softmax-like, None = not batchable).
    - ``elementwise``: output entry i depends only on input entries i (after broadcasting).
    - ``linear``: f(a x + b y) = a f(x) + b f(y) in its (single) argument.
    - ``sympy``: a sympy function for exact symbolic checks of elementwise functions, or None.
    """

    name: str
    shape_rule: Callable
    jax: Callable
    num_args: tuple = (1, 1)
    dtype_rule: Optional[Callable] = None
    core_ndim: Optional[int] = None
    elementwise: bool = False
    linear: bool = False
    sympy: Optional[Callable] = None
    index_arg: Optional[int] = None  # which argument holds int indices (gather functions)
    description: str = ""

    def result_dtype(self, dtypes) -> str:
        if self.dtype_rule is not None:
            return self.dtype_rule(dtypes)
        floats = [d for d in dtypes if is_float(d)]
        return promote(floats) if floats else DEFAULT_FLOAT


_REGISTRY: dict[str, FunctionSpec] = {}
_FAMILIES: list[tuple[re.Pattern, Callable[[re.Match], FunctionSpec]]] = []


def register(spec: FunctionSpec, *, replace: bool = False) -> FunctionSpec:
    """Add a function to the registry under ``spec.name`` (it then prints and parses)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", spec.name):
        raise CircuitError(f"function name {spec.name!r} must be an identifier (letters, digits, _ .)")
    if spec.name in _REGISTRY and not replace and _REGISTRY[spec.name] != spec:
        raise CircuitError(f"a function named {spec.name!r} is already registered; pass replace=True")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_function(name: str) -> None:
    """Remove a function registered under ``name`` (nodes already built keep their spec)."""
    if _REGISTRY.pop(name, None) is None:
        raise CircuitError(f"no function named {name!r} is registered")


def register_family(pattern: str, factory: Callable[[re.Match], FunctionSpec]):
    """Register a parametrised family: names matching ``pattern`` are built by ``factory``."""
    _FAMILIES.append((re.compile(pattern), factory))


def lookup(name: str) -> FunctionSpec:
    """The spec registered under ``name`` (families are built on first use)."""
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    for pattern, factory in _FAMILIES:
        m = pattern.fullmatch(name)
        if m:
            spec = factory(m)
            _REGISTRY[name] = spec
            return spec
    known = ", ".join(sorted(_REGISTRY))
    raise CircuitError(
        f"unknown GeneralFunction {name!r}; registered: {known}, gen_index_at_<d>[_batch_x][_c]. "
        "Register your own with circuits.register_function(...)"
    )


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


# ---------------------------------------------------------------------------- shape rules
def _same_shape(shapes):
    return shapes[0]


def _broadcast(shapes):
    out = broadcast_shapes(shapes)
    if out is None:
        raise ShapeError(f"shapes {', '.join(map(str, map(list, shapes)))} do not broadcast")
    return out


def _needs_rank(k, rule):
    def checked(shapes):
        for s in shapes:
            if len(s) < k:
                raise ShapeError(f"needs an argument of rank >= {k}, got shape {list(s)}")
        return rule(shapes)

    return checked


def _drop_last(shapes):
    return shapes[0][:-1]


def _float_dtype(dtypes):
    floats = [d for d in dtypes if is_float(d)]
    return promote(floats) if floats else DEFAULT_FLOAT


# ---------------------------------------------------------------------------- elementwise
def register_elementwise(name, jax_fn, *, sympy=None, linear=False, num_args=1, replace=False,
                         description=""):
    """Register an elementwise function (broadcasting when it takes several arguments)."""
    return register(
        FunctionSpec(
            name=name,
            shape_rule=_broadcast if num_args > 1 else _same_shape,
            jax=jax_fn,
            num_args=(num_args, num_args),
            core_ndim=0,
            elementwise=True,
            linear=linear,
            sympy=sympy,
            dtype_rule=_float_dtype,
            description=description,
        ),
        replace=replace,
    )


def register_function(name, shape_rule, jax_fn, *, num_args=1, dtype_rule=None, core_ndim=None,
                      elementwise=False, linear=False, sympy=None, replace=False, description=""):
    """Register a user function: ``shape_rule(list_of_shapes) -> shape``, ``jax_fn(*arrays)``.

    >>> import jax.numpy as jnp, numpy as np, circuits as C
    >>> _ = register_function('cumsum_last_demo', lambda shapes: shapes[0],
    ...                       lambda x: jnp.cumsum(x, axis=-1), core_ndim=1)
    >>> c = C.GeneralFunction('cumsum_last_demo', C.Array(np.ones(3, np.float32), name='x'))
    >>> C.evaluate(c)
    array([1., 2., 3.], dtype=float32)
    >>> C.bind(C.parse(c.to_text()), {'x': np.ones(3, np.float32)}) == c   # it prints and parses by its name
    True
    >>> unregister_function('cumsum_last_demo')
    """
    n = (num_args, num_args) if isinstance(num_args, int) else tuple(num_args)
    return register(
        FunctionSpec(
            name=name, shape_rule=shape_rule, jax=jax_fn, num_args=n, dtype_rule=dtype_rule,
            core_ndim=core_ndim, elementwise=elementwise, linear=linear, sympy=sympy,
            description=description,
        ),
        replace=replace,
    )


def _jnp():
    import jax.numpy as jnp

    return jnp


def _jax():
    import jax

    return jax


def _sym(name):
    def f(*args):
        import sympy

        return getattr(sympy, name)(*args)

    return f


def _gelu_new(x):
    jnp = _jnp()
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _sympy_sigmoid(x):
    import sympy

    return 1 / (1 + sympy.exp(-x))


def _sympy_rsqrt(x):
    import sympy

    return 1 / sympy.sqrt(x)


register_elementwise("exp", lambda x: _jnp().exp(x), sympy=_sym("exp"))
register_elementwise("log", lambda x: _jnp().log(x), sympy=_sym("log"))
register_elementwise("sin", lambda x: _jnp().sin(x), sympy=_sym("sin"))
register_elementwise("cos", lambda x: _jnp().cos(x), sympy=_sym("cos"))
register_elementwise("tanh", lambda x: _jnp().tanh(x), sympy=_sym("tanh"))
register_elementwise("sqrt", lambda x: _jnp().sqrt(x), sympy=_sym("sqrt"))
register_elementwise("abs", lambda x: _jnp().abs(x), sympy=_sym("Abs"))
register_elementwise("rsqrt", lambda x: _jax().lax.rsqrt(x), sympy=_sympy_rsqrt)
register_elementwise("reciprocal", lambda x: 1.0 / x, sympy=lambda x: 1 / x)
register_elementwise("sigmoid", lambda x: _jax().nn.sigmoid(x), sympy=_sympy_sigmoid)
register_elementwise("relu", lambda x: _jnp().maximum(x, 0), sympy=lambda x: __import__("sympy").Max(x, 0))
register_elementwise("gelu", lambda x: _jax().nn.gelu(x, approximate=False),
                     description="exact gelu, x * Phi(x)")
register_elementwise("gelu_new", _gelu_new, description="tanh-approximated gelu (GPT-2)")
register_elementwise("silu", lambda x: _jax().nn.silu(x), sympy=lambda x: x * _sympy_sigmoid(x))
register_elementwise("square", lambda x: x * x, sympy=lambda x: x**2)
register_elementwise("pow", lambda x, y: _jnp().power(x, y), num_args=2, sympy=lambda x, y: x**y,
                     description="x ** y, broadcasting")


# ---------------------------------------------------------------------------- last-axis functions
def _last_axis(name, jax_fn, shape_rule, description, dtype_rule=_float_dtype):
    register(
        FunctionSpec(
            name=name, shape_rule=_needs_rank(1, shape_rule), jax=jax_fn, core_ndim=1,
            dtype_rule=dtype_rule, description=description,
        )
    )


def _shifted_last_axis(x):
    """x - max(x) over the last axis (max held constant for gradients), with lax primitives:
    jax.nn.softmax computes the same but costs ~1 ms to trace (custom_jvp, nested jit), which
    dominates tracing a large circuit."""
    jax = _jax()
    lax = jax.lax
    if not jax.numpy.issubdtype(x.dtype, jax.numpy.floating):
        x = lax.convert_element_type(x, jax.dtypes.canonicalize_dtype(float))
    last = x.ndim - 1
    peak = lax.stop_gradient(lax.reduce_max(x, (last,)))
    return lax.sub(x, lax.broadcast_in_dim(peak, x.shape, tuple(range(last)))), last


def _softmax(x):
    lax = _jax().lax
    shifted, last = _shifted_last_axis(x)
    e = lax.exp(shifted)
    return lax.div(e, lax.broadcast_in_dim(lax.reduce_sum(e, (last,)), e.shape, tuple(range(last))))


def _log_softmax(x):
    lax = _jax().lax
    shifted, last = _shifted_last_axis(x)
    total = lax.log(lax.reduce_sum(lax.exp(shifted), (last,)))
    return lax.sub(shifted, lax.broadcast_in_dim(total, shifted.shape, tuple(range(last))))


_last_axis("softmax", _softmax, _same_shape, "softmax over the last axis")
_last_axis("log_softmax", _log_softmax, _same_shape, "log_softmax over the last axis")
_last_axis("logsumexp", lambda x: _jax().nn.logsumexp(x, axis=-1), _drop_last,
           "log(sum(exp(x))) over the last axis (drops it)")
_last_axis("max", lambda x: _jnp().max(x, axis=-1), _drop_last, "max over the last axis (drops it)",
           dtype_rule=lambda d: d[0])
_last_axis("min", lambda x: _jnp().min(x, axis=-1), _drop_last, "min over the last axis (drops it)",
           dtype_rule=lambda d: d[0])
_last_axis("mean", lambda x: _jnp().mean(x, axis=-1), _drop_last, "mean over the last axis (drops it)")


def _last_dim_size(x):
    jnp = _jnp()
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    return jnp.full(x.shape[:-1], x.shape[-1], dtype=dtype)


_last_axis("last_dim_size", _last_dim_size, _drop_last,
           "the length of the last axis, broadcast over the others (drops it)")


# ---------------------------------------------------------------------------- gen_index family
def _gen_index_factory(m: re.Match) -> FunctionSpec:
    """``gen_index_at_<d>[_batch_x][_c]``: gather along axis d of x by an int tensor.

    - plain: ``out = take(x, idx, axis=d)``: shape x[:d] + idx + x[d+1:].
    - ``_batch_x``: x's leading axes are batched with idx's (x.shape[:idx.ndim] == idx.shape);
      d counts from the first axis after them (negative d counts from the end of x):
      ``out[b] = x[b, ..., idx[b], ...]``, shape x without that axis.
    - ``_c`` (checked): indices must lie in [0, size); an out-of-range index gives NaN (never a
      silently wrapped or clamped value).  Without ``_c`` negative indices count from the end.
    """
    d = int(m.group(1))
    batch_x = m.group(2) is not None
    checked = m.group(3) is not None
    name = m.group(0)

    def axis_of(x_ndim, i_ndim):
        if batch_x:
            return x_ndim + d if d < 0 else i_ndim + d
        return x_ndim + d if d < 0 else d

    def shape_rule(shapes):
        xs, ids = shapes
        ax = axis_of(len(xs), len(ids))
        lo = len(ids) if batch_x else 0
        if not lo <= ax < len(xs):
            raise ShapeError(f"axis {d} is out of range for x of shape {list(xs)}"
                             + (f" with {len(ids)} batch axes" if batch_x else ""))
        if batch_x:
            if tuple(xs[: len(ids)]) != tuple(ids):
                raise ShapeError(
                    f"_batch_x needs x's leading axes {list(xs[:len(ids)])} to equal the index "
                    f"shape {list(ids)}"
                )
            return tuple(xs[:ax]) + tuple(xs[ax + 1:])
        return tuple(xs[:ax]) + tuple(ids) + tuple(xs[ax + 1:])

    def dtype_rule(dtypes):
        if not is_int(dtypes[1]):
            raise ShapeError(f"the index argument must have an int dtype, got {dtypes[1]}")
        return dtypes[0]

    def lower(x, idx):
        jnp = _jnp()
        ax = axis_of(x.ndim, idx.ndim)
        n = x.shape[ax]
        if checked:
            bad = (idx < 0) | (idx >= n)
        else:
            idx = jnp.where(idx < 0, idx + n, idx)
            bad = (idx < 0) | (idx >= n)
        safe = jnp.clip(idx, 0, max(n - 1, 0))
        if batch_x:
            b = idx.ndim
            expanded = safe.reshape(safe.shape + (1,) * (x.ndim - b))
            expanded = jnp.broadcast_to(
                expanded, tuple(x.shape[:ax]) + (1,) + tuple(x.shape[ax + 1:])
            ) if x.ndim > b else expanded
            out = jnp.take_along_axis(x, expanded, axis=ax).squeeze(ax) if x.ndim > b else x
            bad_b = bad.reshape(bad.shape + (1,) * (out.ndim - b))
        else:
            out = jnp.take(x, safe, axis=ax)
            bad_b = bad.reshape((1,) * ax + bad.shape + (1,) * (x.ndim - ax - 1))
        if jnp.issubdtype(out.dtype, jnp.floating):
            return jnp.where(bad_b, jnp.nan, out)
        return out

    return FunctionSpec(
        name=name, shape_rule=shape_rule, jax=lower, num_args=(2, 2), dtype_rule=dtype_rule,
        core_ndim=None, index_arg=1, description=_gen_index_factory.__doc__,
    )


register_family(r"gen_index_at_(-?\d+)(_batch_x)?(_c)?", _gen_index_factory)
