"""Every notebook in notebooks/ runs top to bottom without an error (executed with a real kernel),
shows what its stored outputs show (``notebooks/execute.py``: text compared once timings, memory
and addresses are masked, numbers to 1e-5 relative or one unit of their last printed digit; images
not compared byte for byte), and every plot it draws has a title, axis labels and a legend."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Notebooks that must show a plot (an image output: no Agg backend hiding it) and the token-level
# attention view.
PLOTS = {"02_induction.ipynb", "03_features.ipynb", "04_discovery.ipynb", "05_exploratory_analysis.ipynb"}
ATTENTION_VIEWS = {"02_induction.ipynb"}


def _runner():
    spec = importlib.util.spec_from_file_location("notebooks_execute", ROOT / "notebooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_shows_its_stored_outputs(path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    run = _runner()
    stored = nbformat.read(path, as_version=4)
    nb, plot_problems = run.execute(path)
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html = [o for o in outputs if "text/html" in o.get("data", {})]
    assert html, "the circuit's notebook view (_repr_html_) did not render"
    if path.name in PLOTS:
        assert [o for o in outputs if "image/png" in o.get("data", {})], "the notebook's plot did not show"
    if path.name in ATTENTION_VIEWS:
        assert any("circuits-attn" in o["data"]["text/html"] for o in html), "no attention view rendered"
    assert not plot_problems, plot_problems
    # the repository keeps the outputs (make notebooks), and they are what the notebook shows now
    code = [c for c in stored.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), f"{path.name} is stored without its outputs: run make notebooks"
    assert not run.differences(stored, nb), run.differences(stored, nb)


def test_output_comparison_masks_timings_and_allows_rounding():
    run = _runner()
    assert run.same_text("took 12.3 ms, 4.1 MiB at 0x7f00aa", "took 9.1 ms, 3.9 MiB at 0x7f11bb") is None
    assert run.same_text("loss 0.221", "loss 0.222") is None               # one unit of the last digit
    assert run.same_text("loss 0.221", "loss 0.223") is not None
    assert run.same_text("3.2903142", "3.2903150") is None                 # within 1e-5 relative
    assert run.same_text("3.2903142e+01", "3.2913142e+01") is not None
    assert run.same_text("b0.a.head2 kept", "b0.a.head3 kept") is not None  # names are not numbers to round
    assert run.same_text("['a', 'b']", "['a', 'c']") is not None
    assert run.same_text("error 8.9e-16", "error 3.4e-15") is None       # float64 residues, not results
    assert run.same_text("error 8.9e-10", "error 3.4e-9") is not None


def test_there_is_a_notebook():
    assert NOTEBOOKS
