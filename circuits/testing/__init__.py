"""Testing helpers for circuits and for users' own rewrites: public hypothesis strategies.

See ``circuits.testing.strategies`` for the strategies and an example of property-testing a rewrite,
and ``circuits.testing.roundtrip.store_of`` for exact text round trips.

A failing example explains itself: ``dags(...)`` draws circuits, which print in the text
format, and ``circuits_with_inputs(...)`` draws a ``CircuitWithInputs`` whose repr is a call that
rebuilds the shrunk case — the circuit's text, its Arrays' values by the hash the text prints, and
the inputs — so that it pastes and runs after ``from circuits.testing import CircuitWithInputs``.
A rule that wrongly rewrites ``x + y`` to ``x`` fails like this::

    Falsifying example: test_rule(
        case=CircuitWithInputs(circuit=r'''
    0 Add
      'x' [] Symbol
      1 [] Scalar 1
    ''',
    arrays={},
    inputs={'x': [0.5]}),
    )
"""

from .roundtrip import store_of
from .strategies import (
    ALL_TYPES,
    CLOSED_TYPES,
    DEFAULT_FUNCTIONS,
    DEFAULT_NAMES,
    MAGNITUDE_CAP,
    POSITIVE_MIN,
    CircuitWithInputs,
    EinsumSpec,
    RearrangeSpec,
    arrays,
    circuits_with_inputs,
    dags,
    describe_case,
    einsum_specs,
    indices,
    inputs_for,
    int_arrays,
    names,
    rearrange_specs,
    shapes,
    slices,
)

__all__ = [
    "ALL_TYPES", "CLOSED_TYPES", "DEFAULT_FUNCTIONS", "DEFAULT_NAMES", "MAGNITUDE_CAP", "POSITIVE_MIN",
    "CircuitWithInputs", "EinsumSpec", "RearrangeSpec", "arrays", "circuits_with_inputs", "dags",
    "describe_case", "einsum_specs", "indices", "inputs_for", "int_arrays", "names", "rearrange_specs",
    "shapes", "slices", "store_of",
]
