"""Values and files: the tensor store, circuit files, and values for placeholder Arrays.

- ``store``: ``TensorStore``, a content-addressed directory of tensors (one verified file per hash);
- ``files``: ``save``/``load`` (and ``save_many``/``load_many``), one self-contained file per circuit;
- ``values``: ``bind`` named Arrays to tensors, ``fill_random`` placeholders, list ``placeholders``.

>>> import numpy as np, circuits as C
>>> from circuits.io import bind
>>> c = C.parse("'s' Add\\n  'w' [2] Array 0a")
>>> C.evaluate(bind(c, {'w': np.ones(2, np.float32)})).tolist()
[1.0, 1.0]
"""

from .files import load, load_many, save, save_many
from .store import TensorStore
from .values import bind, fill_random, placeholders

__all__ = ["TensorStore", "save", "load", "save_many", "load_many", "bind", "fill_random", "placeholders"]
