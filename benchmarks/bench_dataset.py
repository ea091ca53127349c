"""Interactive speed over a dataset (issue 35): a new experiment over a batch of prompts, after the
clean run over the same batch, against a bare torch batched forward making the same change by a
hook, in one process.

    python -m benchmarks.bench_dataset               # an empty, then a warm compilation cache
    python -m benchmarks.bench_dataset --here        # this process only (the cache in force)
    python -m benchmarks.bench_dataset --under-load  # also the ablation row while the tests run beside it

Shipped induction model, 50 prompts of 34 tokens (the circuit over a tokens Symbol, unique names).
Rows, each the median over the variants, every variant new to the process (its first call):
- a new head patch over the batch (``evaluate(patch(c, head, {'toks_int_var': corrupt}), feed)``,
  8 heads) against a torch forward whose hook puts the head's corrupted output (cached once) in;
- a new zero-ablation of a head (8 heads) against a torch forward whose hook zeroes it;
- a new exact path patch b0.a.head2 -> a layer-1 head's q, k or v (12) against a torch forward
  that feeds the receiver a residual stream with the sender's corrupted output;
- a new position patch of a head (8 (head, position) pairs) against a torch forward whose hook
  puts the head's corrupted output in at that position; the first in the process apart (it
  compiles or loads the one kernel the clean run never used: the mask's product over the rows);
- attribution of all 8 heads over the batch (``attribute(circuit, heads, {'toks_int_var':
  corrupt}, metric=<the loss at one position>)``, 8 positions: a new variant each, whose
  gradients run op by op) against one torch forward + backward keeping the heads' outputs' gradients
  and the same estimates; the first attribution in the process apart (it compiles or loads the
  backward kernels), with its XLA compilations;
with the XLA compilations (traces and compilations on the calling thread, from
``jax.monitoring``) each kind made, and the clean run's first call.  Torch runs at the faster of
one thread and all cores (measured); every value is checked against torch's.

``--under-load`` then records the zero-ablation row again (an empty, then a warm cache) while a
second process this benchmark starts runs the test suite (``pytest -n 2 -m "not slow" tests``,
its own compilation cache; stopped after): on a loaded 2-core machine each small kernel call
waits behind other work (issue 35 item 5).  The load average is printed with the row.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from .common import XlaCounter, fastest_torch_threads, report, timed

ROWS, TOKENS = 50, 34


class TorchBatched:
    """The shipped attention-only model in torch over a batch ``[B, tokens]`` (float32, eager): the
    per-token loss ``[B, positions]``; ``hook(layer, out)`` may change a layer's head outputs
    ``[B, heads, positions, d_model]``."""

    def __init__(self, weights):
        import torch

        self.w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}

    def _ln(self, x, name):
        w = self.w
        mean = x.mean(-1, keepdim=True)
        xc = x - mean
        import torch

        return xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + 1e-5) * w[f"{name}.scale"] + w[f"{name}.bias"]

    def _attend(self, l, q_in, k_in, v_in, n):
        import torch

        w = self.w
        q = torch.einsum("...sd,hcd->...hsc" if q_in.dim() == 3 else "bhsd,hcd->bhsc", q_in, w[f"a{l}.w.q"])
        k = torch.einsum("...sd,hcd->...hsc" if k_in.dim() == 3 else "bhsd,hcd->bhsc", k_in, w[f"a{l}.w.k"])
        v = torch.einsum("...sd,hcd->...hsc" if v_in.dim() == 3 else "bhsd,hcd->bhsc", v_in, w[f"a{l}.w.v"])
        mask = w["t.a.c.causal_mask"][:n, :n]
        scores = torch.einsum("bhqc,bhkc->bhqk", q, k) * q.shape[-1] ** -0.5
        probs = torch.softmax(scores * mask - 10000.0 * (1 - mask), -1)
        return torch.einsum("bhqk,bhkc,hdc->bhqd", probs, v, w[f"a{l}.w.o"])

    def embed(self, toks):
        import torch

        toks = torch.as_tensor(toks)
        inp = toks[:, :-2]
        n = inp.shape[1]
        return self.w["t.w.tok_embeds"][inp], self.w["t.w.pos_embeds"][:n], n

    def loss(self, toks, x):
        import torch

        toks = torch.as_tensor(toks)
        logits = self._ln(x, "final.ln.w") @ self.w["t.w.unembed"].T
        return -torch.log_softmax(logits, -1).gather(2, toks[:, 1:-1, None])[..., 0]

    def heads(self, toks, hook=None):
        """Each layer's head outputs and the final residual."""
        import torch

        with torch.no_grad():
            x, pos, n = self.embed(toks)
            outs = []
            for l in range(2):
                h = self._ln(x, f"a{l}.ln.w")
                out = self._attend(l, h + pos, h + pos, h, n)
                if hook is not None:
                    out = hook(l, out)
                outs.append(out)
                x = x + out.sum(1)
            return outs, x

    def attribution(self, toks, corrupt_heads, position):
        """Attribution patching of every head for the loss at ``position``: one forward keeping
        the heads' outputs' gradients, one backward; ``[B, layers, heads]`` estimates."""
        import torch

        x, pos, n = self.embed(toks)
        outs = []
        for l in range(2):
            h = self._ln(x, f"a{l}.ln.w")
            out = self._attend(l, h + pos, h + pos, h, n)
            if out.requires_grad:  # downstream of an earlier layer's heads
                out.retain_grad()
            else:
                out.requires_grad_()
            outs.append(out)
            x = x + out.sum(1)
        self.loss(toks, x)[:, position].sum().backward()
        with torch.no_grad():
            return torch.stack([((c - o) * o.grad).sum((2, 3)) for c, o in zip(corrupt_heads, outs)], 1)

    def forward(self, toks, hook=None):
        import torch

        with torch.no_grad():
            return self.loss(toks, self.heads(toks, hook)[1])

    def path_patched(self, toks, corrupted_heads, sender, receiver, role):
        """Exact path patching of layer-0 head ``sender`` into layer-1 head ``receiver``'s ``role``
        input (``corrupted_heads``: the corrupted run's layer-0 head outputs, cached once)."""
        import torch

        with torch.no_grad():
            x, pos, n = self.embed(toks)
            h0 = self._ln(x, "a0.ln.w")
            out0 = self._attend(0, h0 + pos, h0 + pos, h0, n)
            x1 = x + out0.sum(1)
            patched = x1 + corrupted_heads[:, sender] - out0[:, sender]
            heads = self.w["a1.w.q"].shape[0]
            clean_in, patched_in = self._ln(x1, "a1.ln.w"), self._ln(patched, "a1.ln.w")
            per_head = [clean_in[:, None].expand(-1, heads, -1, -1).clone() for _ in range(3)]
            per_head["qkv".index(role)][:, receiver] = patched_in
            out1 = self._attend(1, per_head[0] + pos, per_head[1] + pos, per_head[2], n)
            return self.loss(toks, x1 + out1.sum(1))




