"""Causal scrubbing (Chan et al., Redwood Research, 2022): test a hypothesis about which paths of a
circuit matter, and through which feature of the input, by resampling everything it says does not.

``scrub(circuit, hypothesis, data)`` draws ``samples`` reference rows from ``data``, then for each
claim (depth first) a datum among the rows that agree with its parent's datum on the claim's
feature, and for each unclaimed path a random datum; treeifies the circuit along the hypothesis
(``treeify``), so each input occurrence reads its owner's datum; and evaluates the original, the
scrubbed and the fully scrubbed circuit (every input resampled except the ``labels`` paths) on the
same reference rows, batched over the samples (no Python loop over samples).  The result reports the
three losses, their standard errors and the fraction of the loss reduction the hypothesis
recovers, ``(random - scrubbed) / (random - original)``.

Sampling within a feature class is O(rows): rows sorted by class once, then one uniform draw per
sample inside the parent's class.  Each draw has its own generator seeded by ``seed`` and the
claim's name, so adding a claim does not move the others' samples.  Unclaimed paths below one
claim share one random datum (as in Redwood's rust_circuit).

Evaluation does each (subcircuit, datum) pair once: slots that received the same draw read one
input Symbol, so the subcircuits above them are one interned node; and a subcircuit that reads
one slot only (layer 0 under a random draw, the original run) is computed once per distinct
dataset row its slots drew, in one batched program over those rows, and gathered per sample by
the samples' program (``reuse_rows``).

>>> import numpy as np
>>> from circuits import Symbol, Add, Einsum, Scalar, Index
>>> from circuits.interp import Claim, scrub
>>> x = Symbol((2,), name='x')
>>> out = Add(Einsum.from_spec(',->', Index(x, (0,), name='x0'), Scalar(2.0), name='A'),
...           Einsum.from_spec(',->', Index(x, (1,), name='x1'), Scalar(3.0), name='B'), name='out')
>>> data = {'x': np.random.default_rng(0).normal(size=(50, 2))}
>>> r = scrub(out, Claim('out', children=[Claim('A'), Claim('B')]), data, samples=100)
>>> r.scrubbed == r.original
True
"""

from __future__ import annotations

import numbers
from typing import Callable, Mapping

import numpy as np

from ..dtypes import is_float
from ..errors import CircuitError
from ..nodes import Circuit, Concat, Einsum, Scalar, Symbol
from ..shapes import check_allocation
from ..traversal import toposort
from .checks import check_count, check_seed
from .hypothesis import Claim
from .treeify import SlotPlan, plan_slots, slot_name, treeify

__all__ = ["scrub", "ScrubResult", "sample_slots"]

BOOTSTRAP = 200


def _class_sampler(classes: np.ndarray):
    """``(rng, parent_rows) -> rows``: for each parent row, a uniformly drawn row of its class."""
    perm = np.argsort(classes, kind="stable")
    counts = np.bincount(classes)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])

    def draw(rng: np.random.Generator, parent_rows: np.ndarray) -> np.ndarray:
        c = classes[parent_rows]
        return perm[starts[c] + (rng.random(parent_rows.shape[0]) * counts[c]).astype(np.int64)]

    return draw


def sample_slots(plan: SlotPlan, data: Mapping[str, np.ndarray], samples: int, seed: int,
                 reference: np.ndarray | None = None) -> np.ndarray:
    """Row indices ``[slots, samples]``: slot 0 the reference rows (``reference``, else drawn),
    then each drawn slot, in the plan's depth-first order (a claim's rows agree with its
    parent's on the claim's feature)."""
    rows = int(next(iter(data.values())).shape[0])
    idx = np.empty((plan.n_slots, samples), dtype=np.int64)
    idx[0] = np.random.default_rng([seed, 0]).integers(0, rows, samples) if reference is None else reference
    samplers: dict[int, Callable] = {}  # one per Feature object: claims often share one
    for slot, (claim, parent_slot, kind) in plan.draws.items():
        rng = np.random.default_rng([seed, plan.seed_key(slot)])
        if kind == "uniform":
            idx[slot] = rng.integers(0, rows, samples)
            continue
        feature = plan.claims[claim].feature
        if id(feature) not in samplers:
            samplers[id(feature)] = _class_sampler(feature.classes(data, plan.claims[claim].name))
        idx[slot] = samplers[id(feature)](rng, idx[parent_slot])
    return idx


