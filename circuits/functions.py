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

import collections
import math
import re
import threading
import weakref
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


# Members of a family (``gen_index_at_7_c``...) are built on demand and are not registered: the
# nodes using one keep it alive, a weak table finds it again while they live, and only the most
# recently used few are held strongly.  So every distinct name a parser ever read (a failed parse
# included) does not stay in memory for good.
_FAMILY_SPECS: "weakref.WeakValueDictionary[str, FunctionSpec]" = weakref.WeakValueDictionary()
_FAMILY_RECENT: "collections.OrderedDict[str, FunctionSpec]" = collections.OrderedDict()
_FAMILY_RECENT_SIZE = 64
_FAMILY_LOCK = threading.Lock()


def lookup(name: str) -> FunctionSpec:
    """The spec registered under ``name`` (members of a family are built on first use)."""
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    spec = _FAMILY_SPECS.get(name)
    if spec is None:
        for pattern, factory in _FAMILIES:
            m = pattern.fullmatch(name)
            if m:
                spec = factory(m)
                _FAMILY_SPECS[name] = spec
                break
    if spec is not None:
        with _FAMILY_LOCK:
            _FAMILY_RECENT[name] = spec
            _FAMILY_RECENT.move_to_end(name)
            if len(_FAMILY_RECENT) > _FAMILY_RECENT_SIZE:
                _FAMILY_RECENT.popitem(last=False)
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
GEN_INDEX_PATTERN = r"gen_index_at_(-?\d{1,9})(_batch_x)?(_no_batch_index)?(_c)?"
_GEN_INDEX_RE = re.compile(GEN_INDEX_PATTERN)


@attrs.frozen
class GenIndex:
    """The meaning of a ``gen_index_at_<d>[_batch_x][_no_batch_index][_c]`` name, as in
    rust_circuit (``GeneralFunction.gen_index(x, index, index_dim, batch_x, batch_index)``):

    - ``gen_index_at_<d>`` (batch_index): the index's axes come **first**:
      ``out[i..., rest...] = x[..., idx[i...], ...]`` (``d`` the axis of x), shape
      ``idx.shape + x.shape without axis d``;
    - ``_batch_x``: x's leading axes are the index's (``x.shape[:idx.ndim] == idx.shape``), ``d``
      counts within the axes after them: ``out[b, ...] = x[b, ..., idx[b], ...]``;
    - ``_no_batch_index``: the index's axes replace axis ``d`` where it is (numpy's ``take``),
      shape ``x.shape[:d] + idx.shape + x.shape[d+1:]`` (``_batch_x_no_batch_index``: the same
      values, ``d`` must be negative);
    - ``_c``: indices must lie in ``[0, size)``; without it negative indices count from the end.

    A negative ``d`` counts from the end of x (of its axes after the batch axes with
    ``_batch_x``).  At ``d = 0`` the plain and ``_no_batch_index`` forms agree.

    >>> g = GenIndex.parse('gen_index_at_1_c')
    >>> g.layout, g.axis(3, 2), g.out_shape((4, 5, 6), (2, 7))
    ('first', 1, (2, 7, 4, 6))
    >>> GenIndex.parse('gen_index_at_1_no_batch_index').out_shape((4, 5, 6), (2, 7))
    (4, 2, 7, 6)
    """

    d: int
    batch_x: bool = False
    batch_index: bool = True
    checked: bool = False

    @classmethod
    def parse(cls, name: str) -> "GenIndex | None":
        """The parts of a gen_index function name, or None for any other name."""
        m = _GEN_INDEX_RE.fullmatch(name)
        if m is None:
            return None
        return cls(int(m.group(1)), m.group(2) is not None, m.group(3) is None, m.group(4) is not None)

    @property
    def name(self) -> str:
        return (f"gen_index_at_{self.d}{'_batch_x' if self.batch_x else ''}"
                f"{'' if self.batch_index else '_no_batch_index'}{'_c' if self.checked else ''}")

    @property
    def layout(self) -> str:
        """``'batch'`` (x's leading axes are idx's, out is x without the gathered axis),
        ``'first'`` (idx's axes, then x's others) or ``'at'`` (idx's axes where axis d was)."""
        if self.batch_index:
            return "batch" if self.batch_x else "first"
        return "at"

    def axis(self, x_ndim: int, i_ndim: int) -> int:
        """The gathered axis of x (may be out of range: ``check`` says so)."""
        lead = i_ndim if self.layout == "batch" else 0
        return lead + (self.d if self.d >= 0 else x_ndim - lead + self.d)

    def check(self, x_shape, i_shape) -> int:
        """The gathered axis, or ShapeError (message only) when the shapes do not fit."""
        x_ndim, i_ndim = len(x_shape), len(i_shape)
        ax = self.axis(x_ndim, i_ndim)
        lead = i_ndim if self.layout == "batch" else 0
        if self.batch_x and not self.batch_index and self.d >= 0:
            raise ShapeError(f"{self.name}: _batch_x without batching the index needs a negative axis, "
                             f"e.g. gen_index_at_{self.d - x_ndim}_batch_x_no_batch_index")
        if not lead <= ax < x_ndim:
            raise ShapeError(f"axis {self.d} is out of range for x of shape {list(x_shape)}"
                             + (f" with {i_ndim} batch axes" if lead else ""))
        if lead and tuple(x_shape[:lead]) != tuple(i_shape):
            raise ShapeError(
                f"_batch_x needs x's leading axes {list(x_shape[:lead])} to equal the index "
                f"shape {list(i_shape)}"
            )
        return ax

    def out_shape(self, x_shape, i_shape) -> tuple:
        ax = self.check(x_shape, i_shape)
        x_shape, i_shape = tuple(x_shape), tuple(i_shape)
        rest = x_shape[:ax] + x_shape[ax + 1:]
        if self.layout == "batch":
            return rest
        if self.layout == "first":
            return i_shape + rest
        return x_shape[:ax] + i_shape + x_shape[ax + 1:]

    def valid_range(self, size: int) -> tuple:
        """``(lo, hi)``: the index values that select an entry of an axis of ``size``."""
        return (0, size) if self.checked else (-size, size)


