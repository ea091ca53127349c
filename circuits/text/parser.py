"""Parse the text format (see ``circuits.text``) back into circuits.

Parsing runs in four passes, none recursive, so a 50,000-deep text parses like a flat one:

1. read every line into a record (identifier, shape, node class, payload) and attach it to the
   record one level less indented above it; the node class reads the payload
   (``parse_payload``: the parser holds no code for any particular node type);
2. resolve references (``20 'ln.mean_subbed'``, ``'idxed_embeds'``, ``7``) against the records
   defined anywhere in the text, then against ``references``; definition blocks (``~`` roots,
   written by the printer for deep circuits) may be referred to before or after they appear;
3. give each placeholder Array, and each Symbol printed without a dtype, a dtype: ``int64``
   when it reaches, through nodes that pass an index on (Index, Rearrange, Concat, Tag), the
   index argument of a gather function (``gen_index_at_0_c``...), else ``float32`` (what each
   class says about its children: ``index_children``);
4. build the nodes children-first, each by its class's ``from_payload`` (the public
   constructors, which validate), checking every printed shape against the one the node computes.

Any text gives circuits or a ``ParseError`` naming the line number, the line, the column where it
can and what was expected; the library's errors from node constructors (a ``ShapeError``...) are
wrapped into one (any other exception is a bug and propagates as it is).  An Array is looked up
in ``store`` (``store.find(prefix)``, then ``store.get(full_hash)``) and becomes a placeholder
when the store lacks it or no store is given: a placeholder with the dtype of pass 3, unless the
store knows the placeholder itself (an optional ``store.placeholder(prefix, shape, name)``: a
circuit file records its placeholders' dtypes); see ``Array.from_payload``.
A placeholder is never equal to the valued Array it stands for (``circuits.nodes.leaves``), so
parsing without a store gives placeholders even while the original circuit is alive.

>>> c = parse('''
... 'y' Einsum ab,b->a
...   'w' [2,3] Array 0123abcd   # a placeholder: no store given
...   'x' [3] Symbol
... ''')
>>> c.shape, c.children[0].is_placeholder
((2,), True)
"""

from __future__ import annotations

import re

from ..errors import CircuitError, ParseError
from ..nodes import NODE_TYPE_BY_NAME, Circuit
from ..nodes.base import ParseContext, quote_name
from ..nodes.leaves import RandomTensors
from ..shapes import shape_text
from .lexer import FAST_LINE, fail, read_line, read_shape
from .printer import gc_paused


class _Record:
    """One definition line, later its node."""

    __slots__ = ("line_number", "line", "serial", "name", "shape", "cls", "payload",
                 "payload_column", "children", "node", "expanded", "int_index",
                 "position", "waits", "alias", "repeat_of", "repeat", "infos", "infos_nodes")

    def __init__(self, line_number, line, serial, name, shape, cls, payload, payload_column):
        self.line_number = line_number
        self.line = line
        self.serial = serial
        self.name = name
        self.shape = shape
        self.cls = cls  # the node class
        self.payload = payload  # as its cls.parse_payload read it
        self.payload_column = payload_column
        self.children = []
        self.node = None
        self.expanded = False
        self.position = -1  # where its subtree ends in the text (children come first)
        self.waits = False  # refers to a node whose subtree ends later in the text
        self.int_index = False
        self.alias = None  # rust_circuit's identifier, when the line gives two quoted names
        self.repeat_of = None  # an earlier record with the same identifier (see _Tree._close)
        self.repeat = False  # this line restates repeat_of: it is that node (its only "child")
        self.infos = None  # a Module's argument flags, one per argument line
        self.infos_nodes = None  # ... and the records (after pass 2) of the Symbols they bind

    def error(self, message, expected=None, column=None):
        return fail(message, self.line_number, self.line, column, expected)


class _Reference:
    """A line that only names a node defined elsewhere."""

    __slots__ = ("line_number", "line", "serial", "name")

    def __init__(self, line_number, line, serial, name):
        self.line_number = line_number
        self.line = line
        self.serial = serial
        self.name = name


