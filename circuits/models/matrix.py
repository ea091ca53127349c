"""The verification matrix: every architecture the library builds, checked against ``transformers``.

For each family (GPT-2, OPT, Llama, Mistral, GPT-NeoX/Pythia, Gemma-2, Qwen2, Gemma, Qwen3, Phi-3,
Mixtral, StableLM, GPT-J, GPT-Neo, Falcon in three layouts, BLOOM) a random-weight
model is made from a ``transformers`` config that exercises what sets the family apart
(grouped-query heads, sliding windows shorter than the prompt, Gemma-2's soft-capping and
alternating windows, partial rotary, q/k/v biases), and in float32 and float64 four cells are
checked:

- **logits**: ``Model.circuit(tokens)`` against the torch model (relative error ``max|ours -
  torch| / max|torch|`` at most 1e-4 in float32, 1e-9 in float64);
- **head ablation**: the circuit with head ``h`` of layer ``l`` replaced by zeros (as
  ``interp.ablate`` does) against the torch model with a hook zeroing that head's slice of the
  attention output projection's input;
- **head sum**: the per-head nodes ``h{l}.attn.head{h}`` (plus the output bias) summed, against
  the output of the torch attention module's output projection;
- **generation**: ``Model.generate`` (greedy, KV cache) against ``transformers``' ``generate``:
  token for token in float64; in float32 up to the first step where ``transformers``' top-2
  logit gap is below 1e-4 (random weights have near-ties that rounding flips).

A cell is ``ok`` (within the tolerance), ``refused`` (the library raised a ``CircuitError``:
never built approximately), or ``WRONG`` (it ran and disagreed: the matrix must have none).
The float64 oracle is the ``transformers`` model in float64 throughout (``float64_oracle``).

One command writes the table (torch and transformers needed)::

    python -m circuits.models.matrix --out docs/models.md

>>> sorted(FAMILIES)[:4]
['bloom', 'falcon', 'falcon-7b', 'falcon-rw']
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import CircuitError

VOCAB = 97
PROMPT, NEW = 12, 8
TOLERANCE = {"float32": 1e-4, "float64": 1e-9}
NEAR_TIE = 1e-4


@dataclass
class FamilySpec:
    """A ``transformers`` model class and config for one family, and where its layers,
    attention modules and output projections sit (for the hooks)."""

    model: str
    config: str
    kwargs: dict
    layers: str  # attribute path from the model to its list of layers
    attn: str  # attribute path from a layer to its attention module
    out_proj: str  # attribute of the attention module: the output projection
    what: str = ""  # what the config exercises

    def head_dim(self, cfg) -> int:
        d = getattr(cfg, "hidden_size", None) or cfg.n_embd
        heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
        return getattr(cfg, "head_dim", None) or d // heads


_SMALL = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48,
              max_position_embeddings=64)
FAMILIES = {
    "gpt2": FamilySpec("GPT2LMHeadModel", "GPT2Config", dict(n_embd=32, n_head=4, n_layer=2, n_positions=64),
                       "transformer.h", "attn", "c_proj", "learned positions, fused c_attn, tied unembedding"),
    "opt": FamilySpec("OPTForCausalLM", "OPTConfig",
                      dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_dim=48,
                           max_position_embeddings=64, word_embed_proj_dim=16),
                      "model.decoder.layers", "self_attn", "out_proj", "positions offset by 2, project_in/out"),
    "llama": FamilySpec("LlamaForCausalLM", "LlamaConfig", dict(_SMALL, num_key_value_heads=2),
                        "model.layers", "self_attn", "o_proj", "grouped-query heads (2 KV heads), rotary, SwiGLU"),
    "mistral": FamilySpec("MistralForCausalLM", "MistralConfig", dict(_SMALL, num_key_value_heads=2, sliding_window=5),
                          "model.layers", "self_attn", "o_proj", "a sliding window of 5 (prompts of 12)"),
    "gpt_neox": FamilySpec("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(_SMALL, rotary_pct=0.5),
                           "gpt_neox.layers", "attention", "dense",
                           "parallel residual, head-interleaved qkv, rotary on half of each head"),
    "gemma2": FamilySpec("Gemma2ForCausalLM", "Gemma2Config",
                         dict(_SMALL, num_hidden_layers=3, num_key_value_heads=2, head_dim=8, sliding_window=5,
                              query_pre_attn_scalar=8, attn_logit_softcapping=4.0, final_logit_softcapping=6.0),
                         "model.layers", "self_attn", "o_proj",
                         "soft-capped scores (4) and logits (6), windows of 5 on alternate layers, sandwich norms"),
    "qwen2": FamilySpec("Qwen2ForCausalLM", "Qwen2Config",
                        dict(_SMALL, num_hidden_layers=3, num_key_value_heads=2, use_sliding_window=True,
                             sliding_window=5, max_window_layers=1),
                        "model.layers", "self_attn", "o_proj", "q/k/v biases, windows of 5 from layer 1 on"),
    "gemma": FamilySpec("GemmaForCausalLM", "GemmaConfig", dict(_SMALL, num_key_value_heads=1, head_dim=12),
                        "model.layers", "self_attn", "o_proj",
                        "norms scaled by 1 + weight, embeddings by sqrt(d), GELU-gated MLP, head_dim 12 != d / heads, "
                        "multi-query"),
    "qwen3": FamilySpec("Qwen3ForCausalLM", "Qwen3Config",
                        dict(_SMALL, num_hidden_layers=3, num_key_value_heads=2, head_dim=6, attention_bias=True,
                             use_sliding_window=True, sliding_window=5, max_window_layers=2),
                        "model.layers", "self_attn", "o_proj",
                        "RMSNorm of each head's queries and keys, biases on q/k/v/o, window of 5 on layer 2"),
    "phi3": FamilySpec("Phi3ForCausalLM", "Phi3Config",
                       dict(_SMALL, num_key_value_heads=2, sliding_window=6,
                            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
                       "model.layers", "self_attn", "o_proj",
                       "fused qkv_proj and gate_up_proj, rotary on half of each head, a window of 6"),
    "mixtral": FamilySpec("MixtralForCausalLM", "MixtralConfig",
                          dict(_SMALL, num_key_value_heads=2, num_local_experts=5, num_experts_per_tok=2,
                               experts_implementation="eager"),
                          "model.layers", "self_attn", "o_proj",
                          "5 experts, the top 2 routed per token (router and experts as nodes)"),
    "stablelm": FamilySpec("StableLmForCausalLM", "StableLmConfig",
                           dict(_SMALL, num_key_value_heads=2, use_qkv_bias=True, qk_layernorm=True,
                                use_parallel_residual=True),
                           "model.layers", "self_attn", "o_proj",
                           "LayerNorms, per-head LayerNorm of queries and keys, q/k/v biases, parallel residual, "
                           "rotary on a quarter of each head"),
    "gptj": FamilySpec("GPTJForCausalLM", "GPTJConfig", dict(n_embd=32, n_head=4, n_layer=2, n_positions=64,
                                                             n_inner=48, rotary_dim=4),
                       "transformer.h", "attn", "out_proj",
                       "interleaved rotary on 4 of each head's 8 dimensions, one LayerNorm for a parallel block, "
                       "lm_head bias"),
    "gpt_neo": FamilySpec("GPTNeoForCausalLM", "GPTNeoConfig",
                          dict(hidden_size=32, num_heads=4, num_layers=2, max_position_embeddings=64,
                               intermediate_size=48, window_size=5, attention_types=[[["local", "global"], 1]]),
                          "transformer.h", "attn.attention", "out_proj",
                          "local attention (window 5) on layer 0, unscaled scores, learned positions"),
    "falcon": FamilySpec("FalconForCausalLM", "FalconConfig",
                         dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, num_kv_heads=2,
                              new_decoder_architecture=True, max_position_embeddings=64, ffn_hidden_size=48, bias=True),
                         "transformer.h", "self_attention", "dense",
                         "new_decoder_architecture: grouped qkv (2 KV heads), a norm each for attention and MLP, "
                         "biases"),
    "falcon-7b": FamilySpec("FalconForCausalLM", "FalconConfig",
                            dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, multi_query=True,
                                 max_position_embeddings=64),
                            "transformer.h", "self_attention", "dense",
                            "multi-query attention (one KV head), one LayerNorm for a parallel block"),
    "falcon-rw": FamilySpec("FalconForCausalLM", "FalconConfig",
                            dict(hidden_size=32, num_attention_heads=16, num_hidden_layers=2, multi_query=False,
                                 parallel_attn=False, alibi=True, bias=True, max_position_embeddings=64),
                            "transformer.h", "self_attention", "dense",
                            "ALiBi (16 heads: slopes 2^(-k/2), rounded to bfloat16 as transformers does), "
                            "head-interleaved qkv, sequential blocks"),
    "bloom": FamilySpec("BloomForCausalLM", "BloomConfig", dict(hidden_size=32, n_head=16, n_layer=2),
                        "transformer.h", "self_attention", "dense",
                        "ALiBi (16 heads: slopes 2^(-k/2)), embedding LayerNorm, head-interleaved qkv, BLOOM's GELU"),
}


def _attr(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def randomize(model, seed: int):
    """Weights large enough that every part of the model moves the logits (the default init
    leaves them near zero); Gemma's norm weights are offsets from 1, so they stay near 0."""
    import torch

    offset = 0.0 if "gemma" in type(model).__name__.lower() else 1.0
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "ln" in name):
                p.copy_(offset + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * min(p.shape) ** -0.5)
            else:  # stacked experts [experts, out, in]: each a Linear of fan-in `in`
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    return model.eval()


