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
from .nodes import (
    Add,
    Array,
    Circuit,
    Concat,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Module,
    ModuleArgSpec,
    ModuleSpec,
    Rearrange,
    Scalar,
    Scatter,
    SetSymbolicShape,
    Symbol,
    Tag,
)
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
    "clear_cache": ("circuits.backend", "clear_cache"),
    "set_cache_size": ("circuits.backend", "set_cache_size"),
    # the JAX backend itself (C.backend.last_run(), C.backend.tiers.pinned(...))
    "backend": ("circuits.backend", None),
    "models": ("circuits.models", None),
    # importers.from_torch (torch is imported only when it is called)
    "importers": ("circuits.importers", None),
    "testing": ("circuits.testing", None),
    # text format (circuits/text/)
    "parse": ("circuits.text.parser", "parse"),
    "parse_many": ("circuits.text.parser", "parse_many"),
    "print_many": ("circuits.text.printer", "print_many"),
    "summary": ("circuits.text.summary", "summary"),
    # values for placeholder Arrays, tensor store and circuit files (circuits/io/)
    "bind": ("circuits.io", "bind"),
    "fill_random": ("circuits.io", "fill_random"),
    "TensorStore": ("circuits.io", "TensorStore"),
    "save": ("circuits.io", "save"),
    "load": ("circuits.io", "load"),
    "save_many": ("circuits.io", "save_many"),
    "load_many": ("circuits.io", "load_many"),
    # the changed nodes between two circuits, with their paths (circuits/analysis/); its
    # .rust_text() is rust_circuit's text diff (circuits/text/rust_diff.py)
    "diff": ("circuits.analysis.diff", "diff"),
    # selection: the Circuit methods c.get / get_unique / update / paths, and the same
    # functions and the matchers in circuits.select
    "select": ("circuits.select", None),
    # interventions: ablate, patch, path_patch, attribute (circuits/interp/)
    "interp": ("circuits.interp", None),
    # exact symbolic comparison
    "symbolic_equal": ("circuits.backend", "symbolic_equal"),
    # analysis (circuits/analysis/): what a circuit costs, where its time goes
    "cost": ("circuits.analysis.cost", "cost"),
    "profile": ("circuits.analysis.profile", "profile"),
    # rust_circuit's expansion: replace nodes by others of another batch shape (circuits/expand.py)
    "expand": ("circuits.expand", "expand"),
    "Expander": ("circuits.expand", "Expander"),
    "substitute_all_modules": ("circuits.expand", "substitute_all_modules"),
    "sample": ("circuits.expand", "sample"),
    "symbolic_size": ("circuits.shapes", "symbolic_size"),
}

__all__ = [
    # nodes
    "Circuit", "Array", "Scalar", "Symbol", "Einsum", "Add", "GeneralFunction", "Index",
    "Rearrange", "Concat", "Tag", "Module", "ModuleSpec", "ModuleArgSpec", "Scatter",
    "SetSymbolicShape", "DiscreteVar",
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