def parse(text: str, store=None, references=None, seed=0, check_repeats=True) -> Circuit:
    """The circuit a text describes: its last root (earlier roots and ``~`` blocks define nodes
    it may refer to).

    >>> print(parse("'z' Add\\n  'one' [] Scalar 1\\n  'one'").to_text())
    'z' Add
      'one' [] Scalar 1
      'one'
    """
    return parse_many(text, store=store, references=references, seed=seed, check_repeats=check_repeats)[-1]


def parse_many(text: str, store=None, references=None, seed=0, check_repeats=True) -> list:
    """Every root of a text, in order; roots share the nodes they refer to.

    ``references`` (a dict name -> node, or an iterable of named nodes) supplies nodes the text
    refers to by name without defining them.  ``seed`` seeds the values of rust_circuit's
    random tensors (``Array rand``, or an Array line without a hash), in text order.
    ``check_repeats=False`` is rust_circuit's ``on_repeat_check_info_same=False``: a line whose
    serial number an earlier line defined is that node whatever else it says (a print with
    ``bijection=False`` writes ``8 tok_embeds``, the name unquoted).

    >>> parse_many("0 Add\\n  8 'e' [2] Scalar 1\\n  8 e", check_repeats=False)[0].children[1].name
    'e'

    >>> from circuits import Scalar
    >>> a, b = parse_many("'a' Add\\n  'one'\\n'b' Add\\n  'one'\\n  'one'", references=[Scalar(1.0, name='one')])
    >>> b.children[0] is a.children[0]
    True
    """
    if not isinstance(text, str):
        raise TypeError(f"parse takes a str, got {type(text).__name__}")
    check_text_size(text)
    with gc_paused():
        records, roots, references_found, order = _read(text, check_repeats)
        externals = _external_table(references)
        _resolve(records, roots, references_found, externals)
        _mark_int_indices(records)
        _build(order, store, seed)
        nodes = [r.node for r in roots]
        # Free the records while the collector is off, so it never has to scan them.
        del records, roots, references_found, order, externals
    if not nodes:
        raise fail("the text holds no circuit", None, None, None, "at least one unindented node line")
    return nodes


# Parsing holds about this many bytes per character of text at its peak (lines, records, nodes:
# a 96 MB text took 3.7 GB).
PARSE_BYTES_PER_CHAR = 40
# Texts up to this many characters always parse (tens of MB at most), whatever the budget.
PARSE_FREE_CHARS = 1 << 20


def check_text_size(text: str, budget: int | None = None) -> None:
    """Raise ``ParseError`` before parsing a text whose parse would need more memory than the
    allocation budget (``CIRCUITS_MAX_ALLOC_BYTES``, default 4 GiB: texts up to about 100 MB);
    texts up to ``PARSE_FREE_CHARS`` characters always parse.

    >>> check_text_size("'x' [2] Symbol", budget=10**6)
    >>> check_text_size("x" * (2 << 20), budget=10**6)
    Traceback (most recent call last):
    ...
    circuits.errors.ParseError: this text is 2.0 MiB; parsing it needs about 80.0 MiB (40 bytes per character), over the allocation budget of 976.6 KiB; raise it with the environment variable CIRCUITS_MAX_ALLOC_BYTES=<bytes> if this is intended, or split the circuit
    """
    from ..shapes import MAX_ALLOC_ENV, _human_bytes, max_alloc_bytes

    if len(text) <= PARSE_FREE_CHARS:
        return
    limit = max_alloc_bytes() if budget is None else budget
    need = len(text) * PARSE_BYTES_PER_CHAR
    if need > limit:
        raise ParseError(
            f"this text is {_human_bytes(len(text))}; parsing it needs about {_human_bytes(need)} "
            f"({PARSE_BYTES_PER_CHAR} bytes per character), over the allocation budget of "
            f"{_human_bytes(limit)}; raise it with the environment variable {MAX_ALLOC_ENV}=<bytes> if "
            "this is intended, or split the circuit")


