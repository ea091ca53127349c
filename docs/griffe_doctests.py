"""A griffe extension for the API reference: doctest examples in docstrings shown as code.

The docstrings hold their examples as bare ``>>>`` sessions (doctest runs them); rendered as
Markdown, their output (``['a', 'b']``) would read as reference links. Each run of lines from a
``>>>`` line to the next blank line becomes a fenced ``pycon`` block.
"""

import griffe


def fence_doctests(text: str) -> str:
    out, in_block, indent = [], False, ""
    for line in text.splitlines():
        stripped = line.lstrip()
        if not in_block and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            in_block = True
        elif in_block and not stripped:
            out.append(f"{indent}```")
            in_block = False
        out.append(line)
    if in_block:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_instance(self, *, obj, **kwargs):
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
