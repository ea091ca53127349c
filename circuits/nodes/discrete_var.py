"""DiscreteVar: a random variable over a finite set of samples (rust_circuit's ``DiscreteVar``)."""

from __future__ import annotations

from .base import Circuit, check_children, no_payload, shape_error


class DiscreteVar(Circuit):
    """A random variable taking the value ``values[i]`` with probability ``probs[i]``: children
    ``(values [n, ...], probs [n])``, shape ``values.shape[1:]``.  It has no single value: it
    is evaluated by expanding it into a batch of its samples (``circuits.expand.sample``), the
    ground causal scrubbing builds on.

    >>> import numpy as np
    >>> from circuits import Array
    >>> v = DiscreteVar(Array(np.zeros((5, 3), np.float32)), Array(np.full((5,), .2, np.float32)))
    >>> v.shape
    (3,)
    """

    __slots__ = ()
    type_name = "DiscreteVar"
    child_count = (2, 2)

    def _setup(self, values, probs, name=None):
        values, probs = check_children("DiscreteVar", name, (values, probs))
        if len(values.shape) < 1 or probs.shape != values.shape[:1]:
            raise shape_error("DiscreteVar", name, "", (values, probs),
                              "values must be [n, ...] and probs [n] (one probability per sample)")
        return self._set_common((values, probs), values.shape[1:], values.dtype, name)

    @classmethod
    def parse_payload(cls, text):
        return no_payload(cls, text, "'DiscreteVar' with the values and probs lines under it")

    def expanded(self, children, gained, size_map, replacements=None):
        """The same variable over the expanded values and probabilities."""
        return DiscreteVar(*children, name=self.name)