# ---------------------------------------------------------------------------- pass 1: lines
def _read(text, check_repeats=True):
    """Records (definition lines) in text order, the roots, the reference lines as
    ``(parent or None, child position, reference)``, and the records in the order their subtrees
    end (children before parents for every indented child)."""
    lines = text.split("\n")
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    base, base_line = _first_indent(lines) if text[:1] in (" ", "\n", "\r", "#") else (0, 0)
    tree_width = 2 if ("‣" in text or "▼" in text or "|/" in text) else 3
    tree = _Tree()
    tree.tree_width = tree_width
    tree.check_repeats = check_repeats
    add = tree.add
    fast = FAST_LINE.match
    shapes: dict = {}
    for number, line in enumerate(lines, 1):
        if base:
            if line[:base].strip(" "):
                if line.lstrip(_SKIPPED)[:1] in ("", "#"):
                    continue
                raise fail(f"less indented than the first node line (line {base_line}), which sets "
                           f"the left margin at {base} spaces", number, line, 1,
                           f"at least {base} spaces before every node line")
            line = line[base:]
        if "▼" in line or "|/" in line:
            rest = line.lstrip(_SKIPPED)
            if rest[:1] == "▼" or rest[:2] == "|/":
                rest = rest[1 if rest[0] == "▼" else 2:].strip(" ")
                if not rest or rest[0] == "#":
                    tree.only_child = (number, line)
                    continue
        if "!" in line:
            line, info = split_child_info(line)
            if info is not None:
                tree.add_line(number, line, fast, shapes)
                tree.child_info(number, line, info)
                continue
        m = fast(line)
        if m is not None:
            indent, serial, name, shape, type_name, payload = m.groups()
            if (type_name is None and (shape is not None or (serial is None and name is None))) or len(indent) & 1:
                m = None  # a blank line, or an error for read_line to explain
        if m is not None:
            if serial is not None:
                serial = int(serial)
            if shape is not None:
                shape_text = shape
                shape = shapes.get(shape_text)
                if shape is None:
                    shape = read_shape(shape_text, number, line, m.start("shape"))
                    shapes[shape_text] = shape
            if payload is not None:
                if payload[-1] == " ":
                    payload = payload.rstrip(" ")
                column = m.start("payload")
            else:
                column = 0
            add(number, line, len(indent) >> 1, False, serial, name, shape, type_name, payload, column)
        else:
            parsed = read_line(line, number, tree_width, tree.serials if not check_repeats else None)
            if parsed is not None:
                add(number, line, *parsed)
    return tree.finish()


_SKIPPED = " │├└─‣┌"


def _first_indent(lines):
    """How many spaces the first node line is indented: rust_circuit's texts are indented as a
    whole (inside a Python string), and its parser measures indentation from that line."""
    for number, line in enumerate(lines, 1):
        rest = line.lstrip(" ")
        if rest and rest[0] != "#" and rest.lstrip(_SKIPPED)[:1] not in ("", "#"):
            return len(line) - len(rest), number
    return 0, 0


def _first_unquoted(text: str, chars: str):
    """``(i, ch)``: the first character of ``chars`` outside quotes (backslash escapes inside
    quotes skipped), or ``(len(text), None)``."""
    quoted = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and quoted:
            i += 2
            continue
        if ch == "'":
            quoted = not quoted
        elif ch in chars and not quoted:
            return i, ch
        i += 1
    return n, None


def split_child_info(line):
    """``(line, info)``: a line with rust_circuit's child info (``'fst' [2] Symbol ! 'arg0'``,
    what a Module's argument binds) split at its ``!`` outside quotes; info None without one."""
    i, ch = _first_unquoted(line, "#!")
    if ch != "!":
        return line, None
    return line[:i].rstrip(" "), _strip_comment(line[i + 1:]).strip()


def _strip_comment(info):
    """Child info without a trailing comment (``'sym' ftt # a comment``: rust's printer's
    commenters write them there)."""
    return info[:_first_unquoted(info, "#")[0]]


_FLAGS = re.compile(r"^(.*?)\s+([tf]{3})\s*$")


