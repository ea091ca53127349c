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
