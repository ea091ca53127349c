"""Scaling over several devices with JAX's own sharding (``jax.sharding``): no distribution of our
own.  A circuit's arguments (its Arrays and Symbols) are placed on a ``jax.sharding.Mesh``, each
as a ``NamedSharding`` of that mesh, and ``jax.jit`` compiles the one program for that placement:
XLA's partitioner splits every computation the way its inputs are split and inserts the
collectives.

- **Data parallel**: ``evaluate_batched(c, inputs, devices=4)`` (or ``mesh=`` with an axis named
  ``'batch'``) splits each chunk of rows over the devices; the weights are replicated.
- **Tensor parallel** (weights bigger than one device): ``compile(c, mesh=mesh, shard={matcher:
  PartitionSpec})`` splits the matched Arrays (and Symbols) along mesh axes, e.g. every attention
  weight over its head axis (``{Regex(r'^a\\d+\\.w\\.'): P('model')}``) or the unembedding over
  the vocabulary (``{'t.w.unembed': P('model')}``); the rest is replicated.  Both compose in
  ``evaluate_batched(..., mesh=Mesh(devices.reshape(2, 2), ('batch', 'model')), shard=...)``.

``mesh`` is a ``jax.sharding.Mesh`` or a list of devices (a one-axis mesh named ``'model'``).
Matched nodes must be arguments (Arrays or Symbols); a spec must fit the node's rank, name axes
of the mesh and split sizes divisible by them; otherwise ``EvaluationError`` names the node and
the fix.  Multi-host: call ``jax.distributed.initialize()`` in every process first, then build
the mesh over ``jax.devices()`` (all hosts' devices); see the README (tested as two processes on one
machine: ``tests/backend/test_multihost.py``).

>>> import numpy as np, jax
>>> from jax.sharding import PartitionSpec as P
>>> from circuits import Array, Einsum, Symbol
>>> from circuits.backend.lower.program import Program
>>> x = Symbol((2, 4), name='x')
>>> w = Array(np.eye(4, dtype=np.float32), name='w')
>>> program = Program([Einsum.from_spec('ab,bc->ac', x, w)], 'float32')
>>> place = Placement(mesh_of(jax.devices()[:1]), program, {'w': P(None, 'model')})
>>> place.specs()
{'w': P(None, 'model')}
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ...errors import EvaluationError
from ...nodes import Array, Symbol

__all__ = ["Placement", "mesh_of", "BATCH_AXIS"]

BATCH_AXIS = "batch"


def mesh_of(mesh, axis: str = "model"):
    """A ``jax.sharding.Mesh``: ``mesh`` itself, or a one-axis mesh (named ``axis``) over a list
    of devices.

    >>> import jax
    >>> mesh_of(jax.devices()[:1]).axis_names
    ('model',)
    """
    from jax.sharding import Mesh

    if isinstance(mesh, Mesh):
        return mesh
    try:
        devices = list(mesh)
    except TypeError:
        raise EvaluationError(f"mesh={mesh!r}: give a jax.sharding.Mesh or a list of devices") from None
    if not devices:
        raise EvaluationError("mesh=[]: give at least one device")
    return Mesh(np.array(devices), (axis,))


def _as_spec(spec):
    from jax.sharding import PartitionSpec

    if isinstance(spec, PartitionSpec):
        return spec
    if spec is None or isinstance(spec, (str, tuple, list)):
        return PartitionSpec(*((spec,) if spec is None or isinstance(spec, str) else spec))
    raise EvaluationError(f"shard spec {spec!r}: give a jax.sharding.PartitionSpec (e.g. P('model', None))")


class Placement:
    """Where each argument of ``program`` goes on ``mesh``: the ``shard`` matchers' specs for the
    arguments they match, replicated otherwise.  ``batched`` arguments (a leading
    batch axis in their values) are split along ``batch_axis`` first.  Placed Array values are
    remembered (one transfer per weight, not one per call)."""

    def __init__(self, mesh, program, shard: Mapping | None = None, batch_axis: str | None = None):
        from jax.sharding import NamedSharding, PartitionSpec

        from ...select import as_matcher

        self.mesh = mesh
        self.arg_nodes = tuple(program.arg_nodes())
        root = program.nodes[program.outputs[0]]
        names = tuple(mesh.axis_names)
        if batch_axis is not None and batch_axis not in names:
            raise EvaluationError(f"batch axis {batch_axis!r} is not an axis of the mesh {names}")
        self.batch_axis = batch_axis
        self._specs: dict[int, PartitionSpec] = {}
        by_hash = {n.hash: i for i, n in enumerate(self.arg_nodes)}
        for matcher, spec in (shard or {}).items():
            spec = _as_spec(spec)
            m = as_matcher(matcher)
            matched = m.matches(root, program.nodes)
            hits = [n for n in self.arg_nodes if n.hash in matched]
            if not hits:
                raise EvaluationError(
                    f"shard: {matcher!r} matches none of the circuit's Arrays or Symbols "
                    f"(only arguments can be sharded; e.g. {', '.join(repr(n.name) for n in self.arg_nodes[:4])})"
                )
            for n in hits:
                self._check(n, spec, names)
                self._specs[by_hash[n.hash]] = spec
        self._sharding = {i: NamedSharding(mesh, s) for i, s in self._specs.items()}
        self._replicated = NamedSharding(mesh, PartitionSpec())
        self._placed: dict[int, tuple] = {}  # slot -> (value given, placed value)

    def _check(self, node, spec, names):
        if type(node) not in (Array, Symbol):
            raise EvaluationError(f"shard: {node.line()} is not an Array or Symbol; only arguments can be sharded")
        if len(spec) > len(node.shape):
            raise EvaluationError(f"shard: {spec} has {len(spec)} entries for {node.line()} of rank {len(node.shape)}")
        for axis, entry in enumerate(spec):
            parts = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            size = 1
            for p in parts:
                if p not in names:
                    raise EvaluationError(f"shard: {spec} for {node.line()} names {p!r}, not an axis of the mesh {names}")
                size *= self.mesh.shape[p]
            if node.shape[axis] % size:
                raise EvaluationError(
                    f"shard: axis {axis} of {node.line()} has size {node.shape[axis]}, not divisible by the "
                    f"{size} devices of {spec[axis]!r}: pick a mesh axis whose size divides it"
                )

    def specs(self) -> dict:
        """``{argument name: PartitionSpec}`` for the sharded arguments."""
        return {self.arg_nodes[i].name: s for i, s in self._specs.items()}

    def _batched_sharding(self, slot):
        from jax.sharding import NamedSharding, PartitionSpec

        rest = tuple(self._specs.get(slot, PartitionSpec()))
        return NamedSharding(self.mesh, PartitionSpec(self.batch_axis, *rest))

    def place(self, args: Sequence, axes: Sequence | None = None) -> list:
        """The argument values on the mesh (``axes[i] == 0``: a batched value)."""
        import jax

        out = []
        for slot, value in enumerate(args):
            batched = axes is not None and axes[slot] == 0
            if batched:
                out.append(jax.device_put(value, self._batched_sharding(slot)))
                continue
            if type(self.arg_nodes[slot]) is Symbol:
                out.append(jax.device_put(value, self._sharding.get(slot, self._replicated)))
                continue
            seen = self._placed.get(slot)
            if seen is None or seen[0] is not value:
                seen = (value, jax.device_put(value, self._sharding.get(slot, self._replicated)))
                self._placed[slot] = seen
            out.append(seen[1])
        return out

    def batch_devices(self) -> int:
        """How many ways a batch is split (1 without a batch axis)."""
        return 1 if self.batch_axis is None else int(self.mesh.shape[self.batch_axis])