class _InfoSlot:
    """Where a reference in a Module's child info resolves to (pass 2 writes ``children``)."""

    __slots__ = ("module", "children")

    def __init__(self, module):
        self.module = module
        self.children = module.infos_nodes

    @property
    def position(self):
        return self.module.position

    @property
    def waits(self):
        return self.module.waits

    @waits.setter
    def waits(self, value):
        self.module.waits = value


class _Tree:
    """Pass 1's state: places each line read under its parent (the open item one level up)."""

    def __init__(self):
        self.records: list = []
        self.roots: list = []
        self.found: list = []
        self.order: list = []
        self.open_items: list = []  # the item at each depth on the path to the current line
        self.only_child = None  # (number, line) of a '▼' line: the next line is an only child
        self.tree_width = 3  # glyph columns a level of tree arrows takes (rust's '├‣': 2)
        self.check_repeats = True  # a repeat line must agree with the line it repeats
        self.hidden: dict = {}  # id(only child) -> the parent whose place it took in open_items
        self.serials: dict = {}  # serial -> its first record
        self.idents: dict = {}  # a record's identifier without serial (alias or name) -> first record
        # Payloads read so far, per node type: payload text -> value (a circuit repeats the same
        # specs and indices many times).  Per parse, so a re-registered function is looked up anew.
        self.payloads = {name: {} for name in NODE_TYPE_BY_NAME}

    def add(self, number, line, depth, definition, serial, name, shape, type_name, payload, column, alias=None):
        open_items = self.open_items
        level = len(open_items)
        only_child = self.only_child
        if only_child is not None:  # rust_circuit's '▼': this line is the only child of the line
            self.only_child = None  # above, printed at its parent's indentation
            depth += 1
        if depth > level:
            raise fail(
                f"indented {depth} levels under a line at level {level - 1}" if open_items
                else "the first node line is indented", number, line, 1,
                "at most one level (two spaces) deeper than the line above",
            )
        if depth:
            parent = open_items[depth - 1]
            if type(parent) is _Reference or parent.cls.child_count[1] == 0:
                raise _childless(parent, number, line)
        else:
            parent = None
        if level > depth:
            self._close(level - depth)
        if type_name is None:
            if definition:
                raise fail("a '~' definition block needs a node type", number, line, 1,
                           "'~ [serial] ['name'] [shape] Type [payload]'")
            item = _Reference(number, line, serial, name if alias is None else alias)
            self.found.append((parent, len(parent.children) if parent is not None else len(self.roots), item))
        else:
            cls = NODE_TYPE_BY_NAME[type_name]
            item = _Record(number, line, serial, name, shape, cls, None, column)
            item.alias = alias
            if serial is not None:
                item.repeat_of = self.serials.setdefault(serial, item)
            elif alias is not None or name is not None:
                item.repeat_of = self.idents.setdefault(alias if alias is not None else name, item)
            if item.repeat_of is item:
                item.repeat_of = None
            known = self.payloads[type_name]
            value = known.get(payload, _UNREAD)
            if value is _UNREAD:
                try:
                    value = cls.parse_payload(payload)
                except ParseError as e:
                    if payload is None and item.repeat_of is not None:
                        value = _NOT_GIVEN  # a repeat may leave the payload out
                    else:
                        raise e.at(number, line, column) from None
                else:
                    known[payload] = value
            item.payload = value
            self.records.append(item)
        if parent is not None:
            parent.children.append(item)
        elif not definition:
            self.roots.append(item)
        open_items.append(item)
        if only_child is not None:
            if parent is None:
                raise fail("'▼' (an only child follows) above a root line", only_child[0], only_child[1], 1,
                           "'▼' between a node line and its only child")
            open_items.pop()
            open_items[-1] = item
            self.hidden[id(item)] = parent

    def add_line(self, number, line, fast, shapes):
        """Read one line that the fast path may not see (the line part of a child-info line)."""
        parsed = read_line(line, number, self.tree_width)
        if parsed is None:
            raise fail("child info ('!') after no node", number, line, 1, "a node line before '!'")
        self.add(number, line, *parsed)

    def child_info(self, number, line, info):
        """Attach a Module argument's child info (``'sym'`` or a Symbol line, then optional
        ``ftt`` flags) to the Module above the line just read."""
        open_items = self.open_items
        parent = open_items[-2] if len(open_items) > 1 else None
        if parent is None or type(parent) is _Reference or not parent.cls.takes_child_info:
            raise fail("child info ('! ...') only follows an argument line of a Module", number, line,
                       len(line) + 1, "a line under a Module, or no '!'")
        if len(parent.children) < 2:
            raise fail("the first child of a Module is its body, which takes no child info", number, line,
                       len(line) + 1, "the body line without '!'")
        m = _FLAGS.match(info)
        text, flags = (m.group(1), m.group(2)) if m else (info, "ttt")
        parsed = read_line(text, number)
        if parsed is None or parsed[0] or parsed[1]:
            raise fail(f"cannot read the child info {info!r}", number, line, None,
                       "! 'symbol name' (or a Symbol line), optionally followed by flags like ftt")
        _, _, serial, name, shape, type_name, payload, column = parsed[:8]
        if parent.infos is None:
            parent.infos = []
            parent.infos_nodes = []
        if len(parent.infos) != len(parent.children) - 2:
            raise fail(f"an earlier argument line of the Module on line {parent.line_number} has no child info",
                       number, line, 1, "! 'symbol' on every argument line of a Module")
        position = len(parent.infos)
        if type_name is None:
            item = _Reference(number, line, serial, name)
            slot = _InfoSlot(parent)
            self.found.append((slot, position, item))
        else:
            cls = NODE_TYPE_BY_NAME[type_name]
            try:
                value = cls.parse_payload(payload)
            except ParseError as e:
                # shown on the line as written (line ! info), the caret under the info's payload
                raise e.at(number, f"{line} ! {info}", len(line) + 3 + column) from None
            item = _Record(number, line, serial, name, shape, cls, value, 0)
            self.records.append(item)
            item.position = len(self.order)
            self.order.append(item)
        parent.infos.append(flags)
        parent.infos_nodes.append(item)

    def _close(self, count):
        """The last ``count`` open items' subtrees end here (and those of the parents an only
        child hid)."""
        pop, order, hidden = self.open_items.pop, self.order, self.hidden
        for _ in range(count):
            item = pop()
            while item is not None:
                if type(item) is _Record:
                    if item.repeat_of is not None:
                        _repeat(item, self.check_repeats)
                    item.position = len(order)
                    order.append(item)
                item = hidden.pop(id(item), None) if hidden else None

    def finish(self):
        self._close(len(self.open_items))
        return self.records, self.roots, self.found, self.order


