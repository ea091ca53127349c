"""Run the notebooks headless and keep their outputs: ``make notebooks`` (or
``python notebooks/execute.py [names]``) executes each notebook top to bottom with a real kernel
and writes it back with its outputs; ``tests/test_notebooks.py`` runs them again and compares.

Outputs are compared as text once timings, memory figures and object addresses are masked
(``masked``); numbers agree to 1e-5 relative, or within one unit of their last printed digit (a
rounding flip; numbers both under 1e-12 agree); images are not compared, only that a cell still shows one. While a notebook
runs, every figure drawn is checked for a title, both axis labels and a legend (a colorbar counts
for an image): ``plot_problems`` lists what is missing.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))

# Prepended while a notebook runs (and removed before it is saved): every figure is checked when
# it is drawn for display.
_CHECK_PLOTS = r'''
import matplotlib.backend_bases as _bb
_plot_problems = []
_print_figure = _bb.FigureCanvasBase.print_figure
def _check_figure(self, *args, **kwargs):
    fig = self.figure
    def fig_text(name):
        t = getattr(fig, name, None)
        return t.get_text() if t is not None else ""
    colorbar = any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>" or not ax.get_visible():
            continue
        checks = [("title", ax.get_title() or fig_text("_suptitle")),
                  ("x label", ax.get_xlabel() or fig_text("_supxlabel")),
                  ("y label", ax.get_ylabel() or fig_text("_supylabel")),
                  ("legend", ax.get_legend() is not None or fig.legends or colorbar)]
        missing = [what for what, ok in checks if not ok]
        if missing:
            _plot_problems.append(f"{ax.get_title() or fig_text('_suptitle') or 'a plot'!r}: no {', '.join(missing)}")
    return _print_figure(self, *args, **kwargs)
_bb.FigureCanvasBase.print_figure = _check_figure
'''
_REPORT = "print('PLOT PROBLEMS:', _plot_problems)"

_MASKS = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ns|µs|us|ms)\b"), "<time>"),
    (re.compile(r"(?<![\w.])\d+\.\d+\s?s\b|(?<![\w.])\d+\s(?:s|sec|seconds|min|minutes)\b"), "<time>"),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:B|KiB|MiB|GiB|kB|KB|MB|GB)\b"), "<bytes>"),
    (re.compile(r"\d+(?:\.\d+)?\s?(?:it/s|s/it)"), "<rate>"),
]
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w])")


def masked(text: str) -> str:
    """``text`` with timings, memory figures and addresses replaced by placeholders."""
    for pattern, placeholder in _MASKS:
        text = pattern.sub(placeholder, text)
    return text


def _unit(token: str) -> float:
    """One unit of the last printed digit of a number as written."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def same_text(stored: str, fresh: str, rtol: float = 1e-5, atol: float = 1e-12) -> str | None:
    """None if the two texts agree (masked; numbers within ``rtol`` or one unit of their last
    printed digit; two numbers both under ``atol`` in size, float64 rounding residues such as a
    reconstruction's 1e-15 error, agree), else a description of the first difference."""
    a, b = masked(stored), masked(fresh)
    pa, pb = _NUMBER.split(a), _NUMBER.split(b)
    na, nb = _NUMBER.findall(a), _NUMBER.findall(b)
    if pa != pb or len(na) != len(nb):
        for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
            if _NUMBER.sub("#", x) != _NUMBER.sub("#", y):
                return f"line {i + 1}: stored {x!r}, now {y!r}"
        return f"the text differs in length: stored {len(a.splitlines())} lines, now {len(b.splitlines())}"
    for x, y in zip(na, nb):
        fx, fy = float(x), float(y)
        if abs(fx - fy) > max(rtol * max(abs(fx), abs(fy)), _unit(x) * 1.0001, _unit(y) * 1.0001, 2 * atol):
            return f"number {x} stored, {y} now"
    return None


def outputs(cell) -> list[tuple[str, str]]:
    """What a code cell shows, as (kind, text): stdout, text/plain of results and displays, and
    the kinds of rich output (html, image) by name alone; stderr (warnings, progress) left out."""
    shown = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream" and o["name"] == "stdout":
            if shown and shown[-1][0] == "stdout":
                shown[-1] = ("stdout", shown[-1][1] + o["text"])
            else:
                shown.append(("stdout", o["text"]))
        elif o["output_type"] in ("execute_result", "display_data"):
            data = o.get("data", {})
            for kind in sorted(k for k in data if k not in ("text/plain",)):
                shown.append((kind, ""))
            if "text/plain" in data and not any(k.startswith("image/") for k in data):
                shown.append(("text/plain", data["text/plain"]))
        elif o["output_type"] == "error":
            shown.append(("error", f"{o['ename']}: {o['evalue']}"))
    return shown


def differences(stored_nb, fresh_nb) -> list[str]:
    """Each code cell whose outputs differ (see ``same_text``), described."""
    found = []
    cells = [(a, b) for a, b in zip(stored_nb.cells, fresh_nb.cells) if a.cell_type == "code"]
    for n, (a, b) in enumerate(cells):
        oa, ob = outputs(a), outputs(b)
        if [k for k, _ in oa] != [k for k, _ in ob]:
            found.append(f"code cell {n}: shows {[k for k, _ in ob]}, stored {[k for k, _ in oa]}")
            continue
        for (kind, x), (_, y) in zip(oa, ob):
            problem = same_text(x, y)
            if problem:
                found.append(f"code cell {n} ({kind}): {problem}")
    return found


def execute(path: Path, timeout: int = 600):
    """The notebook at ``path`` run top to bottom in a fresh kernel (in a temporary working
    directory, ``PYTHONHASHSEED=0``): ``(notebook with outputs, plot problems)``."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(_CHECK_PLOTS))
    nb.cells.append(nbformat.v4.new_code_cell(_REPORT))
    saved = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = "0"
    try:
        with tempfile.TemporaryDirectory() as cwd:
            nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                    resources={"metadata": {"path": cwd}}).execute()
    finally:
        if saved is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = saved
    report = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    nb.cells = nb.cells[1:-1]
    problems = ast.literal_eval(report.split("PLOT PROBLEMS:", 1)[1].strip()) if "PLOT PROBLEMS:" in report else ["no report"]
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = i + 1
        for o in cell.get("outputs", []):
            if "execution_count" in o:
                o["execution_count"] = i + 1
        cell.metadata.pop("execution", None)
    return nb, problems


def main(names: list[str]) -> int:
    import nbformat

    bad = 0
    for path in NOTEBOOKS:
        if names and path.stem not in names and path.name not in names:
            continue
        nb, problems = execute(path)
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
        print(f"{path.name}: {len(nb.cells)} cells, {len(errors)} errors, plots: {problems or 'ok'}")
        bad += bool(errors or problems)
        nbformat.write(nb, path)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
