"""Generation with a KV cache, where an edit to the circuit applies to every step.

``generate(model, prompt, max_new_tokens, *, edit=None, ...)`` runs two programs:

- the **prefill**: the prompt's tokens (a batch padded on the left to a common length, that
  length rounded up to a power of two) computed together, their keys and values written to the
  cache, the first new token chosen from the last position's logits;
- the **decode step**: one new token per row against the cache, run once per new token.

Each is the circuit ``model.circuit(tokens, output='step')`` builds (``circuits.models.sequence``:
the position ids, attention masks and cache are Symbols), passed through ``edit`` (any function
from circuit to circuit: ``interp.ablate``, ``interp.patch``, a steering vector added with
``c.update(site, lambda n: Add(n, v))``, a spliced SAE), lowered once (``circuits.backend.Lowered``)
and compiled with the cache update and the choice of the next token around it.  The cache has a
fixed number of slots, the prompt and new tokens rounded up to a power of two: every step of a
generation has the same shapes, so the edited step compiles once, and a later generation whose
lengths fall in the same buckets (or whose edit differs only in values, e.g. another steering
vector) reuses the compiled programs (the compile cache is keyed by the name- and value-blind
structure and the shapes).  The program around a compiled step (the edited circuit's heads
batched, lowered, its arguments bound) is kept on the model under the content hash of the
circuit the edit returned (``step_program``): a generation whose edit returns the same circuit
again skips that work, and one whose edit returns anything else never meets a kept program.

Positions are absolute: ``'positions'`` holds each new token's position in its own sequence
(padding aside), so an edit that reads it (``sequence.position_mask``) acts on the same tokens in
the prefill and in the step that computes them.  Padding is exact: a padded slot's key is masked
in every query (``exp(-10000)`` is 0), and a row's real tokens sit at positions 0, 1, ... as they
would alone.  The cache's keys are those the edited model computes: an edit that changes keys or
values changes what later tokens read.

Sampling: ``temperature=0`` is greedy (the first largest logit, as ``argmax``); otherwise the
logits are divided by ``temperature``, cut to the ``top_k`` largest and to the smallest set whose
probability reaches ``top_p`` (the order ``transformers`` applies them in), and a token is drawn
with JAX's PRNG from ``seed`` (fold-in of the step, split per row).  The parameters are values of
the compiled program: changing them compiles nothing.

>>> import numpy as np
>>> from circuits.models.model import Model
>>> from circuits.models.gpt2 import random_gpt2_weights
>>> cfg = dict(model_type='gpt2', n_embd=16, n_head=2, n_layer=1, vocab_size=23, n_positions=32)
>>> m = Model(cfg, random_gpt2_weights(cfg, seed=1))
>>> out = generate(m, np.array([3, 5, 7]), 4)
>>> out.shape, out[:3].tolist()
((7,), [3, 5, 7])
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from ..backend import Lowered, batch_heads, precision
from ..errors import CircuitError
from ..nodes import Array, Circuit, Index, Symbol
from .sequence import KEY_POSITIONS, MASK, POSITIONS, new_keys_values

MIN_PREFILL = 8
MIN_CACHE = 16
PREFILL_FROM = 32  # prompts longer than this get the prefill program


def bucket(n: int, least: int) -> int:
    """The power of two at least ``n`` and ``least``."""
    size = least
    while size < n:
        size *= 2
    return size


# ---------------------------------------------------------------------------- prompts
class Prompt:
    """A prompt normalised: its rows of token ids and how to give the result back."""

    def __init__(self, model, prompt, prepend_bos: bool):
        self.text = isinstance(prompt, str) or (isinstance(prompt, (list, tuple)) and bool(prompt)
                                                and all(isinstance(p, str) for p in prompt))
        if self.text:
            self.texts = [prompt] if isinstance(prompt, str) else list(prompt)
            self.batch = not isinstance(prompt, str)
            tok = model._tok()
            self.rows = tok.encode_batch(self.texts, prepend_bos=prepend_bos)
            self.form = "text"
        else:
            rows, batch = model._rows(prompt, prepend_bos)
            self.rows, self.batch = rows, batch
            arr = None if isinstance(prompt, (list, tuple)) else np.asarray(
                prompt.detach().cpu().numpy() if hasattr(prompt, "detach") else prompt)
            self.form = "2d" if arr is not None and arr.ndim == 2 else "list" if batch else "1d"
        for r in self.rows:
            if len(r) == 0:
                raise CircuitError("an empty prompt: give at least one token (prepend_bos=True gives the BOS token)")


# ---------------------------------------------------------------------------- programs
PROGRAMS_KEPT = 8  # step programs kept per model (the most recently used)


def step_program(model, n: int, capacity: int, edit, greedy: bool) -> "StepProgram":
    """The step program of ``n`` new tokens over ``capacity`` cache slots under ``edit`` (None:
    the unedited step), kept on the model under the edited circuit's content hash.

    An edit is applied to the step built with per-head nodes (it may name a head: an edit built
    on the fused step would miss it, silently for a predicate); head batching then fuses the
    heads again, and the compiled step is as fast as the unedited one (BENCHMARKS.md,
    ``bench_generate``).  What costs is the Python around it: head batching, lowering and
    binding a 2,000-node circuit, about as long as two decode steps.  So the program is kept
    under the hash of what ``edit`` returned, never under the function: a later generation
    whose edit returns the same circuit (the same steering vector, the same ablation) reuses
    it, and one whose edit returns anything else (another vector, a function that reads state
    which changed) builds its own, so a kept program can never stand in for a different edit."""
    step = model.step_circuit(n, capacity, split_heads=edit is not None)
    circuit = step if edit is None else edit(step)
    if not isinstance(circuit, Circuit):
        raise CircuitError(f"edit must return a circuit (a function from circuit to circuit), got "
                           f"{type(circuit).__name__}")
    if circuit.shape != step.shape:
        raise CircuitError(f"edit changed the step's logits from shape {list(step.shape)} to "
                           f"{list(circuit.shape)}; an edit must keep the circuit's value shape")
    kept = model._programs
    key = (step.hash, circuit.hash, greedy, model.dtype)
    program = kept.pop(key, None)
    if program is None:
        program = StepProgram(model, step, circuit, model.step_window(n, capacity, edit is not None), greedy)
        while len(kept) >= PROGRAMS_KEPT:
            kept.pop(next(iter(kept)))
    kept[key] = program  # last: the most recently used
    return program


class StepProgram:
    """One step kind (prefill or decode) of one model and edit, lowered and compiled: the edited
    step circuit, its next-token logits and new keys and values as the roots of one program, the
    Symbols bound inside a jitted function that also updates the cache and picks the next token."""

    def __init__(self, model, step: Circuit, circuit: Circuit, window: int | None, greedy: bool):
        layers = model.attention_layers
        clean = new_keys_values(step, layers)
        found = new_keys_values(circuit, layers)
        keys, values = [], []
        for (k0, v0), (k, v) in zip(clean, found):
            # a layer the edit cut off from the logits: its cache is never read; zeros keep the shapes
            keys.append(k if k is not None else Array(np.zeros(k0.shape, np.dtype(k0.dtype)), name="unread_k"))
            values.append(v if v is not None else Array(np.zeros(v0.shape, np.dtype(v0.dtype)), name="unread_v"))
        last = Index(circuit, (-1,), name="logits.last")
        roots, _ = batch_heads([last, *keys, *values])
        self.lowered = Lowered(roots, model.dtype)
        self.layers, self.greedy, self.window = len(layers), greedy, window
        slots = {}
        allowed = {"tokens", POSITIONS, KEY_POSITIONS, MASK, f"{MASK}.sliding"} | {
            f"{a}.past_{kv}" for a in layers for kv in ("k", "v")}
        for i, node in enumerate(self.lowered.args):
            if isinstance(node, Symbol):
                if node.name not in allowed:
                    raise CircuitError(f"the edited step reads the Symbol {node.line()}, which generation does not bind; "
                                       "an edit's inputs must be values (Arrays), not Symbols")
                slots[node.name] = i
        self.slots = slots
        self.cache_shapes = [k.shape for k in keys], [v.shape for v in values]
        with precision(self.lowered.dtype):
            dummy = {node.name: np.zeros(node.shape, np.dtype(node.dtype)) for node in self.lowered.args
                     if isinstance(node, Symbol)}
            self.args = self.lowered.bind(dummy)
        tag = ("generate", "greedy" if greedy else "sample", self.window,
               tuple(sorted((name, i) for name, i in slots.items())))
        self.function = self.lowered.cached(tag, self._make)

    def _make(self):
        import jax
        import jax.numpy as jnp

        run = self.lowered.traceable()
        slots, n_layers, window, greedy = dict(self.slots), self.layers, self.window, self.greedy
        fdt = jnp.float64 if self.lowered.dtype == "float64" else jnp.float32

        def row(args, tokens, positions, key_positions, mask, sliding, past_k, past_v):
            args = list(args)
            for name, value in (("tokens", tokens), (POSITIONS, positions), (KEY_POSITIONS, key_positions), (MASK, mask),
                                (f"{MASK}.sliding", sliding)):
                if name in slots:
                    args[slots[name]] = value.astype(args[slots[name]].dtype)
            for l in range(n_layers):
                for kv, cache in (("k", past_k), ("v", past_v)):
                    i = slots.get(f"h{l}.attn.past_{kv}")
                    if i is not None:
                        args[i] = cache[l].astype(args[i].dtype)
            return run(args)

        def step(args, tokens, positions, key_positions, past_positions, cache_k, cache_v, slot, seed, counter,
                 temperature, top_k, top_p):
            # masks: a key is visible when it holds a token (position >= 0) not after the query's,
            # and (sliding layers) fewer than `window` positions before it
            kpos = jnp.concatenate([past_positions, key_positions], axis=1)  # [B, capacity + n]
            qpos = key_positions[:, :, None]
            seen = (kpos[:, None, :] >= 0) & (kpos[:, None, :] <= qpos)
            mask = seen.astype(fdt)
            sliding = (seen & (qpos - kpos[:, None, :] < window)).astype(fdt) if window else mask
            # ALiBi reads each key's position: an empty slot's -1 read as 0 (its key is masked)
            outs = jax.vmap(row, in_axes=(None, 0, 0, 0, 0, 0, 0, 0))(
                args, tokens, positions, jnp.maximum(kpos, 0), mask, sliding, list(cache_k), list(cache_v))
            logits = outs[0]
            new_k, new_v = outs[1:1 + n_layers], outs[1 + n_layers:]
            cache_k = [jax.lax.dynamic_update_slice(c, k.astype(c.dtype), (0, 0, slot, 0)) for c, k in zip(cache_k, new_k)]
            cache_v = [jax.lax.dynamic_update_slice(c, v.astype(c.dtype), (0, 0, slot, 0)) for c, v in zip(cache_v, new_v)]
            past_positions = jax.lax.dynamic_update_slice(past_positions, key_positions, (0, slot))
            if greedy:
                chosen = jnp.argmax(logits, axis=-1)
            else:
                chosen = sample(logits.astype(jnp.float32), seed, counter, temperature, top_k, top_p)
            return chosen.astype(jnp.int32), cache_k, cache_v, past_positions

        return step


def sample(logits, seed, counter, temperature, top_k, top_p):
    """Rows of ``logits`` [B, V] sampled (traceable; see the module docstring for the order)."""
    import jax
    import jax.numpy as jnp

    scaled = logits / temperature
    order = jnp.argsort(-scaled, axis=-1)
    desc = jnp.take_along_axis(scaled, order, axis=-1)
    kth = jnp.take(desc, jnp.clip(top_k - 1, 0, desc.shape[-1] - 1), axis=-1)[:, None]
    scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    desc = jnp.where(desc < kth, -jnp.inf, desc)
    probs = jax.nn.softmax(desc, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # the mass of the tokens ranked above each one
    keep_sorted = (before < top_p) | (top_p >= 1.0)
    keep = jnp.zeros_like(keep_sorted).at[jnp.arange(order.shape[0])[:, None], order].set(keep_sorted)
    scaled = jnp.where(keep, scaled, -jnp.inf)
    key = jax.random.fold_in(jax.random.PRNGKey(seed), counter)
    keys = jax.random.split(key, logits.shape[0])
    return jax.vmap(jax.random.categorical)(keys, scaled)


# ---------------------------------------------------------------------------- the loop
def _check_sampling(temperature, top_k, top_p, vocab: int):
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise CircuitError(f"temperature={temperature!r} must be a number >= 0 (0: greedy)")
    if temperature == 0 and (top_k is not None or top_p is not None):
        raise CircuitError("top_k and top_p shape sampling; give temperature > 0 with them (temperature=0 is greedy)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise CircuitError(f"top_k={top_k!r} must be an int >= 1")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise CircuitError(f"top_p={top_p!r} must be a number in (0, 1]")
    return min(int(top_k or vocab), vocab), float(1.0 if top_p is None else top_p)


def generate(model, prompt, max_new_tokens: int = 10, *, edit=None, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int = 0, stream: bool = False, stop_at_eos: bool = True,
             eos_token_id=None, stop=None, prepend_bos: bool = True):
    """``prompt`` continued by ``model`` for up to ``max_new_tokens`` tokens (see the module
    docstring).  ``prompt``: a text (the result is the text continued), a list of texts (a list of
    texts), token ids [n] (ids [n + new]), [1, n] or [rows, n] (a 2-d array, rows that stop early
    padded with the pad token, else EOS), or a list of token rows (a list of arrays).
    ``edit``: a function from circuit to circuit applied to every step.  Generation of a row stops
    at an end-of-sequence token (``eos_token_id``: an id or ids, else the tokenizer's and config's;
    ``stop_at_eos=False``: never) or when its text comes to contain one of the ``stop`` strings;
    the stopping token is kept.  ``stream=True`` returns an iterator instead: of token ids (ints),
    or of text pieces for a text prompt (a list per step for a batch, None / '' for finished rows).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise CircuitError(f"max_new_tokens={max_new_tokens!r} must be an int >= 0")
    if edit is not None and not callable(edit):
        raise CircuitError(f"edit must be a function from circuit to circuit, got {type(edit).__name__}")
    top_k, top_p = _check_sampling(temperature, top_k, top_p, model.vocab_size)
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not isinstance(s, str) or not s for s in stops):
        raise CircuitError(f"stop={stop!r}: give non-empty strings")
    if stops and model.tokenizer is None:
        raise CircuitError("stop strings need the model's tokenizer")
    p = Prompt(model, prompt, prepend_bos)
    for r in p.rows:
        model._check_length(len(r), "the prompt")
        if model.context is not None and len(r) + max_new_tokens > model.context:
            raise CircuitError(f"a prompt of {len(r)} tokens plus max_new_tokens={max_new_tokens} needs "
                               f"{len(r) + max_new_tokens} positions; the model's context is {model.context} "
                               f"({model._family.context_key})")
    eos = _eos_ids(model, eos_token_id) if stop_at_eos else set()
    run = _run(model, p, int(max_new_tokens), edit, float(temperature), top_k, top_p, int(seed), eos, stops)
    if stream:
        return _stream(model, p, run)
    new = [[] for _ in p.rows]
    for step in run:
        for i, t in enumerate(step):
            if t is not None:
                new[i].append(t)
    return _result(model, p, new)