_UNREAD = object()
_NOT_GIVEN = object()


def _repeat(r, check=True):
    """A line whose identifier an earlier line defined (rust_circuit restates repeated nodes:
    ``1 Scalar``, ``2 [] Scalar 1``).  A repeated serial is always that node; a repeated name
    is when the line could not be a node of its own (no children where its type takes some, or a
    leaf without its shape), else it is another node bearing the same name.  What the line
    restates must agree with the first line."""
    first = r.repeat_of
    if r.serial is None and r.children and r.cls.child_count[0] > 0:
        r.repeat_of = None
        if r.payload is _NOT_GIVEN:
            r.cls.parse_payload(None)  # raises what is missing
        return
    if (r.serial is None and not r.children and r.cls.child_count[1] == 0 and r.shape is not None
            and r.payload is not _NOT_GIVEN):
        # A complete leaf line: the node it says.  When it says what the first line says, it is
        # that node (rust_circuit's identifier is the name: two 'my_arg' [] Scalar 3874 lines are
        # one node, and one random 'Array rand'), so a reference by the name is not ambiguous.
        if (r.cls, r.name, r.shape, r.payload) != (first.cls, first.name, first.shape, first.payload) \
                or first.children or first.position < 0:
            r.repeat_of = None
            return
    if r.children:
        raise r.error(f"line {first.line_number} already defined this node, so it cannot have "
                      "children here", "no children under a repeated node")
    for what, mine, theirs in (("type", r.cls, first.cls), ("name", r.name, first.name),
                               ("shape", r.shape, first.shape), ("payload", r.payload, first.payload)) * check:
        if mine is not None and mine is not _NOT_GIVEN and mine != theirs:
            shown = (lambda v: v.type_name) if what == "type" else repr
            raise r.error(f"this line repeats line {first.line_number} with another {what}: "
                          f"{shown(mine)}, not {shown(theirs)}", f"the {what} line {first.line_number} gives, or none", 1)
    if first.position < 0:
        raise r.error(f"a cycle: this line repeats line {first.line_number}, a node it is inside",
                      "references only to nodes outside the referring subtree")
    r.repeat = True
    r.children = [first]


