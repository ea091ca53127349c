"""The prepared accelerator script (``benchmarks.device_check``) runs, here on the CPU: its checks
pass, every part runs within its budget and reports, a missing module is named in one line before
anything runs, and its summary judges each ratio by the issue's target."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_first_calls, device_check

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_module_is_named_in_one_line_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr(device_check, "NEEDED", ("numpy", "no_such_module_here", "jax"))
    monkeypatch.setattr(device_check, "run_all", lambda args: pytest.fail("ran without its imports"))
    with pytest.raises(SystemExit) as stop:
        device_check.main([])
    message = str(stop.value.code)
    assert message.count("\n") == 0 and message.startswith("missing: no_such_module_here (ModuleNotFoundError")
    assert "numpy" not in message and "make device-wheels" in message


def test_printed_ratios_are_judged_by_the_targets_on_the_card():
    row = device_check._ratio_row(
        "latency", "  shipped: new zero-ablation (8 heads, median)   2.39 ms vs torch 1.33 ms: ratio 2.80 (target <= 4)")
    assert row[0] == "latency: shipped: new zero-ablation (8 heads, median)"
    assert row[2].startswith("NOT met") and "<= 2" in row[2]
    row = device_check._ratio_row("throughput", "  ratio one sequence compile / best hand (target <= 1.05)     1.093")
    assert row[1] == "1.093" and row[2].startswith("met") and "<= 1.2" in row[2]
    assert device_check._ratio_row("latency", "  shipped: new path patch   1.8 ms: ratio 0.79 (target <= 8)")[2] == ""


def test_the_first_calls_summary_reads_both_processes_rows():
    def sweep(seconds, compilations, loaded):
        return {"row": "sweep", "seconds": seconds, "baseline_s": 1.0, "ratio": seconds, "compilations": compilations,
                "compile_s": 0.5 * compilations, "compilations_all_threads": compilations, "loaded": loaded,
                "agrees": True}

    empty = [sweep(12.0, 11, 0), {"row": "attribution.second", "seconds": 0.05, "baseline_s": 0.02, "ratio": 2.5,
                                  "agrees": False}]
    warm = [sweep(1.5, 0, 90), {"row": "eap.third", "seconds": 0.01, "baseline_s": 0.006, "ratio": 1.67, "edges": 32491}]
    lines = {k: (v, verdict) for k, v, verdict in bench_first_calls.summary(empty, warm)}
    warm_sweep = lines["144-head sweep, first call, new process, warm cache"]
    assert "1.50x" in warm_sweep[0] and "90 kernels loaded" in warm_sweep[0] and warm_sweep[1] == "met (target <= 2)"
    empty_sweep = lines["144-head sweep, first call, new process, empty cache"][1]
    assert empty_sweep.startswith("NOT met (target <= 10)") and "compilations NOT met" in empty_sweep
    assert lines["attribution, second call on new data (empty cache process)"][1].startswith("NOT met")
    assert lines["EAP over 32491 edges, third call on new data (warm cache process)"][1] == "met (target <= 2)"
    assert lines["values disagree with torch (empty cache)"] == ("attribution.second", "BAD")


@pytest.mark.slow
def test_device_check_quick_passes_on_cpu():
    out = subprocess.run([sys.executable, "-m", "benchmarks.device_check", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("  ok ") == 13 and "BAD" not in out.stdout and "card: " in out.stdout
    (card,) = [json.loads(x[len(device_check.CARD):]) for x in out.stdout.splitlines() if x.startswith("CARD ")]
    assert card["platform"] == "cpu" and card["jax"] and card["torch"]


@pytest.mark.slow
def test_every_part_runs_on_cpu_on_small_models_within_the_budget(tmp_path):
    record = tmp_path / "record.json"
    out = subprocess.run([sys.executable, "-m", "benchmarks.device_check", "--small", "--json", str(record)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(record.read_text())
    assert {"checks", "first calls, empty cache", "first calls, warm cache", "latency", "throughput"} <= set(data["parts"])
    assert all(p["problem"] is None for p in data["parts"].values())
    assert [r["row"] for r in data["first_calls"]["warm"]] == [
        "setup", "clean", "sweep", "attribution.first", "attribution.second", "eap.first", "eap.second", "eap.third",
        "background"]
    summary = out.stdout[out.stdout.index("\nsummary ("):]
    for phrase in ("checks against the numpy oracle", "144-head sweep, first call, new process, warm cache",
                   "attribution, second call on new data", "third call on new data", "new zero-ablation",
                   "ratio one sequence compile / best hand", "ratio batch evaluate_batched / best hand"):
        assert phrase in summary


def test_a_part_out_of_time_is_reported_and_the_rest_still_run(capsys):
    run = device_check.Run(budget=5)
    assert run.part("first", 100, lambda s: pytest.fail("started with under 10 s left")) is None
    assert run.record["parts"]["first"] == "not run: out of time" and run.summary == [("first", "not run", "out of time")]
    run = device_check.Run(budget=60)
    assert run.part("failing", 30, lambda s: ("got", "exit status 1: boom")) == "got"
    assert run.summary == [("failing", "exit status 1: boom", "FAILED")] and run.record["parts"]["failing"]["problem"]
