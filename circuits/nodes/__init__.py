"""Node classes: one family per module, all following the protocol in ``base``."""

from .add import Add
from .base import Circuit
from .concat import Concat
from .discrete_var import DiscreteVar
from .einsum import Einsum
from .general_function import GeneralFunction
from .index import Index
from .leaves import Array, Scalar, Symbol
from .module import Module, ModuleArgSpec, ModuleSpec
from .rearrange import Rearrange
from .scatter import Scatter
from .symbolic_shape import SetSymbolicShape
from .tag import Tag

NODE_TYPES = (Array, Scalar, Symbol, Einsum, Add, GeneralFunction, Index, Rearrange, Concat, Tag,
              Module, Scatter, SetSymbolicShape, DiscreteVar)
NODE_TYPE_BY_NAME = {t.type_name: t for t in NODE_TYPES}

__all__ = [
    "Circuit", "Array", "Scalar", "Symbol", "Einsum", "Add", "GeneralFunction", "Index",
    "Rearrange", "Concat", "Tag", "Module", "ModuleSpec", "ModuleArgSpec", "Scatter",
    "SetSymbolicShape", "DiscreteVar", "NODE_TYPES", "NODE_TYPE_BY_NAME",
]
