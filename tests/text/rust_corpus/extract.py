"""Extract every circuit text from rust_circuit's python tests, demos and module library.

Reads the bare git mirror of https://github.com/redwoodresearch/rust_circuit_public (MIT licence,
see its LICENSE.md) and writes ``texts.json`` next to this script: one entry per string literal in
those Python files that reads as rust_circuit's circuit text format (its first node line matches
rust's line grammar with a known node type), with the source file, line, the enclosing function,
and whether the literal sits inside ``pytest.raises`` (rust expects it to fail).

    python tests/text/rust_corpus/extract.py [MIRROR_GIT_DIR]

The data is derived from rust_circuit's files and keeps their attribution in ``texts.json``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

DEFAULT_MIRROR = "/work/.mirror/redwoodresearch+rust_circuit_public/repo"
SOURCES = ("python/tests/", "python/rust_circuit/demos/", "python/rust_circuit/module_library.py")
VARIANTS = (
    "Add Array Concat Cumulant DiscreteVar Einsum GeneralFunction Index Module Rearrange Scalar "
    "Scatter SetSymbolicShape StoredCumulantVar Symbol Tag Conv"
).split()
# A node line as rust's parser reads it: an identifier (serial or quoted name), an optional
# second quoted name, optional AD, optional shape, and a variant.
_NODE_LINE = re.compile(
    r"^[\s│└├‣─]*(?:\d+|'(?:\\.|[^'\\])*')(?: +'(?:\\.|[^'\\])*')?(?: +AD)?(?: +\[[^\]]*\])?"
    r" +(%s)\b" % "|".join(VARIANTS)
)
_SKIP = re.compile(r"^[\s│└├‣─]*(#.*)?$")


def _git(mirror, *args):
    return subprocess.run(["git", "-C", mirror, *args], check=True, capture_output=True,
                          text=True).stdout


def is_circuit_text(s: str) -> bool:
    lines = [ln for ln in s.split("\n") if not _SKIP.match(ln)]
    return bool(lines) and _NODE_LINE.match(lines[0]) is not None


class _Finder(ast.NodeVisitor):
    def __init__(self):
        self.found = []
        self.function = None
        self.raises = 0

    def visit_FunctionDef(self, node):
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_With(self, node):
        raising = any(
            isinstance(item.context_expr, ast.Call)
            and isinstance(item.context_expr.func, ast.Attribute)
            and item.context_expr.func.attr == "raises"
            for item in node.items
        )
        self.raises += raising
        self.generic_visit(node)
        self.raises -= raising

    def visit_Constant(self, node):
        if isinstance(node.value, str) and is_circuit_text(node.value):
            self.found.append((node.lineno, node.value, self.function, self.raises > 0))

    def visit_JoinedStr(self, node):  # f-strings depend on run-time values: left out
        pass


def extract(mirror=DEFAULT_MIRROR):
    commit = _git(mirror, "rev-parse", "HEAD").strip()
    files = [f for f in _git(mirror, "ls-tree", "-r", "--name-only", "HEAD").split("\n")
             if f.endswith(".py") and f.startswith(SOURCES)]
    entries = []
    for path in sorted(files):
        source = _git(mirror, "show", f"HEAD:{path}")
        finder = _Finder()
        finder.visit(ast.parse(source))
        for line, text, function, raises in finder.found:
            entries.append({
                "id": f"{path.rsplit('/', 1)[-1][:-3]}:{line}",
                "source": path, "line": line, "function": function,
                "expects_error": raises, "text": textwrap.dedent(text) if "\t" in text else text,
            })
    return {
        "about": "Circuit texts from rust_circuit's python tests, demos and module library, "
                 "extracted by tests/text/rust_corpus/extract.py.",
        "origin": "https://github.com/redwoodresearch/rust_circuit_public",
        "commit": commit,
        "licence": "MIT (rust_circuit_public/LICENSE.md); the texts remain their authors' work, "
                   "reproduced here under that licence with this attribution.",
        "texts": entries,
    }


if __name__ == "__main__":
    data = extract(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MIRROR)
    out = Path(__file__).with_name("texts.json")
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(data['texts'])} texts -> {out}")