def _childless(parent, number, line):
    if type(parent) is _Reference:
        return fail(f"line {parent.line_number} refers to a node defined elsewhere, so it cannot "
                    "have children", number, line, 1, "children only under a line with a node type")
    return fail(f"line {parent.line_number} is an {parent.cls.type_name}, which has no children",
                number, line, 1, "children only under a node that takes them")


# ---------------------------------------------------------------------------- pass 2: references
def _external_table(references):
    if references is None:
        return {}
    if isinstance(references, dict):
        items = references.items()
    else:
        items = []
        for node in references:
            if not isinstance(node, Circuit):
                raise TypeError(f"references must be circuit nodes, got {type(node).__name__}")
            if node.name is None:
                raise TypeError(f"a reference needs a name to be referred to: {node!r}")
            items.append((node.name, node))
    table = {}
    for name, node in items:
        if not isinstance(node, Circuit):
            raise TypeError(f"references[{name!r}] is a {type(node).__name__}, not a circuit node")
        record = _Record(None, None, None, name, None, type(node), None, 0)
        record.node = node
        table[name] = record
    return table


def _resolve(records, roots, found, externals):
    by_serial: dict = {}
    by_name: dict = {}
    for r in records:
        if r.repeat:
            continue
        if r.serial is not None:
            other = by_serial.get(r.serial)
            if other is not None:
                raise r.error(f"serial {r.serial} is already used on line {other.line_number}",
                              "a serial number no other node has", 1)
            by_serial[r.serial] = r
        if r.name is not None:
            by_name.setdefault(r.name, []).append(r)
        if r.alias is not None and r.alias != r.name:
            by_name.setdefault(r.alias, []).append(r)

    def target(ref):
        if ref.serial is not None:
            r = by_serial.get(ref.serial)
            if r is not None:
                if ref.name is not None and r.name != ref.name:
                    found = "unnamed" if r.name is None else quote_name(r.name)
                    raise fail(f"serial {ref.serial} is {found} (line {r.line_number}), not "
                               f"{quote_name(ref.name)}", ref.line_number, ref.line, None,
                               "the serial and name of one node")
                return r
            if ref.name is None or ref.name not in externals:
                raise fail(f"no node has serial {ref.serial}", ref.line_number, ref.line, None,
                           "the serial of a node defined somewhere in the text")
            return externals[ref.name]
        found = by_name.get(ref.name)
        if found is not None:
            if len(found) > 1:
                lines = ", ".join(str(r.line_number) for r in found[:5])
                raise fail(f"{len(found)} nodes are named {quote_name(ref.name)} (lines {lines})",
                           ref.line_number, ref.line, None, "the serial number too, e.g. "
                           f"{found[0].serial if found[0].serial is not None else 0} {quote_name(ref.name)}")
            return found[0]
        external = externals.get(ref.name)
        if external is None:
            raise fail(f"no node named {quote_name(ref.name)} is defined", ref.line_number, ref.line, None,
                       "a node defined somewhere in the text, or given in references=")
        return external

    for parent, position, ref in found:
        node = target(ref)
        if parent is None:
            roots[position] = node
        else:
            parent.children[position] = node
            if node.position >= parent.position:  # (equal: a node inside itself, a cycle)
                parent.waits = True