def _eos_ids(model, eos_token_id) -> set:
    if eos_token_id is not None:
        ids = [eos_token_id] if isinstance(eos_token_id, (int, np.integer)) else list(eos_token_id)
        return {int(i) for i in ids}
    ids = set(model.tokenizer.eos_token_ids) if model.tokenizer is not None else set()
    cfg = model.config.get("eos_token_id")
    for i in ([cfg] if isinstance(cfg, int) else cfg if isinstance(cfg, list) else []):
        if isinstance(i, int) and not isinstance(i, bool):
            ids.add(i)
    return ids


def _run(model, p: Prompt, max_new: int, edit, temperature, top_k, top_p, seed, eos, stops) -> Iterator[list]:
    """Per step, the new token of each row (None for a row that has stopped)."""
    if max_new == 0:
        return
    rows = p.rows
    B, L = len(rows), max(len(r) for r in rows)
    greedy = temperature == 0
    # A short prompt goes through the decode step token by token: one program to compile, not two
    # (the first generation in a process is mostly compilation).  Measured on GPT-2 small, 16
    # prompt tokens, 64 new: a prefill program made warm generation 1.3x faster (4.4 -> 3.4 s)
    # and the first call with an empty compilation cache 1.34x slower (12.7 -> 16.9 s), which
    # would take that row from 2.1x to about 2.8x transformers' (target 3): docs/benchmarks.md.
    n = bucket(L, MIN_PREFILL) if L > PREFILL_FROM else L
    capacity = bucket(n + max_new, MIN_CACHE)
    decode = step_program(model, 1, capacity, edit, greedy)
    lengths = np.array([len(r) for r in rows])
    tokens = np.full((B, n), model._pad_id(), np.int32)
    key_pos = np.full((B, n), -1, np.int32)
    for i, r in enumerate(rows):
        tokens[i, n - len(r):] = r
        key_pos[i, n - len(r):] = np.arange(len(r))
    positions = np.maximum(key_pos, 0)
    fdt = np.float64 if model.dtype == "float64" else np.float32
    k_shapes, v_shapes = decode.cache_shapes
    with precision(decode.lowered.dtype):
        # numpy, not jnp.zeros / jnp.full: each of those compiles a kernel of its own on first use
        cache_k = [np.zeros((B, s[0], capacity, s[2]), fdt) for s in k_shapes]
        cache_v = [np.zeros((B, s[0], capacity, s[2]), fdt) for s in v_shapes]
        past = np.full((B, capacity), -1, np.int32)
        sampling = (np.asarray(temperature if temperature > 0 else 1.0, fdt), np.asarray(top_k, np.int32),
                    np.asarray(top_p, fdt))
        if L > PREFILL_FROM:
            prefill = step_program(model, n, capacity, edit, greedy)
            chosen, cache_k, cache_v, past = prefill.function(
                prefill.args, tokens, positions, key_pos, past, cache_k, cache_v, 0, seed, 0, *sampling)
        else:
            for s in range(n):
                chosen, cache_k, cache_v, past = decode.function(
                    decode.args, tokens[:, s:s + 1], positions[:, s:s + 1], key_pos[:, s:s + 1], past, cache_k,
                    cache_v, s, seed, 0, *sampling)
    done = np.zeros(B, bool)
    texts = [""] * B
    generated = [[] for _ in range(B)]
    pad = model._pad_id()
    for t in range(max_new):
        token = np.asarray(chosen).astype(np.int64)
        out = []
        for i in range(B):
            if done[i]:
                out.append(None)
                continue
            tok = int(token[i])
            out.append(tok)
            generated[i].append(tok)
            if tok in eos:
                done[i] = True
            elif stops:
                texts[i] = model.tokenizer.decode(generated[i])
                tail = texts[i][-(max(len(s) for s in stops) + 32):]
                if any(s in tail for s in stops):
                    done[i] = True
        yield out
        if done.all() or t == max_new - 1:
            return
        feed = np.where(done, pad, token)[:, None].astype(np.int32)
        pos = (lengths + t)[:, None].astype(np.int32)
        with precision(decode.lowered.dtype):
            chosen, cache_k, cache_v, past = decode.function(
                decode.args, feed, pos, pos, past, cache_k, cache_v, n + t, seed, t + 1, *sampling)


