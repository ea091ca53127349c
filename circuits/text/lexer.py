"""Reading single lines of the text format: indentation, identifier, shape, type and payload.

``FAST_LINE`` reads the lines the printer writes in one regular-expression match; ``read_line``
reads every other form (comments, colours, tree glyphs, loose spacing, escapes) and, when a line
is wrong, walks it to say where and what was expected.  Payloads are read by their node classes
(``parse_payload``); shapes are cached by their text, since a circuit repeats the same few.

>>> read_line("    20 'ln.mean_subbed' Add", 1)
(2, False, 20, 'ln.mean_subbed', None, 'Add', None, 0, None)
>>> read_line("'a0.w.q.head0' [32,256] Index [0,:,:]  # a comment", 1)
(0, False, None, 'a0.w.q.head0', (32, 256), 'Index', '[0,:,:]', 30, None)
"""

from __future__ import annotations

import re

from ..errors import ParseError
from ..nodes import NODE_TYPE_BY_NAME
from ..shapes import SizeOverflow, decimal_int, read_size

# What a line's content may be once its indentation is removed.
_CONTENT = re.compile(
    r"""(?P<define>~\ +)?
    (?:(?P<serial>[0-9]+)(?:\ +|(?=\#)|$))?
    (?:'(?P<name>[^'\\]*(?:\\.[^'\\]*)*)'(?:\ +|(?=\#)|$))?
    (?:'(?P<name2>[^'\\]*(?:\\.[^'\\]*)*)'(?:\ +|(?=\#)|$))?
    (?:AD(?:\ +|(?=\#)|$))?
    (?:\[(?P<shape>[^\]\#]*)\](?:\ +|(?=\#)|$))?
    (?:(?P<type>[A-Za-z_][A-Za-z0-9_]*)(?:\ +(?P<payload>[^\#]*))?)?
    (?:\#.*)?$""",
    re.VERBOSE,
)
# The lines the printer writes by default, indentation included, read in one match: single
# spaces, no comment, no escapes in the name, a known type (the caller checks the indentation
# is even).  Whatever it refuses (or reads as
# neither a definition nor a reference) goes through ``read_line``, which reads everything else
# and explains errors.
FAST_LINE = re.compile(
    r"""(?P<indent>\ *)
    (?:(?P<serial>[0-9]{1,18})(?:\ |$))?
    (?:'(?P<name>[^'\\]*)'(?:\ |$))?
    (?:\[(?P<shape>[0-9,]*)\]\ )?
    (?:(?P<type>%s)(?:\ (?P<payload>[^\#\ ][^\#]*))?)?$"""
    % "|".join(sorted(NODE_TYPE_BY_NAME, key=len, reverse=True)),
    re.VERBOSE,
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_INDENT_CHARS = " │├└─‣┌"
_ESCAPES = {"\\": "\\", "'": "'", "n": "\n", "r": "\r", "t": "\t"}
# \xHH, \uHHHH, \UHHHHHHHH: how many hex digits follow (see ``circuits.errors.escape_char``).
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
TYPE_NAMES = ", ".join(NODE_TYPE_BY_NAME)


def fail(message, line_number, line, column=None, expected=None):
    return ParseError(message, line_number=line_number, line=line, column=column, expected=expected)


def read_line(line: str, line_number: int, tree_width: int = 3, loose_serials=None):
    """``(depth, is_definition_block, serial, name, shape, type_name, payload, payload_column,
    alias)`` for a node line (the column is 0-based, 0 without payload), or None for a blank or
    comment line.  Raises ParseError for anything else.

    rust_circuit's forms read too: two quoted names (``'ident' 'name'``: the first is what other
    lines refer to, ``alias``), its ``AD`` mark (autonaming off: nothing to keep here), and its
    tree arrows (``├‣``, two columns a level: ``tree_width=2``).  ``loose_serials`` (the serials
    defined so far, when repeats are not checked): a line with one of them followed by anything
    is a reference to that node, as rust reads ``8 tok_embeds`` without checking repeats."""
    content = line.lstrip(_INDENT_CHARS)
    if not content:
        return None
    first = content[0]
    if first == "#":
        return None
    if first == "\x1b" or (first == "~" and content.startswith("~ \x1b")):
        line = strip_colors(line)
        content = line.lstrip(_INDENT_CHARS)
        if not content or content[0] == "#":
            return None
        first = content[0]
    width = len(line) - len(content)
    depth = 0
    if width:
        if line.count(" ", 0, width) == width:
            if width & 1:
                raise fail(f"indentation of {width} spaces is not a whole number of levels", line_number,
                           line, width + 1, "two spaces per level")
            depth = width >> 1
        else:
            if width % tree_width:
                raise fail(f"tree indentation of {width} characters is not a whole number of levels",
                           line_number, line, width + 1,
                           f"{'three' if tree_width == 3 else 'two'} glyph columns per level")
            depth = width // tree_width
    if first == ".":
        rest = content[3:].strip(" ")
        if content.startswith("...") and (not rest or rest[0] == "#"):
            raise fail(
                "children left out ('...') cannot be parsed", line_number, line, width + 1,
                "the full text: print with depth=None",
            )
    if loose_serials:
        serial = re.match(r"([0-9]+)(?: |$)", content)
        if serial is not None and int(serial.group(1)) in loose_serials:
            return depth, False, int(serial.group(1)), None, None, None, None, 0, None
    m = _CONTENT.match(content)
    if m is None and "\\'" in content:
        content = _rust_names(content)
        m = _CONTENT.match(content)
    if m is None:
        raise _diagnose(content, width, line, line_number)
    define, serial, name, alias, shape, type_name, payload = m.groups()
    if alias is not None:
        name, alias = alias, name
        if "\\" in alias:
            alias = _unescape(alias, line, line_number, width + m.start("name"))
    payload_column = 0
    if serial is not None:
        if len(serial) > 18:  # (int() refuses over 4300 digits; no circuit has 10**18 nodes)
            raise fail(f"serial number {serial[:20]}... is too long", line_number, line, width + 1,
                       "a serial number of at most 18 digits")
        serial = int(serial)
    if name is not None and "\\" in name:
        name = _unescape(name, line, line_number, width + m.start("name2" if alias is not None else "name"))
    if shape is not None:
        shape = read_shape(shape, line_number, line, width + m.start("shape"))
    if type_name is not None:
        if type_name not in NODE_TYPE_BY_NAME:
            raise fail(f"unknown node type {type_name!r}", line_number, line, width + m.start("type") + 1,
                       f"one of {TYPE_NAMES}")
        if payload:
            if payload[-1] == " ":  # spaces before a comment
                payload = payload.rstrip(" ") or None
            payload_column = width + m.start("payload")
        else:
            payload = None
    elif shape is not None:
        raise fail("a shape with no node type after it", line_number, line, width + m.end("shape") + 2,
                   f"a node type ({TYPE_NAMES})")
    elif serial is None and name is None and alias is None:
        raise fail("a line with nothing to read", line_number, line, width + 1,
                   "a node line ([serial] ['name'] [shape] Type [payload]) or a reference")
    if define is not None and depth:
        raise fail("'~' marks a definition block and belongs on a root line", line_number, line, width + 1,
                   "'~' only at the start of an unindented line")
    return depth, define is not None, serial, name, shape, type_name, payload, payload_column, alias


def strip_colors(line: str) -> str:
    r"""The line without the ANSI colour codes the printer adds, leaving quoted names untouched
    (a name may itself hold an escape character).

    >>> strip_colors("\x1b[2m20\x1b[0m \x1b[1m'a\x1b[1m'\x1b[0m")
    "20 'a\x1b[1m'"
    """
    out = []
    i, n = 0, len(line)
    quoted = False
    while i < n:
        c = line[i]
        if quoted:
            if c == "\\":
                out.append(line[i:i + 2])
                i += 2
                continue
            quoted = c != "'"
        elif c == "'":
            quoted = True
        elif c == "\x1b":
            m = _ANSI.match(line, i)
            if m is not None:
                i = m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


_SEPARATES = frozenset(" #")


def _rust_names(content):
    r"""The line with its quoted names read as rust_circuit's parser reads them, rewritten in
    this format's escapes.  Rust's name pattern ``'((?:(?:\\')?[^']*)*)'`` keeps inside a name
    every quote that follows a backslash, and unescapes by replacing ``\'`` then ``\\``, so its
    tests' ``'\\'\\'`` is one name (``\'\``) where this format's escapes end the name after
    ``'\\'``.  Called only for a line the format's own reading refuses; the closing quote is the
    first that follows no backslash or that a space, ``#`` or the end of the line follows.

    >>> print(_rust_names(r"5 '\\'\\' [2] Scalar 1.2"))
    5 '\\\'\\' [2] Scalar 1.2
    """
    from ..nodes.base import quote_name

    pos, n = 0, len(content)
    while pos < n and content[pos].isdigit():
        pos += 1
    for _ in range(2):  # an identifier and a name
        while pos < n and content[pos] == " ":
            pos += 1
        if pos >= n or content[pos] != "'":
            break
        close = pos + 1
        while close < n:
            if content[close] == "'" and (content[close - 1] != "\\" or close + 1 == n
                                          or content[close + 1] in _SEPARATES):
                break
            close += 1
        if close >= n:
            break
        raw = content[pos + 1:close]
        name = raw.replace("\\'", "'").replace("\\\\", "\\")
        content = content[:pos] + quote_name(name) + content[close + 1:]
        pos += len(quote_name(name))
    return content


def _unescape(raw, line, line_number, column):
    out = []
    i = 0
    n = len(raw)
    while i < n:
        c = raw[i]
        if c == "\\":
            nxt = raw[i + 1] if i + 1 < n else ""
            width = _HEX_ESCAPES.get(nxt)
            if width is not None:
                digits = raw[i + 2:i + 2 + width]
                if len(digits) != width or not _HEX_DIGITS.issuperset(digits) or int(digits, 16) > 0x10FFFF:
                    raise fail(f"bad escape \\{nxt}{digits} in a name", line_number, line, column + i + 1,
                               f"\\{nxt} then {width} hex digits (a code point up to 10ffff)")
                out.append(chr(int(digits, 16)))
                i += 2 + width
                continue
            if nxt not in _ESCAPES:
                raise fail(f"unknown escape \\{nxt} in a name", line_number, line, column + i + 1,
                           "one of \\\\ \\' \\n \\r \\t \\xHH \\uHHHH \\UHHHHHHHH")
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _diagnose(content, width, line, line_number):
    """Walk a line the fast path refused and say where it went wrong."""
    pos = 0
    n = len(content)

    def at(p, message, expected):
        return fail(message, line_number, line, width + p + 1, expected)

    def skip_separator(p, after):
        if p >= n or content[p] == "#":
            return p
        if content[p] != " ":
            raise at(p, f"{content[p]!r} right after {after}", "a space")
        while p < n and content[p] == " ":
            p += 1
        return p

    if content[0] == "\t":
        raise at(0, "a tab in the indentation", "spaces (two per level)")
    if content.startswith("~"):
        pos = skip_separator(1, "'~'")
    if pos < n and content[pos].isdigit():
        while pos < n and content[pos].isdigit():
            pos += 1
        pos = skip_separator(pos, "the serial number")
    if pos < n and content[pos] == "'":
        start = pos
        pos += 1
        while pos < n and content[pos] != "'":
            pos += 2 if content[pos] == "\\" else 1
        if pos >= n:
            raise at(start, "the name's quote is never closed", "a closing '")
        pos = skip_separator(pos + 1, "the name")
    if pos < n and content[pos] == "[":
        close = content.find("]", pos)
        if close < 0 or "#" in content[pos:close]:
            raise at(pos, "the shape's '[' is never closed", "a shape like [300,256]")
        pos = skip_separator(close + 1, "the shape")
    if pos < n and content[pos] != "#":
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(content, pos)
        if m is None:
            raise at(pos, f"cannot read {content[pos:].split(' ')[0]!r}",
                     f"a serial, a 'name', a [shape] or a node type ({TYPE_NAMES})")
        pos = m.end()
        if pos < n and content[pos] not in " #":
            raise at(pos, f"{content[pos]!r} right after the node type", "a space, then the payload")
    raise at(pos, "cannot read this line", "[serial] ['name'] [shape] Type [payload]")


# ---------------------------------------------------------------------------- payloads
# Payload caches are global: keep them small, and never let them hold a big payload (a failed
# parse of a huge text must not stay in memory through them).
CACHE_ENTRIES = 4096
CACHED_PAYLOAD_CHARS = 256


def remember_payload(cache: dict, text: str, value) -> None:
    if len(text) > CACHED_PAYLOAD_CHARS:
        return
    if len(cache) >= CACHE_ENTRIES:
        cache.clear()
    cache[text] = value


_SHAPES: dict = {}


def _size(entry):
    """One printed size: ``300``, rust_circuit's ``1_000`` and named ``large:3`` (the axis name
    is rust's display metadata, which circuits do not hold: only the size is kept)."""
    if ":" in entry:
        axis, _, entry = entry.partition(":")
        axis = axis.strip()
        if not axis or any(c in axis for c in " []"):
            raise ValueError(entry)
    entry = entry.strip()
    if entry.endswith("s") or "*" in entry:  # rust_circuit's symbolic sizes: 0s, 2*1s
        return read_size(entry)
    if "_" in entry:
        if entry.startswith("_") or entry.endswith("_") or "__" in entry:
            raise ValueError(entry)
        entry = entry.replace("_", "")
    return decimal_int(entry)


def read_shape(text, line_number, line, column):
    """``'300,256'`` -> ``(300, 256)``; rust_circuit's ``'large:3, 1_000,'`` -> ``(3, 1000)``."""
    shape = _SHAPES.get(text)
    if shape is not None:
        return shape
    stripped = text.strip()
    try:
        entries = stripped.split(",") if stripped else []
        if len(entries) > 1 and not entries[-1].strip():  # rust allows a trailing comma
            entries.pop()
        shape = tuple(decimal_int(s) if s.isdigit() else _size(s) for s in entries)
    except ValueError as e:
        why = f": {e}" if isinstance(e, SizeOverflow) else ""
        raise fail(f"cannot read the shape [{text}]{why}", line_number, line, column + 1,
                   "a shape like [300,256], [0s,2*1s] or [] (non-negative sizes)") from None
    if any(s < 0 for s in shape):
        raise fail(f"the shape [{text}] has a negative size", line_number, line, column + 1,
                   "non-negative sizes")
    remember_payload(_SHAPES, text, shape)
    return shape
