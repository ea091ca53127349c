"""``where(condition, x, y)``: ``x`` where ``condition`` is nonzero, else ``y`` (numpy
broadcasting of all three).  The form of torch's ``where`` and ``masked_fill`` (the torch.export
importer maps both onto it), kept apart from the built-ins because its first argument is a
condition, not a value.

>>> import numpy as np
>>> from circuits import Array, GeneralFunction, Scalar, evaluate
>>> keep = Array(np.array([True, False, True]), name='keep')
>>> evaluate(GeneralFunction('where', keep, Array(np.arange(3, dtype=np.float32), name='x'), Scalar(-1.0)))
array([ 0., -1.,  2.], dtype=float32)
"""

from __future__ import annotations

from ..dtypes import DEFAULT_FLOAT, promote
from .registry import FunctionSpec, broadcast, lookup, register, registered_names


def _where(condition, x, y):
    import jax.numpy as jnp

    return jnp.where(condition.astype(bool), x, y)


def _where_numpy(condition, x, y):
    import numpy as np

    return np.where(condition.astype(bool), x, y)


def _dtype(dtypes):
    # The condition's dtype plays no part in the result's.
    return promote(dtypes[1:]) if dtypes[1:] else DEFAULT_FLOAT


_SPEC = FunctionSpec(
    name="where", shape_rule=broadcast, jax=_where, num_args=(3, 3), dtype_rule=_dtype, core_ndim=0,
    elementwise=True, propagates_nan=False, numpy=_where_numpy,
    description="x where the condition is nonzero, else y (broadcasting)",
)
# Loading this file a second time (pytest's doctest collection does) registers nothing new.
if "where" not in registered_names() or lookup("where").jax.__module__ != _where.__module__:
    register(_SPEC)
