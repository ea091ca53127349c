"""The rule catalogue: small named rules, each with a docstring and a before/after example.

One family per file: ``add``, ``einsum``, ``scalars``, ``identities``, ``index``,
``rearrange``, ``canonical``, ``functions``, and the rules that only make evaluation faster,
``contraction``, ``gather`` and ``chunking`` (which ``rewrites.optimize`` runs).  Each family's
``RULES`` compose with ``+``; ``SIMP_RULES`` is the core of the value-preserving set that
``rewrites.simp`` runs to a fixpoint (``rewrites.default_rules()`` adds the sets of
``index``, ``rearrange``, ``canonical`` and ``functions``).  Rules that undo one another
(flatten/nest, distribute/factor, Einsum <-> Rearrange) are not in it, nor those that inline
named results (``flatten_add_all``, ``flatten_einsum_all``): use them with a strategy of your own.

>>> from circuits import Add, Symbol
>>> x = Symbol((2,), name='x')
>>> flatten_add(Add(Add(x, x), x)).children
(<'x' [2] Symbol>, <'x' [2] Symbol>, <'x' [2] Symbol>)
"""

from ..engine import Rule, RuleSet
from . import add, einsum, identities, scalars
from .add import (
    add_single_term,
    dedupe_add_terms,
    factor_add,
    flatten_add,
    flatten_add_all,
    nest_add,
    nest_add_terms,
    remove_add_zeros,
)
from .einsum import (
    distribute,
    distribute_einsum_over_add,
    drop_einsum_ones,
    einsum_identity,
    einsum_permute_to_rearrange,
    einsum_zero,
    flatten_einsum,
    flatten_einsum_all,
    nest_einsum,
    nest_einsum_operands,
    rearrange_permute_to_einsum,
)
from .identities import concat_single, index_select_all
from .scalars import fold_add_scalars, fold_function_of_scalars, merge_einsum_scalars

# Cheap, often-applicable rules first: the first rule that applies wins.
SIMP_RULES = RuleSet(
    flatten_add, remove_add_zeros, add_single_term, fold_add_scalars, dedupe_add_terms,
    einsum_zero, flatten_einsum, einsum_identity, drop_einsum_ones, merge_einsum_scalars,
    fold_function_of_scalars, index_select_all, concat_single,
    name="simp",
)

# Rules that restructure without simplifying (each has an inverse), or that inline named
# results; not in SIMP_RULES.
STRUCTURAL_RULES = RuleSet(
    flatten_add_all, flatten_einsum_all, nest_add, factor_add, nest_einsum, distribute_einsum_over_add,
    einsum_permute_to_rearrange,
    rearrange_permute_to_einsum, name="structural",
)


def all_rules() -> list[Rule]:
    """Every Rule object defined in the modules of ``rewrites.rules``."""
    import importlib
    import pkgutil

    found, seen = [], set()
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(mod).values():
            if isinstance(value, Rule) and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
    return found


__all__ = [
    "SIMP_RULES", "STRUCTURAL_RULES", "all_rules", "add", "einsum", "identities", "scalars",
    "flatten_add", "nest_add", "nest_add_terms", "remove_add_zeros", "add_single_term",
    "dedupe_add_terms", "factor_add", "flatten_add_all", "flatten_einsum_all", "flatten_einsum",
    "nest_einsum", "nest_einsum_operands",
    "einsum_zero", "drop_einsum_ones", "einsum_identity", "distribute", "distribute_einsum_over_add",
    "einsum_permute_to_rearrange", "rearrange_permute_to_einsum", "merge_einsum_scalars",
    "fold_add_scalars", "fold_function_of_scalars", "index_select_all", "concat_single",
]