def _as_rows(value: Circuit) -> Circuit:
    """The value with at least one axis (a scalar becomes ``[1]``), so outputs can be concatenated."""
    if value.shape:
        return value
    return Einsum.from_spec(",a->a", value, Scalar(1.0, (1,)))


def _check_data(circuit: Circuit, data: Mapping) -> tuple[dict[str, np.ndarray], int, dict[str, Symbol]]:
    symbols = {n.name: n for n in toposort(circuit) if isinstance(n, Symbol)}
    if not symbols:
        raise CircuitError(f"scrub: {circuit.line()} has no input Symbol; scrubbing resamples inputs, so build "
                           f"the circuit over Symbols (e.g. models.tokens_symbol) and give data for them")
    missing = sorted(set(symbols) - set(data))
    if missing:
        raise CircuitError(f"scrub: no data for the circuit's inputs {missing}; data has {sorted(data)}")
    arrays, rows = {}, None
    for name, sym in symbols.items():
        arr = np.asarray(data[name])
        if tuple(arr.shape[1:]) != sym.shape or arr.ndim != len(sym.shape) + 1:
            raise CircuitError(f"scrub: data[{name!r}] has shape {list(arr.shape)}; expected [rows, "
                               f"{', '.join(map(str, sym.shape))}] for {sym.line()}")
        if rows is not None and arr.shape[0] != rows:
            raise CircuitError(f"scrub: data arrays disagree on the number of rows ({rows} and {arr.shape[0]} "
                               f"for {name!r})")
        rows = arr.shape[0]
        arrays[name] = arr
    if not rows:
        raise CircuitError("scrub: the data has no rows")
    return arrays, rows, symbols


def _rows_of(arrays) -> int:
    return int(next(iter(arrays.values())).shape[0])


def _default_score(values: np.ndarray) -> np.ndarray:
    return values.reshape(values.shape[0], -1).mean(axis=1)


