"""The registry: ``FunctionSpec``, ``Bounds``, ``register``/``lookup`` and the registering helpers.

A ``FunctionSpec`` says everything the library knows about one function; every other module reads
it from the spec (never from a table keyed by the function's name), so a function registered by a
user is seen by the symbolic interpreter, the rewrite rules and the test strategies alike.
"""

from __future__ import annotations

import collections
import re
import threading
import weakref
from typing import TYPE_CHECKING, Callable, Optional

import attrs

from ..dtypes import DEFAULT_FLOAT, is_float, promote
from ..errors import CircuitError, ShapeError
from ..shapes import broadcast_shapes

if TYPE_CHECKING:
    from .gather import GenIndex

Shape = tuple


@attrs.frozen
class Bounds:
    """How a function maps bounds on values, for the random circuits of ``circuits.testing``
    (which keep every value they draw finite and small).

    - ``image(*intervals) -> (lo, hi)``: bounds on the result given ``(lo, hi)`` bounds on each
      argument; a function on the last axis (``core_ndim = 1``) also gets that axis's length as
      the keyword ``n`` (softmax's smallest entry depends on it).
    - ``arg_max``: the arguments' magnitudes stay below it (exp's, so that it does not
      overflow); one number for all arguments or one per argument; None: no bound of its own.
    - ``arg_positive``: the arguments must be positive (log, sqrt; pow's base only:
      ``(True, False)``).
    - ``positive``: the result is positive (exp, softmax, sqrt of its positive argument).
    - ``keeps_positive``: positive arguments give a positive result (max, mean).

    >>> b = Bounds(lambda x: (max(x[0], 0.0), max(x[1], 0.0)), keeps_positive=True)  # relu
    >>> b.image((-2.0, 3.0)), b.arg(0)
    ((0.0, 3.0), (False, None))
    """

    image: Callable
    arg_max: Optional[float | tuple] = None
    arg_positive: bool | tuple = False
    positive: bool = False
    keeps_positive: bool = False

    def arg(self, i: int) -> tuple:
        """``(positive, max_magnitude)`` the ``i``-th argument must satisfy."""
        pos = self.arg_positive[i] if isinstance(self.arg_positive, tuple) else self.arg_positive
        mag = self.arg_max[i] if isinstance(self.arg_max, tuple) else self.arg_max
        return bool(pos), mag


