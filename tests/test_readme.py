"""The README's tour runs as written."""

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tour_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no python example"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    # the tour saved and reloaded its circuit
    assert os.path.exists(tmp_path / "model.circuit")
    assert namespace["same"] == namespace["loss"]
    assert namespace["fast"].shape == namespace["loss"].shape