def scrub(circuit: Circuit, hypothesis: Claim, data: Mapping[str, np.ndarray], *, samples: int = 1000,
          seed: int = 0, labels=None, score: Callable[[np.ndarray], np.ndarray] | None = None,
          batch_size: int | None = None, dtype: str = "float32", reuse_rows: bool | None = None) -> "ScrubResult":
    """Causal scrubbing of ``hypothesis`` (a ``Claim`` tree rooted at ``circuit``'s output) on
    ``data`` (``{input Symbol name: array [rows, *shape]}``).

    - ``circuit`` computes a loss from its input Symbols (e.g. ``attn_only(w, tokens_symbol(n))``);
      ``score(values [samples, *shape]) -> [samples]`` turns its value into one loss per sample
      (default: the mean over the output's axes).
    - ``labels``: a matcher for the nodes through which the loss reads its labels (for
      ``attn_only``: ``'true_toks_int'``).  Paths through them always read the reference datum,
      in every run: the loss is scored against the reference labels.
    - ``samples`` reference rows are drawn with replacement (seeded by ``seed``).
    - ``reuse_rows``: a subcircuit that reads one slot's datum (layer 0 on a resampled input) is
      computed once per distinct dataset row its slots draw, then gathered per sample, when
      that is less work and its values fit ``REUSE_BUDGET`` bytes (``None``, the default);
      ``False`` computes every sample's subcircuits anew; ``True`` reuses whenever the values
      fit ``REUSE_BUDGET``.
      The losses are the same either way (up to float rounding).

    Returns a ``ScrubResult`` (prints as a table; ``_repr_html_`` in notebooks).

    >>> import numpy as np
    >>> from circuits import Symbol, Add, Einsum, Index, Scalar
    >>> x = Symbol((2,), name='x')
    >>> out = Add(Einsum.from_spec(',->', Index(x, (0,), name='x0'), Scalar(2.0), name='A'),
    ...           Einsum.from_spec(',->', Index(x, (1,), name='x1'), Scalar(3.0), name='B'), name='out')
    >>> data = {'x': np.random.default_rng(0).normal(size=(50, 2))}
    >>> r = scrub(out, Claim('out', children=[Claim('A')]), data, samples=200, seed=1)
    >>> bool(r.scrubbed != r.original), r.samples
    (True, 200)
    """
    if not isinstance(circuit, Circuit):
        raise CircuitError(f"scrub: expected a circuit, got {type(circuit).__name__}")
    if isinstance(samples, bool) or not isinstance(samples, numbers.Integral) or samples < 2:
        raise CircuitError(f"scrub: samples={samples!r:.80}: give an int, at least 2 (standard errors need them)")
    samples = int(samples)
    seed = check_seed(seed, "scrub")
    batch_size = check_count(batch_size, "scrub", "batch_size", none=True, fix="rows of one evaluation")
    # the losses of the three runs, before anything is drawn or evaluated (10**12 samples: refused here)
    check_allocation((3, samples, *circuit.shape), "float64", lambda: f"scrub: samples={samples}")
    arrays, rows, symbols = _check_data(circuit, data)
    if not isinstance(hypothesis, Claim):
        raise CircuitError(f"a hypothesis is a Claim (the root claim, at the output), got {hypothesis!r}")
    root = hypothesis if labels is None else _with_child(hypothesis, Claim(labels, name="labels"))
    plan = plan_slots(root)
    scrubbed = treeify(circuit, plan, symbols)
    check_allocation((2 * plan.n_slots, samples), "int64", lambda: f"scrub: samples={samples} draws of {plan.n_slots} slots")
    idx = sample_slots(plan, arrays, samples, seed)
    # The fully scrubbed run: every input random, but the labels paths on the reference.  Its
    # random slots are numbered after ours.
    first = plan.n_slots
    if labels is None:
        random_c = _rename_slots(circuit, {}, symbols, whole=first)
        rand_idx = {first: np.random.default_rng([seed, 2]).integers(0, rows, samples)}
    else:
        empty_plan = plan_slots(Claim(hypothesis.site, children=[Claim(labels, name="labels")],
                                      name=hypothesis.name))
        empty_idx = sample_slots(empty_plan, arrays, samples, seed, reference=idx[0])
        random_c = _rename_slots(treeify(circuit, empty_plan, symbols).circuit,
                                 {s: s + first - 1 for s in range(1, empty_plan.n_slots)}, symbols)
        rand_idx = {s + first - 1: empty_idx[s] for s in range(1, empty_plan.n_slots)}
    original = _rename_slots(circuit, {}, symbols, whole=0)
    out = Concat(_as_rows(original), _as_rows(scrubbed.circuit), _as_rows(random_c), axis=0)
    slot_rows = {slot: idx[slot] for slot in range(plan.n_slots)}
    slot_rows.update(rand_idx)
    # Slots fed the same draw (the fully scrubbed run's draw is the root claim's random draw) read
    # one Symbol, so the subcircuits above them are one interned node, computed once.
    out = _rename_slots(out, _equal_slots(slot_rows), symbols)
    values = _evaluate(out, arrays, slot_rows, symbols, batch_size=batch_size, dtype=dtype, reuse_rows=reuse_rows)
    width = values.shape[1] // 3
    shape = circuit.shape
    parts = [values[:, k * width:(k + 1) * width].reshape((samples, *shape)) for k in range(3)]
    scorer = score or _default_score
    losses = []
    for p in parts:
        per_row = np.asarray(scorer(p), dtype=np.float64)
        if per_row.shape != (samples,):
            raise CircuitError(f"scrub: score gave shape {list(per_row.shape)}; it must give one loss per sample "
                               f"[{samples}] from values of shape {list(p.shape)}")
        losses.append(per_row)
    same = {}
    for slot, (claim, parent_slot, kind) in plan.draws.items():
        if kind == "feature":
            same[plan.claims[claim].name] = float(np.mean(idx[slot] == idx[parent_slot]))
    return ScrubResult(hypothesis, losses[0], losses[1], losses[2], seed=seed, same_as_parent=same,
                       circuit=scrubbed.circuit, n_slots=len(scrubbed.slots), plan=plan, indices=idx)


