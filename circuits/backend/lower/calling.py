"""Arguments bound once per program: the per-call fast path of ``Compiled`` and ``evaluate_batched``.

``bind_arguments`` checks every argument of a program at every call: each Array's and Scalar's
device value looked up, each Symbol found among the inputs by node or name, its shape and dtype
read and its cast decided.  For a program called again and again (a ``Compiled``, a circuit
evaluated on batch after batch) that is the same work each time; on a GPU, where the seed's
arithmetic is 0.1 ms, it was most of the gap to a hand-written ``jax.jit`` (BENCHMARKS.md, issue
24).  An ``ArgumentBinder`` does it once:

- the Arrays' and Scalars' device values are looked up on the first call and kept, in their
  argument positions, with the program (the program holds their nodes, so nothing lives longer);
- how the inputs' keys map to the Symbols is resolved once per set of keys;
- each input's type, shape and dtype (its *signature*) is checked once per argument: a signature
  seen before skips the check, one not seen before is checked the full way;
- what depends on an input's *values* is checked at every call, as ``bind_arguments`` does: the
  range of int tokens that a gather reads or that would wrap in the cast, a finite float that
  would become inf in a narrowing cast.  Their extent is read
  from the host for a numpy array (which the caller may have changed in place since the last
  call) and once per device array (JAX arrays are immutable: kept by identity while it lives).

Only dict inputs whose values are numpy or (concrete) JAX arrays take the fast path; anything
else, and any input the checks reject, goes the full way (``bind_arguments``), which raises the
library's error naming the Symbol.  Inputs are passed on as they are (a numpy array is not
copied unless its dtype must change; JAX moves it to the device in the call).

>>> import numpy as np
>>> from circuits import Symbol, Array, Einsum
>>> from circuits.backend.lower.program import Program
>>> x = Symbol((2,), name='x')
>>> program = Program([Einsum.from_spec('a,a->', x, Array(np.ones(2, np.float32), name='w'))], 'float32')
>>> binder = ArgumentBinder(program, 'float32')
>>> args = binder.bind({'x': np.arange(2.0)})
>>> [a.dtype.name for a in args]               # the Symbol cast to float32, the Array on the device
['float32', 'float32']
>>> binder.bind({'x': np.arange(3.0)}) is None  # a wrong shape: the full check raises it
True
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from ...errors import EvaluationError
from ...nodes import Symbol
from ..cache.bounded import WeakCaches
from .binding import bind_arguments, check_symbol_value, leaf_value, narrows, overflowed, symbol_values
from .program import Program

__all__ = ["ArgumentBinder", "binder_of", "bind_once"]

# At most this many sets of input keys and input signatures are kept per program (then the
# table starts again: a caller that keys every call differently just takes the full check).
_MAX_LAYOUTS = 32
_MAX_SIGNATURES = 256

_binder_lock = threading.Lock()
_BINDERS = WeakCaches("binders", "compiled")  # every live binder's tables, in cache_stats and clear_cache


def bind_once(program: Program, inputs, fdt: str, batched: bool = False, given=None):
    """``bind_arguments(program, inputs, fdt, batched=batched, given=given)``, through the binder
    kept with ``program`` when the inputs allow it (the same values, the same errors): how every
    path binds a program's arguments."""
    if given is None:
        bound = binder_of(program, fdt).bind(inputs, batched)
        if bound is not None:
            return bound
    return bind_arguments(program, inputs, fdt, batched=batched, given=given)


def binder_of(program: Program, fdt: str) -> "ArgumentBinder":
    """The binder kept with ``program`` (made on first use): the program cached for a live
    circuit (``cached_program``) carries it from one ``evaluate_batched`` call to the next."""
    binder = program.call_state
    if binder is None or binder.fdt != fdt:
        with _binder_lock:
            binder = program.call_state
            if binder is None or binder.fdt != fdt:
                binder = program.call_state = ArgumentBinder(program, fdt)
                _BINDERS.add(binder)
    return binder


