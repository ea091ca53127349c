"""Normalisation layers recognised by structure: a LayerNorm or an RMSNorm as the model builders
(``circuits.models.blocks``) write them, whatever their names.

``layer_norm_parts(node)``: bias + scale * (x - mean x) * rsqrt(var + eps) (the scale and the bias
optional); ``rms_norm_parts(node)``: x * rsqrt(mean(x^2) + eps) * scale; ``norm_parts`` tries
both.  Residual-stream path expansion, the logit lens and TransformerLens's ``hook_scale`` /
``hook_normalized`` read their input ``x``, their ``rsqrt`` (the inverse of TransformerLens's
``hook_scale``) and the normalised value.

>>> import numpy as np
>>> from circuits import Array
>>> from circuits.models.blocks import layer_norm, rms_norm
>>> x = Array(np.ones((2, 3), np.float32), name='x')
>>> w = Array(np.ones(3, np.float32), name='w')
>>> norm_parts(layer_norm(x, w, None, 'n'))['kind'], norm_parts(rms_norm(x, w, 'r'))['kind'], norm_parts(x)
('layer_norm', 'rms_norm', None)
"""

from __future__ import annotations

from ..nodes import Add, Circuit, Einsum, GeneralFunction

__all__ = ["layer_norm_parts", "rms_norm_parts", "norm_parts"]


def _is_rsqrt(node: Circuit) -> bool:
    return isinstance(node, GeneralFunction) and node.function.name == "rsqrt"


def _centred(node: Circuit) -> dict | None:
    """``x - mean(x)`` as ``layer_norm`` writes it (``Add(x, neg_mean)``, ``neg_mean`` reading x)."""
    if not (isinstance(node, Add) and len(node.children) == 2):
        return None
    x, neg_mean = node.children
    if isinstance(neg_mean, Einsum) and neg_mean.children and neg_mean.children[0] is x:
        return {"x": x, "neg_mean": neg_mean, "mean_subbed": node}
    return None


def _normalised(node: Circuit) -> dict | None:
    """``(x - mean x) * rsqrt(...)``: the LayerNorm before its scale and bias (``'ln.y'``)."""
    if not (isinstance(node, Einsum) and len(node.children) == 2 and _is_rsqrt(node.children[1])):
        return None
    found = _centred(node.children[0])
    if found is None:
        return None
    return {**found, "y": node, "rsqrt": node.children[1]}


def layer_norm_parts(node: Circuit) -> dict | None:
    """The parts of a LayerNorm output built like ``circuits.models.blocks.layer_norm``, or None.

    ``{'kind': 'layer_norm', 'x': input, 'bias', 'y_scaled', 'y', 'mean_subbed', 'rsqrt', 'scale',
    'neg_mean'}`` (``bias`` / ``scale`` None when the LayerNorm has none; ``y`` is the value
    before the scale and bias); recognised by structure (node types and how they connect), not by
    name.

    >>> import numpy as np
    >>> from circuits import Array
    >>> from circuits.models.blocks import layer_norm
    >>> x = Array(np.ones((2, 3), np.float32), name='x')
    >>> ln = layer_norm(x, Array(np.ones(3, np.float32), name='w'), Array(np.zeros(3, np.float32), name='b'), 'n')
    >>> layer_norm_parts(ln)['x'] is x, layer_norm_parts(x)
    (True, None)
    """
    if isinstance(node, Add) and len(node.children) == 2:
        for i in (1, 0):
            found = _scaled(node.children[i])
            if found is not None:
                return {"kind": "layer_norm", **found, "bias": node.children[1 - i], "out": node}
        return None
    found = _scaled(node)
    if found is not None:
        return {"kind": "layer_norm", **found, "bias": None, "out": node}
    found = _normalised(node)
    if found is not None:
        return {"kind": "layer_norm", **found, "scale": None, "y_scaled": node, "bias": None, "out": node}
    return None


def _scaled(node: Circuit) -> dict | None:
    """``y * scale`` over a normalised ``y``."""
    if not (isinstance(node, Einsum) and len(node.children) == 2):
        return None
    found = _normalised(node.children[0])
    scale = node.children[1]
    if found is None or node.shape != found["y"].shape or len(scale.shape) != 1:
        return None  # a projection of a normalised value (a weight matrix) is no LayerNorm scale
    return {**found, "y_scaled": node, "scale": scale}


def rms_norm_parts(node: Circuit) -> dict | None:
    """The parts of an RMSNorm output built like ``circuits.models.blocks.rms_norm``
    (``Einsum(x, rsqrt(mean(x^2) + eps), scale)``), or None: ``{'kind': 'rms_norm', 'x', 'rsqrt',
    'scale', 'out'}``.

    >>> import numpy as np
    >>> from circuits import Array
    >>> from circuits.models.blocks import rms_norm
    >>> x = Array(np.ones((2, 3), np.float32), name='x')
    >>> rms_norm_parts(rms_norm(x, Array(np.ones(3, np.float32), name='w'), 'n'))['x'] is x
    True
    """
    if not (isinstance(node, Einsum) and len(node.children) == 3):
        return None
    x, rsqrt, scale = node.children
    if not _is_rsqrt(rsqrt):
        return None
    # rsqrt(eps + mean(x^2)): the mean of squares reads x itself, twice
    inner = rsqrt.children[0]
    if not any(isinstance(c, Einsum) and c.children[:2] == (x, x) for c in getattr(inner, "children", ())):
        return None
    return {"kind": "rms_norm", "x": x, "rsqrt": rsqrt, "scale": scale, "out": node}


def norm_parts(node: Circuit) -> dict | None:
    """``layer_norm_parts(node)`` or ``rms_norm_parts(node)``, whichever recognises it (None: neither)."""
    return layer_norm_parts(node) or rms_norm_parts(node)