REUSE_BUDGET = 1 << 30  # bytes of per-row subcircuit values ``scrub`` keeps to gather from


def _equal_slots(slot_rows: Mapping[int, np.ndarray]) -> dict[int, int]:
    """Slot -> the first slot with the very same rows, for every slot that repeats one."""
    first: dict[bytes, int] = {}
    out = {}
    for slot in sorted(slot_rows):
        key = np.ascontiguousarray(slot_rows[slot], dtype=np.int64).tobytes()
        if key in first:
            out[slot] = first[key]
        else:
            first[key] = slot
    return out


def _slot_of(node: Symbol, symbols) -> tuple[str, int] | None:
    base, _, slot = node.name.rpartition("@")
    if base in symbols and slot.isdigit():
        return base, int(slot)
    return None


def _bucket(n: int) -> int:
    """``n`` rounded up to ``m * 2**k`` with ``8 <= m < 16`` (at most 1/8 more)."""
    if n <= 16:
        return n
    k = n.bit_length() - 4
    return -(-n // (1 << k)) * (1 << k)


def _distinct_bound(draws: int, rows: int) -> int:
    """How many distinct rows ``draws`` draws from ``rows`` rows hit, at most, but for a chance
    under 1e-4: the mean plus four standard deviations for uniform draws with replacement (what
    hits the most rows), capped at ``rows``.  It depends on the sizes only, not on the draw, so a
    table of this many rows has one shape for every seed and its programs are compiled once.

    >>> _distinct_bound(64, 64), _distinct_bound(1000, 2000), _distinct_bound(1000, 10**6)
    (51, 829, 1000)
    """
    if draws <= 0 or rows <= 0:
        return 0
    q1 = np.exp(draws * np.log1p(-1.0 / rows))
    q2 = np.exp(draws * np.log1p(-2.0 / rows)) if rows > 2 else 0.0
    mean = rows * (1.0 - q1)
    var = max(0.0, rows * q1 + rows * (rows - 1.0) * q2 - rows * rows * q1 * q1)
    return int(min(rows, draws, np.ceil(mean + 4.0 * np.sqrt(var))))


_MIXED = -1


def _evaluate(out: Circuit, arrays, slot_rows, symbols, *, batch_size, dtype, reuse_rows) -> np.ndarray:
    """``out`` (over slot Symbols ``x@s``) on every sample: ``[samples, *out.shape]``.

    With row reuse, each maximal subcircuit that reads one slot only (a *frontier* node: a
    parent reads several slots) is evaluated on the original inputs, once per distinct dataset
    row any slot reading it draws (one batched call per group of slots), and the program of
    ``out`` gathers its rows per sample instead of computing it: a resampled row drawn by many
    samples and slots costs one evaluation."""
    from ..backend import evaluate_batched
    from ..nodes import GeneralFunction
    from ..traversal import replace

    samples = int(next(iter(slot_rows.values())).shape[0])
    order = toposort(out)
    slot: dict[bytes, int | None] = {}  # None: no slot below; _MIXED: several
    frontier: dict[bytes, tuple[Circuit, int]] = {}
    for node in order:
        if isinstance(node, Symbol):
            found = _slot_of(node, symbols)
            slot[node.hash] = None if found is None else found[1]
            continue
        below = {slot[c.hash] for c in node.children} - {None}
        s = below.pop() if len(below) == 1 else (_MIXED if below else None)
        slot[node.hash] = s
        if s == _MIXED:
            for c in node.children:
                cs = slot[c.hash]
                if cs not in (None, _MIXED) and not isinstance(c, Symbol) and is_float(c.dtype):
                    frontier[c.hash] = (c, cs)
    s_out = slot[out.hash]
    if s_out not in (None, _MIXED) and not isinstance(out, Symbol):
        frontier[out.hash] = (out, s_out)

    plan = None
    if frontier and reuse_rows is not False:
        plan = _reuse_plan(frontier, slot_rows, symbols, samples, _rows_of(arrays), dtype, force=bool(reuse_rows))
    main, inputs = out, {}
    if plan is not None:
        groups, unslotted = plan
        swap = {}
        for g, (slots, nodes, rows) in enumerate(groups):
            present = {n.name for n in toposort(*nodes) if isinstance(n, Symbol)}
            values = _evaluate_rows(nodes, {k: v[rows] for k, v in arrays.items() if k in present},
                                    batch_size=batch_size, dtype=dtype)
            for k, (u, v) in enumerate(zip(nodes, values)):
                table = Symbol(tuple(v.shape), name=f"scrub.rows{g}.{k}", dtype=u.dtype)
                inputs[table.name] = v
                for s in slots:
                    pos = Symbol((), name=f"scrub.row{g}@{s}", dtype="int64")
                    inputs[pos.name] = np.searchsorted(rows, slot_rows[s])
                    for h in unslotted.get((u.hash, s), ()):
                        swap[frontier[h][0]] = GeneralFunction("gen_index_at_0_c", table, pos,
                                                               name=frontier[h][0].name)
        main = replace(out, swap)
    feed = {}
    for n in toposort(main):
        if isinstance(n, Symbol):
            found = _slot_of(n, symbols)
            feed[n.name] = inputs[n.name] if found is None else arrays[found[0]][slot_rows[found[1]]]
    return np.asarray(evaluate_batched(main, feed, batch_size=batch_size, dtype=dtype, mode="jit"))


def _evaluate_rows(nodes: list[Circuit], inputs, *, batch_size, dtype) -> list:
    """Each of ``nodes`` on every row of ``inputs`` (jax arrays ``[rows, *node.shape]``), in one
    program: the nodes flattened and concatenated, so their shared subcircuits run once."""
    from ..backend import evaluate_batched
    from ..nodes import Rearrange

    if len(nodes) == 1:
        return [evaluate_batched(nodes[0], inputs, batch_size=batch_size, dtype=dtype, mode="jit", return_jax=True)]
    flat = []
    for u in nodes:
        axes = " ".join(f"a{i}" for i in range(len(u.shape)))
        flat.append(Rearrange(_as_rows(u), f"{axes} -> ({axes})") if len(u.shape) > 1 else _as_rows(u))
    both = evaluate_batched(Concat(*flat, axis=0), inputs, batch_size=batch_size, dtype=dtype, mode="jit",
                            return_jax=True)
    out, start = [], 0
    for u, f in zip(nodes, flat):
        out.append(both[:, start:start + f.shape[0]].reshape((both.shape[0], *u.shape)))
        start += f.shape[0]
    return out


def _work(nodes) -> int:
    """A rough cost of evaluating ``nodes`` once: the elements every computed node produces (an
    einsum: the product of all its axes' sizes, the multiply-adds)."""
    total = 0
    for n in toposort(*nodes):
        if not n.children:
            continue
        if isinstance(n, Einsum):
            total += int(np.prod(list(n.axis_sizes().values()), dtype=np.int64))
        else:
            total += int(np.prod(n.shape, dtype=np.int64))
    return total


def _merge_groups(groups: list, size) -> list:
    """Groups ``(slots, nodes, rows)`` merged while one program over the union of two groups'
    rows costs less than the two (their nodes share subcircuits: layer 0 under each head).
    ``size(slots)``: the rows a group's table will hold (not the draw's: the same every seed)."""
    groups = [(slots, nodes, rows, _work(nodes) * size(slots)) for slots, nodes, rows in groups]
    merged = True
    while merged and len(groups) > 1:
        merged, best = False, None
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                a, b = groups[i], groups[j]
                nodes = a[1] + [n for n in b[1] if n not in a[1]]
                rows = np.union1d(a[2], b[2])
                cost = _work(nodes) * size(a[0] | b[0])
                gain = a[3] + b[3] - cost
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, i, j, (a[0] | b[0], nodes, rows, cost))
        if best is not None:
            _, i, j, new = best
            groups = [g for k, g in enumerate(groups) if k not in (i, j)] + [new]
            merged = True
    return [(slots, nodes, rows) for slots, nodes, rows, _ in groups]


