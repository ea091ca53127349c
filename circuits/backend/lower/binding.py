"""Argument values for every evaluation path: precision, checking and binding the values of
Symbols, Arrays and Scalars, and the values on the device that every path shares.

All checks happen before anything runs: a bad input raises one ``EvaluationError`` that names
every offending node and says what was expected (a Symbol's shape and dtype, a placeholder
Array, an int that would wrap, a finite float that would become inf, an index outside the axis a
gather reads).

>>> from circuits import Symbol, Add
>>> from circuits.backend.lower.program import Program
>>> x = Symbol((2,), name='x')
>>> bind_arguments(Program([Add(x, x)], 'float32'), {'x': [1, 2]}, 'float32')
[array([1., 2.], dtype=float32)]
"""

from __future__ import annotations

import collections
import contextlib
import functools
import struct
import sys
import weakref
from typing import Iterable, Mapping

import numpy as np

from ...dtypes import FLOAT_DTYPES, dtype_str, is_float
from ...errors import EvaluationError
from ...nodes import Circuit, Scalar, Symbol
from ..cache.bounded import BoundedCache
from .program import ARGUMENT_TYPES, Program

__all__ = [
    "float_dtype", "precision", "bind_arguments", "symbol_values", "check_symbol_value", "leaf_value",
    "check_index_values", "device_cache_info", "raise_problems",
]


# ---------------------------------------------------------------------------- precision
def float_dtype(dtype) -> str:
    """Normalise the ``dtype=`` option: the float type every float value is computed in."""
    known = _FLOAT_NAMES.get(dtype) if type(dtype) is str else None  # read at every call: kept
    if known is not None:
        return known
    try:
        name = dtype if dtype == "bfloat16" else np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in FLOAT_DTYPES:
        raise EvaluationError(f"dtype={dtype!r}: evaluation precision must be one of {', '.join(FLOAT_DTYPES)}")
    if type(dtype) is str:
        _FLOAT_NAMES[dtype] = name  # only the spellings numpy accepts for a float dtype get in
    return name


_FLOAT_NAMES: dict = {}


def precision(fdt: str):
    """A context in which JAX computes in ``fdt`` (float64 needs JAX's x64 mode, switched on only
    for the duration of the call)."""
    if fdt == "float64":
        import jax

        return jax.enable_x64(True)
    return contextlib.nullcontext()


def _canonical(dtype: str):
    """The dtype JAX actually uses for ``dtype`` in the current precision (int64 -> int32 when
    x64 is off)."""
    if "jax" not in sys.modules and dtype != "bfloat16":  # JAX's own rule, without importing it
        from .numpy_ops import jax_dtype

        return jax_dtype(dtype)
    import jax

    return np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype) if dtype != "bfloat16" else jax.numpy.bfloat16))


# ---------------------------------------------------------------------------- binding values
def _as_array(value):
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return value
    try:
        return np.asarray(value)
    except Exception as e:  # noqa: BLE001 - report any unconvertible input the same way
        raise EvaluationError(f"cannot read {type(value).__name__} as an array: {e}") from None


def _kind(dtype) -> str:
    name = str(dtype)
    if name == "bfloat16":
        return "f"
    try:
        return np.dtype(dtype).kind
    except TypeError:
        return "?"


def _cast(value, dtype):
    if dtype_str(value.dtype) == str(dtype):
        return value
    return value.astype(dtype)


def _split_inputs(inputs: Mapping | None):
    by_node, by_name = {}, {}
    if inputs is None:
        return by_node, by_name
    if not isinstance(inputs, Mapping):
        raise EvaluationError(f"inputs must be a dict {{symbol or name: value}}, got {type(inputs).__name__}")
    for key, value in inputs.items():
        if isinstance(key, Circuit):
            if type(key) is not Symbol:
                raise EvaluationError(f"inputs key {key.line()} is not a Symbol; only Symbols are bound by inputs")
            by_node[key.hash] = value
        elif isinstance(key, str):
            by_name[key] = value
        else:
            raise EvaluationError(f"inputs keys must be Symbols or their names, got {key!r}")
    return by_node, by_name


