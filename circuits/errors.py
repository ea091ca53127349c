"""The small exception hierarchy of `circuits`.

Every error names the node (its printed line) or the text line at fault, says what was
expected and, where there is one, how to fix it.
"""


_NAMED_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_char(c: str) -> str:
    r"""One character as the text format writes it inside a quoted name: itself when printable,
    else a backslash escape (``\n``, ``\t``, ``\x07``, ``\u202e``, ``\U000e0001``)."""
    named = _NAMED_ESCAPES.get(c)
    if named is not None:
        return named
    if c.isprintable():
        return c
    o = ord(c)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def printable(text: str, keep: str = "") -> str:
    r"""``text`` with every character that is not printable (control, escape, bell, bidi and
    other format characters, line separators, lone surrogates) written as a backslash escape,
    so that a message or a line shown to a person never carries them raw.  Characters in
    ``keep`` stay as they are.

    >>> printable("a\x1b[31mb\u202e")
    'a\\x1b[31mb\\u202e'
    """
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable() or c in keep:
            out.append(c)
        else:
            out.append(escape_char(c))
    return "".join(out)


class CircuitError(Exception):
    r"""Base class of every error this library raises on purpose.

    Its message is shown with unprintable characters escaped (``printable``): a name, a path or
    a value quoted in it never sends a terminal escape, a bell or a bidi override to a person.

    >>> str(CircuitError("no file /tmp/a\x1b[2Jb"))
    'no file /tmp/a\\x1b[2Jb'
    """

    def __str__(self) -> str:
        return printable(super().__str__(), keep="\n")


class ShapeError(CircuitError, ValueError):
    """A node's children have shapes (or axes) that its operation cannot accept."""


class ParseError(CircuitError, ValueError):
    """Text that is not in the circuit text format.

    Carries ``line_number`` (1-based), ``line`` (the text of that line), ``column`` (1-based or
    None) and ``expected`` (what the parser wanted there).
    """

    def __init__(self, message, *, line_number=None, line=None, column=None, expected=None):
        self.message = message
        self.line_number = line_number
        self.line = line
        self.column = column
        self.expected = expected
        where = ""
        if line_number is not None:
            where = f"line {line_number}"
            if column is not None:
                where += f", column {column}"
            where += ": "
        # The text at fault is shown with its unprintable characters escaped (a name may hold a
        # terminal escape or a right-to-left mark); the caret counts the escaped characters.
        text = printable(f"{where}{message}", keep="\n")
        if expected:
            text += f" (expected {printable(str(expected))})"
        if line is not None:
            text += f"\n    {printable(line)}"
            if column is not None:
                text += "\n    " + " " * len(printable(line[: max(column - 1, 0)])) + "^"
        super().__init__(text)

    def at(self, line_number, line, offset=0) -> "ParseError":
        """This error placed on a line of text, its column moved by ``offset``: a node's
        ``parse_payload`` counts columns within the payload, the parser knows where that starts.

        >>> print(ParseError("not a number", column=1, expected="a number").at(3, "[] Scalar x", 10))
        line 3, column 11: not a number (expected a number)
            [] Scalar x
                      ^
        """
        column = None if self.column is None else self.column + offset
        return ParseError(self.message, line_number=line_number, line=line, column=column,
                          expected=self.expected)


class EvaluationError(CircuitError, RuntimeError):
    """A circuit that cannot be evaluated as it stands (unbound Symbol, placeholder Array...)."""


class RewriteError(CircuitError):
    """A rewrite rule or strategy that failed (a rule returning a node of another shape...)."""


class RewriteLoopError(RewriteError):
    """A fixpoint strategy that went round in a loop or ran out of its step budget."""


class StoreError(CircuitError, OSError):
    """A tensor store or circuit file that is missing, corrupted or tampered with."""


class SelectionError(CircuitError, LookupError):
    """A selection that matched nothing (or too much) where a count was required."""
