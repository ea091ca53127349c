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