def symbol_values(symbols: Iterable[Symbol], inputs: Mapping | None, problems: list) -> dict:
    """Symbol hash -> the raw value bound to it; unbound or ambiguous ones go to ``problems``."""
    by_node, by_name = _split_inputs(inputs)
    symbols = list(symbols)
    name_count = collections.Counter(s.name for s in symbols if s.name is not None and s.hash not in by_node)
    out = {}
    for sym in symbols:
        if sym.hash in by_node:
            out[sym.hash] = by_node[sym.hash]
        elif sym.name in by_name:
            if name_count[sym.name] > 1:
                problems.append(
                    f"input {sym.name!r} matches {name_count[sym.name]} distinct Symbols (e.g. "
                    f"{sym.line()}); key the inputs by the Symbol nodes themselves"
                )
            out[sym.hash] = by_name[sym.name]
        else:
            how = f"inputs={{{sym.name!r}: value}}" if sym.name else "inputs={symbol: value}"
            problems.append(f"unbound Symbol {sym.line()}: pass {how}")
    return out


def check_symbol_value(sym: Symbol, value, fdt: str, problems: list, batched: bool | None = False):
    """The value cast for ``sym`` (None after appending to ``problems``).  ``batched=None`` accepts
    either the Symbol's shape or one leading batch axis more; returns (value, is_batched)."""
    arr = _as_array(value)
    shape = tuple(arr.shape)
    if batched is None:
        is_batched = len(shape) == len(sym.shape) + 1
    else:
        is_batched = batched
    core = shape[1:] if is_batched else shape
    if core != sym.shape:
        expected = f"{list(sym.shape)}" + (" (or [batch, ...] of it)" if batched is None else "")
        problems.append(f"input for Symbol {sym.line()} has shape {list(shape)}; expected {expected}")
        return None, is_batched
    kind = _kind(arr.dtype)
    if is_float(sym.dtype):
        ok, target = kind in "fiu", fdt
    elif sym.dtype == "bool":
        ok, target = kind == "b", "bool"
    else:
        ok, target = kind in "iu", sym.dtype
    if not ok:
        problems.append(
            f"input for Symbol {sym.line()} has dtype {arr.dtype}; expected {sym.dtype}"
            + (" (a float array cannot be used as indices)" if kind == "f" else "")
        )
        return None, is_batched
    canonical = _canonical(target)
    bad = _wrapping_int(arr, canonical)
    if bad is not None:
        problems.append(
            f"input for Symbol {sym.line()} holds {bad}, outside the {canonical} it is computed in "
            f"(it would wrap silently): pass values in [{np.iinfo(canonical).min}, {np.iinfo(canonical).max}]"
            + (" or evaluate with dtype='float64' (64-bit ints)" if canonical.itemsize < 8 else "")
        )
        return None, is_batched
    if not narrows(arr.dtype, canonical):
        return _cast(arr, canonical), is_batched
    with np.errstate(over="ignore"):  # an overflow is reported below, by the Symbol's name
        cast = _cast(arr, canonical)
    bad = overflowed(arr, cast)
    if bad is not None:
        problems.append(
            f"input for Symbol {sym.line()} holds {bad!r}, beyond the largest {dtype_str(canonical)} "
            f"({_largest(canonical):g}) it is computed in (it would become inf silently): scale it, "
            "pass inf itself if that is meant"
            + (", or evaluate with dtype='float64'" if canonical.itemsize < 8 else "")
        )
        return None, is_batched
    return cast, is_batched


def _largest(dtype) -> float:
    """The largest finite value of an int or float dtype (bfloat16 included)."""
    if str(dtype) == "bfloat16":
        import ml_dtypes

        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    dtype = np.dtype(dtype)
    return float(np.iinfo(dtype).max if dtype.kind in "iu" else np.finfo(dtype).max)


def narrows(source, target) -> bool:
    """Whether the cast of a ``source`` int or float to the float ``target`` can turn a finite
    value into inf (float64 -> float32, an int -> float16)."""
    return _kind(target) == "f" and _kind(source) in "fiu" and _largest(source) > _largest(target)


def overflowed(value, cast):
    """A finite value of ``value`` (numpy or JAX) that became inf in ``cast``, its cast to a
    narrower float; None if none.  ``inf`` and ``nan`` given as such are not overflows."""
    if isinstance(cast, np.ndarray):
        xp = np
    else:
        import jax.numpy as xp
    if bool(xp.isfinite(cast).all()):
        return None
    lost = xp.isinf(cast) & xp.isfinite(value)
    if not bool(lost.any()):
        return None
    first = int(xp.argmax(lost.reshape(-1)))
    return value.reshape(-1)[first].item()


