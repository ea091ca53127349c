"""What every evaluation path shares: precision, checking and binding argument values, the one
jit policy with the one bounded compile cache and its counters, and resolving nodes given by name.

All checks happen before anything runs: a bad input raises one ``EvaluationError`` that names
every offending node and says what was expected.

Whether a program is compiled is decided in one place, ``maybe_jit``: ``mode='jit'`` always
compiles, ``'eager'`` never does, ``'auto'`` compiles programs of up to ``JIT_MAX_OPS`` distinct
nodes and any program whose compiled function is already cached.  Compiled functions live in
one cache keyed by the program's name- and value-blind key plus what the caller adds (``'run'``,
``'vmap'`` and its batch axes, ``'grad'`` and its slots), so every path reuses compiled code for
patched circuits alike.

>>> import numpy as np
>>> from circuits import Symbol, Add
>>> from circuits.backend.program import Program
>>> x = Symbol((2,), name='x')
>>> program = Program([Add(x, x)], 'float32')
>>> args = bind_arguments(program, {'x': [1, 2]}, 'float32')
>>> args
[array([1., 2.], dtype=float32)]
>>> run = maybe_jit((program.key, 'run'), len(program), 'auto', lambda: program.skeleton().run)
>>> run(args)
[Array([2., 4.], dtype=float32)]
>>> is_cached((program.key, 'run'))
True
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import struct
import threading
import weakref
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..dtypes import FLOAT_DTYPES, is_float
from ..errors import EvaluationError, SelectionError
from ..nodes import Circuit, Scalar, Symbol
from .fusion import lower as batch_heads_lowering  # heads batched, then gathered log_softmax fused
from .fusion import worth_lowering as has_head_sums
from .program import ARGUMENT_TYPES, Program

__all__ = [
    "float_dtype", "precision", "bind_arguments", "symbol_values", "check_symbol_value", "leaf_value",
    "check_index_values", "device_cache_info", "raise_problems", "MODES", "JIT_MAX_OPS", "check_mode", "use_jit", "maybe_jit", "cached_jit", "is_cached",
    "compile_cache_stats", "clear_compile_cache", "set_compile_cache_size", "resolve_nodes", "as_items", "program_with_also",
    "cached_program", "program_cache_info", "package_outputs", "counted_jit", "items_key_of", "worth_compiling", "is_compiled", "is_compiled_any",
]


# ---------------------------------------------------------------------------- precision
def float_dtype(dtype) -> str:
    """Normalise the ``dtype=`` option: the float type every float value is computed in."""
    try:
        name = dtype if dtype == "bfloat16" else np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in FLOAT_DTYPES:
        raise EvaluationError(f"dtype={dtype!r}: evaluation precision must be one of {', '.join(FLOAT_DTYPES)}")
    return name


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
    if str(value.dtype) == str(dtype):
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
    return _cast(arr, canonical), is_batched


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
    entry = _on_device.get(id(host))
    value = None if entry is None else entry.values.get(target)
    return _array_on_device(host, target) if value is None else value


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

_SCALAR_CACHE_SIZE = 4096
_on_device: dict = {}  # id(host value) -> _Entry (its device values by dtype, its extent)
_scalars_on_device: dict = {}  # (value, canonical dtype) -> device value, oldest first
_device_lock = threading.Lock()


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
        ref = weakref.ref(host, lambda r, key=key: _forget(key, r))
    except TypeError:
        return None
    with _device_lock:
        return _on_device.setdefault(key, _Entry(ref))


def _forget(key, ref):
    # the host value died: its device values go (unless a newer value already holds the id)
    entry = _on_device.get(key)
    if entry is not None and entry.ref is ref:
        _on_device.pop(key, None)


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


def _scalar_on_device(value: float, target):
    # 0.0 and -0.0 are equal keys but different values (Scalars hold one NaN object)
    key = (value, target) if value else (struct.pack("<d", value), target)
    found = _scalars_on_device.get(key)
    if found is None:
        found = _upload(np.asarray(value, dtype=target))
        with _device_lock:
            found = _scalars_on_device.setdefault(key, found)
            while len(_scalars_on_device) > _SCALAR_CACHE_SIZE:  # the oldest go first
                del _scalars_on_device[next(iter(_scalars_on_device))]
    return found


def device_cache_info() -> dict:
    """How many host values have device copies (``arrays``) and how many Scalar values
    (``scalars``)."""
    return {"arrays": len(_on_device), "scalars": len(_scalars_on_device)}


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


# ---------------------------------------------------------------------------- jit policy and compile cache
MODES = ("auto", "jit", "eager")

# Above this many distinct nodes ``mode='auto'`` runs op by op: XLA's compile time grows with
# program size (a 50,000-op chain takes ~15 s to compile on CPU, ~0.6 s to run eagerly), and a
# program already in the compile cache is jitted whatever its size.
JIT_MAX_OPS = 5000

_cache: "collections.OrderedDict[Any, Callable]" = collections.OrderedDict()
_cache_lock = threading.Lock()
_cache_size = 128
_stats = collections.Counter()


def check_mode(mode: str) -> str:
    """The ``mode=`` option, checked."""
    if mode not in MODES:
        raise EvaluationError(f"mode={mode!r}: use one of {', '.join(MODES)}")
    return mode


def use_jit(mode: str, size: int, key) -> bool:
    """The jit policy: compile a program of ``size`` distinct nodes whose function is cached
    under ``key``?"""
    if mode == "auto":
        return size <= JIT_MAX_OPS or is_cached(key)
    return mode == "jit"


def worth_compiling(program: Program, key) -> bool:
    """Whether the tiered ``'auto'`` mode should compile ``program`` whole (under ``key``): when it
    is small enough (``JIT_MAX_OPS``) or already compiled."""
    return use_jit("auto", len(program), key)


def maybe_jit(key, size: int, mode: str, make: Callable[[], Callable]) -> Callable:
    """The function ``make()`` builds: jitted and from the compile cache (under ``key``) when
    the jit policy says so, else as it is (it then runs op by op).

    ``make`` must build a function that holds no node and no tensor (a ``Skeleton``'s ops):
    the cache outlives the circuit."""
    if use_jit(mode, size, key):
        return cached_jit(key, make)
    return make()


def cached_jit(key, make: Callable[[], Callable]) -> Callable:
    """``jax.jit`` of the function ``make()`` builds, cached under ``key``: made on a miss (the
    least recently used entry is evicted beyond the cache size), every trace counted as a
    compilation."""
    with _cache_lock:
        fn = _cache.get(key)
        if fn is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return fn
        _stats["misses"] += 1
    fn = _counted_jit(make())
    with _cache_lock:
        _cache[key] = fn
        while len(_cache) > _cache_size:
            _cache.popitem(last=False)
            _stats["evictions"] += 1
    return fn


def _counted_jit(fn: Callable) -> Callable:
    return counted_jit(fn, "compilations")


def counted_jit(fn: Callable, counter: str) -> Callable:
    """``jax.jit(fn)``, every trace (a compilation for XLA) counted under ``counter`` in
    ``cache_stats()`` (``'compilations'`` for whole programs, ``'kernel_compilations'`` for the
    per-operation kernels of ``circuits.backend.incremental``)."""
    import jax

    from .persistent import ensure_persistent_cache

    ensure_persistent_cache()

    def traced(*args):
        with _cache_lock:
            _stats[counter] += 1
        return fn(*args)

    return jax.jit(traced)


def is_cached(key) -> bool:
    with _cache_lock:
        return key in _cache


def is_compiled(key) -> bool:
    """Whether the compile cache holds a function under ``key`` (e.g. ``(program.key, 'run')``)."""
    return is_cached(key)


def is_compiled_any(prefix: tuple) -> bool:
    """Whether the compile cache holds a function whose key starts with ``prefix`` (e.g. a
    program's ``vmap`` over any batch axes)."""
    n = len(prefix)
    with _cache_lock:
        return any(type(k) is tuple and k[:n] == prefix for k in _cache)


def compile_cache_stats() -> dict:
    """Counters of the compile cache: ``compilations`` (whole programs traced for XLA),
    ``kernel_compilations`` (per-operation kernels traced), ``hits``, ``misses``, ``evictions``,
    and its ``size`` and ``max_size`` (``circuits.backend.cache_stats`` adds the value cache).

    >>> sorted(compile_cache_stats())
    ['compilations', 'evictions', 'hits', 'kernel_compilations', 'max_size', 'misses', 'size']
    """
    with _cache_lock:
        out = {k: _stats[k] for k in ("compilations", "kernel_compilations", "hits", "misses", "evictions")}
        out.update(size=len(_cache), max_size=_cache_size)
    return out


def clear_compile_cache():
    """Drop every cached compiled function (the counters keep counting).

    >>> clear_compile_cache(); compile_cache_stats()['size']
    0
    """
    with _cache_lock:
        _cache.clear()


def set_compile_cache_size(n: int):
    """Bound the compile cache to ``n`` functions (least recently used ones go first).

    >>> set_compile_cache_size(256); compile_cache_stats()['max_size']
    256
    >>> set_compile_cache_size(128)
    """
    global _cache_size
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise EvaluationError(f"compile cache size must be an int number of functions, got {n!r}")
    if int(n) < 1:
        raise EvaluationError(f"compile cache size must be at least 1 function, got {n}")
    with _cache_lock:
        _cache_size = int(n)
        while len(_cache) > _cache_size:
            _cache.popitem(last=False)
            _stats["evictions"] += 1


# ---------------------------------------------------------------------------- nodes by name
def as_items(also) -> list:
    """The ``also=`` (or ``wrt=``) option as a list: one node or name, or a sequence of them."""
    if also is None:
        return []
    return [also] if isinstance(also, (str, Circuit)) else list(also)


def program_with_also(circuit: Circuit, fdt: str, also, batch_heads: bool = False) -> tuple[Program, list]:
    """A program computing ``circuit`` then the nodes ``also`` names; and the items as given.

    ``batch_heads=True`` lowers sums of per-head subcircuits to one computation over a head axis
    (``circuits.backend.head_batching``); nodes named by ``also`` keep their values."""
    items = as_items(also)
    program = Program([circuit], fdt)
    wanted = resolve_nodes(program, items, "also") if items else []
    if batch_heads and has_head_sums(program.nodes):
        (root,), kept = batch_heads_lowering([circuit], wanted)
        if root is not circuit:
            return Program([root, *(kept[n.hash] for n in wanted)], fdt), items
    if wanted:
        program = program.with_outputs([circuit, *wanted])
    return program, items


# ---------------------------------------------------------------------------- programs of live circuits
# ``evaluate`` called again on a circuit it has seen reuses the circuit's lowered program: no new
# walk, key or argument table, so a warm ``evaluate`` costs what a ``Compiled`` call costs.  An
# entry is keyed by the identity of the root (checked through a weak reference), holds a
# *detached* program (its leaves, its skeleton; no interior node, so not the root), and goes
# when the root dies; at most ``_PROGRAMS_SIZE`` roots are kept, the least recently used go first.

_PROGRAMS_SIZE = 64
_PROGRAMS_PER_ROOT = 8
_programs: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()  # id(root) -> (weakref, {key: entry})
# Reentrant: a root's weak reference callback (``_drop_program``) can run in the thread that holds
# the lock, when the garbage collector frees a circuit during an update of the table.
_programs_lock = threading.RLock()


def items_key_of(also):
    """A hashable key for the ``also=`` option (names, or nodes by hash); None when an item is
    neither.

    >>> items_key_of(['a'])
    (('name', 'a'),)
    """
    return _items_key(as_items(also))


def _items_key(items: list):
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(("name", item))
        elif isinstance(item, Circuit):
            out.append(("node", item.hash))
        else:
            return None
    return tuple(out)


def _drop_program(key, ref):
    if _programs is None:  # interpreter shutdown: the module's globals are already gone
        return
    with _programs_lock:
        found = _programs.get(key)
        if found is not None and found[0] is ref:
            del _programs[key]


def cached_program(circuit: Circuit, fdt: str, also, batch_heads: bool = False) -> tuple[Program, list]:
    """``program_with_also`` for evaluation, from the cache of live circuits' programs (the
    program comes back detached: ready to bind and run, without its interior nodes).

    >>> from circuits import Add, Symbol
    >>> x = Symbol((2,), name='x')
    >>> c = Add(x, x)
    >>> cached_program(c, 'float32', None)[0] is cached_program(c, 'float32', None)[0]
    True
    """
    items = as_items(also)
    ikey = _items_key(items)
    if not circuit.children or ikey is None:  # a leaf would keep itself alive in its own entry
        return program_with_also(circuit, fdt, also, batch_heads)
    rkey, pkey = id(circuit), (fdt, ikey, bool(batch_heads))
    found = _programs.get(rkey)
    if found is not None and found[0]() is circuit:
        entry = found[1].get(pkey)
        if entry is not None:
            with _programs_lock:
                if rkey in _programs:
                    _programs.move_to_end(rkey)
            return entry, items
    program, items = program_with_also(circuit, fdt, also, batch_heads)
    detached = program.detached()
    with _programs_lock:
        found = _programs.get(rkey)
        if found is None or found[0]() is not circuit:
            ref = weakref.ref(circuit, lambda r, k=rkey: _drop_program(k, r))
            found = _programs[rkey] = (ref, {})
        per_root = found[1]
        per_root[pkey] = detached
        while len(per_root) > _PROGRAMS_PER_ROOT:
            del per_root[next(iter(per_root))]
        _programs.move_to_end(rkey)
        while len(_programs) > _PROGRAMS_SIZE:
            _programs.popitem(last=False)
    return detached, items


def program_cache_info() -> dict:
    """How many live circuits have a cached program (``roots``) and how many programs in all."""
    with _programs_lock:
        entries = list(_programs.values())
        return {"roots": len(entries), "programs": sum(len(v[1]) for v in entries)}


def package_outputs(outs: list, items: list):
    """The root's value alone, or ``(value, {item: value})`` when ``also=`` named ``items``."""
    if not items:
        return outs[0]
    return outs[0], dict(zip(items, outs[1:]))


def resolve_nodes(program: Program, items, what: str) -> list[Circuit]:
    """Nodes of ``program`` named by ``items`` (nodes, or names matching exactly one distinct
    node); raises ``SelectionError`` naming the item otherwise."""
    out = []
    by_name: dict[str, list[Circuit]] | None = None
    for item in items:
        if isinstance(item, Circuit):
            if item.hash not in program.slot_of:
                raise SelectionError(f"{what}: {item.line()} is not a node of this circuit")
            out.append(item)
            continue
        if not isinstance(item, str):
            raise SelectionError(f"{what}: expected nodes or node names, got {item!r}")
        if by_name is None:
            by_name = {}
            for n in program.nodes:
                if n.name is not None:
                    by_name.setdefault(n.name, []).append(n)
        found = by_name.get(item, [])
        if not found:
            close = difflib.get_close_matches(item, list(by_name), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise SelectionError(f"{what}: no node named {item!r} in this circuit{hint}")
        if len(found) > 1:
            lines = "\n  ".join(n.line() for n in found[:5])
            raise SelectionError(
                f"{what}: name {item!r} is ambiguous, {len(found)} distinct nodes have it:\n  {lines}\n"
                "pass the node itself instead of its name"
            )
        out.append(found[0])
    return out
