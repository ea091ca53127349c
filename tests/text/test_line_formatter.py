"""One line formatter (``circuits.nodes.base.format_line``) behind ``Circuit.line``, the
printer's plain and coloured lines and the notebook view: they all show a node the same way."""

import pytest
from hypothesis import given, settings

import circuits as C
from circuits.nodes.base import format_line
from circuits.testing import dags
from circuits.text.html import MAX_PAYLOAD_CHARS, to_html
from circuits.text.lexer import strip_colors
from circuits.text.printer import PrintOptions


@settings(max_examples=30, deadline=None)
@given(dags(max_nodes=6, max_depth=2))
def test_line_printer_and_notebook_show_the_same_line(node):
    line = node.line()
    assert line == format_line(node.type_name, node.name, node.payload_text(),
                               node.shape if node.prints_shape else None)
    first = node.to_text().split("\n")[0]
    assert first.endswith(line)  # after the serial, if any
    assert strip_colors(node.to_text(color=True).split("\n")[0]) == first
    if len(node.payload_text()) <= MAX_PAYLOAD_CHARS:
        import html
        import re

        page = to_html(node, max_nodes=1)
        shown = re.search(r'id="c[0-9a-f]+-0"[^>]*>(?:<summary>)?(.*?)(?:</summary>|</div>)', page).group(1)
        assert html.unescape(re.sub(r"<[^>]+>", "", shown)).startswith(line + " ")


def test_format_line_paints_name_and_body():
    painted = format_line("Index", "w", "[0,:]", (3,), lambda part, text: f"<{part}>{text}</{part}>")
    assert painted == "<name>'w'</name> <body>[3] Index [0,:]</body>"


def test_print_options_are_one_checked_value():
    x = C.Symbol((2,), name="x")
    with pytest.raises(TypeError, match="colour.*the options are depth, shapes"):
        x.to_text(colour=True)
    with pytest.raises(ValueError, match="depth"):
        PrintOptions(depth=-1).checked()
    assert PrintOptions().checked().max_chars > 0
