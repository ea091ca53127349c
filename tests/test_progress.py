"""circuits.progress: tqdm's bar when enabled, a silent bar with the same methods otherwise."""

import io
import sys

import pytest

from circuits.progress import SilentBar, progress


def test_disabled_is_silent_and_counts(capsys):
    bar = progress(range(5), desc="work", enabled=False)
    assert isinstance(bar, SilentBar)
    assert list(bar) == [0, 1, 2, 3, 4] and bar.n == 5
    bar.set_postfix(loss=1.0)
    bar.close()
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_manual_bar_updates_and_needs_no_iterable():
    with progress(total=10, enabled=False) as bar:
        bar.update(3)
        bar.update(4)
    assert bar.n == 7 and len(bar) == 10
    with pytest.raises(TypeError, match="update"):
        iter(bar).__next__()


def test_enabled_uses_tqdm_and_writes_the_bar():
    tqdm = pytest.importorskip("tqdm")
    stream = io.StringIO()
    with progress(total=4, desc="steps", enabled=True, file=stream, mininterval=0) as bar:
        for _ in range(4):
            bar.update(1)
    assert isinstance(bar, tqdm.tqdm)
    text = stream.getvalue()
    assert "steps" in text and "4/4" in text


def test_missing_tqdm_falls_back_to_silent(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # `from tqdm.auto import tqdm` raises ImportError
    bar = progress([1, 2], enabled=True)
    assert isinstance(bar, SilentBar) and list(bar) == [1, 2]


def test_default_is_silent_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(progress([1], enabled=None), SilentBar)


# ------------------------------------------------------------------ estimates from work done
from circuits.progress import Estimate  # noqa: E402


def _naive_remaining(steps, total):
    """What a rate of items over elapsed time (tqdm's, without smoothing) says is left."""
    n = sum(k for k, _ in steps)
    return (total - n) * sum(s for _, s in steps) / n


def test_a_slow_first_item_is_not_extrapolated_over_the_rest():
    # the first of 144 items compiles for 30 s (nothing measured it), the others take 10 ms each
    steps = [(1, 30.0)] + [(1, 0.01)] * 3
    estimate = Estimate(total=144)
    for n, seconds in steps:
        estimate.record(n, seconds)
    assert estimate.remaining() == pytest.approx(140 * 0.01)
    assert _naive_remaining(steps, 144) > 1000  # what the bar said before: about 17 minutes
    assert estimate.rate() == pytest.approx(100.0)


def test_measured_one_off_seconds_are_left_out_of_every_step():
    # each program's first chunk compiles (measured by the one-off clock): its run time alone counts
    estimate = Estimate(total=40)
    estimate.record(10, seconds=20.5, one_off=20.0)  # first chunk: 0.5 s of work
    assert estimate.remaining() == pytest.approx(30 * 0.05)  # while alone, the first step counts (less its compile)
    estimate.record(10, seconds=12.5, one_off=12.0)  # a second program compiles too
    estimate.record(10, seconds=0.5)
    assert estimate.remaining() == pytest.approx(10 * 0.05)


def test_costs_weigh_the_items():
    # 10 cheap items (cost 1) then 10 dear ones (cost 9): time left follows the cost, not the count
    estimate = Estimate(total=20, total_cost=10 * 1 + 10 * 9)
    estimate.record(1, seconds=5.0, cost=1)  # the first: one-off work
    estimate.record(9, seconds=0.9, cost=9)  # 0.1 s per unit of cost
    assert estimate.remaining() == pytest.approx(90 * 0.1)
    assert Estimate(total=20).remaining() is None  # nothing done: no estimate


def test_the_bar_shows_the_estimate(monkeypatch):
    pytest.importorskip("tqdm")
    import circuits.progress as progress_module

    clock = [0.0]
    monkeypatch.setattr(progress_module, "_now", lambda: clock[0])
    compiled = [0.0]
    stream = io.StringIO()
    bar = progress(total=100, enabled=True, file=stream, mininterval=0, one_off=lambda: compiled[0])
    clock[0] += 60.0
    compiled[0] += 59.0  # the first item: 59 s compiling, 1 s running
    bar.update(1)
    for _ in range(9):
        clock[0] += 0.001
        bar.update(1)
    left = (bar.total - bar.n) / bar.format_dict["rate"]
    assert left == pytest.approx(90 * 0.001)
    bar.close()
    assert "10/100" in stream.getvalue()
