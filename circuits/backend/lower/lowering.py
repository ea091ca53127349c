"""A circuit to the program ``evaluate`` runs: the nodes ``also=`` names (by node or by name)
as extra outputs, sums of per-head subcircuits batched (``circuits.backend.lower.head_batching``),
and the programs of live circuits cached, so a warm ``evaluate`` skips the lowering.

>>> from circuits import Add, Symbol
>>> x = Symbol((2,), name='x')
>>> program, items = program_with_also(Add(x, x, name='y'), 'float32', 'x')
>>> [n.name for n in program.nodes], items
(['x', 'y'], ['x'])
"""

from __future__ import annotations

import collections
import difflib
import threading
import weakref

from ...errors import SelectionError
from ...nodes import Circuit
from ...traversal import toposort
from ..cache.bounded import BoundedCache
from .fusion import lower as batch_heads_lowering
from .fusion import worth_lowering as has_head_sums
from .program import Program

__all__ = [
    "resolve_nodes", "as_items", "program_with_also", "cached_program", "program_cache_info", "package_outputs",
    "items_key_of", "resolve_also",
]


# ---------------------------------------------------------------------------- nodes by name
def expand_also(circuit: Circuit, also):
    """``also=`` with every matcher (``circuits.select``: Glob, Regex, Type, ``Inside``... and
    TransformerLens hook names no node has, ``'blocks.0.attn.hook_z'``) replaced by the nodes it
    matches: each by its name where no other node of the circuit has it, else the node itself
    (the keys the values come back under).  Nodes and plain names pass as given.

    >>> from circuits import Symbol, GeneralFunction, Add
    >>> from circuits.select import Glob
    >>> x = Symbol((2,), name='x')
    >>> expand_also(Add(GeneralFunction('exp', x, name='e1'), GeneralFunction('exp', x, name='e2')), Glob('e*'))
    ['e1', 'e2']
    """
    from ...select import Matcher, as_matcher
    from ...select.hooks import is_hook_name

    items = as_items(also) if not isinstance(also, Matcher) else [also]
    if all(isinstance(i, Circuit) or (isinstance(i, str) and not is_hook_name(i)) for i in items):
        return also
    from ...traversal import toposort

    order = toposort(circuit)
    counts = collections.Counter(n.name for n in order if n.name is not None)
    out: list = []
    for item in items:
        if isinstance(item, Circuit) or (isinstance(item, str) and (not is_hook_name(item) or counts[item])):
            out.append(item)
            continue
        try:
            m = as_matcher(item)
        except TypeError:
            raise SelectionError(f"also: expected nodes, names or matchers, got {item!r}") from None
        hits = m.matches(circuit, order)
        if not hits:
            from ...select import get

            get(circuit, m)  # raises, naming the matcher (and why, for a hook name)
        out += [n.name if n.name is not None and counts[n.name] == 1 else n for n in order if n.hash in hits]
    return out


def as_items(also) -> list:
    """The ``also=`` (or ``wrt=``) option as a list: one node or name, or a sequence of them."""
    if also is None:
        return []
    return [also] if isinstance(also, (str, Circuit)) else list(also)


def program_with_also(circuit: Circuit, fdt: str, also, batch_heads: bool = False) -> tuple[Program, list]:
    """A program computing ``circuit`` then the nodes ``also`` names; and the items as given.

    ``batch_heads=True`` lowers sums of per-head subcircuits to one computation over a head axis
    (``circuits.backend.lower.head_batching``); nodes named by ``also`` keep their values."""
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
# when the root dies; at most 64 roots are kept, the least recently used go first.

_PROGRAMS_PER_ROOT = 8
# id(root) -> (weak reference to the root, {options: program}).  Reentrant: a root's weak
# reference callback (``_drop_program``) can run in the thread that holds the lock, when the
# garbage collector frees a circuit during an update of the table.
_programs = BoundedCache("programs", "compiled", max_entries=64, reentrant=True)
_per_root_lock = threading.Lock()


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
    programs = globals().get("_programs")
    if programs is None:  # interpreter shutdown: the module's globals are already gone
        return
    programs.pop_if(key, lambda found: found[0] is ref)


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
            return entry, items
    program, items = program_with_also(circuit, fdt, also, batch_heads)
    detached = program.detached()
    ref = weakref.ref(circuit, lambda r, k=rkey, drop=_drop_program: drop(k, r))
    found = _programs.setdefault(rkey, (ref, {}))
    if found[0]() is not circuit:  # the id of a circuit that died: its entry goes
        found = (ref, {})
        _programs.put(rkey, found, 0)
    with _per_root_lock:
        per_root = found[1]
        per_root[pkey] = detached
        while len(per_root) > _PROGRAMS_PER_ROOT:
            del per_root[next(iter(per_root))]
    return detached, items


def program_cache_info() -> dict:
    """How many live circuits have a cached program (``roots``) and how many programs in all."""
    entries = _programs.values()
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


def resolve_also(circuit: Circuit, items: list, fdt: str) -> list[Circuit]:
    """The nodes ``also=`` names (by node, or by a name one distinct node has) in ``circuit``, for
    the op-by-op tier (which runs the circuit itself, not its program)."""
    if all(isinstance(i, Circuit) for i in items):
        present = {n.hash for n in toposort(circuit)}
        for item in items:
            if item.hash not in present:
                raise SelectionError(f"also: {item.line()} is not a node of this circuit")
        return items
    return resolve_nodes(Program([circuit], fdt), items, "also")
