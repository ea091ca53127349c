"""The backend's modules form a pipeline: no import loop (imports inside functions counted), every
name has one home (no module hands on a name it imported), and every cache is the one bounded
class, registered where it is created."""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import circuits.backend as backend

BACKEND = pathlib.Path(backend.__file__).parent


def _modules() -> dict:
    """``{module name under circuits.backend: its syntax tree}`` (the package's ``__init__``: ``''``)."""
    out = {}
    for path in sorted(BACKEND.rglob("*.py")):
        parts = list(path.relative_to(BACKEND).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = ast.parse(path.read_text())
    return out


def _package_of(module: str) -> list:
    parts = module.split(".") if module else []
    is_package = (BACKEND.joinpath(*parts) / "__init__.py").exists()
    return parts if is_package else parts[:-1]


def _imported(module: str, node: ast.ImportFrom) -> list:
    """The backend modules ``node`` (a relative import in ``module``) reads from: the module it
    names, or each submodule it imports from a package."""
    if node.level == 0:
        prefix = "circuits.backend"
        if node.module is None or not (node.module == prefix or node.module.startswith(prefix + ".")):
            return []
        base = node.module[len(prefix) + 1:].split(".") if node.module != prefix else []
    else:
        package = _package_of(module)
        up = node.level - 1
        if up > len(package):
            return []  # above the backend (``from ..nodes import``)
        base = package[:len(package) - up] + (node.module.split(".") if node.module else [])
    target = ".".join(base)
    found = []
    for alias in node.names:
        sub = ".".join([*base, alias.name])
        if sub in MODULES:
            found.append(sub)
        elif target in MODULES:
            found.append(target)
    return found


MODULES = _modules()


def _edges() -> dict:
    edges: dict = {m: set() for m in MODULES}
    for module, tree in MODULES.items():
        for node in ast.walk(tree):  # module level and inside functions alike
            if isinstance(node, ast.ImportFrom):
                for target in _imported(module, node):
                    if target != module:
                        edges[module].add(target)
    return edges


def _cycle(edges: dict) -> list | None:
    """One import loop among ``edges`` (a list of modules, the first repeated at the end), or None."""
    state: dict = {}
    for start in sorted(edges):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(edges[start])))]
        state[start] = 1
        path = [start]
        while stack:
            module, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[module] = 2
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(edges.get(child, ())))))
    return None


def test_the_backend_has_no_import_loop_counting_imports_inside_functions():
    edges = _edges()
    del edges[""]  # the package's door imports everything (and nothing imports it back)
    for targets in edges.values():
        targets.discard("")
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package missing
        return False


def test_every_relative_import_names_a_module_that_exists():
    """A module moved into a stage's folder climbs one level more to leave the backend: an import
    inside a function that still names ``..io`` fails only when that function runs."""
    missing = []
    for module, tree in MODULES.items():
        package = ["circuits", "backend", *_package_of(module)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                if not _exists(".".join(base)):
                    missing.append(f"{module or '__init__'} line {node.lineno}: {'.' * node.level}{node.module or ''}")
    assert missing == []


def test_a_loop_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _defined(tree: ast.Module) -> set:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _is_package(module: str) -> bool:
    return (BACKEND.joinpath(*module.split(".")) / "__init__.py").exists() if module else True


def test_every_name_has_one_home():
    """A name imported from a backend module is defined there (no module re-exports what it
    imported; a package's ``__init__``, its face, is the one that does: the door, ``tiers``)."""
    defined = {m: _defined(tree) for m, tree in MODULES.items()}
    wrong = []
    for module, tree in MODULES.items():
        if _is_package(module):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            for target in _imported(module, node):
                if target == "":
                    continue
                for alias in node.names:
                    if ".".join([target, alias.name]) in MODULES or alias.name == target.rsplit(".", 1)[-1]:
                        continue  # a submodule
                    if alias.name not in defined[target]:
                        wrong.append(f"{module or '__init__'}: from {target} import {alias.name}")
    assert wrong == []


STAGES = ("cache", "lower", "tiers")  # the folders, in pipeline order; then the entry points


def _stage(module: str) -> int:
    top = module.split(".")[0]
    return STAGES.index(top) if top in STAGES else len(STAGES)


def test_the_folders_show_the_pipeline():
    """``cache/`` imports from no later stage, ``lower/`` only from ``cache/``, ``tiers/`` from both;
    the entry points (``evaluation``, ``batched``...) from any, and no stage from them."""
    later = [f"{module} imports {target}" for module, targets in _edges().items() if module
             for target in targets if target and _stage(target) > _stage(module)]
    assert later == []


def test_every_cache_is_the_one_bounded_class():
    """No hand-written least-recently-used table outside ``bounded`` (an ``OrderedDict`` evicted
    with ``popitem(last=False)``, or a dict cleared when full)."""
    found = []
    for module, tree in MODULES.items():
        if module.endswith("bounded"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "OrderedDict":
                found.append(f"{module}: OrderedDict")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "popitem":
                found.append(f"{module}: popitem")
    assert found == []