def _wrapping_int(arr, canonical):
    """A value of the int array ``arr`` that the cast to ``canonical`` would change (an int64
    token 2**32 + 3 becomes 3 in int32, before any range check could see it); None if none."""
    if canonical.kind not in "iu" or _kind(arr.dtype) not in "iu" or np.can_cast(arr.dtype, canonical):
        return None
    extent = _extent(arr)
    if extent is None:
        return None
    info = np.iinfo(canonical)
    lo, hi = extent
    return lo if lo < info.min else hi if hi > info.max else None


def leaf_value(node: Circuit, fdt: str, problems: list, targets: dict | None = None):
    """The argument value of an Array or Scalar: cast to the evaluation precision and on the
    device, uploaded once and reused by every later call (see "values on the device").
    ``targets`` (node dtype -> the dtype JAX computes it in) memoises that lookup over a call."""
    if targets is None:
        targets = {}
    target = targets.get(node.dtype)
    if target is None:
        target = targets[node.dtype] = _canonical(fdt if is_float(node.dtype) else node.dtype)
    if type(node) is Scalar:
        return _scalar_on_device(node.value, target)
    host = node.value
    if host is None:
        problems.append(
            f"placeholder Array {node.line()} has no value: give it one with "
            "circuits.bind(circuit, {name: array}) or circuits.fill_random(circuit, seed)"
        )
        return None
    entry = _on_device.peek(id(host))
    value = None if entry is None else entry.values.get(target)
    if value is not None:
        return value
    if host.nbytes <= _SMALL_BYTES:
        return _small_on_device(node, host, target)
    return _array_on_device(host, target)


def check_index_values(node: Circuit, value, index_range, problems: list) -> None:
    """Append to ``problems`` when ``value`` (bound to ``node``) holds an index outside
    ``index_range = (lo, hi, gather)``: a gather would silently give NaN there.  An Array's
    own value is checked from its host copy, its extent read once."""
    lo, hi, gather = index_range
    if type(node) is Symbol:
        extent = _extent(value)
    else:
        extent = _array_extent(node.value)
    if extent is None:
        return
    vmin, vmax = extent
    if lo <= vmin and vmax < hi:
        return
    bad = vmin if vmin < lo else vmax
    what = f"input for Symbol {node.line()}" if type(node) is Symbol else f"Array {node.line()}"
    problems.append(
        f"{what} holds index {bad}, outside [{lo}, {hi}) of the axis it gathers in "
        f"{gather.line()} (an out-of-range index would give NaN): check the tokens against the vocabulary"
    )


def _extent(value):
    """``(min, max)`` of an int array as Python ints, None when it is empty."""
    arr = np.asarray(value)
    if not arr.size:
        return None
    return int(arr.min()), int(arr.max())


# ---------------------------------------------------------------------------- values on the device
# One device-resident value per Array value (and per Scalar value) and evaluation dtype, shared
# by every evaluation path: evaluate, Compiled, evaluate_batched, the gradients and Eager hand
# the same device buffer to JAX on every call, so the weights cross from host to device once,
# not once per call (on a GPU that upload dominated: ~100 MB for the seed model).
#
# An Array's entry is keyed by the identity of its host value (an Array and its renamed twins
# share that object, so they share one upload) and dropped when that value dies: it lives
# exactly as long as the tensor and holds no node, so nodes stay collectable and the compile
# cache stays tensor-free.  On the CPU the upload aliases a 64-byte-aligned host value (Arrays
# store their private copies aligned; store files map aligned), so no second copy is held.
# Scalars share a small bounded cache keyed by value.  Fills run outside any lock: two threads
# may upload the same value at once, and the first stored wins.

# Small Arrays are also kept by content: the constants interventions make anew each time (a zeroed
# head, a mean, a patched value) cross to the device once.  Bounded in bytes, oldest first out.
_SMALL_BYTES = 1 << 18
# id(host value) -> _Entry (its device values by dtype, its extent): an entry goes with its value
_on_device = BoundedCache("device arrays", "values", lru=False)
# (content hash, shape, dtype, canonical dtype) -> device value
_small = BoundedCache("device small arrays", "values", max_bytes=1 << 26, lru=False)
# (value, canonical dtype) -> device value
_scalars_on_device = BoundedCache("device scalars", "values", max_entries=4096, lru=False)


_ALIAS_FROM_BYTES = 1 << 20


def _upload(value):
    """``value`` as a device array (the one place Arrays and Scalars cross to the device)."""
    import jax

    if getattr(value, "nbytes", 0) < _ALIAS_FROM_BYTES:
        # small: a copy is cheaper than the zero-copy path (~0.15 ms against ~1 ms a call on
        # the CPU), which matters for the constants a new intervention makes
        return jax.device_put(value)
    try:
        return jax.device_put(value, may_alias=True)
    except TypeError:  # a JAX without may_alias= (older than 0.4.36): copies
        return jax.device_put(value)


