"""The TransformerLens / auto-circuit side-by-side benchmarks (``benchmarks/bench_autocircuit``,
``benchmarks/bench_latency_tl``) run in their own environment; here: that they say so and are
skipped where it is missing, and auto-circuit's edge names map onto ours."""

import importlib.util
import subprocess
import sys
import types

import numpy as np
import pytest

from benchmarks import run_all, tl_models
from benchmarks.bench_autocircuit import ac_name, prompts


def test_a_missing_package_exits_skipped_with_the_recipe(capsys):
    with pytest.raises(SystemExit) as e:
        tl_models.require("numpy", "no_such_package_for_the_side_by_side")
    assert e.value.code == tl_models.SKIPPED == run_all.SKIPPED
    err = capsys.readouterr().err
    assert "no_such_package_for_the_side_by_side" in err and "python3.11 -m venv /work/ac-env" in err
    assert "auto-circuit==1.0.1 --no-deps" in err


def test_run_all_skips_a_benchmark_that_needs_another_environment(tmp_path, monkeypatch, capsys):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n")
    monkeypatch.setattr(run_all, "BENCHMARKS_MD", md)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: types.SimpleNamespace(returncode=77, stdout=""))
    run_all.main(["bench_autocircuit"])  # no SystemExit: skipped is not failed
    assert "skipped benchmarks.bench_autocircuit" in capsys.readouterr().out
    assert md.read_text() == "# Benchmarks\n"


@pytest.mark.skipif(importlib.util.find_spec("transformer_lens") is not None,
                    reason="TransformerLens is installed here: the benchmarks would run")
def test_the_benchmarks_exit_skipped_in_the_project_environment():
    for name in ("bench_autocircuit", "bench_latency_tl", "bench_gpt2_first"):
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}"], capture_output=True, text=True)
        assert proc.returncode == 77, proc.stderr
        assert f"-m benchmarks.{name}" in proc.stderr


def test_auto_circuit_edge_names_map_onto_ours():
    assert ac_name("Resid Start->A0.1.Q") == "embeds -> b0.a.head1.a.q"
    assert ac_name("A0.2->A1.0.K") == "b0.a.head2 -> b1.a.head0.a.k"
    assert ac_name("A1.3->Resid End") == "b1.a.head3 -> output"
    assert ac_name("A0.0->A1.3.V") == "b0.a.head0 -> b1.a.head3.a.v"


def test_corrupted_prompts_keep_the_repeat_and_change_the_first_half():
    clean, corrupt = prompts(3)
    assert clean.shape == corrupt.shape == (3, 34)
    assert (clean[:, 1:17] == clean[:, 17:33]).all() and (corrupt[:, 17:] == clean[:, 17:]).all()
    assert (corrupt[:, 1:17] != clean[:, 1:17]).any(axis=1).all() and np.array_equal(corrupt[:, 0], clean[:, 0])
