"""Where a builder's tokens sit in the sequence: their positions, what each attends to, the KV cache.

Every HuggingFace-family builder computes ``n`` tokens.  A ``Layout`` answers, in one place for
all of them, the questions that depend on where those tokens sit rather than on the architecture:

- the **positions** of the tokens (rows of a learned position table, rotary tables);
- the **mask** each attention layer applies (causal, or within a sliding window);
- the **KV cache**: the keys and values of earlier tokens that the new ones also attend to
  (``past_symbol`` makes a layer's cache Symbols, ``with_past`` puts them before the new keys).

Two kinds of layout:

- ``Layout.fixed(n, past=0)``: the tokens sit at positions ``past .. past + n - 1``; positions
  and masks are Arrays built here (what ``gpt2(config, weights, tokens)`` computes); ``past > 0``
  reads a cache of ``past`` earlier tokens from Symbols ``'h{l}.attn.past_k'`` / ``'past_v'``;
- ``Layout.step(n, capacity)``: one step of generation, where the same program serves every
  step: the position ids are the Symbol ``'positions'`` [n] (int), the masks Symbols
  ``'attention_mask'`` (and ``'attention_mask.sliding'`` for windowed layers) [n, capacity + n],
  the cache ``capacity`` slots of Symbols, of which the mask says which hold earlier tokens (an
  ALiBi model reads the keys' positions too: ``'key_positions'`` [capacity + n]).
  ``circuits.models.generate`` binds them at every step.

The cache always comes first along the key axis: ``'h{l}.attn.k_all'`` is ``Concat(past_k,
new keys)`` and ``'h{l}.attn.v_all'`` likewise, so the new keys of layer ``l`` are
``k_all.children[1]`` in any circuit built on a cached layout, edited or not.

>>> lay = Layout.fixed(3, past=2)
>>> lay.mask().value.tolist()
[[1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]]
>>> Layout.step(1, 8).mask(window=4).line()
"'attention_mask.sliding' [1,9] Symbol"
"""

from __future__ import annotations

import numpy as np

from ..errors import CircuitError
from ..nodes import Array, Circuit, Concat, GeneralFunction, Index, Rearrange, Symbol
from .blocks import ALL, sliding_causal_mask

POSITIONS = "positions"
KEY_POSITIONS = "key_positions"
MASK = "attention_mask"


