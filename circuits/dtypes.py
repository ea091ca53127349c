"""Dtypes: the names circuits use, normalisation, and numpy-style promotion.

A leaf module: it imports nothing from the rest of the package but ``errors``.

>>> promote(["int64", "float32"]), normalize_dtype(None), is_int("uint8")
('float64', 'float32', True)
"""

from __future__ import annotations

from .errors import CircuitError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
DEFAULT_FLOAT = "float32"


_NAMED: dict = {}  # numpy dtype -> its name (``dtype.name`` is a slow property)
_STR: dict = {}  # dtype -> str(dtype)


def dtype_str(dtype) -> str:
    """``str(dtype)``, memoised: numpy builds a dtype's name anew at every call (about 20
    microseconds), and kernel keys are made per operation run.

    >>> import numpy as np
    >>> dtype_str(np.dtype('float32'))
    'float32'
    """
    name = _STR.get(dtype)
    if name is None:
        name = _STR[dtype] = str(dtype)
    return name


def normalize_dtype(dtype) -> str:
    """The canonical name of a dtype ('float32', 'int64', ...); raises on unsupported ones."""
    if type(dtype) is str and dtype in DTYPES:
        return dtype
    import numpy as np

    if dtype is None:
        return DEFAULT_FLOAT
    if isinstance(dtype, np.dtype):
        name = _NAMED.get(dtype)
        if name is None:
            name = _NAMED[dtype] = dtype.name
    else:
        name = str(dtype) if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in DTYPES:
        raise CircuitError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    return dtype in INT_DTYPES


def promote(dtypes) -> str:
    """numpy-style result dtype of combining values of these dtypes (floats win over ints)."""
    import numpy as np

    dtypes = tuple(dtypes)
    if not dtypes:
        return DEFAULT_FLOAT
    first = dtypes[0]
    for d in dtypes:
        if d != first:
            break
    else:
        return first
    if "bfloat16" in dtypes:
        floats = [d for d in dtypes if is_float(d)]
        return "bfloat16" if set(floats) == {"bfloat16"} else max(floats, key=FLOAT_DTYPES.index)
    return np.result_type(*[np.dtype(d) for d in dtypes]).name


# Bytes per element of each dtype (for allocation budgets and cost estimates).
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2,
            "float32": 4, "int32": 4, "uint32": 4, "float64": 8, "int64": 8, "uint64": 8}