class ArgumentBinder:
    """Binds a program's arguments for one float precision ``fdt``; ``bind(inputs)`` returns the
    argument list (``bind(inputs, batched=True)``: with the batch axes, as ``bind_arguments``
    does) or None when the inputs must take the full check (see the module docstring)."""

    __slots__ = ("fdt", "_nodes", "_free", "_given", "_index_ranges", "_base", "_symbols", "_ranges", "_layouts",
                 "_signatures", "_extents", "__weakref__")

    def __init__(self, program: Program, fdt: str):
        # what the binder needs of the program, not the program (which may keep it: no cycle)
        self.fdt = fdt
        self._nodes = program.arg_nodes()
        self._free = program.free_symbols()
        self._given = bool(program.given_slots)
        self._index_ranges = program.index_ranges()
        self._base = None  # the argument list with the constants in place, None at the Symbols
        self._symbols = {}  # Symbol hash -> its argument position
        self._ranges = {}  # argument position -> (lo, hi) of a gather it indexes
        self._layouts = {}  # tuple of input keys -> ((position, key), ...) or False (full check)
        self._signatures = {}  # (position, type, shape, dtype, batched?) -> _Signature or False
        self._extents = {}  # id(device array) -> (weak reference, (min, max))

    def info(self) -> dict:
        """What the binder keeps: ``entries`` (its constants, layouts, signatures and extents)."""
        held = (self._base is not None) + len(self._layouts) + len(self._signatures) + len(self._extents)
        return {"entries": held, "bytes": 0}

    def clear(self) -> None:
        """Forget what was bound once (the constants' device values, the checks' tables)."""
        self._base = None
        self._symbols, self._ranges, self._layouts, self._signatures, self._extents = {}, {}, {}, {}, {}

    # ------------------------------------------------------------------ once per program
    def _constants(self):
        """The argument list with the Arrays' and Scalars' device values in place; None when
        one cannot be bound (a placeholder Array: the full check reports it)."""
        if self._base is not None:
            return self._base
        if self._given:
            return None
        problems: list[str] = []
        targets: dict = {}
        base, symbols = [], {}
        for pos, node in enumerate(self._nodes):
            if type(node) is Symbol:
                symbols[node.hash] = pos
                base.append(None)
            else:
                base.append(leaf_value(node, self.fdt, problems, targets))
        if problems:
            return None
        ranges = self._index_ranges
        self._ranges = {pos: ranges[node.hash][:2] for pos, node in enumerate(self._nodes)
                        if type(node) is Symbol and node.hash in ranges}
        self._symbols = symbols
        self._base = base
        return base

    def _layout(self, keys: tuple):
        """``((position, key), ...)``: where each free Symbol's value is found among ``keys``
        (False when the keys leave one unbound or ambiguous: the full check says which)."""
        problems: list[str] = []
        try:
            found = symbol_values(self._free, dict(zip(keys, range(len(keys)))), problems)
        except EvaluationError:  # a key that is neither a Symbol nor a name
            problems.append("bad key")
        layout = False if problems else tuple((self._symbols[h], keys[i]) for h, i in found.items())
        if len(self._layouts) >= _MAX_LAYOUTS:
            self._layouts.clear()
        self._layouts[keys] = layout
        return layout

    def _signature(self, sig: tuple, value, batched: bool):
        """What the input signature ``sig`` at an argument needs (checked the full way once);
        False when the full check must run at every call (another kind of value, or an error)."""
        pos, kind = sig[0], sig[1]
        node = self._nodes[pos]
        out = False
        if _concrete_array(value, kind):
            problems: list[str] = []
            cast, is_batched = check_symbol_value(node, value, self.fdt, problems, None if batched else False)
            if problems:  # not kept: the problem may be this value's (an int that would wrap), not its signature's
                return False
            target = cast.dtype
            wrap = None
            if target.kind in "iu" and not np.can_cast(value.dtype, target):
                info = np.iinfo(target)
                wrap = (int(info.min), int(info.max) + 1)
            out = _Signature(None if target == value.dtype else target, 0 if is_batched else None, wrap,
                             self._ranges.get(pos), issubclass(kind, np.ndarray), narrows(value.dtype, target))
        if len(self._signatures) >= _MAX_SIGNATURES:
            self._signatures.clear()
        self._signatures[sig] = out
        return out

    # ------------------------------------------------------------------ every call
    def bind(self, inputs, batched: bool = False):
        """The argument values (and with ``batched``, the batch axes) for ``inputs``, or None."""
        base = self._base if self._base is not None else self._constants()
        if base is None:
            return None
        if inputs is None:
            keys = ()
        elif type(inputs) is dict:
            keys = tuple(inputs)
        else:
            return None
        layout = self._layouts.get(keys)
        if layout is None:
            layout = self._layout(keys)
        if layout is False:
            return None
        args = list(base)
        axes = [None] * len(args) if batched else None
        signatures = self._signatures
        for pos, key in layout:
            value = inputs[key]
            kind = type(value)
            try:
                sig = (pos, kind, value.shape, value.dtype, batched)
            except AttributeError:
                return None
            found = signatures.get(sig)
            if found is None:
                found = self._signature(sig, value, batched)
            if found is False:
                return None
            if found.bounds is not None:
                extent = self._extent(value, found.host)
                if extent is not None and not all(lo <= extent[0] and extent[1] < hi for lo, hi in found.bounds):
                    return None  # an index out of range or an int that would wrap: the full check says which
            if found.cast is not None:
                if found.narrows:
                    with np.errstate(over="ignore"):
                        cast = value.astype(found.cast)
                    if overflowed(value, cast) is not None:
                        return None  # a finite float that became inf: the full check says which
                    value = cast
                else:
                    value = value.astype(found.cast)
            args[pos] = value
            if batched:
                axes[pos] = found.axis
        return (args, axes) if batched else args

    def _extent(self, value, host: bool):
        """``(min, max)`` of an int input (None when empty): read from a numpy array at every
        call, once per JAX array while it lives."""
        if host:
            return _read_extent(value)
        key = id(value)
        found = self._extents.get(key)
        if found is not None and found[0]() is value:
            return found[1]
        extent = _read_extent(value)
        try:
            ref = weakref.ref(value, lambda r, k=key, extents=self._extents: _forget(extents, k, r))
        except TypeError:
            return extent
        if len(self._extents) >= _MAX_SIGNATURES:
            self._extents.clear()
        self._extents[key] = (ref, extent)
        return extent


def _read_extent(value):
    """``(min, max)`` of an int array, None when empty (a device array's reduced on the device)."""
    return (int(value.min()), int(value.max())) if value.size else None


def _forget(extents: dict, key, ref):
    found = extents.get(key)
    if found is not None and found[0] is ref:
        extents.pop(key, None)


class _Signature:
    """What one checked input signature needs at each call: a cast (the dtype, or None), its
    batch axis, the bounds its values must lie in (``[(lo, hi), ...]`` half-open, or None), and
    whether it is a host (numpy) value."""

    __slots__ = ("cast", "axis", "bounds", "host", "narrows")

    def __init__(self, cast, axis, wrap, index_range, host: bool, narrows: bool = False):
        self.cast = cast
        self.narrows = narrows  # a float cast that can overflow: its result is checked at each call
        self.axis = axis
        bounds = [b for b in (wrap, index_range) if b is not None]
        self.bounds = bounds or None
        self.host = host


def _concrete_array(value, kind) -> bool:
    """A numpy array, or a JAX array with a value (not a tracer: its values cannot be read)."""
    if issubclass(kind, np.ndarray):
        return True
    import jax

    return isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer)
