"""Testing helpers for circuits and for users' own rewrites: public hypothesis strategies.

See ``circuits.testing.strategies`` for the strategies and an example of property-testing a rewrite,
and ``circuits.testing.roundtrip.store_of`` for exact text round trips.
"""

from .strategies import (
    ALL_TYPES,
    CLOSED_TYPES,
    DEFAULT_FUNCTIONS,
    DEFAULT_NAMES,
    MAGNITUDE_CAP,
    POSITIVE_MIN,
    EinsumSpec,
    RearrangeSpec,
    arrays,
    circuits,
    circuits_with_inputs,
    einsum_specs,
    indices,
    inputs_for,
    int_arrays,
    names,
    rearrange_specs,
    shapes,
    slices,
)
from .roundtrip import store_of

__all__ = [
    "ALL_TYPES", "CLOSED_TYPES", "DEFAULT_FUNCTIONS", "DEFAULT_NAMES", "MAGNITUDE_CAP", "POSITIVE_MIN",
    "EinsumSpec", "RearrangeSpec", "arrays", "circuits", "circuits_with_inputs", "einsum_specs",
    "indices", "inputs_for", "int_arrays", "names", "rearrange_specs", "shapes", "slices", "store_of",
]