class Layout:
    """The positions, masks and KV cache of the ``n`` tokens a builder computes (see the module
    docstring); build one with ``Layout.fixed`` or ``Layout.step``."""

    def __init__(self, n: int, past: int, dynamic: bool):
        if n < 1:
            raise CircuitError(f"a layout needs at least one token, got n={n}")
        if past < 0:
            raise CircuitError(f"past_len={past} must be >= 0")
        self.n, self.past, self.dynamic = int(n), int(past), bool(dynamic)
        self._masks: dict = {}
        self._windows: set = set()
        self._positions = Symbol((self.n,), name=POSITIONS, dtype="int64") if dynamic else None
        self._key_positions: Circuit | None = None

    @classmethod
    def fixed(cls, n: int, past: int = 0) -> "Layout":
        """``n`` tokens at positions ``past .. past + n - 1`` after ``past`` cached ones."""
        return cls(n, past, False)

    @classmethod
    def step(cls, n: int, capacity: int) -> "Layout":
        """``n`` new tokens of a generation step over a cache of ``capacity`` slots, all of it
        given as Symbols (positions, masks, cache)."""
        if capacity < 1:
            raise CircuitError(f"a generation step needs a cache of at least one slot, got {capacity}")
        return cls(n, capacity, True)

    @property
    def keys(self) -> int:
        """How many keys each query sees, cache included: ``past + n``."""
        return self.past + self.n

    @property
    def window(self) -> int | None:
        """The sliding window some layer asked a mask for (None when every layer sees all)."""
        return next((w for w in self._windows if w is not None), None)

    @property
    def positions(self) -> Circuit | None:
        """The Symbol ``'positions'`` of a step layout (None for a fixed one)."""
        return self._positions

    def position_ids(self) -> np.ndarray:
        """The positions of a fixed layout."""
        return np.arange(self.past, self.past + self.n)

    # ------------------------------------------------------------------ masks
    def mask(self, window: int | None = None) -> Circuit:
        """``mask[q, k] = 1`` where query ``q`` may attend key ``k`` (the cache's ``past`` keys
        first): causal, and with a ``window`` only the last ``window`` positions up to the query's
        own (Mistral's and Gemma-2's sliding window).  One node per window, shared by the layers."""
        if window is not None and window >= self.keys and not self.dynamic:
            window = None  # wider than the sequence: the same as no window
        got = self._masks.get(window)
        if got is not None:
            return got
        self._windows.add(window)
        if len({w for w in self._windows if w is not None}) > 1:
            raise CircuitError(f"layout: windows {sorted(w for w in self._windows if w)} in one model; "
                               "one sliding window size is supported")
        if self.dynamic:
            name = MASK if window is None else f"{MASK}.sliding"
            node = Symbol((self.n, self.keys), name=name)
        else:
            name = "causal_mask" if window is None else "sliding_mask"
            node = Array(sliding_causal_mask(self.n, self.keys, window), name=name)
        self._masks[window] = node
        return node

    # ------------------------------------------------------------------ positions
    def learned(self, table: Circuit, name: str, *, offset: int = 0) -> Circuit:
        """The rows of a learned position table for the tokens' positions (OPT's ``offset`` of 2
        added): a slice of the table for a fixed layout, a gather by ``'positions'`` for a step."""
        rows = table.shape[0] - offset
        if not self.dynamic:
            if self.past + self.n > rows:
                raise CircuitError(f"{self.past + self.n} positions but the position table has {rows} rows")
            return Index(table, (slice(offset + self.past, offset + self.past + self.n), ALL), name=name)
        table = table if offset == 0 else Index(table, (slice(offset, None), ALL), name=f"{name}.table")
        return GeneralFunction("gen_index_at_0_c", table, self._positions, name=name)

    def rotary(self, dim: int, theta: float, dtype: str, name: str = "rotary", *,
               rotary_dim: int | None = None, interleaved: bool = False) -> tuple[Circuit, Circuit]:
        """Rotary cos and signed sin [n, dim] (``blocks.rotary_tables`` for the tokens' positions
        at ``dtype``; ``rotary_dim`` for a partial rotary, ``interleaved`` for GPT-J's pairs):
        Arrays for a fixed layout; for a step, rows of tables over the ``past + n`` positions a
        step can reach, gathered by ``'positions'``."""
        from .blocks import rotary_sin_signed, rotary_tables

        if not self.dynamic:
            cos, sin = rotary_tables(self.position_ids(), dim, theta, dtype, rotary_dim, interleaved=interleaved)
            return (Array(cos, name=f"{name}.cos"),
                    Array(rotary_sin_signed(sin, rotary_dim, interleaved=interleaved), name=f"{name}.sin_signed"))
        cos, sin = rotary_tables(np.arange(self.keys), dim, theta, dtype, rotary_dim, interleaved=interleaved)
        cos_t = Array(cos, name=f"{name}.cos_table")
        sin_t = Array(rotary_sin_signed(sin, rotary_dim, interleaved=interleaved), name=f"{name}.sin_signed_table")
        return (GeneralFunction("gen_index_at_0_c", cos_t, self._positions, name=f"{name}.cos"),
                GeneralFunction("gen_index_at_0_c", sin_t, self._positions, name=f"{name}.sin_signed"))

    def key_positions(self) -> Circuit:
        """The position of every key a query may see [past + n] (int64): ``arange(past + n)`` for
        a fixed layout; for a step the Symbol ``'key_positions'`` (each cache slot's token position,
        then the new tokens'; ``circuits.models.generate`` binds it, empty slots as 0: the mask
        hides them)."""
        if self._key_positions is None:
            self._key_positions = (Symbol((self.keys,), name=KEY_POSITIONS, dtype="int64") if self.dynamic
                                   else Array(np.arange(self.keys, dtype=np.int64), name=KEY_POSITIONS))
        return self._key_positions

    def alibi(self, table: np.ndarray, n_kv: int, group: int, name: str = "alibi") -> Circuit:
        """ALiBi's bias [n_kv, group, past + n] of the keys' positions from ``table`` [positions,
        heads] (``blocks.alibi_table``, already in the precision the model wants): a slice of it
        for a fixed layout, rows gathered by ``key_positions`` for a step.  Heads are laid out as
        ``attention`` expects them (query head ``h`` is ``(h // group, h % group)``)."""
        table = np.asarray(table)
        if table.ndim != 2 or table.shape[1] != n_kv * group:
            raise CircuitError(f"layout.alibi: a table [positions, {n_kv * group}] is needed, got {list(table.shape)}")
        if table.shape[0] < self.keys:
            raise CircuitError(f"layout.alibi: {self.keys} key positions but the table has {table.shape[0]} rows")
        if not self.dynamic:
            rows = Array(np.ascontiguousarray(table[:self.keys]), name=f"{name}.rows")
        else:
            rows = GeneralFunction("gen_index_at_0_c", Array(np.ascontiguousarray(table[:self.keys]),
                                                             name=f"{name}.table"),
                                   self.key_positions(), name=f"{name}.rows")
        return Rearrange(rows, "t (n g) -> n g t", n=n_kv, g=group, name=name)

    # ------------------------------------------------------------------ KV cache
    def past_symbol(self, layer_name: str, which: str, shape, dtype: str = "float32") -> Symbol | None:
        """The cache's keys or values (``which``: ``'k'`` or ``'v'``) of one attention layer: the
        Symbol ``'<layer_name>.past_<which>'`` of ``shape`` with ``past`` on the position axis
        (``transformers``' layout: keys after rotary), or None without a cache."""
        if self.past == 0:
            return None
        return Symbol(tuple(int(s) for s in shape), name=f"{layer_name}.past_{which}", dtype=dtype)

    @staticmethod
    def with_past(past: Circuit | None, new: Circuit, layer_name: str, which: str, axis: int = 1) -> Circuit:
        """``new`` keys or values after the cache's (``Concat(past, new)`` along the position
        ``axis``, named ``'<layer_name>.<which>_all'``); ``new`` itself without a cache."""
        if past is None:
            return new
        return Concat(past, new, axis=axis, name=f"{layer_name}.{which}_all")

    def check_context(self, family: str, context: int | None, key: str) -> None:
        """Refuse a fixed layout's positions past the model's context (``key``: the config field
        that says it); a step's positions are values, checked by whoever binds them."""
        if context is not None and not self.dynamic and self.keys > context:
            what = f"{self.n} tokens" + (f" after {self.past} cached" if self.past else "")
            raise CircuitError(f"{family}: {what} need {self.keys} positions but the model's context is "
                               f"{key}={context}")