def hf_model(family: str, seed: int = 0, vocab: int = VOCAB, **overrides):
    """A random-weight ``transformers`` model of ``family`` (eager attention, ids 0 for BOS, EOS
    and padding)."""
    import transformers

    transformers.logging.set_verbosity_error()
    spec = FAMILIES[family]
    config = getattr(transformers, spec.config)(**{**spec.kwargs, "vocab_size": vocab, "bos_token_id": 0,
                                                   "eos_token_id": 0, "pad_token_id": 0,
                                                   "attn_implementation": "eager", **overrides})
    return randomize(getattr(transformers, spec.model)(config), seed)


@contextlib.contextmanager
def float64_oracle(model):
    """``model`` (a ``transformers`` causal LM) computing in float64 throughout.

    transformers upcasts some steps to float32 for half-precision models: the attention softmax
    (``softmax(..., dtype=torch.float32)``), RMS norms (``.to(torch.float32)``, Gemma's
    ``x.float()``) and the rotary frequencies (computed in float32 at init, read with
    ``.float()``), GPT-J's sinusoid table (made in float32 at init) and BLOOM's ALiBi slopes
    (``_get_alibi_slopes``, float32).  On a ``.double()`` model those upcasts are downcasts that
    cap its precision at float32's (about 1e-7): a float64 comparison at 1e-9 would measure
    transformers' rounding, not ours.  Here the model is made float64 and, while the context
    lasts, a request to turn a float64 tensor into float32 keeps it float64, the default rotary
    frequencies and GPT-J's table are recomputed in float64 from the config, and BLOOM's slopes
    are made in float64; nothing else of the model changes (Falcon's ALiBi, rounded to bfloat16 by
    design, stays as it is).
    """
    import torch

    model.double()
    for module in model.modules():
        if isinstance(getattr(module, "inv_freq", None), torch.Tensor):
            dim = 2 * module.inv_freq.numel()
            params = getattr(model.config, "rope_parameters", None) or {}
            theta = params.get("rope_theta", getattr(model.config, "rope_theta", 10000.0))
            module.inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            if hasattr(module, "original_inv_freq"):
                module.original_inv_freq = module.inv_freq.clone()
        if isinstance(getattr(module, "embed_positions", None), torch.Tensor) and hasattr(module, "pos_embd_dim"):
            dim, n = module.pos_embd_dim, module.embed_positions.shape[0]  # GPT-J's [sin | cos] table
            inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            angles = torch.arange(n, dtype=torch.float64)[:, None] * inv
            module.embed_positions = torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)
    to, flt, softmax = torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax
    bloom = sys.modules.get("transformers.models.bloom.modeling_bloom")
    slopes = getattr(bloom, "_get_alibi_slopes", None)

    def slopes64(num_heads, device):  # BLOOM's ALiBi slopes, made in float32 by transformers
        p = 2 ** math.floor(math.log2(num_heads))
        base = torch.tensor(2 ** (-(2 ** -(math.log2(p) - 3))), dtype=torch.float64)
        out = torch.pow(base, torch.arange(1, 1 + p, dtype=torch.float64))
        if p != num_heads:
            extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * p) - 3))), dtype=torch.float64)
            out = torch.cat([out, torch.pow(extra, torch.arange(1, 1 + 2 * min(p, num_heads - p), 2,
                                                                dtype=torch.float64))])
        return out

    def keep_to(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return to(self, *args, **kwargs)

    def keep_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else flt(self, *args, **kwargs)

    def keep_softmax(x, *args, **kwargs):
        if x.dtype == torch.float64 and kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return softmax(x, *args, **kwargs)

    torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax = keep_to, keep_float, keep_softmax
    if slopes is not None:
        bloom._get_alibi_slopes = slopes64
    try:
        yield model
    finally:
        torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax = to, flt, softmax
        if slopes is not None:
            bloom._get_alibi_slopes = slopes


# ---------------------------------------------------------------------------- cells
@dataclass
class Cell:
    status: str  # 'ok', 'refused', 'WRONG'
    detail: str

    def __str__(self):
        return f"{self.status} ({self.detail})" if self.detail else self.status


@dataclass
class Row:
    family: str
    dtype: str
    cells: dict = field(default_factory=dict)
    seconds: float = 0.0


def _rel(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def _check(value: float, tol: float) -> Cell:
    return Cell("ok" if value <= tol else "WRONG", f"{value:.1e}")


def _cell(fn) -> Cell:
    try:
        return fn()
    except CircuitError as e:
        return Cell("refused", str(e).splitlines()[0][:80])


class Oracle:
    """The torch side of one (family, dtype): forward passes with optional hooks."""

    def __init__(self, family: str, dtype: str, seed: int = 0, **overrides):
        self.family, self.dtype, self.spec = family, dtype, FAMILIES[family]
        self.model = hf_model(family, seed, **overrides)
        self.state = {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}
        self.config = self.model.config.to_dict()
        self.head_dim = self.spec.head_dim(self.model.config)

    @contextlib.contextmanager
    def precision(self):
        import torch

        with torch.no_grad():
            if self.dtype == "float64":
                with float64_oracle(self.model):
                    yield
            else:
                yield

    def attention(self, layer: int):
        return _attr(_attr(self.model, self.spec.layers)[layer], self.spec.attn)

    def logits(self, tokens, zero_head=None) -> np.ndarray:
        import torch

        handles = []
        if zero_head is not None:
            layer, head = zero_head
            lo, hi = head * self.head_dim, (head + 1) * self.head_dim

            def pre(module, args):
                x = args[0].clone()
                x[..., lo:hi] = 0
                return (x,) + tuple(args[1:])

            handles.append(getattr(self.attention(layer), self.spec.out_proj).register_forward_pre_hook(pre))
        try:
            with self.precision():
                return self.model(torch.tensor(np.asarray(tokens)[None])).logits[0].numpy()
        finally:
            for h in handles:
                h.remove()

    def attention_output(self, tokens, layer: int) -> np.ndarray:
        import torch

        seen = {}

        def keep(module, args, out):  # returns None: the output is left as it is
            seen["out"] = out

        # the output projection's output: BLOOM's attention module adds the residual stream itself
        h = getattr(self.attention(layer), self.spec.out_proj).register_forward_hook(keep)
        try:
            with self.precision():
                self.model(torch.tensor(np.asarray(tokens)[None]))
        finally:
            h.remove()
        return seen["out"][0].numpy()

    def generate(self, tokens, n: int):
        """``transformers``' greedy tokens and, per step, the gap between its top two logits."""
        import torch

        ids = torch.tensor(np.asarray(tokens)[None])
        with self.precision():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                      eos_token_id=None, pad_token_id=0, output_logits=True,
                                      return_dict_in_generate=True)
        gaps = []
        for step in out.logits:
            top = torch.topk(step[0].double(), 2).values
            gaps.append(float(top[0] - top[1]))
        return out.sequences[0].numpy()[len(tokens):], gaps


def check(family: str, dtype: str, *, cells=("logits", "head ablation", "head sum", "generation"), seed: int = 0,
          overrides: dict | None = None) -> Row:
    """One row of the matrix: ``family`` in ``dtype`` (``overrides``: config fields changed, to
    show that the matrix can fail)."""
    import circuits as C

    from .model import Model

    start = time.perf_counter()
    oracle = Oracle(family, dtype, seed, **(overrides or {}))
    row = Row(family, dtype)
    tol = TOLERANCE[dtype]
    tokens = np.random.default_rng(seed + 1).integers(1, VOCAB, PROMPT)
    model = None

    def build():
        nonlocal model
        if model is None:
            model = Model(oracle.config, oracle.state, dtype=dtype)
        return model

    layer, head = 1, 1
    if "logits" in cells:
        row.cells["logits"] = _cell(lambda: _check(_rel(C.evaluate(build().circuit(tokens, split_heads=False),
                                                                     dtype=dtype), oracle.logits(tokens)), tol))
    if "head ablation" in cells:
        def ablation():
            c = build().circuit(tokens)
            site = c.get_unique(f"h{layer}.attn.head{head}")
            zero = C.Array(np.zeros(site.shape, np.dtype(site.dtype)), name=f"h{layer}.attn.head{head}.zero_ablated")
            got = C.evaluate(c.update(site, lambda n: zero), dtype=dtype)
            want = oracle.logits(tokens, zero_head=(layer, head))
            moved = _rel(oracle.logits(tokens), want)  # the ablation must change the logits to test anything
            cell = _check(_rel(got, want), tol)
            return cell if moved > 10 * tol else Cell("WRONG", f"the ablation moved the logits by only {moved:.1e}")
        row.cells["head ablation"] = _cell(ablation)
    if "head sum" in cells:
        def head_sum():
            c = build().circuit(tokens)
            n_heads = oracle.model.config.num_attention_heads if hasattr(oracle.model.config, "num_attention_heads") \
                else oracle.model.config.n_head
            names = [f"h{layer}.attn.head{h}" for h in range(n_heads)]
            attn = c.get_unique(f"h{layer}.attn")
            biases = [k for k in attn.children if isinstance(k, C.Array)]  # the output projection's bias
            _, values = C.evaluate(c, dtype=dtype, also=names + biases)
            total = sum(values[n] for n in names) + sum(values[b] for b in biases)
            return _check(_rel(total, oracle.attention_output(tokens, layer)), tol)
        row.cells["head sum"] = _cell(head_sum)
    if "generation" in cells:
        def generation():
            got = build().generate(tokens, NEW, stop_at_eos=False)[PROMPT:]
            want, gaps = oracle.generate(tokens, NEW)
            if dtype == "float64":
                upto = NEW
            else:
                ties = [i for i, g in enumerate(gaps) if g < NEAR_TIE]
                upto = ties[0] if ties else NEW  # tokens before HF's first near-tie must agree
            same = int(np.argmax(got != want)) if np.any(got != want) else NEW
            status = "ok" if same >= upto else "WRONG"
            return Cell(status, f"{min(same, upto)}/{upto} tokens" + ("" if upto == NEW else f", tie at {upto}"))
        row.cells["generation"] = _cell(generation)
    row.seconds = time.perf_counter() - start
    return row


def run(families=None, dtypes=("float32", "float64"), cells=("logits", "head ablation", "head sum", "generation"),
        log=None) -> list[Row]:
    rows = []
    for family in families or FAMILIES:
        for dtype in dtypes:
            row = check(family, dtype, cells=cells)
            rows.append(row)
            if log is not None:
                log(f"{family} {dtype}: " + ", ".join(f"{k} {v}" for k, v in row.cells.items()) +
                    f" ({row.seconds:.0f} s)")
    return rows


def markdown(rows: list[Row]) -> str:
    """The matrix as a markdown table (one row per family and dtype)."""
    cells = list(dict.fromkeys(k for r in rows for k in r.cells))
    lines = ["| family | dtype | " + " | ".join(cells) + " |", "|---|---|" + "---|" * len(cells)]
    for r in rows:
        lines.append(f"| {r.family} | {r.dtype} | " + " | ".join(str(r.cells.get(c, "")) for c in cells) + " |")
    return "\n".join(lines)


PAGE = """# Verified architectures

Generated by `python -m circuits.models.matrix --out docs/models.md` ({when}; transformers {tv}, torch {pv}).
Every family the library builds, on a random-weight model whose config exercises what sets it apart,
in float32 and float64 (`circuits/models/matrix.py` says how each cell is checked). A cell is `ok`
with the relative error (logits, head ablation, head sum: at most 1e-4 in float32, 1e-9 in float64)
or the tokens that agree with `transformers`' `generate` (float64: all; float32: those before its first
top-2 logit gap under 1e-4), `refused` (a clear error: never built approximately) or `WRONG` (none may be).

{table}

| family | the config exercises |
|---|---|
{what}
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", default=None, help=f"default: all ({', '.join(FAMILIES)})")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "float64"])
    parser.add_argument("--out", default=None, help="write the page here (markdown)")
    args = parser.parse_args(argv)
    rows = run(args.families, args.dtypes, log=print)
    import torch
    import transformers

    page = PAGE.format(when=time.strftime("%Y-%m-%d"), tv=transformers.__version__, pv=torch.__version__,
                       table=markdown(rows),
                       what="\n".join(f"| {f} | {s.what} |" for f, s in FAMILIES.items() if f in {r.family for r in rows}))
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(page)
    print(markdown(rows))
    wrong = [(r.family, r.dtype, k) for r in rows for k, v in r.cells.items() if v.status == "WRONG"]
    if wrong:
        raise SystemExit(f"silently wrong cells: {wrong}")


if __name__ == "__main__":
    main()