class _Entry:
    __slots__ = ("ref", "values", "extent")

    def __init__(self, ref):
        self.ref = ref
        self.values = {}  # canonical dtype -> device value
        self.extent = _UNREAD


_UNREAD = object()


def _entry(host) -> _Entry | None:
    """The cache entry of one host value (made on first use); None when the value cannot be
    tracked (no weak reference to it), so nothing is cached for it."""
    key = id(host)
    entry = _on_device.get(key)
    if entry is not None:
        return entry
    try:
        # the callback holds what it calls: at interpreter exit a value may die after this
        # module's globals are gone
        ref = weakref.ref(host, functools.partial(_forget, _on_device, key))
    except TypeError:
        return None
    return _on_device.setdefault(key, _Entry(ref))


def _forget(cache, key, ref):
    # the host value died: its device values go (unless a newer value already holds the id)
    cache.pop_if(key, lambda entry: entry.ref is ref)


def _array_on_device(host, target):
    entry = _entry(host)
    value = None if entry is None else entry.values.get(target)
    if value is None:
        value = _upload(_cast(_as_array(host), target))
        if entry is not None:
            value = entry.values.setdefault(target, value)
    return value


def _array_extent(host):
    entry = _entry(host)
    if entry is None:
        return _extent(host)
    if entry.extent is _UNREAD:
        entry.extent = _extent(host)
    return entry.extent


def _small_on_device(node, host, target):
    """The device value of a small Array's ``host`` value, shared by every Array of the same
    contents (``_array_on_device`` when it is not yet known)."""
    key = (node.content_hash, host.shape, host.dtype.str, target)
    found = _small.get(key)
    if found is None:
        found = _small.setdefault(key, _array_on_device(host, target), host.nbytes)
    return found


def _scalar_on_device(value: float, target):
    # 0.0 and -0.0 are equal keys but different values (Scalars hold one NaN object)
    key = (value, target) if value else (struct.pack("<d", value), target)
    found = _scalars_on_device.get(key)
    if found is None:
        found = _scalars_on_device.setdefault(key, _upload(np.asarray(value, dtype=target)))
    return found


def device_cache_info() -> dict:
    """How many host values have device copies (``arrays``) and how many Scalar values
    (``scalars``)."""
    return {"arrays": len(_on_device), "scalars": len(_scalars_on_device), "small_arrays": len(_small)}


def raise_problems(problems: list, what: str = "cannot evaluate"):
    if problems:
        shown = problems[:10] + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else [])
        raise EvaluationError(f"{what}:\n  " + "\n  ".join(shown))


def bind_arguments(program: Program, inputs: Mapping | None, fdt: str, *, batched: bool = False,
                   given: Mapping | None = None):
    """Argument values in ``program.arg_slots`` order, every one checked before anything runs.

    Arrays and Scalars give their device values (uploaded on first use, then reused).
    ``batched=True`` accepts a leading batch axis on Symbol values and also returns which
    arguments carry one.  ``given`` (node hash -> value) holds the values of the program's
    ``given_slots``, taken as they are (but a given Array or Symbol is still checked against
    the index range of a gather it feeds).
    """
    problems: list[str] = []
    nodes = program.arg_nodes()
    given_slots = program.given_slots
    syms = symbol_values(program.free_symbols(), inputs, problems)
    symbol_batched = None if batched else False
    targets: dict = {}
    values, axes = [], []
    for slot, node in zip(program.arg_slots, nodes):
        if slot in given_slots:
            values.append(given[node.hash])
            axes.append(None)
        elif type(node) is Symbol:
            raw = syms.get(node.hash)
            v, b = (None, False) if raw is None else check_symbol_value(node, raw, fdt, problems, symbol_batched)
            values.append(v)
            axes.append(0 if b else None)
        else:
            values.append(leaf_value(node, fdt, problems, targets))
            axes.append(None)
    ranges = program.index_ranges()
    if ranges:
        for slot, node, v in zip(program.arg_slots, nodes, values):
            r = ranges.get(node.hash)
            # a given computed value (e.g. a cached Index of the tokens) was checked when it was
            # computed; a given leaf (a sweep's own tokens) is checked here like any argument
            if r is not None and v is not None and (slot not in given_slots or type(node) in ARGUMENT_TYPES):
                check_index_values(node, v, r, problems)
    raise_problems(problems)
    if batched:
        return values, axes
    return values
