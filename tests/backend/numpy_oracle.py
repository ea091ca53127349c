"""The plain-numpy oracle the evaluation tests compare against: the one in ``tests/nodes/oracle.py``
(written independently of the JAX lowering; shared with the node tests)."""

from __future__ import annotations

import numpy as np

from tests.nodes.oracle import UNARY, evaluate

# The numpy meaning of every function circuits.functions registers itself.
NUMPY_FUNCTIONS = {**UNARY, "pow": np.power}


def numpy_evaluate(root, inputs=None):
    return evaluate(root, inputs)