def gen_index_name(d: int, batch_x: bool, checked: bool, batch_index: bool = True) -> str:
    return GenIndex(d, batch_x, batch_index, checked).name


def _gen_index_factory(m: re.Match) -> FunctionSpec:
    """``gen_index_at_<d>[_batch_x][_no_batch_index][_c]``: gather along axis d of x by an int
    tensor; see ``GenIndex`` for the layouts (rust_circuit's).  An out-of-range index gives NaN
    at evaluation (never a silently wrapped or clamped value); an index Array whose values are
    known is checked when the node is built, and int Symbols feeding a gather when they are
    bound (``circuits.evaluate`` checks its inputs before running)."""
    g = GenIndex.parse(m.group(0))
    name = g.name

    def shape_rule(shapes):
        xs, ids = shapes
        return g.out_shape(xs, ids)

    def dtype_rule(dtypes):
        if not is_int(dtypes[1]):
            raise ShapeError(f"the index argument must have an int dtype, got {dtypes[1]}")
        return dtypes[0]

    def lower(x, idx):
        jnp = _jnp()
        ax = g.axis(x.ndim, idx.ndim)
        n = x.shape[ax]
        if g.checked:
            bad = (idx < 0) | (idx >= n)
        else:
            idx = jnp.where(idx < 0, idx + n, idx)
            bad = (idx < 0) | (idx >= n)
        safe = jnp.clip(idx, 0, max(n - 1, 0))
        q = idx.ndim
        if g.layout == "batch":
            expanded = safe.reshape(safe.shape + (1,) * (x.ndim - q))
            expanded = jnp.broadcast_to(
                expanded, tuple(x.shape[:ax]) + (1,) + tuple(x.shape[ax + 1:])
            ) if x.ndim > q else expanded
            out = jnp.take_along_axis(x, expanded, axis=ax).squeeze(ax) if x.ndim > q else x
            bad_b = bad.reshape(bad.shape + (1,) * (out.ndim - q))
        else:
            out = jnp.take(x, safe, axis=ax)
            if g.layout == "first" and ax and q:
                out = jnp.moveaxis(out, tuple(range(ax, ax + q)), tuple(range(q)))
                bad_b = bad.reshape(bad.shape + (1,) * (x.ndim - 1))
            else:
                bad_b = bad.reshape((1,) * ax + bad.shape + (1,) * (x.ndim - ax - 1))
        if jnp.issubdtype(out.dtype, jnp.floating):
            return jnp.where(bad_b, jnp.nan, out)
        return out

    return FunctionSpec(
        name=name, shape_rule=shape_rule, jax=lower, num_args=(2, 2), dtype_rule=dtype_rule,
        core_ndim=None, index_arg=1, description=_gen_index_factory.__doc__,
    )


register_family(GEN_INDEX_PATTERN, _gen_index_factory)
