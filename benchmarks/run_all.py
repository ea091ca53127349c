"""Run every benchmark, one fresh process each (so one benchmark's caches and garbage do not
colour the next).  ``make bench`` or ``python -m benchmarks.run_all [name ...]``."""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = [
    "bench_build", "bench_text", "bench_lowering", "bench_seed_model", "bench_optimize",
    "bench_rewrites", "bench_files", "bench_torch_import",
]


def main(argv=None):
    names = (argv if argv is not None else sys.argv[1:]) or BENCHMARKS
    failed = []
    for name in names:
        print(f"\n=== benchmarks.{name}", flush=True)
        if subprocess.call([sys.executable, "-m", f"benchmarks.{name}"]) != 0:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
