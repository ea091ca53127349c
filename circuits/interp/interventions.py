"""Interventions as circuit transforms: ablation, activation patching, exact path patching.

Each function returns a plain circuit (no side tables) that prints, saves and evaluates like any
other; the clean circuit's nodes are shared wherever the intervention does not reach.  What a
transform changes, by name:

- ``ablate``: each site is replaced by an Array constant ``'<site>.zero_ablated'``,
  ``'<site>.mean_ablated'`` or ``'<site>.resampled'`` (the same structure for all three kinds,
  so variants differ only in an Array's value);
- ``patch``: each site is replaced by a copy of its subtree computed from the source: the source
  inputs become Arrays ``'<input>.source'`` and every copied named node ``'<name>.source'``;
- ``path_patch``: the sender is recomputed from the source as in ``patch`` (``'<sender>.source'``),
  and each receiver by a copy of the nodes between the sender and it (``'<name>.patched'``) that
  reads the patched sender; every other node reads the clean sender.

>>> import numpy as np
>>> import circuits as C
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> clean, corrupt = np.array([1, 2, 3, 4, 5, 6]), np.array([1, 7, 3, 9, 5, 6])
>>> loss = attn_only(w, clean, unique_names=True)
>>> ablate(loss, 'b0.a.head1').get_unique('b0.a.head1.zero_ablated').line()
"'b0.a.head1.zero_ablated' [4,8] Array bf36816987ffe333fbf07e90"
>>> patched = patch(loss, 'b1.a.head0', {'toks_int_var': corrupt})
>>> [n.name for n in patched.get(C.select.Glob('*.source'))][-1]
'b1.a.head0.source'
>>> pp = path_patch(loss, 'b0.a.head1', 'b1.a.head0.a.k', {'toks_int_var': corrupt})
>>> pp.get_unique('b1.a.head0.a.k.patched').line()
"'b1.a.head0.a.k.patched' Einsum kd,cd->kc"
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..nodes import Array, Circuit, Symbol
from ..select import as_matcher
from ..traversal import toposort
from .positions import mix
from .sites import copy_with, one_root, replace_within, resolve_inputs, resolve_site, resolve_sites, site_label

__all__ = ["ablate", "patch", "path_patch", "source_copies"]

KINDS = ("zero", "mean", "resample")
SUFFIX = {"zero": ".zero_ablated", "mean": ".mean_ablated", "resample": ".resampled"}


def ablate(circuit: Circuit, sites, kind: str = "zero", *, positions=None, data: Mapping | None = None,
           seed: int = 0, rows=None, axis: int | None = None, dtype=None, batch_size: int | None = None,
           mode: str = "auto") -> Circuit:
    """Replace each site's value by a constant Array named ``'<site>.<kind>_ablated'``
    (``'<site>.resampled'`` for resampling).

    - ``kind='zero'``: zeros;
    - ``kind='mean'``: the site's value averaged over a batch of inputs, ``data`` (a mapping
      from input names, Arrays or Symbols of the circuit, to values with a leading batch axis),
      computed once, here;
    - ``kind='resample'``: the site's value on one input of ``data`` drawn at random: the draws
      are ``numpy.random.default_rng(seed).integers(0, batch, len(sites))``, one per site in the
      order given.

    The values are computed in the sites' float dtype (``dtype=`` to override) with
    ``evaluate_batched`` (``batch_size`` rows at a time, ``mode`` as for ``evaluate``).  Sites are
    names, matchers or nodes, each naming exactly one node, or TransformerLens hook names (every
    head's node of a layer for ``'blocks.1.attn.hook_z'``).

    ``positions`` (an int, a list of ints or a slice of each site's position axis, negative from
    the end; ``circuits.interp.positions``) ablates only those entries: the site becomes
    ``'<site>.mixed'``, the ablated value there and the site's own elsewhere; ``rows`` does the
    same for rows of a batch (the circuit then reads the Symbol ``'row'``).

    >>> import numpy as np
    >>> from circuits import Symbol, Scalar, Einsum, evaluate
    >>> d = Einsum.from_spec('ab,->ab', Symbol((3, 2), name='x'), Scalar(2.0), name='d')
    >>> evaluate(ablate(d, 'd', positions=-1), {'x': np.ones((3, 2))})[:, 0].tolist()
    [2.0, 2.0, 0.0]

    >>> import numpy as np
    >>> from circuits import Symbol, Einsum, evaluate
    >>> x = Symbol((2,), name='x')
    >>> y = Einsum.from_spec('a,a->a', x, x, name='sq')
    >>> m = ablate(y, 'sq', 'mean', data={'x': np.array([[1.0, 2.0], [3.0, 4.0]])})
    >>> m.line(), m.value.tolist()
    ("'sq.mean_ablated' [2] Array 03e2552d96f2901a5ce2e894", [5.0, 10.0])
    """
    if kind not in KINDS:
        raise CircuitError(f"ablate: kind={kind!r}; use one of {', '.join(map(repr, KINDS))}")
    resolved = resolve_sites(circuit, sites)
    if kind == "zero":
        if data is not None:
            raise CircuitError("ablate: kind='zero' takes no data (mean and resample do)")
        values = [np.zeros(node.shape, np.dtype(node.dtype)) for _, node in resolved]
    else:
        if data is None:
            raise CircuitError(f"ablate: kind={kind!r} needs data=, a mapping from input names to batched values")
        batched = values_over_batch(circuit, resolved, data, dtype, batch_size, mode)
        if kind == "mean":
            values = [v.mean(axis=0) for v in batched]
        else:
            draws = np.random.default_rng(seed).integers(0, batched[0].shape[0], len(resolved))
            values = [v[r] for v, r in zip(batched, draws)]
    table = {}
    for (label, node), v in zip(resolved, values):
        value = Array(np.asarray(v).astype(np.dtype(node.dtype)), name=label + SUFFIX[kind])
        table[node] = value if positions is None and rows is None else _mixing(label, value, positions, rows, axis)
    return replace_within(circuit, table)


def _mixing(label: str, other: Circuit, positions, rows, axis):
    """The site as rebuilt, with ``other`` at ``positions`` / ``rows`` (see ``positions.mix``)."""
    def fn(site: Circuit) -> Circuit:
        return mix(site, other, label, positions, rows, axis)
    return fn


def values_over_batch(circuit, resolved, data, dtype, batch_size, mode) -> list[np.ndarray]:
    """Each site's value on every row of ``data``: ``[batch, *site.shape]`` arrays."""
    from ..backend import evaluate_batched

    inputs = resolve_inputs(circuit, data, "data", batched=True)
    sizes = {v.shape[0] for _, v in inputs.values()}
    if len(sizes) != 1:
        raise CircuitError(f"data: the inputs disagree on the batch size ({sorted(sizes)})")
    if 0 in sizes:
        raise CircuitError("data: the batch is empty; give at least one row")
    # Arrays named by data become Symbols (same name, shape, dtype) so the batch binds to them.
    symbols = {h: node if isinstance(node, Symbol) else Symbol(node.shape, name=node.name, dtype=node.dtype)
               for h, (node, _) in inputs.items()}
    copies = copy_with([n for _, n in resolved], symbols, "")
    symbol_hashes = {s.hash for s in symbols.values()}
    roots = []
    for label, node in resolved:
        roots.append(copies[node.hash])
        if not any(n.hash in symbol_hashes for n in toposort(roots[-1])):
            raise CircuitError(
                f"ablate: site {label!r} ({node.line()}) does not depend on any input in data "
                f"({', '.join(n.line() for n, _ in inputs.values())}); its value is the same on every row"
            )
    fdt = dtype or ("float64" if any(n.dtype == "float64" for _, n in resolved) else "float32")
    feed = {symbols[h]: v for h, (_, v) in inputs.items()}
    present = {n.hash for n in toposort(*roots) if isinstance(n, Symbol)}
    feed = {s: v for s, v in feed.items() if s.hash in present}
    _, values = evaluate_batched(one_root(roots), feed, batch_size=batch_size, dtype=fdt, also=roots, mode=mode)
    return [np.asarray(values[r]) for r in roots]


def source_copies(circuit: Circuit, nodes: list[tuple[str, Circuit]], source: Mapping, what: str = "patch"
                  ) -> dict[bytes, Circuit]:
    """``{node hash: copy}``: each node of ``nodes`` (``(label, node)`` pairs) recomputed from ``source`` (a mapping from inputs, Arrays
    or Symbols of ``circuit`` or their names, to values); the source inputs become Arrays named
    ``'<input>.source'`` and every copied named node ``'<name>.source'``.  A node that does not
    depend on any source input is an error naming it."""
    inputs = resolve_inputs(circuit, source, "source")
    table = {h: v if isinstance(v, Circuit) else Array(v, name=f"{node.name if node.name is not None else 'input'}.source")
             for h, (node, v) in inputs.items()}
    copies = copy_with([n for _, n in nodes], table, ".source", within=circuit)
    for label, node in nodes:
        if copies[node.hash] is node:
            raise CircuitError(
                f"{what}: {label} ({node.line()}) does not depend on any input in source "
                f"({', '.join(n.line() for n, _ in inputs.values())}); patching it would change nothing"
            )
    return copies


def patch(circuit: Circuit, sites, source: Mapping, *, positions=None, rows=None, axis: int | None = None) -> Circuit:
    """Activation patching: each site is recomputed from ``source`` (a mapping from input
    names, Arrays or Symbols of the circuit, to replacement values), everything else from the
    circuit's own inputs.

    Each site is replaced by a copy of its subtree over Arrays ``'<input>.source'`` holding the
    source values; the copy's named nodes are ``'<name>.source'`` (the site's own replacement is
    ``'<site>.source'``); nodes that do not depend on the source are shared with the original.
    A source value may be a node instead (e.g. ``Symbol(shape, name='corrupt_toks')``): the copy
    reads it, and ``evaluate_batched`` then runs the patch over a whole batch of sources.

    ``positions`` patches only those entries of each site's position axis (an int, a list of
    ints or a slice, negative from the end; ``axis=`` another axis): the site becomes
    ``'<site>.mixed'``, the source's value there and its own elsewhere; ``rows`` only those rows
    of a batch (see ``circuits.interp.positions``).  Other positions change only the mask's
    value (an Array ``'<site>.position_mask'``): such variants share one compiled program.

    >>> import numpy as np
    >>> from circuits import Symbol, Add, Einsum, evaluate
    >>> x = Symbol((2,), name='x')
    >>> c = Add(Einsum.from_spec('a,a->a', x, x, name='sq'), x, name='y')
    >>> p = patch(c, 'sq', {'x': np.array([3.0, 4.0], np.float32)})
    >>> print(p.to_text())
    'y' Add
      'sq.source' Einsum a,a->a
        'x.source' [2] Array d7b471089d3ea6cfdbc72a25
        'x.source'
      'x' [2] Symbol
    >>> evaluate(p, {'x': np.array([1.0, 1.0])})
    array([10., 17.], dtype=float32)
    """
    resolved = resolve_sites(circuit, sites)
    copies = source_copies(circuit, [(f"site {label!r}", n) for label, n in resolved], source, "patch")
    if positions is None and rows is None:
        return replace_within(circuit, {node: copies[node.hash] for _, node in resolved})
    return replace_within(circuit, {node: _mixing(label, copies[node.hash], positions, rows, axis)
                                    for label, node in resolved})


def path_patch(circuit: Circuit, sender, receivers, source: Mapping, *, freeze=None, positions=None, rows=None,
               axis: int | None = None) -> Circuit:
    """Exact path patching: the sender's value computed from ``source`` is seen only by the
    receivers, through every path from the sender to them; every other node sees the clean
    sender.

    ``sender`` and ``receivers`` are sites (names, matchers or nodes).  A receiver is any node
    downstream of the sender: a role input of a head (``'b1.a.head3.a.k'``, ``.a.q``, ``.a.v``:
    the key projection reads the patched sender through the residual stream and the layer norm),
    or the logits / output.  ``freeze`` (a matcher) names nodes that keep their clean value on
    the sender-to-receiver paths: ``freeze=Glob('b1.a.head*')`` with receiver ``'t.call'`` is the
    direct path from a layer-0 head to the logits, not through layer 1's heads.

    Built on the DAG, not approximated: the sender is recomputed from the source
    (``'<sender>.source'``), and for the receivers the nodes between the sender and them are
    copied over it (``'<name>.patched'``, shared between receivers where they coincide), so each
    receiver is replaced by its copy.  A receiver that does not depend on the sender (other than
    through frozen nodes) is an error naming it.

    ``positions`` / ``rows`` patch the sender only at those positions of its position axis and
    rows of a batch (``'<sender>.mixed'``: the source's value there, the clean one elsewhere),
    as ``patch`` does.

    >>> import numpy as np
    >>> from circuits import Symbol, Add, Einsum, evaluate
    >>> x = Symbol((1,), name='x')
    >>> s = Einsum.from_spec('a,a->a', x, x, name='s')        # sender
    >>> r1, r2 = Add(s, x, name='r1'), Add(s, s, name='r2')
    >>> c = Add(r1, r2, name='out')
    >>> p = path_patch(c, 's', 'r1', {'x': np.array([3.0], np.float32)})
    >>> evaluate(p, {'x': np.array([1.0])})                    # r1 = 9 + 1, r2 = 1 + 1
    array([12.], dtype=float32)
    """
    send = resolve_site(circuit, sender, "sender")
    resolved = resolve_sites(circuit, receivers, "receiver")
    sender_source = source_copies(circuit, [(f"sender {sender!r}" if isinstance(sender, str) else "the sender", send)], source, "path_patch")[send.hash]
    if positions is not None or rows is not None:
        sender_source = mix(send, sender_source, site_label(send, sender), positions, rows, axis)
    frozen: set[bytes] = set()
    if freeze is not None:
        m = as_matcher(freeze)
        order = toposort(circuit)
        frozen = m.matches(circuit, order) - {send.hash} - {n.hash for _, n in resolved}
    copies = copy_with([n for _, n in resolved], {send.hash: sender_source}, ".patched",
                       keep=(lambda n: n.hash in frozen) if frozen else None)
    for label, node in resolved:
        if node.hash == send.hash:
            raise CircuitError(f"path_patch: receiver {label!r} is the sender itself; use patch() for that")
        if copies[node.hash] is node:
            through = " except through frozen nodes" if frozen else ""
            raise CircuitError(
                f"path_patch: receiver {label!r} ({node.line()}) does not depend on the sender "
                f"{send.line()}{through}; a receiver must be downstream of the sender"
            )
    return replace_within(circuit, {node: copies[node.hash] for _, node in resolved})
