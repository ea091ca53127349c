"""The GeneralFunction registry.

Everything about one function lives in its ``FunctionSpec``: its shape rule, dtype rule, JAX
lowering, the name it prints and parses as, its algebraic properties (elementwise, linear, how
many trailing axes it acts on so rewrites know which leading axes are batch axes), its exact
sympy form, whether it propagates NaN, and bounds on its values for the test strategies.  No
other module keeps a table keyed by function names, so a function you register is treated like a
built-in one.

- ``registry``: ``FunctionSpec``, ``Bounds``, ``register``/``lookup`` and the helpers;
- ``builtins``: the built-in functions (exp ... softmax, logsumexp, last_dim_size);
- ``gather``: the ``gen_index_at_<d>[_batch_x][_no_batch_index][_c]`` family and ``GenIndex``,
  the one parser of its names.

Register your own:

>>> import jax.numpy as jnp
>>> spec = register_elementwise('softplus_demo', lambda x: jnp.logaddexp(x, 0.0))
>>> from circuits import GeneralFunction, Scalar
>>> GeneralFunction('softplus_demo', Scalar(0.0, (3,))).line()
'GeneralFunction softplus_demo'
>>> unregister_function('softplus_demo')
"""

from . import builtins as _builtins  # noqa: F401  (registers the built-in functions)
from . import rust as _rust  # noqa: F401  (registers cast_from_…_to_… and multinomial_[…])
from . import sparse as _sparse  # noqa: F401  (registers step and topk_mask_<k>)
from . import where as _where  # noqa: F401  (registers where(condition, x, y))
from .gather import GEN_INDEX_GRAMMAR, GEN_INDEX_PATTERN, GenIndex, gen_index_name
from .registry import (
    Bounds,
    FunctionSpec,
    family_grammars,
    lookup,
    per_element,
    per_row,
    register,
    register_elementwise,
    register_family,
    register_function,
    registered_names,
    unregister_function,
)
from .registry import seal_library as _seal_library

_seal_library()  # everything registered so far is the library's own (registry.is_library_function)

__all__ = [
    "Bounds", "FunctionSpec", "GEN_INDEX_GRAMMAR", "GEN_INDEX_PATTERN", "GenIndex", "family_grammars",
    "gen_index_name", "lookup", "per_element", "per_row", "register", "register_elementwise", "register_family", "register_function",
    "registered_names", "unregister_function",
]
