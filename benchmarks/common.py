"""Shared timing helpers for the benchmarks: medians of repeated runs after warm-up, and ratios
against a hand-written baseline measured in the same process (absolute times are not comparable
between machines or runs)."""

from __future__ import annotations

import statistics
import time


def median_time(fn, *, runs: int = 20, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved_medians(fns: dict, *, runs: int = 20, warmup: int = 2) -> dict:
    """Median time of each function, runs interleaved so drift in machine load hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def report(title: str, rows: list[tuple[str, str]]) -> None:
    print(title)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def agreement_tolerance() -> float:
    """Tolerance for the benchmarks' sanity checks (circuit vs hand-written, both float32): 1e-4 on
    the CPU; on a GPU both sides multiply in TF32 by default, in differently ordered contractions,
    so they agree to about 1e-3 relative (BENCHMARKS.md; ``device_check`` verifies full precision
    separately)."""
    import jax

    return 1e-4 if jax.default_backend() == "cpu" else 5e-3