@attrs.frozen
class FunctionSpec:
    """One GeneralFunction: how it computes its shape and dtype, how it lowers to JAX, and what
    the rewrites, the symbolic interpreter and the test strategies may assume about it.

    - ``shape_rule(shapes) -> shape`` raises ``ShapeError`` (message only) on bad input.
    - ``jax(*arrays) -> array`` the lowering (arrays are jax arrays).
    - ``core_ndim``: the function acts on the last ``core_ndim`` axes of each argument and maps
      leading axes one to one (0 = elementwise, 1 = softmax-like, None = not batchable).
    - ``elementwise``: output entry i depends only on input entries i (after broadcasting).
    - ``linear``: f(a x + b y) = a f(x) + b f(y) in its (single) argument.
    - ``sympy``: its exact sympy form, or None (then it stays an uninterpreted function).  An
      elementwise function's takes one entry of each argument and gives one entry; a function
      on the last ``core_ndim >= 1`` axes takes one block of its argument (an object ndarray of
      those axes) and gives the block of the result (a list for softmax, one expression for a
      reduction such as logsumexp).
    - ``propagates_nan``: a NaN in an argument gives NaN in every result entry that reads it
      (``f(nan) = nan``; ``pow`` does not: ``nan ** 0 = 1``).  Gather rules move a checked
      gather, whose out-of-range entries are NaN, only through such functions.
    - ``bounds``: how it maps bounds on values (``Bounds``), for the test strategies; None: the
      strategies draw it only if it is elementwise with one argument, keeping that within ±4.
    - ``index_arg``: which argument holds int indices (gather functions).
    - ``gather``: for a member of the gen_index family, what its name means (a ``GenIndex``).
    - ``numpy(*arrays) -> array``: the same function on numpy arrays, exactly (to float rounding:
      in the arguments' float dtype), or None; the op-by-op tier computes a node with it while its
      JAX kernel is not made yet (``circuits.backend.tiers.host``), so a first call compiles nothing.
    - ``numpy_grad(x, y, g) -> array``: for a function of one argument with ``numpy``, its
      vector-Jacobian product on numpy arrays (``x`` the argument, ``y`` the result, ``g`` the
      result's cotangent; ``g`` may carry leading axes more than ``x``), exactly as JAX
      differentiates ``jax`` (to float rounding, ties and zeros included), or None: a first
      gradient computes the node's backward step with it while its kernel compiles.
    - ``cost(arg_shapes, out_shape) -> {kind: count}``: the arithmetic it does, by kind (``mul``,
      ``add``, ``div``, ``exp``, ``log``, ``sqrt``, ``sin``, ``cos``, ``tanh``, ``erf``, ``pow``,
      ``cmp``) for ``circuits.cost``; build it with ``per_element`` or ``per_row``.  None: the
      cost is unknown (``circuits.cost`` counts nothing for it and lists it).
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
    propagates_nan: bool = False
    bounds: Optional[Bounds] = None
    index_arg: Optional[int] = None
    gather: Optional[GenIndex] = None
    description: str = ""
    cost: Optional[Callable] = None
    numpy: Optional[Callable] = None
    numpy_grad: Optional[Callable] = None

    def result_dtype(self, dtypes) -> str:
        if self.dtype_rule is not None:
            return self.dtype_rule(dtypes)
        floats = [d for d in dtypes if is_float(d)]
        return promote(floats) if floats else DEFAULT_FLOAT


_REGISTRY: dict[str, FunctionSpec] = {}
_FAMILIES: list[tuple[re.Pattern, Callable[[re.Match], FunctionSpec], str]] = []


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


def register_family(pattern: str, factory: Callable[[re.Match], FunctionSpec], grammar: str = ""):
    """Register a parametrised family: names matching ``pattern`` are built by ``factory``;
    ``grammar`` describes the names in error messages (``gen_index_at_<d>[_c]``...)."""
    _FAMILIES.append((re.compile(pattern), factory, grammar or pattern))


def family_grammars() -> list[str]:
    """How the names of each registered family are spelled, for error messages."""
    return [grammar for _, _, grammar in _FAMILIES]


# Members of a family (``gen_index_at_7_c``...) are built on demand and are not registered: the
# nodes using one keep it alive, a weak table finds it again while they live, and only the most
# recently used few are held strongly.  So every distinct name a parser ever read (a failed parse
# included) does not stay in memory for good.
_FAMILY_SPECS: "weakref.WeakValueDictionary[str, FunctionSpec]" = weakref.WeakValueDictionary()
_FAMILY_RECENT: "collections.OrderedDict[str, FunctionSpec]" = collections.OrderedDict()
_FAMILY_RECENT_SIZE = 64
_FAMILY_LOCK = threading.Lock()


# The library's own functions (``seal_library``, when ``circuits.functions`` has registered its
# built-ins): their names identify their code across processes, given the library's version (the
# backend keeps their compiled kernels on disk by name).  A user's function never is one.
_LIBRARY: dict = {}
_LIBRARY_FAMILIES = [0]  # the first this many families are the library's
_LIBRARY_MEMBERS: "weakref.WeakSet[FunctionSpec]" = weakref.WeakSet()


def seal_library() -> None:
    """Note every function and family registered so far as the library's own."""
    _LIBRARY.update(_REGISTRY)
    _LIBRARY_FAMILIES[0] = len(_FAMILIES)


def is_library_function(spec: FunctionSpec) -> bool:
    """Whether ``spec`` is one of the library's own functions (a built-in, or a member of a
    built-in family), not one a user registered.

    >>> is_library_function(lookup('exp')), is_library_function(lookup('gen_index_at_0'))
    (True, True)
    """
    return _LIBRARY.get(spec.name) is spec or spec in _LIBRARY_MEMBERS


def lookup(name: str) -> FunctionSpec:
    """The spec registered under ``name`` (members of a family are built on first use)."""
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    spec = _FAMILY_SPECS.get(name)
    if spec is None:
        spec = _family_member(name)
    if spec is not None:
        with _FAMILY_LOCK:
            # the first spec stored wins: two threads meeting a new name at once build two specs,
            # and nodes over different specs of one name would be twins, not one interned node
            spec = _FAMILY_SPECS.setdefault(name, spec)
            _FAMILY_RECENT[name] = spec
            _FAMILY_RECENT.move_to_end(name)
            if len(_FAMILY_RECENT) > _FAMILY_RECENT_SIZE:
                _FAMILY_RECENT.popitem(last=False)
        return spec
    known = ", ".join(sorted(_REGISTRY) + family_grammars())
    raise CircuitError(
        f"unknown GeneralFunction {name!r}; registered: {known}. "
        "Register your own with circuits.register_function(...)"
    )


