"""Importers: circuits from other systems' models.

- ``from_torch(module, example_inputs)`` (``torch_export``): any PyTorch module, through
  torch.export's ATen graph; the op converters live in ``aten_ops``.

torch and transformers are optional extras, imported only when an importer is called: importing
this package (or ``circuits``) does not import torch.
"""

from .torch_export import from_torch

__all__ = ["from_torch"]
