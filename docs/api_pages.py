"""The API reference pages, generated from the public names (`__all__`) at build time.

mkdocs runs this as a hook (`hooks:` in mkdocs.yml): `on_files` adds one page per public module,
`api/<module>.md`, with one mkdocstrings entry per name in the module's `__all__`, documented where
it is defined and headed by the name users import. A name added to `__all__` is in the next build;
`tests/test_docs.py` checks every public name has its entry. Run as a script it prints the pages.
"""

import importlib
import inspect

# (module, title, what it holds)
MODULES = [
    ("circuits", "circuits", "Nodes, evaluation, text, files, selection, cost: `import circuits as C`."),
    ("circuits.interp", "circuits.interp",
     "Interventions, sweeps, discovery, causal scrubbing, SAEs and attribution graphs."),
    ("circuits.models", "circuits.models", "Model builders, `load` and `Model`, the shipped induction model."),
    ("circuits.select", "circuits.select", "Matchers and `get` / `get_unique` / `update` / `paths`."),
    ("circuits.importers", "circuits.importers", "`from_torch` (torch.export) and `from_tracr`."),
    ("circuits.testing", "circuits.testing", "Hypothesis strategies for circuits: property tests of your own rewrites."),
    ("rewrites", "rewrites", "The rewrite engine, rule sets, strategies, `simp` and `optimize`."),
]


def public_names(module_name):
    """`__all__`, or for a module without one, its public functions and classes defined in it."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [n for n, v in vars(module).items()
            if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
            and getattr(v, "__module__", "").startswith(module_name)]


def _target(module_name, name):
    """Where `name` is documented: its defining module's path, or the module itself."""
    module = importlib.import_module(module_name)
    obj = getattr(module, name)
    if inspect.ismodule(obj):
        return obj.__name__, "module"
    defined_in = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if (inspect.isclass(obj) or inspect.isfunction(obj)) and defined_in and qualname and "<" not in qualname:
        return f"{defined_in}.{qualname}", "object"
    return f"{module_name}.{name}", "attribute"


def page(module_name, title, blurb):
    lines = [f"# `{title}`", "", blurb, "",
             f"Every public name of `{module_name}`.", ""]
    for name in public_names(module_name):
        target, kind = _target(module_name, name)
        full = f"{module_name}.{name}"
        if kind == "module" and any(m == target for m, _, _ in MODULES):
            lines += [f"## `{full}`", "", f"The module [`{target}`]({target}.md).", ""]
            continue
        lines += [f"::: {target}", "    options:", f"      heading: \"{full}\"",
                  f"      toc_label: \"{name}\"", "      show_root_heading: true",
                  "      heading_level: 2"]
        lines += ["      members: false", ""] if kind == "module" else [""]
    return "\n".join(lines)


def pages():
    return {f"api/{m}.md": page(m, t, b) for m, t, b in MODULES}


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files


if __name__ == "__main__":
    for path, text in pages().items():
        print(f"==> {path}\n{text}")