# ---------------------------------------------------------------------------- pass 3: dtypes
def _mark_int_indices(records):
    """Mark the records that hold int indices: what each node class says its index children
    are (``index_children``), followed through the nodes that pass an index on."""
    stack = []
    # (only a class with its own index_children can name index children of a node that is no index)
    seeding = {t for t in NODE_TYPE_BY_NAME.values() if "index_children" in vars(t)}
    for r in records:
        if r.cls in seeding and not r.repeat:
            children = r.children
            for i in r.cls.index_children(r.payload, len(children), False):
                stack.append(children[i])
    while stack:
        r = stack.pop()
        if r.int_index:
            continue
        r.int_index = True
        children = r.children
        if r.repeat:
            stack.append(children[0])
            continue
        stack.extend([children[i] for i in r.cls.index_children(r.payload, len(children), True)])


# ---------------------------------------------------------------------------- pass 4: nodes
def _build(order, store, seed=0):
    """Build every record.  ``order`` already puts indented children before their parents, so
    only references to nodes not yet built (defined later in the text) need a walk."""
    rng = RandomTensors(seed)  # rust_circuit's random Arrays, within the allocation budget
    contexts = (ParseContext(store, "float32", rng), ParseContext(store, "int64", rng))  # by int_index
    for top in order:
        if top.node is None:
            if top.waits:
                _build_walk(top, contexts)
            else:
                top.node = _node(top, contexts)


def _build_walk(top, contexts):
    """Build a record whose references reach forward in the text, children first."""
    stack = [top]
    while stack:
        r = stack[-1]
        if r.node is not None:
            stack.pop()
            continue
        if not r.expanded:
            r.expanded = True
            for k in r.children:
                if k.node is None:
                    if k.expanded:
                        raise r.error(
                            f"a cycle: line {k.line_number} is referred to from inside its own "
                            "subtree", "references only to nodes outside the referring subtree")
                    stack.append(k)
            continue
        stack.pop()
        r.node = _node(r, contexts)


def _child_info_payload(r, kids, contexts):
    """A Module's ``[(symbol, flags)]`` from its arguments' child info (its class checks that
    each is a Symbol)."""
    infos = r.infos or []
    if len(infos) != len(kids) - 1:
        raise r.error(f"this Module has {len(kids) - 1} argument lines but {len(infos)} say which Symbol "
                      "they bind", "each argument line ending in ! 'symbol' (the Symbol of the body it replaces)")
    out = []
    for k, flags in zip(r.infos_nodes or [], infos):
        if k.node is None:
            k.node = _node(k, contexts)
        out.append((k.node, flags))
    return out


def _node(r, contexts):
    if r.repeat:
        return r.children[0].node
    cls = r.cls
    kids = [k.node for k in r.children]
    least, most = cls.child_count
    if len(kids) < least or (most is not None and len(kids) > most):
        want = f"{least}" if least == most else f"at least {least}" if most is None else f"{least} to {most}"
        raise r.error(f"{cls.type_name} takes {'one child' if want == '1' else want + ' children'}, "
                      f"got {len(kids)}", f"{want} indented child line(s)")
    payload = r.payload
    if cls.takes_child_info:
        payload = _child_info_payload(r, kids, contexts)
    try:
        node = cls.from_payload(payload, kids, r.name, r.shape, contexts[r.int_index])
    except ParseError as e:  # the line is wrong (columns counted within the payload)
        raise e.at(r.line_number, r.line, r.payload_column) from None
    except CircuitError as e:  # a constructor refusing the node: ShapeError, ...  (anything else
        # is a bug in the library, and is left to say so)
        raise r.error(f"cannot build this {cls.type_name}: {e}",
                      "children and payload that fit together") from None
    if r.shape is not None and node.shape != r.shape:
        raise r.error(
            f"the line says shape {shape_text(r.shape)} but the node computes {shape_text(node.shape)}",
            f"shape {shape_text(node.shape)} (or none: it is implied)")
    return node