def new_keys_values(circuit: Circuit, layer_names) -> list[tuple[Circuit | None, Circuit | None]]:
    """For each attention layer name (``'h0.attn'``...), the new keys and values a cached
    ``circuit`` computes: the second child of its ``'<name>.k_all'`` / ``'<name>.v_all'`` Concat,
    or None where the circuit no longer reads them (an edit cut the layer off)."""
    from ..traversal import toposort

    found = {n.name: n for n in toposort(circuit) if isinstance(n, Concat) and n.name is not None
             and n.name.endswith(("_all",))}
    out = []
    for name in layer_names:
        pair = []
        for which in ("k", "v"):
            node = found.get(f"{name}.{which}_all")
            pair.append(None if node is None else node.children[1])
        out.append(tuple(pair))
    return out


def position_mask(circuit: Circuit, positions, *, context: int, dtype: str = "float32") -> Circuit:
    """A 0/1 vector over ``circuit``'s sequence axis, 1 at the tokens whose absolute position is
    in ``positions`` (an int, a list of ints or a slice of ``range(context)``): in a generation
    step, ``table[positions]`` gathered by the step's ``'positions'`` Symbol, so the same edit
    acts on the same tokens in the prefill and in the step that computes them; in a circuit
    without that Symbol (``model.circuit(tokens)``), the tokens are at positions 0, 1, ... of
    its ``'tokens'``.  An edit multiplies by it to act only there (``'position_mask'`` [n]):

    >>> from circuits import Symbol, evaluate
    >>> step = Layout.step(1, 8)
    >>> c = GeneralFunction('gen_index_at_0_c', Array(np.eye(4, dtype=np.float32)), step.positions)
    >>> m = position_mask(c, [2, 5], context=16)
    >>> [float(evaluate(m, {'positions': np.array([p])})[0]) for p in (1, 2, 5)]
    [0.0, 1.0, 1.0]
    """
    from ..traversal import toposort

    table = np.zeros(context, np.dtype(dtype))
    try:
        chosen = np.arange(context)[positions] if isinstance(positions, slice) else np.asarray(
            [positions] if np.isscalar(positions) else list(positions), np.int64)
    except (TypeError, ValueError):
        raise CircuitError(f"positions={positions!r}: give an int, a list of ints or a slice") from None
    if chosen.size and (chosen.min() < 0 or chosen.max() >= context):
        raise CircuitError(f"positions={positions!r}: absolute positions lie in [0, {context}) (the model's context); "
                           "negative positions have no meaning while the sequence grows")
    table[chosen] = 1
    found = [n for n in toposort(circuit) if isinstance(n, Symbol) and n.name == POSITIONS]
    if found:
        return GeneralFunction("gen_index_at_0_c", Array(table, name="position_mask.table"), found[0],
                               name="position_mask")
    tokens = [n for n in toposort(circuit) if n.name == "tokens" and len(n.shape) == 1]
    if not tokens:
        raise CircuitError(f"position_mask: {circuit.line()} has no 'positions' Symbol (a generation step) nor "
                           "'tokens' [n] to count positions along")
    n = tokens[0].shape[0]
    if n > context:
        raise CircuitError(f"position_mask: {n} tokens but context={context}")
    return Array(table[:n], name="position_mask")
