"""Node classes: one family per module, all following the protocol in ``base``.

Adding a node type: the checklist.  ``tests/nodes/test_every_node_type.py`` checks every item
for every class in ``NODE_TYPES``; items marked (own) are defined in the class itself, not
inherited; items marked (payload) are defined in the class itself when it has payload fields of
its own (``__slots__``), and otherwise inherit ``Circuit``'s defaults for a type without payload
(nothing hashed or printed, a bare line, the constructor over the children).

1. Identity: a module of its own here with a ``Circuit`` subclass; ``type_name`` (own) (the
   word in the text format); ``_setup`` (own) validates and calls ``_set_common``; ``_rebuild``
   (payload) makes the node over new children; ``_payload_bytes`` (payload) and ``payload_text``
   (payload) (what it hashes and prints besides children; ``_structure_bytes`` when the payload
   holds nodes, as Module's Symbols).
2. Text: ``parse_payload`` (payload) and ``from_payload`` (payload) read a printed line (the
   parser holds no per-type code); ``child_count`` says how many children a line may have (by
   default any number).
3. Int indices: ``passes_index`` (default False): whether an int index passes through it
   unchanged on its way to a gather (the parser's int marking and ``fill_random``'s bounds read
   only this); ``index_children`` when it holds indices itself (a gather's index argument).
4. Expansion: ``expanded`` (own), its rule in ``circuits.expand``: the node rebuilt over
   children that gained leading batch axes or other (symbolic) sizes, or an ``ExpandError``
   saying why it cannot follow; a leaf resizes its symbolic sizes.
5. ``NODE_TYPES`` below lists it.
6. Evaluation: an op builder in ``circuits.backend.lower.ops.OP_BUILDERS`` (a leaf: one of
   ``circuits.backend.lower.program.ARGUMENT_TYPES``).
7. Exact form: a rule in ``circuits.backend.symbolic.SYMBOLIC_RULES``.
8. Tests: ``circuits.testing.dags`` draws it (``root_types=[it]``), and the node-type test's
   properties hold: it evaluates, round-trips through the printer, batches exactly by expansion.

>>> all('expanded' in vars(t) and '_setup' in vars(t) for t in NODE_TYPES)
True
"""

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
