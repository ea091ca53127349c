"""Shared timing helpers for the benchmarks: medians of repeated runs after warm-up, and ratios
against a hand-written baseline measured in the same process (absolute times are not comparable
between machines or runs)."""

from __future__ import annotations

import statistics
import threading
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


def interleaved_times(fns: dict, *, runs: int = 20, warmup: int = 2, calls: int = 1, block=None,
                      cpu: bool = False):
    """``{name: [seconds per call, one block of calls a run]}`` for each of ``fns``: every
    function's block of ``calls`` calls once a run, ``runs`` runs interleaved so drift in machine
    load hits all alike, after ``warmup`` calls each.  ``block(result)`` waits for a result inside
    the timing (``jax.block_until_ready``: JAX dispatches asynchronously).  ``cpu=True``: also the
    process CPU time (all threads), as a second dict: on a shared machine other processes' load
    stretches wall time but barely moves the work done."""
    wait = block if block is not None else (lambda result: result)
    for fn in fns.values():
        for _ in range(warmup):
            wait(fn())
    wall = {k: [] for k in fns}
    used = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            for _ in range(calls):
                wait(fn())
            wall[k].append((time.perf_counter() - t) / calls)
            used[k].append((time.process_time() - c) / calls)
    return (wall, used) if cpu else wall


def medians_of(times: dict) -> dict:
    return {k: statistics.median(v) for k, v in times.items()}


def interleaved_medians(fns: dict, *, runs: int = 20, warmup: int = 2, block=None) -> dict:
    """Median time of each function, runs interleaved so drift in machine load hits all alike
    (``interleaved_times``)."""
    return medians_of(interleaved_times(fns, runs=runs, warmup=warmup, block=block))


def fastest_torch_threads(run, counts, *, runs: int = 15) -> tuple[int, dict]:
    """``(n, medians)``: of torch's intra-op thread ``counts``, the one under which ``run()`` is
    fastest (medians of interleaved runs, in seconds by count), and torch left set to it: the
    baseline at its best on this machine.  More threads are taken only where they are faster by
    over 5%: a small model runs as fast on one thread, and on a machine with few cores torch's
    OpenMP workers spin after each parallel region, taking a core from whatever runs next in
    the same process (the side compared with)."""
    import torch

    counts = sorted(set(counts))
    fns = {}
    for n in counts:
        def timed(n=n):
            torch.set_num_threads(n)
            run()
        fns[n] = timed
    medians = interleaved_medians(fns, runs=runs)
    best = counts[0]
    for n in counts[1:]:
        if medians[n] < 0.95 * medians[best]:
            best = n
    torch.set_num_threads(best)
    return best, medians


def report(title: str, rows: list[tuple[str, str]]) -> None:
    print(title)
    width = max((len(k) for k, _ in rows), default=0)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def agreement_tolerance() -> float:
    """Tolerance for the benchmarks' sanity checks (circuit vs hand-written, both float32): 1e-4 on
    the CPU; on a GPU both sides multiply in TF32 by default, in differently ordered contractions,
    so they agree to about 1e-3 relative (BENCHMARKS.md; ``device_check`` verifies full precision
    separately)."""
    import jax

    return 1e-4 if jax.default_backend() == "cpu" else 5e-3


class CompileClock:
    """Seconds JAX spent tracing, lowering and compiling (XLA's backend compile), summed from
    ``jax.monitoring``'s duration events since this clock was made: ``clock.read()`` gives
    ``{'trace': s, 'lower': s, 'compile': s, 'compiles': n}``, to split a first call's time into
    compilation and the rest."""

    EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
              "/jax/core/compile/backend_compile_duration": "compile"}

    def __init__(self):
        import jax

        self.totals = {"trace": 0.0, "lower": 0.0, "compile": 0.0, "compiles": 0}
        self._live = True

        def listen(event, duration, **_):
            part = self.EVENTS.get(event)
            if part is not None and self._live:
                self.totals[part] += duration
                self.totals["compiles"] += part == "compile"

        jax.monitoring.register_event_duration_secs_listener(listen)

    def read(self) -> dict:
        return dict(self.totals)

    def since(self, before: dict) -> str:
        now = self.read()
        return (f"{now['compiles'] - before['compiles']} XLA compiles: {now['compile'] - before['compile']:.2f} s "
                f"compiling, {now['trace'] - before['trace'] + now['lower'] - before['lower']:.2f} s tracing and lowering")


class XlaCounter:
    """Traces and XLA compilations JAX made (``jax.monitoring``): ``count()`` those of the calling
    thread, ``counts()`` (this thread's, every thread's)."""

    EVENTS = ("/jax/core/compile/backend_compile_duration", "/jax/core/compile/jaxpr_trace_duration")

    def __init__(self):
        import jax

        self.seen = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, duration, **_: self.seen.append(threading.get_ident()) if event in self.EVENTS else None)

    def count(self) -> int:
        me = threading.get_ident()
        return sum(1 for t in self.seen if t == me)

    def counts(self) -> tuple[int, int]:
        return self.count(), len(self.seen)


def timed(fn):
    """``(seconds, fn())``."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def stream(cmd: list[str], timeout: float, env: dict | None = None, on_line=print) -> tuple[list[str], str | None]:
    """Run ``cmd`` (from the repository's root) for at most ``timeout`` seconds, passing each line
    of its output (stdout and stderr together) to ``on_line`` as it comes: ``(lines, problem)``,
    ``problem`` None when it exited 0, else why it did not (killed at the time limit, or its exit
    status and last lines).  What it printed before a failure is kept."""
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environ = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen(cmd, cwd=root, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            on_line(lines[-1])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(5)
        return lines, f"stopped at its time limit ({timeout:.0f} s)"
    reader.join(5)
    if proc.returncode != 0:
        return lines, f"exit status {proc.returncode}: " + " | ".join(lines[-4:])
    return lines, None
