"""Print circuits in the text format (see ``circuits.text`` for the format itself).

The printer walks the circuit once, iteratively (pre-order, children in order), deciding for every
line whether it defines a node or refers back to one and counting how many printed nodes bear each
name; then it builds the strings, numbering the nodes that need a serial (unnamed, or sharing a
name) in the order they first appear in the text.  It reads node attributes only: never a tensor
value, never a tensor store.  The garbage collector is paused meanwhile (see ``gc_paused``).

Options (all keyword):

- ``depth``: show at most this many levels below each root; cut children print as ``...``
  (such text is for reading and does not parse).  ``str(circuit)`` uses ``depth=6``.
- ``max_lines``: stop after this many node lines, ending with a ``...`` line (for reading
  too: ``str(circuit)`` uses 400, so a circuit with a 100,000-child Add still shows instantly).
- ``shapes``: print the shape on every line, not only for Array/Scalar/Symbol/Index.
- ``comments``: append ``# [shape] dtype`` to every node line.
- ``color``: ANSI colours by node type (the parser strips them again).
- ``tree``: draw the tree with ``├─ └─ │`` glyphs instead of plain indentation (parses too);
  with ``rust`` rust_circuit's arrows ``├‣ └‣``, two columns a level, as its ``arrows=True``.
- ``names``: ``False`` leaves names out (every node then gets a serial number).
- ``max_line_chars``: cut a line longer than this, ending it with ``…`` (for reading: a cut
  line does not parse; ``str(circuit)`` uses 1,000, so a few hundred references to a node with
  a 100,000-character name show as a few hundred kB, not tens of MB).
- ``max_chars``: refuse (``CircuitError``) to write more than this many characters (default
  ``CIRCUITS_MAX_TEXT_CHARS`` or 2**28): a shared node is never expanded twice, but every
  reference repeats its name, so a small text with long names can print very large.
- ``rust``: write what rust_circuit's own parser reads (``circuit_base/src/parsing.rs``):
  Rearrange specs with sizes inside (``(h:2 d) s -> h:2 s d``, ``()`` for a unit axis), Symbols
  with their uuid only (rust has no dtype there), and no ``~`` definition blocks (every level
  indented).  Our parser reads this output back too.
- ``traversal``: rust_circuit's traversal limit on printing: an int ``k`` prints ``k`` levels
  (rust's ``new_traversal(end_depth=k)``), a matcher (anything ``circuits.select`` takes: a name,
  a type, a predicate...) prints a matching node's line but not its children (rust's
  ``term_early_at``).  A node whose children are left out ends its line with `` ...``, as rust
  writes it (for reading; it does not parse).
- ``number_leaves``: rust's numbered leaves: the circuit printed as a tree (a node met again is
  written again in full, under the same identifier) and every leaf line — a node without
  children, or one whose children ``traversal`` leaves out — ends ``# 0``, ``# 1``, ...
  in text order.  It parses back to the same circuit unless a node with children is met twice
  (our parser refuses a restated node with children; rust's parser reads none of this mode).
- ``commenters``: functions ``node -> str``; each non-empty result is appended to the node's
  line (definitions and references alike) as `` # text``, as rust's ``commenters``.  Comments
  parse away.
- ``leaves_on_top``: the lines in reverse order (leaves first, the root last; ``└─`` becomes
  ``┌─``), as rust's ``leaves_on_top``; for reading (neither parser reads it).
- ``bijection``: ``False`` is rust's reading mode: names written bare (unquoted, never with a
  serial, however many nodes share them), serials only for unnamed nodes.  Names no longer
  identify nodes, so neither parser reads it back.
- ``max_indent``: the deepest indentation level written (default 64).  A node with children that
  would start deeper is printed as a reference and its subtree goes, as a definition block (a root
  line marked ``~``), before the roots; definition blocks are ordered deepest first.  This keeps a
  50,000-deep chain at a few megabytes instead of gigabytes, and parses back to the same circuit.

>>> from circuits import Symbol, Add, Scalar
>>> x = Symbol((2,), name='x')
>>> y = Add(x, Scalar(1.0), x)
>>> print(to_text(Add(y, y, name='z')))
'z' Add
  0 Add
    'x' [2] Symbol
    1 [] Scalar 1
    'x'
  0
>>> print(to_text(y, tree=True, comments=True))
0 Add  # [2] float32
├─ 'x' [2] Symbol  # [2] float32
├─ 1 [] Scalar 1  # [] float32
└─ 'x'  # [2] float32
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import CircuitError, printable
from ..nodes.base import Circuit, bulk_build, format_line, quote_name
from ..shapes import shape_text

DEFAULT_MAX_INDENT = 64
# A printed text is refused beyond this many characters (``max_chars``): a circuit whose
# references repeat a long name could otherwise print as gigabytes from a small file.
MAX_TEXT_ENV = "CIRCUITS_MAX_TEXT_CHARS"
DEFAULT_MAX_TEXT_CHARS = 1 << 28


def max_text_chars() -> int:
    import os

    text = os.environ.get(MAX_TEXT_ENV)
    try:
        return int(text) if text else DEFAULT_MAX_TEXT_CHARS
    except ValueError:
        raise CircuitError(f"{MAX_TEXT_ENV}={text!r} is not an int number of characters") from None
DEFINITION_MARK = "~ "

# Tree glyphs (a child, the last child, a line past a level, a blank level): ours, three columns
# a level; rust_circuit's arrows (``rust=True``), two columns, which its parser reads.
TREE_GLYPHS = ("├─ ", "└─ ", "│  ", "   ")
RUST_ARROWS = ("├‣", "└‣", "│ ", "  ")

# Line kinds (_DEF_CUT: a definition whose children a ``traversal`` leaves out).
_DEF, _REF, _CUT, _DEF_CUT = 0, 1, 2, 3

# ANSI colour per node type (the type word and payload); serials are dim, names bold.
_COLORS = {
    "Array": "32", "Scalar": "36", "Symbol": "35", "Einsum": "33", "Add": "34",
    "GeneralFunction": "31", "Index": "96", "Rearrange": "95", "Concat": "94", "Tag": "90",
}
_RESET = "\x1b[0m"


def to_text(circuit, **options) -> str:
    """The text of one circuit (``circuit.to_text()``); several roots sharing serials and
    references are ``print_many(roots)``.

    >>> from circuits import Scalar
    >>> to_text(Scalar(1e-5, name='ln.c.eps'))
    "'ln.c.eps' [] Scalar 0.00001"
    """
    if not isinstance(circuit, Circuit):
        raise TypeError(
            f"to_text prints one circuit node, got {type(circuit).__name__}; "
            "print several roots with print_many(roots)"
        )
    return print_many([circuit], **options)


class PrintOptions(NamedTuple):
    """The print options (see the module docstring), checked once by ``print_many`` and handed
    to every helper as one value."""

    depth: "int | None" = None
    shapes: bool = False
    comments: bool = False
    color: bool = False
    tree: bool = False
    names: bool = True
    max_indent: "int | None" = DEFAULT_MAX_INDENT
    max_lines: "int | None" = None
    max_line_chars: "int | None" = None
    max_chars: "int | None" = None
    rust: bool = False
    traversal: object = None
    number_leaves: bool = False
    commenters: tuple = ()
    leaves_on_top: bool = False
    bijection: bool = True

    def checked(self) -> "PrintOptions":
        """These options with ``max_chars`` filled in; ValueError for an impossible one."""
        if self.traversal is not None and isinstance(self.traversal, int) and not isinstance(
                self.traversal, bool) and self.traversal < 0:
            raise ValueError(f"traversal as a depth must be >= 0, got {self.traversal}")
        commenters = (self.commenters,) if callable(self.commenters) else tuple(self.commenters or ())
        for f in commenters:
            if not callable(f):
                raise ValueError(f"commenters are functions node -> str, got {f!r}")
        self = self._replace(commenters=commenters)
        if self.number_leaves:
            self = self._replace(max_indent=None)  # a tree has no definition blocks
        if self.depth is not None and self.depth < 0:
            raise ValueError(f"depth must be >= 0 or None, got {self.depth}")
        if self.max_indent is not None and self.max_indent < 1:
            raise ValueError(f"max_indent must be >= 1 or None, got {self.max_indent}")
        if self.max_lines is not None and self.max_lines < 1:
            raise ValueError(f"max_lines must be >= 1 or None, got {self.max_lines}")
        if self.max_line_chars is not None and self.max_line_chars < 2:
            raise ValueError(f"max_line_chars must be >= 2 or None, got {self.max_line_chars}")
        opts = self._replace(max_indent=None) if self.rust else self
        return opts if opts.max_chars is not None else opts._replace(max_chars=max_text_chars())


def print_many(roots, **options) -> str:
    """Several roots in one text: serials count on from one root to the next and a node printed
    under an earlier root is only referred to later.  Options as ``to_text`` (``PrintOptions``).

    >>> from circuits import Scalar, Add
    >>> one = Scalar(1.0, name='one')
    >>> print(print_many([Add(one, name='a'), Add(one, one, name='b')]))
    'a' Add
      'one' [] Scalar 1
    'b' Add
      'one'
      'one'
    """
    roots = list(roots)
    for r in roots:
        if not isinstance(r, Circuit):
            raise TypeError(f"print_many takes circuit nodes, got {type(r).__name__}")
    unknown = set(options) - set(PrintOptions._fields)
    if unknown:
        raise TypeError(f"unknown print option(s) {', '.join(sorted(unknown))}; the options are "
                        f"{', '.join(PrintOptions._fields)}")
    opts = PrintOptions(**options).checked()
    with gc_paused():
        layout = _Layout(opts)
        blocks = layout.blocks(roots)
        text = _render(blocks, layout.name_count, opts)
        del blocks, layout  # freed while the collector is off, so it never scans the line entries
    return text


# Printing and parsing allocate a tuple or record per line and create no cycles, and with a large
# circuit alive each automatic collection rescans every node (about half the time of a
# 100,000-node print or parse): both run with the cyclic collector paused.
gc_paused = bulk_build


# ---------------------------------------------------------------------------- layout
class _Layout:
    """Lays out blocks of line entries in text order.  A block is ``(is_definition, entries)``;
    an entry is ``(kind, node, level, glyphs)`` where glyphs is the tree prefix (None without
    ``tree``).  ``name_count`` receives how many distinct printed nodes bear each name (left
    empty with ``names=False``); ``budget`` is how many node lines may still be written
    (negative: no limit)."""

    def __init__(self, opts: PrintOptions):
        self.opts = opts
        self.defined: set = set()
        self.lifted: list = []  # nodes whose subtree became a definition block, in discovery order
        self.name_count: dict = {}
        self.budget = opts.max_lines if opts.max_lines is not None else -1

    def blocks(self, roots):
        tree = self.opts.tree
        root_blocks = []
        for root in roots:
            if self.budget == 0:  # max_lines reached with roots left: say so
                root_blocks.append((False, [(_CUT, None, 0, "" if tree else None, None)]))
                break
            root_blocks.append((False, self._walk(root, False)))
        definition_blocks = []
        lifted = self.lifted
        i = 0
        while i < len(lifted) and self.budget != 0:  # lifted grows while we walk: deeper nodes come later
            definition_blocks.append((True, self._walk(lifted[i], True)))
            i += 1
        definition_blocks.reverse()  # deepest first, so most references point backwards
        return definition_blocks + root_blocks

    def _walk(self, root, is_lifted):
        opts = self.opts
        depth, max_indent, tree = opts.depth, opts.max_indent, opts.tree
        arrows = RUST_ARROWS if opts.rust else TREE_GLYPHS
        depth = _traversal_depth(opts.traversal, depth)
        stop_at = _traversal_matches(opts.traversal, root)
        as_tree = opts.number_leaves
        name_count = self.name_count if opts.names else None
        defined, lifted = self.defined, self.lifted
        budget = self.budget
        entries = []
        emit = entries.append
        limited = budget >= 0
        if as_tree and not limited:  # a shared DAG's tree can be exponential: count it first
            most = opts.max_chars // 4
            if _tree_lines(root, depth, stop_at, opts.traversal is not None, most) > most:
                raise _tree_too_big(root, most)

        if not is_lifted and root.hash in defined:
            emit((_REF, root, 0, "" if tree else None, None))
            if limited:
                self.budget -= 1
            return entries
        stack = [(root, 0, "", True, None)]
        pop, push = stack.pop, stack.append
        first = True
        while stack:
            if limited:  # every item popped writes exactly one node line
                if budget == 0:  # max_lines reached: one last '...' where the next line would be
                    emit((_CUT, None, stack[-1][1], stack[-1][2] if tree else None, None))
                    break
                budget -= 1
            node, level, glyphs, last, info = pop()
            if info is not None:
                # A Module argument's child info: the Symbol it binds is printed after '!' (its
                # line the first time it is met, so it counts as defined here).
                sym = info[0]
                if sym.hash not in defined:
                    defined.add(sym.hash)
                    info = (sym, info[1], True)
                    if name_count is not None and sym.name is not None:
                        name_count[sym.name] = name_count.get(sym.name, 0) + 1
            h = node.hash
            again = False
            if first:  # a root, or a lifted node written out for the first time
                first = False
                defined.add(h)
            elif h in defined:
                if not as_tree:
                    emit((_REF, node, level, glyphs if tree else None, info))
                    continue
                again = True  # number_leaves prints a tree: written again in full
                if len(entries) > opts.max_chars // 4:
                    raise _tree_too_big(root, opts.max_chars // 4)
            else:
                defined.add(h)
                if level == max_indent and node.children:
                    lifted.append(node)
                    emit((_REF, node, level, glyphs if tree else None, info))
                    continue
            kids = node.children
            if kids and stop_at is not None and h in stop_at:
                emit((_DEF_CUT, node, level, glyphs if tree else None, info))
                kids = ()
            else:
                emit((_DEF, node, level, glyphs if tree else None, info))
            if name_count is not None and node.name is not None and not again:
                name_count[node.name] = name_count.get(node.name, 0) + 1
            if not kids:
                continue
            if opts.traversal is not None and depth is not None and level >= depth:
                entries[-1] = (_DEF_CUT,) + entries[-1][1:]  # rust's ' ...' on the line itself
                continue
            if tree:
                mid, end, bar, blank = arrows
                inner = glyphs[:-len(end)] + (blank if last else bar) if level else ""
                if depth is not None and level >= depth:
                    emit((_CUT, None, level + 1, inner + end, None))
                    continue
                n = len(kids)
                infos = _child_infos(node)
                for i in range(n - 1, -1, -1):
                    push((kids[i], level + 1, inner + (end if i == n - 1 else mid), i == n - 1,
                          infos and infos[i]))
            else:
                if depth is not None and level >= depth:
                    emit((_CUT, None, level + 1, None, None))
                    continue
                child_level = level + 1
                infos = _child_infos(node)
                for i in range(len(kids) - 1, -1, -1):
                    push((kids[i], child_level, "", False, infos and infos[i]))
        self.budget = budget
        return entries


def _tree_too_big(root, most: int) -> CircuitError:
    return CircuitError(
        f"number_leaves prints {root.line()} as a tree, which is over {most} lines (its shared "
        "nodes are written once per path); print less with traversal=... or depth=... or "
        "max_lines=..., or allow more with max_chars=...")


def _tree_lines(root, depth, stop_at, depth_cuts_line: bool, most: int) -> int:
    """How many lines ``number_leaves`` writes for ``root`` (its tree: a shared node once per
    path), counted over the DAG without writing them: at most ``most + 1``.  ``depth`` and
    ``stop_at`` cut as ``_Layout._walk`` does; a depth cut costs a ``...`` line unless it is
    a ``traversal``'s (``depth_cuts_line``: the cut marks the node's own line)."""
    def key(node, level):
        return node.hash if depth is None else (node.hash, min(level, depth))

    counts: dict = {}
    stack = [(root, 0, False)]
    while stack:
        node, level, expanded = stack.pop()
        k = key(node, level)
        if not expanded and k in counts:
            continue
        kids = node.children
        if not kids or (stop_at is not None and node.hash in stop_at):
            counts[k] = 1
        elif depth is not None and level >= depth:
            counts[k] = 1 if depth_cuts_line else 2
        elif not expanded:
            stack.append((node, level, True))
            stack.extend((c, level + 1, False) for c in kids if key(c, level + 1) not in counts)
        else:
            total = 1
            for c in kids:
                total += counts[key(c, level + 1)]
            counts[k] = min(total, most + 1)
    return counts[key(root, 0)]


def _traversal_depth(traversal, depth):
    """The ``depth`` limit a traversal given as an int sets (rust's end_depth k: k levels)."""
    if isinstance(traversal, int) and not isinstance(traversal, bool):
        k = max(traversal - 1, 0)
        return k if depth is None else min(depth, k)
    return depth


def _traversal_matches(traversal, root):
    """The hashes of the nodes under ``root`` whose children a matcher traversal leaves out."""
    if traversal is None or (isinstance(traversal, int) and not isinstance(traversal, bool)):
        return None
    from ..select import as_matcher

    return as_matcher(traversal).matches(root)


def _child_infos(node):
    """Per child, what its line says after ``!`` (a Module's argument Symbols), else None."""
    if not node.takes_child_info:
        return None
    return [node.child_info(i) for i in range(len(node.children))]


# ---------------------------------------------------------------------------- strings
def _render(blocks, name_count, opts: PrintOptions):
    """The lines, numbering serials in text order as nodes first appear."""
    tree, names, color, max_chars = opts.tree, opts.names, opts.color, opts.max_chars
    lines = []
    emit = lines.append
    written = 0
    indents = ["  " * i for i in range(64)]
    plain = not (opts.shapes or opts.comments or color or not names or opts.rust or not opts.bijection)
    commenters, number_leaves = opts.commenters, opts.number_leaves
    max_line_chars = opts.max_line_chars
    leaves = 0
    seen: dict = {}  # node hash -> (identifier, serial text such as "20 " or "")
    serials = 0
    for is_definition, entries in blocks:
        for kind, node, level, glyphs, info in entries:
            if tree:
                indent = glyphs
            else:
                try:
                    indent = indents[level]
                except IndexError:
                    indents.extend(["  " * i for i in range(len(indents), level + 64)])
                    indent = indents[level]
            if kind == _CUT:
                emit(indent + ("\x1b[2m...\x1b[0m" if color else "..."))
                continue
            h = node.hash
            known = seen.get(h)
            if known is None:
                known = _identify(node, names, name_count, serials, opts.bijection)
                serials += known[1] != ""
                seen[h] = known
            if plain:
                text = known[1] + node.line() if kind != _REF else known[0]
            else:
                text = _styled(node, kind, known[1], known[0], opts)
            if info is not None:
                # (sym, flags, True): the walk defines the Symbol here; (sym, flags): a reference.
                sym, flags = info[0], info[1]
                sk = seen.get(sym.hash)
                if sk is None:
                    sk = _identify(sym, names, name_count, serials, opts.bijection)
                    serials += sk[1] != ""
                    seen[sym.hash] = sk
                text += " ! " + (sk[1] + sym.line() if len(info) == 3 else sk[0])
                if flags != "ttt":
                    text += " " + flags
            if kind == _DEF_CUT:
                text += " ..."
            if opts.comments:  # after the child info: a comment runs to the end of the line
                text += _paint(f"  # {shape_text(node.shape)} {node.dtype}", "2", color)
            if number_leaves and kind != _REF and (kind == _DEF_CUT or not node.children):
                text += _paint(f" # {leaves}", "35", color)
                leaves += 1
            for commenter in commenters:
                comment = commenter(node)
                if comment:
                    text += _paint(" # " + _one_line(str(comment)), "2", color)
            if level == 0 and is_definition and kind != _REF:
                text = (_paint("~", "2", True) + " " if color else DEFINITION_MARK) + text
            line = indent + text
            if max_line_chars is not None and len(line) > max_line_chars:
                line = line[: max_line_chars - 1] + ("…" + _RESET if color else "…")
            emit(line)
            written += len(line) + 1
            if written > max_chars:
                raise CircuitError(
                    f"the text would be over {max_chars} characters (after {len(lines)} lines); "
                    "print less with max_lines=... or depth=..., or allow more with max_chars=... "
                    f"(default: the environment variable {MAX_TEXT_ENV} or {DEFAULT_MAX_TEXT_CHARS})"
                )
    if opts.leaves_on_top:
        lines.reverse()
        if tree:
            lines = [line.replace("└─", "┌─").replace("└‣", "┌‣") for line in lines]
    return "\n".join(lines)


def size_threshold_commenter(threshold: int):
    """rust_circuit's ``PrintOptions.size_threshold_commenter``: a commenter writing a node's
    element count where it is at least ``threshold`` (rust paints it red; comments here are
    plain text).

    >>> from circuits import Scalar, Add
    >>> print(to_text(Add(Scalar(1.0, (4, 5), name='big'), Scalar(2.0, (5,), name='small')),
    ...               commenters=[size_threshold_commenter(16)]))
    0 Add # 20
      'big' [4,5] Scalar 1 # 20
      'small' [5] Scalar 2
    """
    def comment(node):
        return str(node.numel) if node.numel >= threshold else ""

    return comment


def dtype_commenter(only_arrays: bool = False):
    """rust_circuit's ``PrintOptions.dtype_commenter``: a commenter writing each node's dtype
    (``only_arrays``: Arrays' only).

    >>> import numpy as np
    >>> from circuits import Array, Add
    >>> a = Array(np.zeros(5, np.int8), name='a')
    >>> print(to_text(Add(a, a), commenters=[dtype_commenter(only_arrays=True)]))
    0 Add
      'a' [5] Array b5054f3491c209f2403a6170 # int8
      'a' # int8
    """
    def comment(node):
        return node.dtype if not only_arrays or node.type_name == "Array" else ""

    return comment


def _one_line(comment: str) -> str:
    """A comment as one printable line: control characters escaped (``\\n``)."""
    return printable(comment)


def _identify(node, names, name_count, serials, bijection=True):
    """``(identifier, serial text)`` of a node printed for the first time."""
    name = node.name if names else None
    if name is None:
        return (str(serials), f"{serials} ")
    if not bijection:
        return (name, "")  # rust's bijection=False: the bare name, for reading
    if name_count[name] > 1:
        return (f"{serials} {quote_name(name)}", f"{serials} ")
    return (quote_name(name), "")


def _styled(node, kind, serial, identifier, opts: PrintOptions):
    color = opts.color
    if kind != _REF:
        body_code = _COLORS.get(node.type_name, "0")
        name = node.name if opts.names else None
        text = format_line(
            node.type_name, name if opts.bijection else None,
            rust_payload(node) if opts.rust else node.payload_text(),
            node.shape if opts.shapes or node.prints_shape else None,
            lambda part, t: _paint(t, "1" if part == "name" else body_code, color),
        )
        if name is not None and not opts.bijection:
            text = _paint(name, "1", color) + " " + text
        if serial:
            text = _paint(serial[:-1], "2", color) + " " + text
    else:
        text = _paint(identifier, "2", color)
    return text


def rust_payload(node) -> str:
    """A node's payload as rust_circuit writes it (where it differs from ours).

    >>> from circuits import Rearrange, Symbol
    >>> rust_payload(Rearrange(Symbol((6, 3)), '(h d) s -> h s d 1', h=2))
    '(h:2 d) s -> h:2 s d ()'
    """
    kind = node.type_name
    if kind == "Rearrange":
        from ..nodes.rearrange import to_rust_spec

        return to_rust_spec(node.in_groups, node.out_groups, dict(node.given_sizes))
    if kind == "Symbol":
        return "" if node.uuid is None else str(node.uuid)
    return node.payload_text()


def _paint(text, code, color):
    return f"\x1b[{code}m{text}{_RESET}" if color else text