def _result(model, p: Prompt, new: list[list[int]]):
    if p.form == "text":
        outs = [text + model.tokenizer.decode(ids) for text, ids in zip(p.texts, new)]
        return outs if p.batch else outs[0]
    rows = [np.concatenate([r, np.asarray(ids, np.int64)]) for r, ids in zip(p.rows, new)]
    if p.form == "1d":
        return rows[0]
    if p.form == "list":
        return rows
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), model._pad_id(), np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out if p.batch else out[:1]


def _stream(model, p: Prompt, run):
    """Tokens as they come (ints; a list per step for a batch), or text pieces for a text prompt:
    a piece is what the decoded continuation gained, held back while it ends inside a character."""
    seen = [[] for _ in p.rows]
    emitted = [0] * len(p.rows)
    for step in run:
        if p.form != "text":
            yield step if p.batch else step[0]
            continue
        pieces = []
        for i, t in enumerate(step):
            if t is None:
                pieces.append(None)
                continue
            seen[i].append(t)
            text = model.tokenizer.decode(seen[i])
            if text.endswith("\ufffd"):
                pieces.append("")
                continue
            pieces.append(text[emitted[i]:])
            emitted[i] = len(text)
        yield pieces if p.batch else pieces[0]
    if p.form == "text":  # whatever was held back
        tails = [model.tokenizer.decode(s)[e:] for s, e in zip(seen, emitted)]
        if any(tails):
            yield tails if p.batch else tails[0]
