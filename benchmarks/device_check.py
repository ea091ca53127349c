"""One prepared script for a session lent a GPU machine (issue 40): every GPU check and benchmark
in one command of at most 6 minutes, imports and warm-ups included, so that a failed run can be
repeated once inside the session's 15 minutes of device time.

    python3 -m benchmarks.device_check                 # everything, within --budget seconds (330)
    python3 -m benchmarks.device_check --quick         # the checks only (in this process)
    python3 -m benchmarks.device_check --small         # everything on small models (a CPU smoke test)
    python3 -m benchmarks.device_check --more          # then the older benchmarks too (heads, sharding, ...)

The GPU machine has no network: the script first imports what it needs and names, in one line,
whatever is missing or broken (carry those as wheels: ``make device-wheels``, BENCHMARKS.md).  The
parent process never starts JAX's GPU backend (JAX takes most of the card's memory when it does):
each part runs in a process of its own, under a share of the time budget, and a part that fails
or runs out of time is reported while the others still run.  In order:

1. **checks** (``--checks``): evaluation on the card against the plain-numpy oracle, at JAX's
   default matmul precision and at ``highest``: JAX multiplies float32 matrices in TF32 on recent
   NVIDIA GPUs by default (about 1e-3 relative error on the seed model), so the default-precision
   checks use a tolerance for that, and ``highest`` is held to full float32 accuracy.  Checked:
   the seed model's loss through ``evaluate`` (heads batched, the default), head by head,
   ``compile``, ``rewrites.optimize``, ``evaluate_batched`` over all devices (data parallel),
   ``compile`` with the attention weights split over a mesh (tensor parallel), and float64.  It
   records the card: its kind, compute capability, driver, and the versions of jax and torch.
2. **first calls** (``bench_first_calls``): GPT-2 small's 144-head sweep, attribution (first and
   second call) and EAP (third call) in a new process with an empty compilation cache, then in a
   new process on the cache the first left; compilations counted; against a torch hook loop,
   torch forward+backward and a hand-written ``jax.jit`` forward+backward on the same card (both
   sides at full float32: ``JAX_DEFAULT_MATMUL_PRECISION=highest``, torch's default).
3. **autotune** (a GPU only): the empty-cache sweep again with ``--xla_gpu_autotune_level=0``: how
   much of a kernel's compilation is XLA's GEMM autotuning.
4. **latency** (``bench_latency --quick``): a new ablation and a new path patch on the shipped
   model, first of their kind, against torch eager on the card.
5. **throughput** (``bench_throughput``): one sequence and a batch of 16 against the best
   hand-written JAX (default precision on both sides).
6. ``--more``: ``bench_call_overhead``, ``bench_seed_model``, ``bench_optimize``, ``bench_heads``,
   ``bench_sharding``.

At the end a summary prints each figure as a ratio against its baseline on the same card, with
issue 40's target where it sets one, and ``--json`` (default ``$OUT/device_check.json`` where
``OUT`` is set) keeps every row.  The same script runs on a CPU, which is how it is tested
(``tests/test_device_check.py``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

# What the checks and benchmarks import: the library's own dependencies and the baselines'.
NEEDED = ("numpy", "jax", "jaxlib", "sympy", "attrs", "hypothesis", "opt_einsum", "safetensors", "blake3",
          "platformdirs", "tqdm", "torch", "transformers", "circuits", "rewrites")
CARD = "CARD "  # the checks' line recording the card: CARD {json}
# Issue 40's targets on the card for rows of bench_latency and bench_throughput (their own printed
# targets are the CPU's): a phrase of the row's label -> the ratio it must not exceed.
GPU_TARGETS = {"new zero-ablation": 2.0, "one sequence compile / best hand": 1.2,
               "batch evaluate_batched / best hand": 1.05}
BUDGET = 330.0  # seconds: the whole run, imports and warm-ups included (issue 40: at most 6 minutes)


def preflight() -> list[str]:
    """The modules of ``NEEDED`` that cannot be imported, each with why (imports only: no
    backend is started)."""
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a broken install is as missing as an absent one
            missing.append(f"{name} ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})")
    return missing


def card() -> dict:
    """The card this process computes on, as the record keeps it."""
    import jax
    import jaxlib

    from circuits.backend.cache.executables import device_identity

    platform, version, kind, count, capability, driver = device_identity()
    record = {"card": kind, "platform": platform, "platform_version": version, "devices": count,
              "compute_capability": capability, "driver": driver, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
              "python": sys.version.split()[0]}
    try:
        import torch

        record["torch"] = torch.__version__
        record["torch_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        pass
    return record


def checks() -> list[str]:
    """Evaluation on this process's device against the numpy oracle; the failed checks' labels."""
    import jax

    import circuits as C
    from circuits.models import attn_only, random_weights, tokens_symbol

    from .numpy_attn_only import forward

    dev = jax.devices()[0]
    print(f"card: {dev.device_kind} ({dev.platform}; {len(jax.devices())} device(s): {jax.devices()})", flush=True)
    print(CARD + json.dumps(card()), flush=True)
    w = random_weights(0)
    toks = np.random.default_rng(0).integers(0, 50259, 302)
    want = forward(w, toks)
    circuit = attn_only(w, toks)
    failures = []

    def check(label, got, tol):
        err = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
        ok = np.isfinite(got).all() and err <= tol
        print(f"  {'ok ' if ok else 'BAD'} {label:<62} max rel error {err:.2e} (tolerance {tol:.0e})", flush=True)
        if not ok:
            failures.append(label)

    from jax.sharding import PartitionSpec as P

    import rewrites

    from .bench_sharding import HEAD_WEIGHTS, mesh_devices

    sym = attn_only(w, tokens_symbol(302))
    batch = np.stack([toks, toks[::-1]])
    mesh = mesh_devices()
    t = time.perf_counter()
    optimized = rewrites.optimize(circuit)
    compiled = C.compile(circuit)
    sharded = C.compile(circuit, mesh=mesh, shard={HEAD_WEIGHTS: P("model")})
    # (label, function giving the loss of the token row `toks`)
    cases = [
        ("evaluate, heads batched", lambda: C.evaluate(circuit)),
        ("evaluate, head by head", lambda: C.evaluate(circuit, batch_heads=False)),
        ("compile", compiled),
        ("rewrites.optimize", lambda: C.evaluate(optimized)),
        (f"evaluate_batched over {len(jax.devices())} device(s) (row 0)",
         lambda: C.evaluate_batched(sym, {"toks_int_var": batch}, devices="all")[0]),
        (f"compile, heads sharded over {len(mesh)} device(s)",
         sharded),
    ]
    for label, fn in cases:
        check(f"{label}, default precision", fn(), 5e-3)
        with jax.default_matmul_precision("highest"):
            check(f"{label}, highest precision", fn(), 1e-4)
    check("evaluate, float64", C.evaluate(circuit, dtype="float64"), 1e-9)
    print(f"checks took {time.perf_counter() - t:.1f} s", flush=True)

    return failures


def more_benchmarks(small: bool, heads: tuple) -> None:
    """The older benchmarks (``--more``), in this process."""
    from . import (
        bench_call_overhead,
        bench_heads,
        bench_optimize,
        bench_seed_model,
        bench_sharding,
        bench_throughput,
    )

    small = dict(runs=2, positions=30) if small else {}
    heads_small = dict(d_model=64, n_heads=4, head_size=16, vocab=1000) if small else {}
    for name, run in [("bench_throughput", lambda: bench_throughput.main(
                          runs=2, batch=4, batch_runs=1, chunk_sizes=(1, 4), positions=30, vocab=1000)
                          if small else bench_throughput.main(runs=10, batch=16, batch_runs=5)),
                      ("bench_call_overhead", lambda: bench_call_overhead.main(runs=2, calls=10, launches_too=False)
                          if small else bench_call_overhead.main(launches_too=False)),
                      ("bench_seed_model", lambda: bench_seed_model.main(runs=2, batch=4) if small else bench_seed_model.main()),
                      ("bench_optimize", lambda: bench_optimize.main(**small)),
                      ("bench_heads", lambda: bench_heads.main(tuple(heads), **small, **heads_small)),
                      ("bench_sharding", lambda: bench_sharding.main(**small, batch=4 if small else 32))]:
        t = time.perf_counter()
        print(f"\n=== benchmarks.{name}", flush=True)
        run()
        print(f"({name} took {time.perf_counter() - t:.1f} s)", flush=True)


class Run:
    """The parts run so far, their rows and problems, against one deadline."""

    def __init__(self, budget: float):
        self.deadline = time.monotonic() + budget
        self.record: dict = {"parts": {}}
        self.summary: list[tuple[str, str, str]] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def part(self, name: str, cap: float, run) -> object:
        """Run ``run(seconds)`` (a part, given at most ``cap`` seconds of what is left) and keep
        its problem; a part with under 10 s left is not started."""
        seconds = min(cap, self.left())
        print(f"\n=== {name} (at most {seconds:.0f} s)", flush=True)
        if seconds < 10:
            self.record["parts"][name] = "not run: out of time"
            self.summary.append((name, "not run", "out of time"))
            print("  not run: out of time", flush=True)
            return None
        t = time.monotonic()
        out, problem = run(seconds)
        self.record["parts"][name] = {"seconds": round(time.monotonic() - t, 1), "problem": problem}
        if problem:
            print(f"  {name}: {problem}", flush=True)
            self.summary.append((name, problem, "FAILED"))
        return out


def _ratio_row(label: str, line: str) -> tuple[str, str, str]:
    """A benchmark's printed ratio row as a summary row, judged by issue 40's target on the card
    where it sets one (``GPU_TARGETS``)."""
    parts = line.strip().split("  ")
    name, value = parts[0], parts[-1].strip()
    found = re.findall(r"(?:ratio )?([0-9]+\.[0-9]+)\s*(?:\(|$)", value)
    verdict = ""
    for phrase, target in GPU_TARGETS.items():
        if phrase in name and found:
            ratio = float(found[0])
            verdict = f"{'met' if ratio <= target else 'NOT met'} (issue 40's target on the card: <= {target:g})"
    return f"{label}: {name}", value, verdict


def _module(name: str, *args) -> list[str]:
    return [sys.executable, "-m", f"benchmarks.{name}", *args]


def run_all(args) -> int:
    from . import bench_first_calls
    from .common import report, stream

    run = Run(args.budget)
    gpu = []

    def checks_part(seconds):
        lines, problem = stream(_module("device_check", "--checks", "--child"), seconds)
        for line in lines:
            if line.startswith(CARD):
                run.record["card"] = json.loads(line[len(CARD):])
                gpu.append(run.record["card"]["platform"] not in ("cpu",))
        ok, bad = sum(" ok " in x for x in lines), [x for x in lines if "BAD" in x]
        run.summary.append(("checks against the numpy oracle", f"{ok} ok, {len(bad)} failed",
                            "met" if ok and not bad and not problem else "BAD"))
        return lines, problem

    run.part("checks", 90, checks_part)
    with tempfile.TemporaryDirectory() as cache:
        rows = {}
        for which, cap in (("empty", 170), ("warm", 90)):
            def first_part(seconds, which=which):
                got, problem = bench_first_calls.run_child(args.small, cache, seconds)
                rows[which] = got
                return got, problem

            run.part(f"first calls, {which} cache", cap, first_part)
        run.record["first_calls"] = rows
        run.summary += bench_first_calls.summary(rows.get("empty", []), rows.get("warm", []))

    if (gpu and gpu[0]) or args.autotune:
        def autotune_part(seconds):
            with tempfile.TemporaryDirectory() as fresh:
                flags = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()
                got, problem = bench_first_calls.run_child(args.small, fresh, seconds, rows=("sweep",),
                                                           env={"XLA_FLAGS": flags})
            run.record["autotune_level_0"] = got
            default = {r["row"]: r for r in run.record["first_calls"].get("empty", [])}.get("sweep")
            mine = {r["row"]: r for r in got}.get("sweep")
            if default and mine:
                per = [r["compile_s"] / max(1, r["compilations"]) for r in (default, mine)]
                run.summary.append(("sweep, empty cache, XLA autotuning off (level 0)",
                                    f"{mine['seconds']:.1f} s ({mine['compilations']} compilations, {per[1]:.2f} s each) "
                                    f"against {default['seconds']:.1f} s ({per[0]:.2f} s each) at the default level",
                                    "recorded"))
            return got, problem

        run.part("autotune", 70, autotune_part)

    def ratio_lines(label):
        def part(seconds, cmd, env=None):
            lines, problem = stream(cmd, seconds, env)
            run.record[label] = lines
            run.summary += [_ratio_row(label, x) for x in lines if "ratio" in x and "target" in x]
            return lines, problem
        return part

    latency = ratio_lines("latency")
    run.part("latency", 60, lambda s: latency(s, _module("bench_latency", "--quick")))
    throughput = ratio_lines("throughput")
    small = ["-c", "from benchmarks import bench_throughput as b; b.main(runs=2, batch=4, batch_runs=1, "
                   "chunk_sizes=(1, 4), positions=30, vocab=1000)"]
    run.part("throughput", 90, lambda s: throughput(
        s, [sys.executable, *small] if args.small else _module("bench_throughput", "--runs", "10", "--batch", "16",
                                                              "--batch-runs", "5")))
    if args.more:
        run.part("more", run.left(), lambda s: stream(
            _module("device_check", "--more-only", "--child", *(["--small"] if args.small else []), "--heads",
                    *map(str, args.heads)), s))
    print()
    card_line = run.record.get("card", {})
    report(f"summary ({card_line.get('card', 'card unknown')}, driver {card_line.get('driver') or 'unknown'}, "
           f"jax {card_line.get('jax', '?')}; {args.budget - run.left():.0f} s of {args.budget:.0f})",
           [(k, f"{v}  [{verdict}]" if verdict else v) for k, v, verdict in run.summary])
    out = args.json or (os.path.join(os.environ["OUT"], "device_check.json") if os.environ.get("OUT") else None)
    if out:
        run.record["summary"] = run.summary
        with open(out, "w") as f:
            json.dump(run.record, f, indent=1)
        print(f"(every row in {out})")
    failed = [k for k, _, verdict in run.summary if verdict in ("BAD", "FAILED")]
    return 1 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", "--checks", dest="checks", action="store_true",
                        help="the checks only, in this process")
    parser.add_argument("--more", action="store_true", help="then the older benchmarks (heads, sharding, ...)")
    parser.add_argument("--more-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the parent checked the imports
    parser.add_argument("--heads", type=int, nargs="+", default=[2, 6, 12, 24],
                        help="layers of the head-batching benchmark's models (--more; default 2 6 12 24)")
    parser.add_argument("--small", action="store_true",
                        help="small models with few runs: a smoke test of this script on a CPU")
    parser.add_argument("--autotune", action="store_true",
                        help="the autotuning-off sweep on a CPU too (it runs on a GPU anyway): a test of the part")
    parser.add_argument("--budget", type=float, default=BUDGET, help=f"seconds for everything (default {BUDGET:g})")
    parser.add_argument("--json", help="where to keep every row (default $OUT/device_check.json where OUT is set)")
    args = parser.parse_args(argv)
    if not args.child:
        t = time.perf_counter()
        missing = preflight()
        if missing:
            sys.exit(f"missing: {'; '.join(missing)}: carry them as wheels (make device-wheels; BENCHMARKS.md)")
        print(f"imports: all found ({time.perf_counter() - t:.1f} s)", flush=True)
    if args.more_only:
        more_benchmarks(args.small, tuple(args.heads))
        return
    if args.checks:
        failures = checks()
        if failures:
            sys.exit(f"failed: {', '.join(failures)}")
        return
    sys.exit(run_all(args))


if __name__ == "__main__":
    main()
