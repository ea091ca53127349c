"""The ACDC paper's tracr tasks, whose circuits are known: ``reverse`` and ``frac_prevs``.

Conmy et al. (ACDC, NeurIPS 2023) compile two RASP programs with tracr and ask whether discovery
recovers their circuits; Miller et al. (auto-circuit, COLM 2024) make the ground truth precise.
``tracr_task(name)`` compiles the program as the ACDC repository builds it and gives its two
canonical edge sets in the edge names of ``circuits.interp.edges`` on ``from_tracr``'s circuits:

- ``true_edges``: the edges that must be kept when the other edges are *resample*-ablated
  (auto-circuit's ``tracr_*_true_edges`` / ``tracr_xproportion_official_edges``);
- ``acdc_edges``: the edges that must be kept when the others are *zero*-ablated (the ACDC
  repository's ``get_tracr_*_edges``, as auto-circuit's ``tracr_*_acdc_edges`` restates them:
  token and position embeddings are one source, ``'embeds'``, as in auto-circuit's ``Resid Start``).

The programs:

- ``reverse``: ``length = SelectorWidth(Select(tokens, tokens, TRUE))`` (the repository's own
  ``make_length``, unnamed), ``opp_index = length - indices - 1``, ``Aggregate(Select(indices,
  opp_index, EQ), tokens)``; vocabulary {1, 2, 3}, ``max_seq_len=5``, BOS ``'BOS'``.  Four layers:
  head ``b0.a.head0`` and MLP ``h0.mlp`` compute the length, ``h1.mlp`` and ``h2.mlp`` the opposite
  index, head ``b3.a.head0`` moves each token to its mirror position.
- ``frac_prevs``: tracr's ``make_frac_prevs(tokens == "x")`` (ACDC's ``proportion``, auto-circuit's
  ``xproportion``); vocabulary {w, x, y, z}, ``max_seq_len=5``.  ``h0.mlp`` computes
  ``tokens == "x"``, head ``b1.a.head0`` averages it over the previous positions.

Data as the ACDC repository draws it: ``clean`` inputs and ``corrupt`` ones (a derangement of
``clean``: each example is patched from a different one).  For ``reverse``: the six permutations
of (1, 2, 3); for ``frac_prevs``: distinct random sequences of four tokens.

>>> sorted(TRUE_EDGES['reverse'])
['b3.a.head0 -> output', 'embeds -> b3.a.head0.a.v']
>>> len(ACDC_EDGES['reverse']), len(ACDC_EDGES['frac_prevs'])
(10, 5)
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CircuitError
from ..nodes import Add, Circuit, Einsum, Scalar

TASKS = ("reverse", "frac_prevs")
BOS = "BOS"
MAX_SEQ_LEN = 5

TRUE_EDGES = {
    "reverse": frozenset({"embeds -> b3.a.head0.a.v", "b3.a.head0 -> output"}),
    "frac_prevs": frozenset({"embeds -> h0.mlp", "h0.mlp -> b1.a.head0.a.v", "b1.a.head0 -> output"}),
}
ACDC_EDGES = {
    "reverse": frozenset({
        "b3.a.head0 -> output",
        "h2.mlp -> b3.a.head0.a.q",
        "embeds -> b3.a.head0.a.k",
        "embeds -> b3.a.head0.a.v",
        "h1.mlp -> h2.mlp",
        "h0.mlp -> h1.mlp",
        "embeds -> h1.mlp",
        "b0.a.head0 -> h0.mlp",
        "embeds -> h0.mlp",
        "embeds -> b0.a.head0.a.v",
    }),
    "frac_prevs": frozenset({
        "b1.a.head0 -> output",
        "embeds -> b1.a.head0.a.q",
        "embeds -> b1.a.head0.a.k",
        "h0.mlp -> b1.a.head0.a.v",
        "embeds -> h0.mlp",
    }),
}


@dataclass(frozen=True, eq=False, repr=False)
class TracrTask:
    """One of the ACDC paper's tracr tasks (``tracr_task(name)``): the compiled ``model``, its
    ``vocab``, the canonical ``true_edges`` (resample ablation) and ``acdc_edges`` (zero
    ablation), and example ``clean`` / ``corrupt`` inputs (lists as tracr takes them).
    ``circuit(inputs)`` is ``from_tracr(model, inputs)``; ``tokens(inputs)`` encodes inputs (one
    list, or a list of them) into token ids."""

    name: str
    model: Any
    vocab: frozenset
    true_edges: frozenset
    acdc_edges: frozenset
    clean: tuple
    corrupt: tuple

    def __repr__(self) -> str:
        config = getattr(self.model, "model_config", None)
        n = config.num_layers if config is not None else None
        layers = "" if n is None else f", {n} layer" + "s" * (n != 1)
        vocab = ", ".join(map(str, sorted(self.vocab, key=str)))
        return (f"<TracrTask {self.name!r}{layers}, vocabulary {{{vocab}}}, {len(self.clean)} clean/corrupt "
                f"examples, {len(self.true_edges)} true edges, {len(self.acdc_edges)} ACDC edges>")

    def circuit(self, inputs):
        from .tracr import from_tracr

        return from_tracr(self.model, inputs)

    def metric(self, circuit):
        """The metric auto-circuit runs this task with, as ``circuits.interp.discover`` takes it:
        ``'kl'`` (KL divergence from the clean output distribution) for ``reverse``; for
        ``frac_prevs`` (a numerical output) the mean squared difference of the output from
        ``circuit``'s clean value (ACDC's ``l2``), a function of the output node.  ``circuit`` is
        the clean circuit the metric compares with (``self.circuit(...)``, over the same inputs)."""
        if self.name == "reverse":
            return "kl"
        return squared_error_to(circuit)

    def tokens(self, inputs) -> np.ndarray:
        from .tracr import tracr_tokens

        inputs = list(inputs)
        if inputs and isinstance(inputs[0], (list, tuple)):
            return np.stack([tracr_tokens(self.model, x) for x in inputs])
        return tracr_tokens(self.model, inputs)


def squared_error_to(clean: Circuit):
    """A metric for ``discover``: the output node -> the mean of its squared difference from
    ``clean`` (a node of the output's shape, e.g. the unpatched circuit over the same inputs, so
    that each row of a batch compares with its own clean output): ACDC's ``l2``.

    >>> import numpy as np
    >>> from circuits import Array, evaluate
    >>> clean = Array(np.zeros((2, 1), np.float32), name='clean')
    >>> float(evaluate(squared_error_to(clean)(Array(np.array([[1.0], [3.0]], np.float32), name='out'))))
    5.0
    """
    def metric(out: Circuit) -> Circuit:
        if out.shape != clean.shape:
            raise CircuitError(f"squared_error_to: the output {out.line()} and the clean value {clean.line()} differ in shape")
        ax = "abcdefgh"[: out.ndim]
        diff = Add(out, Einsum.from_spec(f"{ax},->{ax}", clean, Scalar(-1.0)), name="metric.diff")
        return Einsum.from_spec(f"{ax},{ax},->", diff, diff, Scalar(1.0 / max(1, int(np.prod(out.shape)))),
                                name="metric.l2")

    return metric


def reverse_program():
    """The ``reverse`` RASP program as the ACDC repository builds it (its own, unnamed ``length``)."""
    from tracr.rasp import rasp

    length = rasp.SelectorWidth(rasp.Select(rasp.tokens, rasp.tokens, rasp.Comparison.TRUE))
    opp_index = length - rasp.indices - 1
    flip = rasp.Select(rasp.indices, opp_index, rasp.Comparison.EQ)
    return rasp.Aggregate(flip, rasp.tokens)


def frac_prevs_program():
    """The ``frac_prevs`` RASP program (ACDC's ``proportion``): the fraction of the tokens so far that are ``'x'``."""
    from tracr.compiler.lib import make_frac_prevs
    from tracr.rasp import rasp

    return make_frac_prevs(rasp.tokens == "x")


_VOCAB = {"reverse": frozenset({1, 2, 3}), "frac_prevs": frozenset({"w", "x", "y", "z"})}
_PROGRAM = {"reverse": reverse_program, "frac_prevs": frac_prevs_program}


def _derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    while True:
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm


def _examples(name: str, n_examples: int | None, seed: int):
    rng = np.random.default_rng(seed)
    if name == "reverse":
        seqs = [list(p) for p in itertools.permutations((1, 2, 3))]
        if n_examples is not None and n_examples != len(seqs):
            raise CircuitError(f"tracr_task('reverse'): the data are the {len(seqs)} permutations of (1, 2, 3); "
                               f"n_examples={n_examples} is not supported (leave it out)")
    else:
        n = 20 if n_examples is None else n_examples
        every = list(itertools.product("wxyz", repeat=4))
        if not 2 <= n <= len(every):
            raise CircuitError(f"tracr_task('frac_prevs'): n_examples must be in 2..{len(every)}, got {n}")
        seqs = [list(every[i]) for i in rng.choice(len(every), size=n, replace=False)]
    perm = _derangement(len(seqs), rng)
    clean = tuple((BOS, *s) for s in seqs)
    return clean, tuple(clean[i] for i in perm)


@functools.lru_cache(maxsize=None)
def _compiled(name: str):
    from tracr.compiler import compiling

    from ..backend import ensure_persistent_cache

    # tracr's compiler runs haiku's initialisation op by op: 77 small XLA programs for 'reverse'.
    # With the compilation cache on first, a new process reads them from disk (about half the time).
    ensure_persistent_cache()
    return compiling.compile_rasp_to_model(_PROGRAM[name](), vocab=set(_VOCAB[name]), max_seq_len=MAX_SEQ_LEN,
                                           compiler_bos=BOS)


def tracr_task(name: str, *, n_examples: int | None = None, seed: int = 0) -> TracrTask:
    """The tracr task ``name`` (``'reverse'`` or ``'frac_prevs'``), compiled with tracr (once per
    process: compiling takes seconds) with its canonical edge sets and example data
    (``n_examples`` random sequences for ``frac_prevs``, 20 by default; ``seed`` draws them and
    the derangement giving ``corrupt``)."""
    if name not in TASKS:
        raise CircuitError(f"tracr_task: unknown task {name!r}; the tasks are {', '.join(TASKS)}")
    from .tracr import _require_tracr

    _require_tracr()
    clean, corrupt = _examples(name, n_examples, seed)
    return TracrTask(name=name, model=_compiled(name), vocab=_VOCAB[name], true_edges=TRUE_EDGES[name],
                     acdc_edges=ACDC_EDGES[name], clean=clean, corrupt=corrupt)
