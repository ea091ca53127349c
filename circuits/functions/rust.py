"""rust_circuit's parametrised GeneralFunctions that its printed circuits name:

- ``cast_from_{device:D,dtype:T}_to_{device:D2,dtype:T2}``: the argument converted to dtype
  ``T2`` (``None``: kept).  ``T`` (when not ``None``) is the dtype the argument must have; the
  devices are rust's torch devices, which JAX places itself: read and kept in the name only.
- ``multinomial_[s0, s1, ...]`` and ``multinomial_no_replace_[...]``: ``(probs [..., n], seed [])``
  -> int64 ``[..., s0, s1, ...]``, indices below ``n`` drawn with probabilities proportional to
  ``probs`` (with or without replacement), seeded by the value of ``seed``.  The draws come from
  JAX's generator: the same seed gives the same indices here, not torch's indices.

>>> import numpy as np
>>> from circuits import Array, GeneralFunction, evaluate
>>> x = Array(np.array([1.7, -2.2], np.float32), name='x')
>>> c = GeneralFunction('cast_from_{device:None,dtype:None}_to_{device:None,dtype:int64}', x)
>>> c.dtype, evaluate(c).tolist()
('int64', [1, -2])
>>> probs = Array(np.array([0.0, 1.0, 0.0], np.float32), name='p')
>>> seed = Array(np.array(11, np.int64), name='seed')
>>> s = GeneralFunction('multinomial_[4]', probs, seed)
>>> s.shape, s.dtype, evaluate(s).tolist()
((4,), 'int64', [1, 1, 1, 1])
"""

from __future__ import annotations

import math

from ..dtypes import DTYPES
from ..errors import ShapeError
from .registry import FunctionSpec, family_grammars, register_family

# rust's TorchDtype names are torch's: the ones this library has besides.
_RUST_DTYPES = frozenset(DTYPES) - {"uint16", "uint32", "uint64"}

CAST_PATTERN = (r"cast_from_\{device:([a-zA-Z0-9]+),dtype:([a-zA-Z0-9]+)\}"
                r"_to_\{device:([a-zA-Z0-9]+),dtype:([a-zA-Z0-9]+)\}")
CAST_GRAMMAR = "cast_from_{device:<d>,dtype:<t>}_to_{device:<d>,dtype:<t>}"
MULTINOMIAL_PATTERN = r"multinomial(_no_replace)?_\[\s*((?:\d+\s*,\s*)*(?:\d+\s*)?)\]"
MULTINOMIAL_GRAMMAR = "multinomial[_no_replace]_[<sizes>]"


def _dtype(text: str, name: str):
    if text == "None":
        return None
    if text not in _RUST_DTYPES:
        raise ShapeError(f"{name}: unknown dtype {text!r} (one of None, {', '.join(sorted(_RUST_DTYPES))})")
    return text


def _cast_spec(match) -> FunctionSpec:
    name = match.group(0)
    dtype_in = match.group(2) if match.group(2) == "None" or match.group(2) in _RUST_DTYPES else None
    dtype_out = match.group(4) if match.group(4) in _RUST_DTYPES else None
    bad = [t for t in (match.group(2), match.group(4)) if t != "None" and t not in _RUST_DTYPES]

    def shape_rule(shapes):
        if bad:
            _dtype(bad[0], name)
        return shapes[0]

    def dtype_rule(dtypes):
        if dtype_in not in (None, "None") and dtypes[0] != dtype_in:
            raise ShapeError(f"{name} takes a {dtype_in} argument, got {dtypes[0]}; cast it first, "
                             "or write dtype:None for any input")
        return dtype_out or dtypes[0]

    def cast(x):
        import jax.numpy as jnp

        if dtype_out is None:
            return x
        import jax

        # (int64 is int32 while JAX's x64 mode is off: the backend's precision decides)
        return x.astype(jax.dtypes.canonicalize_dtype(jnp.dtype(dtype_out)))

    return FunctionSpec(name=name, shape_rule=shape_rule, jax=cast, dtype_rule=dtype_rule, core_ndim=0,
                        elementwise=True, linear=dtype_out is None,
                        description=f"the argument as {dtype_out or 'its own dtype'} (rust's cast)")


def _multinomial_spec(match) -> FunctionSpec:
    replacement = match.group(1) is None
    entries = [e.strip() for e in match.group(2).split(",")]
    if entries and entries[-1] == "":
        entries.pop()
    sample_shape = tuple(int(e) for e in entries)
    # rust writes the sizes as its Debug form of a shape: "[100]", "[2, 3]"
    name = f"multinomial{'' if replacement else '_no_replace'}_[{', '.join(map(str, sample_shape))}]"
    count = math.prod(sample_shape)

    def shape_rule(shapes):
        if len(shapes) != 2:
            raise ShapeError(f"{name} takes (probs, seed), got {len(shapes)} arguments")
        probs, seed = shapes
        if seed != ():
            raise ShapeError(f"{name}: the seed must be 0-d, got shape {list(seed)}")
        if not probs:
            raise ShapeError(f"{name}: probs must have at least one axis (the categories)")
        if not replacement and count > probs[-1]:
            raise ShapeError(f"{name}: {count} draws without replacement from {probs[-1]} categories")
        return tuple(probs[:-1]) + sample_shape

    def sample(probs, seed):
        import jax
        import jax.numpy as jnp

        n = probs.shape[-1]
        batch = probs.shape[:-1]
        flat = probs.reshape((-1, n)).astype(jnp.float32)
        key = jax.random.PRNGKey(jnp.asarray(seed).astype(jnp.int32))
        keys = jax.random.split(key, flat.shape[0])

        def draw(k, p):
            if replacement:
                return jax.random.categorical(k, jnp.log(p), shape=sample_shape)
            return jax.random.choice(k, n, shape=sample_shape, replace=False, p=p / jnp.sum(p))

        out = jax.vmap(draw)(keys, flat)
        return out.reshape(batch + sample_shape).astype(jax.dtypes.canonicalize_dtype(jnp.int64))

    return FunctionSpec(name=name, shape_rule=shape_rule, jax=sample, num_args=(2, 2),
                        dtype_rule=lambda dtypes: "int64",
                        description=f"{count} seeded draws of a category index "
                                    f"({'with' if replacement else 'without'} replacement)")


# Loading this file a second time (pytest's doctest collection does) registers nothing new.
if CAST_GRAMMAR not in family_grammars():
    register_family(CAST_PATTERN, _cast_spec, CAST_GRAMMAR)
    register_family(MULTINOMIAL_PATTERN, _multinomial_spec, MULTINOMIAL_GRAMMAR)