def _family_member(name: str) -> Optional[FunctionSpec]:
    """A new spec for ``name`` from the family it belongs to (None when it belongs to none)."""
    for i, (pattern, factory, _) in enumerate(_FAMILIES):
        m = pattern.fullmatch(name)
        if m:
            spec = factory(m)
            if i < _LIBRARY_FAMILIES[0] and isinstance(spec, FunctionSpec):
                _LIBRARY_MEMBERS.add(spec)
            return spec
    return None


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


# ---------------------------------------------------------------------------- shape rules
def same_shape(shapes):
    return shapes[0]


def broadcast(shapes):
    out = broadcast_shapes(shapes)
    if out is None:
        raise ShapeError(f"shapes {', '.join(map(str, map(list, shapes)))} do not broadcast")
    return out


def needs_rank(k, rule):
    def checked(shapes):
        for s in shapes:
            if len(s) < k:
                raise ShapeError(f"needs an argument of rank >= {k}, got shape {list(s)}")
        return rule(shapes)

    return checked


def drop_last(shapes):
    return shapes[0][:-1]


def float_dtype(dtypes):
    floats = [d for d in dtypes if is_float(d)]
    return promote(floats) if floats else DEFAULT_FLOAT


# ---------------------------------------------------------------------------- cost rules
def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def per_element(**counts) -> Callable:
    """A ``FunctionSpec.cost`` rule: ``counts`` operations for every entry of the result.

    >>> per_element(exp=1, add=1, div=1)([(2, 3)], (2, 3))
    {'exp': 6, 'add': 6, 'div': 6}
    """

    def cost(arg_shapes, out_shape):
        n = _numel(out_shape)
        return {kind: k * n for kind, k in counts.items()}

    return cost


def per_row(row_counts: Callable) -> Callable:
    """A ``FunctionSpec.cost`` rule for a function on the last axis: ``row_counts(n)`` gives the
    operations for one row of length ``n``; rows are the first argument's leading entries.

    >>> per_row(lambda n: {'cmp': n - 1})([(4, 5)], (4,))
    {'cmp': 16}
    """

    def cost(arg_shapes, out_shape):
        shape = arg_shapes[0]
        rows = _numel(shape[:-1])
        return {kind: k * rows for kind, k in row_counts(shape[-1] if shape else 1).items()}

    return cost


# ---------------------------------------------------------------------------- registering
def register_elementwise(name, jax_fn, *, sympy=None, linear=False, num_args=1, propagates_nan=False,
                         bounds=None, replace=False, description="", cost=None, numpy=None, numpy_grad=None):
    """Register an elementwise function (broadcasting when it takes several arguments)."""
    return register(
        FunctionSpec(
            name=name,
            shape_rule=broadcast if num_args > 1 else same_shape,
            jax=jax_fn,
            num_args=(num_args, num_args),
            core_ndim=0,
            elementwise=True,
            linear=linear,
            sympy=sympy,
            propagates_nan=propagates_nan,
            bounds=bounds,
            dtype_rule=float_dtype,
            description=description,
            cost=cost,
            numpy=numpy,
            numpy_grad=numpy_grad,
        ),
        replace=replace,
    )


def register_function(name, shape_rule, jax_fn, *, num_args=1, dtype_rule=None, core_ndim=None,
                      elementwise=False, linear=False, sympy=None, propagates_nan=False, bounds=None,
                      replace=False, description="", cost=None, numpy=None, numpy_grad=None):
    """Register a user function: ``shape_rule(list_of_shapes) -> shape``, ``jax_fn(*arrays)``;
    the other keywords are ``FunctionSpec``'s fields (``numpy``: the same function on numpy arrays,
    for a first call that compiles nothing; without it the JAX kernel computes the node;
    ``numpy_grad``: its vector-Jacobian product on numpy arrays, for a first gradient).

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
            propagates_nan=propagates_nan, bounds=bounds, description=description, cost=cost, numpy=numpy,
            numpy_grad=numpy_grad,
        ),
        replace=replace,
    )
