"""A circuit to a program, and values to its arguments: the pipeline's second stage (it imports
from ``cache``, nothing from ``tiers``).

- ``einsum``: einsum planning (a contraction plan made once per Einsum node, with its reason);
- ``ops``: per-node-type op builders (``build_op``): functions of the children's values that hold
  no node and no tensor;
- ``program``: the value-free ``Skeleton`` (ops, wiring, one interpreter loop, traceable) and the
  ``Program`` (a circuit in toposort order with its Arrays and Scalars as arguments, keyed by
  name- and value-blind structure);
- ``head_batching``, ``fusion``: sums of per-head subcircuits batched, the gathered log-softmax
  fused; ``lowering``: a circuit to the program ``evaluate`` runs (``also=`` nodes), the programs
  of live circuits cached; ``memory``: the cost model of a program's temporaries;
- ``binding``: precision, checking and binding argument values (``bind_arguments``), and the
  values on the device that every path shares; ``calling``: arguments bound once per program
  (``bind_once``, every path's way to bind); ``sharding``: arguments placed on devices.
"""