def _reuse_plan(frontier, slot_rows, symbols, samples: int, rows_total: int, dtype: str, force: bool):
    """``(groups, unslotted)`` for row reuse, or None when it would not save work or its tables
    would not fit ``REUSE_BUDGET``.  ``groups``: ``(slots, nodes over the original inputs, rows)``
    per set of slots; ``unslotted``: (node hash, slot) -> the frontier nodes it stands for."""
    from ..traversal import deep_map_many

    items = list(frontier.items())

    def fn(node):
        if isinstance(node, Symbol):
            found = _slot_of(node, symbols)
            if found is not None:
                return Symbol(node.shape, name=found[0], dtype=node.dtype)
        return None

    plain = deep_map_many([node for _, (node, _) in items], fn)
    slots_of: dict[bytes, set[int]] = {}
    node_of: dict[bytes, Circuit] = {}
    unslotted: dict[tuple[bytes, int], list[bytes]] = {}
    for (h, (_, s)), u in zip(items, plain):
        slots_of.setdefault(u.hash, set()).add(s)
        node_of[u.hash] = u
        unslotted.setdefault((u.hash, s), []).append(h)
    by_slots: dict[frozenset, list[Circuit]] = {}
    for uh, slots in slots_of.items():
        by_slots.setdefault(frozenset(slots), []).append(node_of[uh])
    groups = [(set(slots), nodes, np.unique(np.concatenate([slot_rows[s] for s in sorted(slots)])))
              for slots, nodes in by_slots.items()]

    def table_rows(slots) -> int:
        return max(1, _distinct_bound(samples * len(slots), rows_total))

    groups = _merge_groups(groups, table_rows)
    out, reused, direct, size = [], 0, 0, 0
    for slots, nodes, rows in groups:
        # The table's rows: a bound on what any draw hits (the same for every seed, so the
        # programs are compiled once); a draw over it (under 1e-4) takes a size of its own.
        padded = table_rows(slots)
        if len(rows) > padded:
            padded = min(_bucket(len(rows)), rows_total)
        rows = np.concatenate([rows, np.repeat(rows[-1:], padded - len(rows))])
        out.append((sorted(slots), nodes, rows))
        reused += len(rows) * len(nodes)
        direct += samples * len(slots) * len(nodes)
        size += sum(len(rows) * int(np.prod(u.shape, dtype=np.int64)) * np.dtype(dtype).itemsize for u in nodes)
    groups = out
    if size > REUSE_BUDGET or (not force and reused >= 0.75 * direct):
        return None
    return groups, unslotted