def run_here(only: str | None = None) -> list[tuple[str, str]]:
    """The rows (``only='ablation'``: the clean run and the zero-ablation row alone)."""
    import torch

    import circuits as C
    from circuits import Symbol
    from circuits.interp import ablate, patch, path_patch
    from circuits.models import attn_only, induction_weights, tokens_symbol

    counter = XlaCounter()
    rows = []
    w = induction_weights()
    rng = np.random.default_rng(0)
    clean, corrupt = rng.integers(1, 64, (ROWS, TOKENS)), rng.integers(1, 64, (ROWS, TOKENS))
    sym = tokens_symbol(TOKENS)
    corrupt_sym = Symbol((TOKENS,), name="corrupt_toks", dtype="int64")
    circuit = attn_only(w, sym, unique_names=True)
    feed = {sym: clean, corrupt_sym: corrupt}
    model = TorchBatched(w)

    before = counter.count()
    dt, value = timed(lambda: C.evaluate(circuit, {sym: clean}))
    clean_xla = counter.count() - before
    kernels = C.backend.tiers.last_run()["kernels"]
    ref = model.forward(clean).numpy()
    np.testing.assert_allclose(value, ref, rtol=1e-4, atol=1e-5)
    bare = lambda: model.forward(clean)  # noqa: E731
    threads, _ = fastest_torch_threads(bare, (1, os.cpu_count() or 1))
    rows.append(("torch threads (the faster of 1 and all cores)", str(threads)))
    t_bare = np.median([timed(bare)[0] for _ in range(9)])
    rows.append(("clean run over the batch, first call (kernels compiled or loaded)",
                 f"{dt * 1e3:.0f} ms: {kernels['compiled']} XLA compilations, {kernels['loaded']} executables loaded "
                 f"from disk ({clean_xla} traces/compilations); torch batched forward {t_bare * 1e3:.2f} ms"))

    corrupt_heads, _ = model.heads(corrupt)

    def row(label, variants, theirs):
        ours_t, theirs_t = [], []
        before = counter.count()
        compiled = 0
        for variant, torch_fn in zip(variants, theirs):
            mark = counter.count()
            dt, value = timed(lambda: C.evaluate(variant(), feed))
            compiled += counter.count() - mark
            ours_t.append(dt)
            dt_t, ref = timed(torch_fn)
            theirs_t.append(dt_t)
            np.testing.assert_allclose(value, ref.numpy(), rtol=1e-4, atol=1e-5)
        a, b = np.median(ours_t), np.median(theirs_t)
        rows.append((f"{label} ({len(variants)}, median)",
                     f"{a * 1e3:.2f} ms vs torch {b * 1e3:.2f} ms: ratio {a / b:.2f} (target <= 4); "
                     f"{compiled} XLA traces/compilations ({counter.count() - before} with torch's)"))

    def head_hook(l0, h0, value):
        def hook(l, out):
            if l == l0:
                out = out.clone()
                out[:, h0] = value(out)
            return out
        return hook

    heads = [(l, h) for l in range(2) for h in range(4)]
    if only == "ablation":
        row("new zero-ablation over the batch",
            [lambda l=l, h=h: ablate(circuit, f"b{l}.a.head{h}") for l, h in heads],
            [lambda l=l, h=h: model.forward(clean, head_hook(l, h, lambda out: 0.0)) for l, h in heads])
        rows.append(("load average (1 min) after the row", f"{os.getloadavg()[0]:.1f}"))
        return rows
    row("new head patch over the batch",
        [lambda l=l, h=h: patch(circuit, f"b{l}.a.head{h}", {"toks_int_var": corrupt_sym}) for l, h in heads],
        [lambda l=l, h=h: model.forward(clean, head_hook(l, h, lambda out, l=l, h=h: corrupt_heads[l][:, h]))
         for l, h in heads])
    row("new zero-ablation over the batch",
        [lambda l=l, h=h: ablate(circuit, f"b{l}.a.head{h}") for l, h in heads],
        [lambda l=l, h=h: model.forward(clean, head_hook(l, h, lambda out: 0.0)) for l, h in heads])
    receivers = [(h, role) for h in range(4) for role in "qkv"]
    row("new path patch over the batch",
        [lambda h=h, r=r: path_patch(circuit, "b0.a.head2", f"b1.a.head{h}.a.{r}", {"toks_int_var": corrupt_sym})
         for h, r in receivers],
        [lambda h=h, r=r: model.path_patched(clean, corrupt_heads[0], 2, h, r) for h, r in receivers])
    def position_hook(l0, h0, p0):
        def hook(l, out):
            if l == l0:
                out = out.clone()
                out[:, h0, p0] = corrupt_heads[l][:, h0, p0]
            return out
        return hook

    cells = [(0, 1, 3), (1, 2, 7), (0, 3, 30), (1, 0, 12), (1, 3, 0), (0, 0, 20), (1, 1, 31), (0, 2, 15), (1, 2, 25)]
    row("new position patch over the batch, the first in the process",
        [lambda l=l, h=h, p=p: patch(circuit, f"b{l}.a.head{h}", {"toks_int_var": corrupt_sym}, positions=p)
         for l, h, p in cells[:1]],
        [lambda l=l, h=h, p=p: model.forward(clean, position_hook(l, h, p)) for l, h, p in cells[:1]])
    row("new position patch over the batch, after the first",
        [lambda l=l, h=h, p=p: patch(circuit, f"b{l}.a.head{h}", {"toks_int_var": corrupt_sym}, positions=p)
         for l, h, p in cells[1:]],
        [lambda l=l, h=h, p=p: model.forward(clean, position_hook(l, h, p)) for l, h, p in cells[1:]])

    # attribution of every head, the loss at one position (a new metric node: a new variant each)
    from circuits import Index
    from circuits.interp import attribute

    heads_named = [f"b{l}.a.head{h}" for l, h in heads]
    source = {"toks_int_var": corrupt}

    def attribution(position):
        est = attribute(circuit, heads_named, source, inputs={sym: clean},
                        metric=lambda c, p=position: Index(c, (p,)))
        return np.stack([est[n] for n in heads_named], 1)

    def torch_attribution(position):
        return model.attribution(clean, corrupt_heads, position).reshape(ROWS, -1).numpy()

    t_fb = np.median([timed(lambda: torch_attribution(31))[0] for _ in range(9)])
    mark = counter.count()
    dt, first = timed(lambda: attribution(31))
    kernels = C.backend.tiers.last_run()["kernels"]
    np.testing.assert_allclose(first, torch_attribution(31), rtol=1e-3, atol=1e-4)
    rows.append(("attribution of 8 heads over the batch, the first in the process",
                 f"{dt * 1e3:.0f} ms vs torch forward+backward {t_fb * 1e3:.2f} ms: ratio {dt / t_fb:.1f}; "
                 f"{kernels['compiled']} XLA compilations, {kernels['loaded']} executables loaded from disk "
                 f"({counter.count() - mark} traces/compilations)"))
    ours_t, theirs_t = [], []
    mark = counter.count()
    for position in (30, 27, 24, 20, 16, 11, 6, 1):
        dt, value = timed(lambda: attribution(position))
        dt_t, ref = timed(lambda: torch_attribution(position))
        np.testing.assert_allclose(value, ref, rtol=1e-3, atol=1e-4)
        ours_t.append(dt)
        theirs_t.append(dt_t)
    a, b = np.median(ours_t), np.median(theirs_t)
    rows.append(("attribution of 8 heads over the batch, a new variant after the first (8, median)",
                 f"{a * 1e3:.2f} ms vs torch forward+backward {b * 1e3:.2f} ms: ratio {a / b:.2f} (target <= 3); "
                 f"{counter.count() - mark} XLA traces/compilations (with torch's)"))
    del torch
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--here", action="store_true", help="run in this process only")
    parser.add_argument("--only", choices=["ablation"], help="with --here: the zero-ablation row alone")
    parser.add_argument("--under-load", action="store_true",
                        help="also the zero-ablation row while a second process runs the test suite")
    parser.add_argument("--quiet-rows", action=argparse.BooleanOptionalAction, default=True,
                        help="the rows without load first (--no-quiet-rows: only those under load)")
    args = parser.parse_args(argv)
    if args.here:
        report(f"dataset ({ROWS} prompts of {TOKENS} tokens, shipped induction model)", run_here(args.only))
        return
    labels = ("empty compilation cache", "warm compilation cache (the same folder again)")
    if args.quiet_rows:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=cache)
            for label in labels:
                print(f"== {label}", flush=True)
                subprocess.run([sys.executable, "-m", "benchmarks.bench_dataset", "--here"], env=env, check=True)
    if args.under_load:
        with tempfile.TemporaryDirectory() as cache, running_tests():
            env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=cache)
            for label in labels:
                print(f"== under load (the test suite running beside it), {label}", flush=True)
                subprocess.run([sys.executable, "-m", "benchmarks.bench_dataset", "--here", "--only", "ablation"],
                               env=env, check=True)


# Seconds the test suite runs before the rows under load start (past its start-up: collecting).
LOAD_SETTLE = 30.0


class running_tests:
    """A second process running the test suite (``pytest -n 2 -m "not slow" tests``, with a
    compilation cache of its own, its output dropped) for the length of a ``with`` block; it is
    stopped (its process group: pytest and its workers) at the end."""

    def __enter__(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.cache = tempfile.TemporaryDirectory()
        env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=self.cache.name, CIRCUITS_PROGRESS="0",
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-n", "2", "-m", "not slow",
                                      "-p", "no:cacheprovider", "tests"], cwd=root, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        print(f"(the test suite runs beside it: process {self.proc.pid}; rows start in {LOAD_SETTLE:.0f} s)",
              flush=True)
        time.sleep(LOAD_SETTLE)
        return self

    def __exit__(self, *exc):
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: pytest and its workers
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        else:
            print(f"(the test suite ended before the rows did: exit {self.proc.returncode})", flush=True)
        self.cache.cleanup()
        return False


if __name__ == "__main__":
    main()
