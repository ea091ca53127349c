"""The layer order of DESIGN §2, enforced: a module imports only from its own layer or below.

    errors, dtypes, shapes, hashing, progress -> functions -> nodes -> traversal, check
    -> text, select, io, testing -> backend -> models, analysis -> rewrites -> interp, importers

Every import is checked, module-level and function-level alike. The one sanctioned exception is
the node protocol's convenience methods (``c.to_text()``, ``c.evaluate()``, ``c.get(...)``), which
import their implementations lazily from ``circuits/nodes/base.py``: they are listed in ALLOWED.

The backend has one door: a module above it imports ``circuits.backend`` (the package, whose
``__all__`` is the backend's public surface: ``Lowered`` for a lowered program), never one of its
submodules (``circuits.backend.evaluation``, ``.cache.compiled``...).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = [
    {"circuits.errors", "circuits.dtypes", "circuits.shapes", "circuits.hashing", "circuits.progress"},
    {"circuits.functions"},
    {"circuits.nodes"},
    {"circuits.traversal", "circuits.check"},
    {"circuits.text", "circuits.select", "circuits.io", "circuits.testing", "circuits.expand"},
    {"circuits.backend"},
    {"circuits.models", "circuits.analysis"},
    {"rewrites"},
    {"circuits.interp", "circuits.importers"},
]

# (importing module, imported package): lazy imports inside the Circuit convenience methods.
ALLOWED = {
    ("circuits.nodes.base", "circuits.traversal"),
    ("circuits.nodes.base", "circuits.text"),
    ("circuits.nodes.base", "circuits.backend"),
    ("circuits.nodes.base", "circuits.select"),
    # (Module.substitute and the shape of a module whose arguments change sizes use the
    # expansion walk in circuits.nodes.expansion: no exception for circuits.expand any more.)
}


def layer_of(module: str):
    """(layer index, unit) of a module of ours, or None for third-party and the package roots."""
    parts = module.split(".")
    for n in (2, 1):
        unit = ".".join(parts[:n])
        for i, layer in enumerate(LAYERS):
            if unit in layer:
                return i, unit
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path):
    """(line, imported module) for every import in the file, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield node.lineno, target
            for alias in node.names:  # `from . import x`, `from circuits.backend import runtime` may import a submodule
                yield node.lineno, f"{target}.{alias.name}"


def violations():
    found = []
    files = sorted([*ROOT.joinpath("circuits").rglob("*.py"), *ROOT.joinpath("rewrites").rglob("*.py")])
    assert len(files) > 40
    for path in files:
        me = module_name(path)
        mine = layer_of(me)
        if mine is None:  # circuits/__init__.py: the public API re-exports every layer
            continue
        for line, target in imports_of(path):
            theirs = layer_of(target)
            if theirs is None or theirs[1] == mine[1]:
                continue
            if theirs[0] > mine[0] and (me, theirs[1]) not in ALLOWED:
                found.append(f"{path.relative_to(ROOT)}:{line}: {mine[1]} (layer {mine[0]}) imports "
                             f"{target} (layer {theirs[0]})")
    return found


def test_no_module_imports_a_higher_layer():
    assert violations() == []


BACKEND = ROOT / "circuits" / "backend"


def backend_submodule(target: str):
    """The backend submodule or stage ``target`` names (``circuits.backend.evaluation``,
    ``circuits.backend.cache`` for ``circuits.backend.cache.compiled`` or a name inside one), None
    for the package itself and the names it exports."""
    parts = target.split(".")
    if parts[:2] != ["circuits", "backend"] or len(parts) < 3:
        return None
    sub = BACKEND.joinpath(*parts[2:3])
    return ".".join(parts[:3]) if sub.with_suffix(".py").exists() or sub.is_dir() else None


def backdoors():
    """Imports of a backend submodule from a module above the backend."""
    found = []
    backend_layer = layer_of("circuits.backend")[0]
    files = sorted([*ROOT.joinpath("circuits").rglob("*.py"), *ROOT.joinpath("rewrites").rglob("*.py")])
    for path in files:
        me = module_name(path)
        mine = layer_of(me)
        if mine is None or mine[0] <= backend_layer:
            continue
        seen = set()
        for line, target in imports_of(path):
            sub = backend_submodule(target)
            if sub is not None and (line, sub) not in seen:
                seen.add((line, sub))
                found.append(f"{path.relative_to(ROOT)}:{line}: {me} imports {sub}; import it from circuits.backend")
    return found


def test_modules_above_the_backend_use_its_one_door():
    assert backdoors() == []


def test_the_door_check_tells_a_submodule_from_an_exported_name():
    assert backend_submodule("circuits.backend.evaluation") == "circuits.backend.evaluation"
    assert backend_submodule("circuits.backend.cache.compiled") == "circuits.backend.cache"
    assert backend_submodule("circuits.backend.cache.compiled.cached_jit") == "circuits.backend.cache"
    assert backend_submodule("circuits.backend.evaluate") is None  # `from ..backend import evaluate`
    assert backend_submodule("circuits.backend") is None


def test_every_package_has_a_layer():
    units = {u for layer in LAYERS for u in layer}
    for path in ROOT.joinpath("circuits").iterdir():
        if path.name.startswith(("_", ".")) or path.suffix not in (".py", ""):
            continue
        assert f"circuits.{path.stem}" in units, f"{path.name} has no layer in tests/test_layers.py"


def test_the_checker_catches_an_upward_import():
    # The check must be able to fail: without its allowance, base.py's lazy backend import is reported.
    saved = set(ALLOWED)
    ALLOWED.clear()
    try:
        assert any("circuits/nodes/base.py" in v and "circuits.backend" in v for v in violations())
    finally:
        ALLOWED.update(saved)


def private_imports(unit: str):
    """Imports of a private name (``_x``, from ``from m import _x``) by a module of ``unit`` from a
    module of ``unit`` in another package: modules that share private names are one package."""
    found = []
    for path in sorted(ROOT.joinpath(*unit.split(".")).rglob("*.py")):
        me = module_name(path)
        package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                target = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(unit):
                continue
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                module = f"{target}.{name}" if ROOT.joinpath(*target.split("."), name + ".py").exists() else target
                home = module.rsplit(".", 1)[0]
                if home != package:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {me} imports {name} from {target}")
    return found


def test_interp_modules_share_no_private_names_outside_a_package():
    # The discovery modules shared six private names: they became the package interp/discovery/.
    assert private_imports("circuits.interp") == []


def test_benchmarks_import_nothing_from_the_tests():
    # The benchmarks' helpers and oracles (numpy_attn_only, variants) live in benchmarks/: the
    # tests may read them, never the other way round.
    found = []
    for path in sorted(ROOT.joinpath("benchmarks").rglob("*.py")):
        for line, target in imports_of(path):
            if target == "tests" or target.startswith("tests."):
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert found == []
