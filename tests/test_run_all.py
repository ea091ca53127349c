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
