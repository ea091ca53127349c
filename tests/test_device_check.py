"""The prepared accelerator script runs (here on the CPU) and its checks pass."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_device_check_quick_passes_on_cpu():
    out = subprocess.run([sys.executable, "-m", "benchmarks.device_check", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("  ok ") == 13 and "BAD" not in out.stdout and "card: " in out.stdout


@pytest.mark.slow
def test_device_check_benchmarks_run_on_cpu_on_small_models():
    out = subprocess.run([sys.executable, "-m", "benchmarks.device_check", "--small", "--heads", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("bench_throughput", "bench_seed_model", "bench_optimize", "bench_heads", "bench_sharding"):
        assert f"=== benchmarks.{name}" in out.stdout and f"({name} took " in out.stdout
    assert " 1 layers, first call: circuit / hand" in out.stdout and "tensor parallel over " in out.stdout
