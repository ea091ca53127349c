"""Analysis of circuits without changing them: cost (FLOPs, bytes, peak memory), profiles, report tables.

This package is the home of ``cost`` and ``profile`` (DESIGN §12). It may import the core and the
backend, never ``rewrites`` or ``interp``.

- ``cost``: ``cost(circuit)`` counts FLOPs by kind, bytes read and written, peak memory for the
  backend's order and for a memory-aware order (placeholder Arrays are enough);
- ``profile``: ``profile(circuit, inputs)`` times every named node (self time, total time, calls).
- ``diff``: ``circuits.diff(a, b)``, the changed nodes between two circuits with their paths.
"""

from .cost import Cost, NodeCost, cost
from .profile import Profile, profile

__all__ = ["cost", "Cost", "NodeCost", "profile", "Profile"]
