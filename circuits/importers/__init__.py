"""Importers: circuits from other systems' models (HuggingFace state dicts, torch.export programs).

This package is the home of DESIGN §11's importers. torch and transformers are optional extras,
imported only inside the importers that need them. Nothing lives here yet.
"""
