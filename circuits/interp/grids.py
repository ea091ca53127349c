"""Patching grids: every (site, position) patch of a list of sites, measured in one call.

``patch_grid(circuit, sites, source, positions=None)`` patches each site at each position alone
(from ``source``, as ``patch(..., positions=p)`` does) and measures the metric of each patched
circuit.  It builds **one** circuit in which every site is ``clean * (1 - m) + patched * m`` for
its row ``m`` of a mask input (``'grid.mask<k>'`` [sites, positions], one per group of sites of
one depth: a layer's heads), and runs it as a compiled program ``vmap``-ed over a group's cells (a
one-hot mask each) and over the rows of a batch: what the group's masks do not reach (the clean
run below them, the source's values) is computed once, and a grid compiles once per group
however many cells it has (the cells run in chunks that bound memory).

The grids a TransformerLens user knows from its ``patching`` module, on every builder's circuit
(sites found by TransformerLens's hook names, ``circuits.select.hooks``):

- ``residual_patch_grid``: the residual stream before each layer, by layer and position
  (``get_act_patch_resid_pre``): ``[layers, positions]``;
- ``head_patch_grid``: each head's output (``hook_z``; ``activation=`` ``'q'``, ``'k'``, ``'v'``,
  ``'pattern'``), by layer, position and head (``get_act_patch_attn_head_out_by_pos``):
  ``[layers, positions, heads]``; ``by_position=False``: every head at every position at once
  (``get_act_patch_attn_head_out_all_pos``): ``[layers, heads]``.

Values are the metric (``metric=`` as for ``attribute``: None sums the output, weights, or a
function ``out -> node``) of each patched circuit, batch axis first for a batch of inputs.
TransformerLens's functions run the corrupted model with clean activations patched in: here the
circuit holds (or ``inputs`` binds) the run being patched, ``source`` the run patched from.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> clean, corrupt = np.array([1, 2, 3, 4, 5, 6]), np.array([1, 7, 3, 9, 5, 6])
>>> loss = attn_only(w, clean, unique_names=True)
>>> head_patch_grid(loss, {'toks_int_var': corrupt}).shape        # [layers, positions, heads]
(2, 4, 2)
>>> from circuits import evaluate
>>> from circuits.interp import patch
>>> one = evaluate(patch(loss, 'b1.a.head0', {'toks_int_var': corrupt}, positions=2)).sum()
>>> bool(np.isclose(head_patch_grid(loss, {'toks_int_var': corrupt})[1, 2, 0], one, atol=1e-5))
True
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..nodes import Circuit, Index, Symbol
from ..select.hooks import hook_source
from .interventions import source_copies
from .metric import log_softmax, metric_node, read_metric
from .positions import bind_rows, mix, ordered_positions, position_axis
from .sites import batched_sources, replace_within, resolve_sites

__all__ = ["patch_grid", "residual_patch_grid", "head_patch_grid", "GRID_MEMORY"]

# The bytes the values of one chunk of cells may take (cells x rows x the circuit's values).
GRID_MEMORY = 512 << 20
MASK = "grid.mask"
_AXES = "abcdefghijklmnopqrstuvwxyz"


def patch_grid(circuit: Circuit, sites, source: Mapping, *, positions=None, metric=None,
               inputs: Mapping | None = None, axis: int | None = None, dtype="float32", whole: bool = False
               ) -> np.ndarray:
    """The metric of ``circuit`` with each site patched from ``source`` at each position alone:
    ``[sites, positions]`` (batch first), from one compiled program (see the module docstring).

    ``sites``: names, matchers, nodes or TransformerLens hook names (a per-head hook: each head);
    ``positions``: an int, list or slice of the sites' position axis (``axis=`` another; default
    every position; the sites must then have as many); ``source`` as for ``patch`` (values with a
    leading batch axis, one source row per input row, are read through ``'<input>.source'``);
    ``inputs`` binds the circuit's Symbols (a batch: one value per row); ``metric`` as for
    ``attribute``.  ``whole=True``: each site patched whole, alone (no positions): ``[sites]``.

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=1, max_positions=16)
    >>> loss = attn_only(w, np.arange(6), unique_names=True)
    >>> patch_grid(loss, ['b0.a.head0', 'b0.a.head1'], {'toks_int_var': np.arange(6)[::-1].copy()}, positions=[0, -1]).shape
    (2, 2)
    """
    from ..backend import Lowered, batch_heads, evaluate, float_dtype, has_batch_axis, precision

    fdt = float_dtype(dtype)
    resolved = resolve_sites(circuit, sites)
    if whole:
        if positions is not None or axis is not None:
            raise CircuitError("patch_grid: whole=True patches each site whole; it takes no positions= or axis=")
        axes_of, length, picked = [None] * len(resolved), 1, np.zeros(1, np.int64)
    else:
        axes_of = [position_axis(n, axis) for _, n in resolved]
        lengths = sorted({n.shape[a] for (_, n), a in zip(resolved, axes_of)})
        if positions is None and len(lengths) > 1:
            raise CircuitError(f"patch_grid: the sites have {lengths} positions; give positions= (the same for each)")
        length = min(lengths)
        picked = ordered_positions(positions if positions is not None else slice(None), length,
                                   f"the sites ({length} positions)")
    source, extra = batched_sources(circuit, source)
    inputs = {**(inputs or {}), **extra}
    copies = source_copies(circuit, [(f"site {label!r}", n) for label, n in resolved], source, "patch_grid")
    # Sites grouped by depth (how many other sites lie below them: a layer's heads are one group),
    # one mask input per group: a group's cells vmap over its own mask alone, so what no site of
    # the group reaches (the layers below it) is computed once, not once per cell.
    depth = _depths(circuit, [n for _, n in resolved])
    groups: dict[int, list[int]] = {}
    for i, (_, node) in enumerate(resolved):
        groups.setdefault(depth[node.hash], []).append(i)
    masks = {g: Symbol((len(members), length), name=f"{MASK}{k}", dtype=fdt)
             for k, (g, members) in enumerate(sorted(groups.items()))}
    table = {}
    for g, members in groups.items():
        for k, i in enumerate(members):
            (label, node), ax = resolved[i], axes_of[i]
            if ax is None:  # the whole site: one mask entry, broadcast over every entry
                row, axes = Index(masks[g], (k, 0)), ""
            else:
                row, axes = Index(masks[g], (k, slice(0, node.shape[ax]))), _AXES[ax]
            table[node] = _grid_mix(label, copies[node.hash], row, axes)
    masked = replace_within(circuit, table)
    spec = read_metric(metric, circuit, "patch_grid")
    clean = None
    if spec.kind == "kl":
        clean = Symbol(circuit.shape, name="grid.clean_log_probs", dtype=fdt)
    target = metric_node(masked, metric, clean=clean, what="patch_grid")
    batched = has_batch_axis(circuit, inputs) or bool(extra)
    inputs = bind_rows(masked, inputs)
    if clean is not None:  # the clean run's log-probabilities, what 'kl' compares with
        own = {k: v for k, v in inputs.items() if k not in extra}
        inputs = {**inputs, clean: log_softmax(np.asarray(evaluate(circuit, own, dtype=fdt), np.float64)).astype(fdt)}
    # a layer's heads as one computation over a head axis, their grid mixes too (half the program:
    # a faster compile and run, the same values to float rounding)
    (target,), _ = batch_heads([target])
    lowered = Lowered([target], fdt)
    values = np.zeros((len(resolved), len(picked)), np.float64)
    rows = None
    with precision(fdt):
        args, in_axes = lowered.bind_batched({**inputs, **{m: np.zeros(m.shape, fdt) for m in masks.values()}})
        rows = next((a.shape[0] for a, ax in zip(args, in_axes) if ax is not None), None)
        if batched and rows is None:  # pragma: no cover - a batched input binds with its axis
            raise CircuitError("patch_grid: the batch has no rows")
        if rows is not None:
            values = np.zeros((len(resolved), len(picked), rows), np.float64)
        for g, members in groups.items():
            slot = lowered.args.index(masks[g])
            cells = np.zeros((len(members) * len(picked), len(members), length), np.dtype(fdt))
            for k in range(len(members)):
                for j, p in enumerate(picked):
                    cells[k * len(picked) + j, k, p] = 1
            chunk = _chunk(circuit, len(cells), rows or 1, fdt)
            tag = ("patch_grid", slot, tuple(in_axes))
            fn = lowered.cached(tag, lambda slot=slot: _make(lowered, slot, in_axes), keep=target)
            out = []
            for start in range(0, len(cells), chunk):
                part = cells[start:start + chunk]
                if len(part) < chunk:  # padded: one compiled shape for every chunk
                    part = np.concatenate([part, np.repeat(part[-1:], chunk - len(part), 0)])
                out.append(np.asarray(fn(part, args), np.float64))
            got = np.concatenate(out)[: len(cells)]
            values[members] = got.reshape((len(members), len(picked)) + got.shape[1:])
    if whole:
        values = values[:, 0]
    return np.moveaxis(values, -1, 0) if rows is not None else values


def _depths(circuit: Circuit, sites: list[Circuit]) -> dict[bytes, int]:
    """For each site, the most sites on a path below it (0: no site below; a layer's index for
    heads)."""
    from ..traversal import toposort

    site_set = {n.hash for n in sites}
    below: dict[bytes, int] = {}
    for n in toposort(circuit):
        below[n.hash] = max((below[c.hash] + (c.hash in site_set) for c in n.children), default=0)
    return {h: below[h] for h in site_set}


def _grid_mix(label, other, row, axes):
    def fn(site: Circuit) -> Circuit:
        return mix(site, other, label, mask=(row, axes), name=f"{label}.grid")
    return fn


def _make(lowered, slot: int, in_axes):
    import jax

    skeleton = lowered.program.skeleton()

    def one(args):
        return skeleton.run(args)[0]

    if any(a is not None for a in in_axes):
        one = jax.vmap(one, in_axes=(list(in_axes),))

    def cell(mask, args):
        args = list(args)
        args[slot] = mask
        return one(args)

    return jax.vmap(cell, in_axes=(0, None))


def _chunk(circuit: Circuit, cells: int, rows: int, fdt: str) -> int:
    """Cells per call: as many as keep a chunk's values within ``GRID_MEMORY`` (each cell computes
    at most the circuit's values, per row)."""
    from ..backend import value_bytes
    from ..traversal import toposort

    per_cell = sum(value_bytes(n, fdt) for n in toposort(circuit) if n.children) * rows
    most = max(1, min(cells, GRID_MEMORY // max(1, per_cell)))
    chunks = -(-cells // most)
    return -(-cells // chunks)


def _layers(circuit: Circuit, hook: str) -> list[str]:
    names, layer = [], 0
    while hook_source(circuit, f"blocks.{layer}.hook_resid_post") is not None:
        name = hook.format(l=layer)
        if hook_source(circuit, name) is None:
            raise CircuitError(f"{name!r}: the circuit has no such hook (circuits.select.hooks lists what each "
                               "builder's circuit has)")
        names.append(name)
        layer += 1
    if not names:
        raise CircuitError(f"the circuit has no layers TransformerLens's hook names find ({circuit.line()}): build it "
                           "with a builder (attn_only, gpt2, ...)")
    return names


def residual_patch_grid(circuit: Circuit, source: Mapping, *, positions=None, metric=None,
                        inputs: Mapping | None = None, dtype="float32") -> np.ndarray:
    """The residual stream before each layer patched at each position alone
    (TransformerLens's ``get_act_patch_resid_pre``): ``[layers, positions]`` of the metric, batch
    first (see the module docstring).

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    >>> residual_patch_grid(attn_only(w, np.arange(6)), {'toks_int_var': np.arange(6)[::-1].copy()}).shape
    (2, 4)
    """
    sites = _layers(circuit, "blocks.{l}.hook_resid_pre")
    return patch_grid(circuit, sites, source, positions=positions, metric=metric, inputs=inputs, dtype=dtype)


def head_patch_grid(circuit: Circuit, source: Mapping, *, by_position: bool = True, activation: str = "z",
                    positions=None, metric=None, inputs: Mapping | None = None, dtype="float32") -> np.ndarray:
    """Each head patched alone (its ``hook_z``, or ``activation`` ``'q'``, ``'k'``, ``'v'``,
    ``'pattern'``), at each position (``[layers, positions, heads]``, TransformerLens's
    ``get_act_patch_attn_head_out_by_pos``) or, ``by_position=False``, at every position at once
    (``[layers, heads]``, ``get_act_patch_attn_head_out_all_pos``); the metric, batch first.  The
    heads' own nodes are patched (split heads: ``attn_only(unique_names=True)`` or not,
    ``gpt2(..., split_heads=True)``); a fused attention layer has no per-head node.

    >>> import numpy as np
    >>> from circuits.models import attn_only, random_weights
    >>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    >>> head_patch_grid(attn_only(w, np.arange(6)), {'toks_int_var': np.arange(6)[::-1].copy()}, by_position=False).shape
    (2, 2)
    """
    hooks = {"z": "attn.hook_z", "q": "attn.hook_q", "k": "attn.hook_k", "v": "attn.hook_v",
             "pattern": "attn.hook_pattern"}
    if activation not in hooks:
        raise CircuitError(f"head_patch_grid: activation={activation!r}; use one of {', '.join(map(repr, hooks))}")
    names = _layers(circuit, "blocks.{l}." + hooks[activation])
    per_layer = []
    for name in names:
        src = hook_source(circuit, name)
        if not src.per_head:
            raise CircuitError(f"head_patch_grid: {name!r} is one fused node ({src.nodes[0].line()}); build the model "
                               "with a node per head (split_heads=True)")
        per_layer.append(src.nodes)
    n_heads = {len(nodes) for nodes in per_layer}
    if len(n_heads) != 1:
        raise CircuitError(f"head_patch_grid: the layers have {sorted(n_heads)} heads; give each layer the same")
    heads = [n for nodes in per_layer for n in nodes]
    if by_position:
        grid = patch_grid(circuit, heads, source, positions=positions, metric=metric, inputs=inputs, dtype=dtype)
        batch = grid.ndim == 3
        # [(rows,) layers * heads, positions] -> [(rows,) layers, positions, heads]
        shaped = grid.reshape(grid.shape[:batch] + (len(names), n_heads.pop(), grid.shape[-1]))
        return np.swapaxes(shaped, -1, -2)
    if positions is not None:
        raise CircuitError("head_patch_grid: by_position=False patches every position; positions= goes with by_position=True")
    grid = patch_grid(circuit, heads, source, positions=None, metric=metric, inputs=inputs, dtype=dtype, whole=True)
    return grid.reshape(grid.shape[:-1] + (len(names), n_heads.pop()))