def _with_child(claim: Claim, child: Claim) -> Claim:
    """``claim`` with one more child; a leaf root (everything on the reference) stays one."""
    other = claim.other if claim.children else "exact"
    return Claim(claim.site, claim.feature, (*claim.children, child), avoid=claim.avoid, other=other,
                 name=claim.name)


def _rename_slots(circuit: Circuit, mapping: dict[int, int], symbols, whole: int | None = None) -> Circuit:
    """Inputs ``x@s`` renamed ``x@mapping[s]`` (or, with ``whole``, each input ``x`` -> ``x@whole``)."""
    from ..traversal import deep_map

    def fn(node):
        if not isinstance(node, Symbol):
            return None
        if whole is not None:
            if node.name in symbols:
                return Symbol(node.shape, name=slot_name(node.name, whole), dtype=node.dtype)
            return None
        base, _, slot = node.name.rpartition("@")
        if base in symbols and slot.isdigit() and int(slot) in mapping:
            return Symbol(node.shape, name=slot_name(base, mapping[int(slot)]), dtype=node.dtype)
        return None

    return deep_map(circuit, fn)


class ScrubResult:
    """The losses of a scrubbing run, per sample and as means with standard errors.

    ``original`` (every path on the reference datum), ``scrubbed`` (the hypothesis' resampling),
    ``random`` (every input resampled but the labels), their standard errors ``*_se``,
    ``recovered = (random - scrubbed) / (random - original)`` with a paired bootstrap standard error
    ``recovered_se``; ``rows`` holds the per-sample losses; ``same_as_parent`` the share of samples
    where a claim's drawn datum equals its parent's (near 1: the feature's classes are too small to
    test anything); ``circuit`` the treeified circuit that was evaluated (print it, save it)."""

    def __init__(self, hypothesis, original_rows, scrubbed_rows, random_rows, *, seed, same_as_parent, circuit,
                 n_slots, plan=None, indices=None):
        self.hypothesis = hypothesis
        self.rows = {"original": original_rows, "scrubbed": scrubbed_rows, "random": random_rows}
        self.samples = int(original_rows.shape[0])
        self.original, self.scrubbed, self.random = (float(np.mean(r)) for r in self.rows.values())
        n = self.samples
        self.original_se, self.scrubbed_se, self.random_se = (float(np.std(r, ddof=1) / np.sqrt(n))
                                                              for r in self.rows.values())
        self.recovered = _recovered(original_rows, scrubbed_rows, random_rows)
        rng = np.random.default_rng([seed, 1])
        boot = []
        for _ in range(BOOTSTRAP):
            pick = rng.integers(0, n, n)
            boot.append(_recovered(original_rows[pick], scrubbed_rows[pick], random_rows[pick]))
        boot = np.asarray(boot)
        self.recovered_se = float(np.nanstd(boot, ddof=1)) if np.isfinite(boot).sum() > 1 else float("nan")
        self.same_as_parent = dict(same_as_parent)
        self.circuit = circuit
        self.n_slots = n_slots
        self.plan, self.indices = plan, indices

    def table(self) -> list[tuple[str, str]]:
        rows = [
            ("original loss", f"{self.original:.4f} ± {self.original_se:.4f}"),
            ("scrubbed loss", f"{self.scrubbed:.4f} ± {self.scrubbed_se:.4f}"),
            ("fully scrubbed loss", f"{self.random:.4f} ± {self.random_se:.4f}"),
            ("recovered", f"{100 * self.recovered:.1f}% ± {100 * self.recovered_se:.1f}%"),
            ("samples", f"{self.samples} ({self.n_slots} input slots)"),
        ]
        rows += [(f"same datum as parent: {k}", f"{100 * v:.1f}%") for k, v in self.same_as_parent.items()]
        return rows

    def __repr__(self):
        rows = self.table()
        w = max(len(k) for k, _ in rows)
        return "causal scrubbing\n" + "\n".join(f"  {k:<{w}}  {v}" for k, v in rows)

    def _repr_html_(self):
        import html

        body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in self.table())
        return (f"<table><caption>causal scrubbing</caption>{body}</table>"
                f"<pre>{html.escape(str(self.hypothesis))}</pre>")


def _recovered(orig: np.ndarray, scrubbed: np.ndarray, random: np.ndarray) -> float:
    gap = float(np.mean(random) - np.mean(orig))
    if gap == 0.0:
        return float("nan")
    return float((np.mean(random) - np.mean(scrubbed)) / gap)
