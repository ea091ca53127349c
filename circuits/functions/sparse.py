"""Functions sparse autoencoders need: the ``topk_mask_<k>`` family (and ``step``, a built-in).

- ``step(x)`` (``builtins``, also rust_circuit's): 1 where ``x > 0`` (strictly), else 0: the gate of a
  JumpReLU (``relu(h) * step(h - θ)``) and of a gated SAE (``step(gate) * relu(magnitude)``).
- ``topk_mask_<k>(x)``: 1 at the ``k`` largest entries of the last axis, 0 elsewhere (ties go to
  the lower index, as ``jax.lax.top_k``); a TopK SAE's activations are ``relu(h) * topk_mask_k(h)``.

>>> import numpy as np
>>> from circuits import Array, GeneralFunction, evaluate
>>> x = Array(np.array([[0.5, -1.0, 2.0, 1.0]], np.float32), name='x')
>>> evaluate(GeneralFunction('topk_mask_2', x)).tolist(), evaluate(GeneralFunction('step', x)).tolist()
([[0.0, 0.0, 1.0, 1.0]], [[1.0, 0.0, 1.0, 1.0]])
"""

from __future__ import annotations

from .registry import (
    FunctionSpec,
    family_grammars,
    float_dtype,
    needs_rank,
    per_row,
    register_family,
)


def _topk_mask(k: int):
    def mask(x):
        import jax
        import jax.numpy as jnp

        if k > x.shape[-1]:
            return jnp.ones_like(x)
        _, idx = jax.lax.top_k(jax.lax.stop_gradient(x), k)
        hot = jax.nn.one_hot(idx, x.shape[-1], dtype=x.dtype)  # [..., k, n]
        return jnp.sum(hot, axis=-2)

    return mask


def _topk_spec(match) -> FunctionSpec:
    k = int(match.group(1))
    return FunctionSpec(
        name=match.group(0), shape_rule=needs_rank(1, lambda shapes: shapes[0]), jax=_topk_mask(k),
        core_ndim=1, dtype_rule=float_dtype, propagates_nan=False,
        description=f"1 at the {k} largest entries of the last axis, else 0",
        cost=per_row(lambda n: {"cmp": n * max(1, k.bit_length())}),
    )


# Loading this file a second time (pytest's doctest collection does) registers nothing new.
if "topk_mask_<k>" not in family_grammars():
    register_family(r"topk_mask_([1-9][0-9]*)", _topk_spec, "topk_mask_<k>")
