"""The small exception hierarchy of `circuits`.

Every error names the node (its printed line) or the text line at fault, says what was
expected and, where there is one, how to fix it.
"""


class CircuitError(Exception):
    """Base class of every error this library raises on purpose."""


class ShapeError(CircuitError, ValueError):
    """A node's children have shapes (or axes) that its operation cannot accept."""


class ParseError(CircuitError, ValueError):
    """Text that is not in the circuit text format.

    Carries ``line_number`` (1-based), ``line`` (the text of that line), ``column`` (1-based or
    None) and ``expected`` (what the parser wanted there).
    """

    def __init__(self, message, *, line_number=None, line=None, column=None, expected=None):
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
        text = f"{where}{message}"
        if expected:
            text += f" (expected {expected})"
        if line is not None:
            text += f"\n    {line}"
            if column is not None:
                text += "\n    " + " " * (column - 1) + "^"
        super().__init__(text)


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
