"""benchmarks.run_all: finds every bench_*.py and rewrites only its own marked sections."""

from benchmarks import run_all


def test_discovers_every_benchmark_module():
    names = run_all.discover()
    assert "bench_cost" in names and "bench_seed_model" in names
    assert all(n.startswith("bench_") for n in names)


def test_sections_are_replaced_in_place_or_appended():
    text = "# Benchmarks\n\nhand-written notes\n"
    once = run_all.write_section(text, "bench_x", run_all.section("bench_x", "ratio 1.0\n", "2025-01-01", "m"))
    assert once.startswith(text.rstrip("\n")) and "<!-- bench:bench_x -->" in once and "ratio 1.0" in once
    twice = run_all.write_section(once + "\ntail notes\n", "bench_x",
                                  run_all.section("bench_x", "ratio 2.0\n", "2025-01-02", "m"))
    assert "ratio 2.0" in twice and "ratio 1.0" not in twice
    assert twice.count("<!-- bench:bench_x -->") == 1 and twice.endswith("tail notes\n")
    assert "hand-written notes" in twice and "`python -m benchmarks.bench_x` (m; 2025-01-02)" in twice


def test_regression_guard_compares_ratios_with_the_last_record():
    text = run_all.write_section("# Benchmarks\n", "bench_x", run_all.section(
        "bench_x", "title\n  ratio a / b (target <= 1.05)   0.970\n  ratio c / d  1.500\n  time  3.0 ms\n", "d", "m"))
    old = run_all.ratios(run_all.recorded(text, "bench_x"))
    assert old == {"ratio a / b (target <= 1.05)": 0.97, "ratio c / d": 1.5}
    new = run_all.ratios("title\n  ratio a / b (target <= 1.05)   1.200\n  ratio c / d  1.550\n")
    assert run_all.got_worse(old, new) == [("ratio a / b (target <= 1.05)", 0.97, 1.2)]
    assert run_all.got_worse(old, new, tolerance=0.5) == []
    assert run_all.recorded(text, "bench_y") == ""
