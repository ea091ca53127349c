"""Every notebook in notebooks/ runs top to bottom without an error (executed with a real kernel)."""

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
# Notebooks that must show a plot (an image output: no Agg backend hiding it) and the token-level
# attention view.
PLOTS = {"02_induction.ipynb", "03_features.ipynb"}
ATTENTION_VIEWS = {"02_induction.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html = [o for o in outputs if "text/html" in o.get("data", {})]
    assert html, "the circuit's notebook view (_repr_html_) did not render"
    if path.name in PLOTS:
        assert [o for o in outputs if "image/png" in o.get("data", {})], "the notebook's plot did not show"
    if path.name in ATTENTION_VIEWS:
        assert any("circuits-attn" in o["data"]["text/html"] for o in html), "no attention view rendered"


def test_there_is_a_notebook():
    assert NOTEBOOKS
