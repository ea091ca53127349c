"""circuits: neural-network computations as immutable expression DAGs of tensor operations.

Build, print, parse, evaluate (JAX), rewrite and take apart circuits:

>>> import numpy as np
>>> import circuits as C
>>> x = C.Array(np.arange(3, dtype=np.float32), name='x')
>>> y = C.GeneralFunction('exp', x, name='y')
>>> C.evaluate(C.Einsum.from_spec('a->', y)).round(3)
np.float32(11.107)

The public API is the list below; everything else is private and may change.  Heavy modules
(JAX evaluation, models, files) load on first use so ``import circuits`` stays fast.
"""

from importlib import import_module

from .errors import (
    CircuitError,
    EvaluationError,
    ParseError,
    RewriteError,
    RewriteLoopError,
    SelectionError,
    ShapeError,
    StoreError,
)
from .functions import FunctionSpec, register_elementwise, register_function, unregister_function
from .nodes import Add, Array, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag
from .traversal import count_nodes, deep_map, replace, strip_names, toposort

# name -> module that defines it (loaded on first access).
_LAZY = {
    "evaluate": ("circuits.backend", "evaluate"),
    "compile": ("circuits.backend", "compile"),
    "Compiled": ("circuits.backend", "Compiled"),
    "evaluate_batched": ("circuits.backend", "evaluate_batched"),
    "grad": ("circuits.backend", "grad"),
    "value_and_grad": ("circuits.backend", "value_and_grad"),
    "Eager": ("circuits.backend", "Eager"),
    "cache_stats": ("circuits.backend", "cache_stats"),
    "models": ("circuits.models", None),
    "interp": ("circuits.interp", None),
    "testing": ("circuits.testing", None),
    # text format (circuits/text/)
    "parse": ("circuits.text.parser", "parse"),
    "parse_many": ("circuits.text.parser", "parse_many"),
    "print_many": ("circuits.text.printer", "print_many"),
    # values for placeholder Arrays, tensor store and circuit files (circuits/io/)
    "bind": ("circuits.io", "bind"),
    "fill_random": ("circuits.io", "fill_random"),
    "TensorStore": ("circuits.io", "TensorStore"),
    "save": ("circuits.io", "save"),
    "load": ("circuits.io", "load"),
    # selection: the Circuit methods c.get / get_unique / update / paths, and the same
    # functions and the matchers in circuits.select
    "select": ("circuits.select", None),
    # exact symbolic comparison
    "symbolic_equal": ("circuits.backend", "symbolic_equal"),
}

__all__ = [
    # nodes
    "Circuit", "Array", "Scalar", "Symbol", "Einsum", "Add", "GeneralFunction", "Index",
    "Rearrange", "Concat", "Tag",
    # functions
    "FunctionSpec", "register_function", "register_elementwise", "unregister_function",
    # traversal
    "toposort", "count_nodes", "deep_map", "replace", "strip_names",
    # errors
    "CircuitError", "ShapeError", "ParseError", "EvaluationError", "RewriteError",
    "RewriteLoopError", "StoreError", "SelectionError",
    *_LAZY,
]


def __getattr__(name):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'circuits' has no attribute {name!r}")
    module, attr = target
    mod = import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
