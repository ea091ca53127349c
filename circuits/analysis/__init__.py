"""Analysis of circuits without changing them: cost (FLOPs, bytes, peak memory), profiles, report tables.

This package is the home of ``cost`` and ``profile`` (DESIGN §12). It may import the core and the
backend, never ``rewrites`` or ``interp``. Here so far: ``diff`` (``circuits.diff``: the changed
nodes between two circuits with their paths).
"""
