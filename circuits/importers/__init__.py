"""Importers: circuits from other systems' models.

- ``from_torch(module, example_inputs)`` (``torch_export``): any PyTorch module, through
  torch.export's ATen graph; the op converters live in ``aten_ops``.
- ``from_tracr(model, inputs)`` (``tracr``): a RASP program compiled by tracr, with
  ``tracr_decode`` (its decoded outputs) and ``tracr_tokens`` (inputs encoded);
  ``tracr_task('reverse' | 'frac_prevs')`` (``tracr_tasks``): the ACDC paper's tracr tasks with
  their canonical circuits as edge sets.

torch, transformers and tracr are optional extras, imported only when an importer is called:
importing this package (or ``circuits``) imports none of them.
"""

from .torch_export import from_torch
from .tracr import from_tracr, tracr_decode, tracr_tokens
from .tracr_tasks import TracrTask, tracr_task

__all__ = ["from_torch", "from_tracr", "tracr_decode", "tracr_tokens", "tracr_task", "TracrTask"]
