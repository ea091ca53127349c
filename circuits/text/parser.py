"""Parse the text format (see ``circuits.text``) back into circuits.

Parsing runs in four passes, none recursive, so a 50,000-deep text parses like a flat one:

1. read every line into a record (identifier, shape, type, payload) and attach it to the record
   one level less indented above it;
2. resolve references (``20 'ln.mean_subbed'``, ``'idxed_embeds'``, ``7``) against the records
   defined anywhere in the text, then against ``references``; definition blocks (``~`` roots,
   written by the printer for deep circuits) may be referred to before or after they appear;
3. give each placeholder Array, and each Symbol printed without a dtype, a dtype: ``int64``
   when it reaches, through Index, Rearrange, Concat or Tag, the index argument of a gather
   function (``gen_index_at_0_c``...), else ``float32``;
4. build the nodes children-first with the public constructors (which validate), checking every
   printed shape against the one the node computes.

Any text gives circuits or a ``ParseError`` naming the line number, the line, the column where it
can and what was expected; the library's errors from node constructors (a ``ShapeError``...) are wrapped into
one (any other exception is a bug and propagates as it is).  An Array is looked up in ``store`` (``store.find(prefix)``, then ``store.get(full_hash)``)
and becomes a placeholder when the store lacks it or no store is given: a placeholder with the
dtype of pass 3, unless the store knows the placeholder itself (an optional
``store.placeholder(prefix, shape, name)``: a circuit file records its placeholders' dtypes).
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

import uuid as uuid_module

from ..errors import CircuitError, ParseError, StoreError
from ..nodes import Add, Array, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar, Symbol, Tag
from ..shapes import shape_text
from ..nodes.base import quote_name
from ..nodes.einsum import parse_spec
from ..nodes.rearrange import parse_rearrange_spec
from .lexer import FAST_LINE, remember_payload, fail, read_index, read_line, read_shape, read_symbol_payload
from .printer import gc_paused

_HEX = frozenset("0123456789abcdefABCDEF")
# Node types an int index passes through unchanged on its way to a gather.
_INDEX_PATH_TYPES = frozenset(("Index", "Rearrange", "Concat", "Tag"))
_LEAF_TYPES = frozenset(("Array", "Scalar", "Symbol"))
_ONE_CHILD_TYPES = frozenset(("Index", "Rearrange", "Tag"))


class _Record:
    """One definition line, later its node."""

    __slots__ = ("line_number", "line", "serial", "name", "shape", "type_name", "payload",
                 "payload_column", "children", "node", "expanded", "int_index", "function",
                 "position", "waits")

    def __init__(self, line_number, line, serial, name, shape, type_name, payload, payload_column):
        self.line_number = line_number
        self.line = line
        self.serial = serial
        self.name = name
        self.shape = shape
        self.type_name = type_name
        self.payload = payload
        self.payload_column = payload_column
        self.children = []
        self.node = None
        self.expanded = False
        self.position = -1  # where its subtree ends in the text (children come first)
        self.waits = False  # refers to a node whose subtree ends later in the text
        self.int_index = False
        self.function = None

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


def parse(text: str, store=None, references=None) -> Circuit:
    """The circuit a text describes: its last root (earlier roots and ``~`` blocks define nodes
    it may refer to).

    >>> print(parse("'z' Add\\n  'one' [] Scalar 1\\n  'one'").to_text())
    'z' Add
      'one' [] Scalar 1
      'one'
    """
    return parse_many(text, store=store, references=references)[-1]


def parse_many(text: str, store=None, references=None) -> list:
    """Every root of a text, in order; roots share the nodes they refer to.

    ``references`` (a dict name -> node, or an iterable of named nodes) supplies nodes the text
    refers to by name without defining them.

    >>> from circuits import Scalar
    >>> a, b = parse_many("'a' Add\\n  'one'\\n'b' Add\\n  'one'\\n  'one'", references=[Scalar(1.0, name='one')])
    >>> b.children[0] is a.children[0]
    True
    """
    if not isinstance(text, str):
        raise TypeError(f"parse takes a str, got {type(text).__name__}")
    with gc_paused():
        records, roots, references_found, order = _read(text)
        externals = _external_table(references)
        _resolve(records, roots, references_found, externals)
        _mark_int_indices(records)
        _build(order, store)
        nodes = [r.node for r in roots]
        # Free the records while the collector is off, so it never has to scan them.
        del records, roots, references_found, order, externals
    if not nodes:
        raise fail("the text holds no circuit", None, None, None, "at least one unindented node line")
    return nodes


# ---------------------------------------------------------------------------- pass 1: lines
def _read(text):
    """Records (definition lines) in text order, the roots, the reference lines as
    ``(parent or None, child position, reference)``, and the records in the order their subtrees
    end (children before parents for every indented child)."""
    records: list = []
    roots: list = []
    found: list = []
    order: list = []
    open_items: list = []  # the item at each depth on the path to the current line
    functions: dict = {}
    lines = text.split("\n")
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    fast = FAST_LINE.match
    shapes: dict = {}
    pop, close = open_items.pop, order.append
    for number, line in enumerate(lines, 1):
        m = fast(line)
        if m is not None:
            indent, serial, name, shape, type_name, payload = m.groups()
            if (type_name is None and (shape is not None or (serial is None and name is None))) or len(indent) & 1:
                m = None  # a blank line, or an error for read_line to explain
        if m is not None:
            depth = len(indent) >> 1
            definition = False
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
        else:
            parsed = read_line(line, number)
            if parsed is None:
                continue
            depth, definition, serial, name, shape, type_name, payload, column = parsed
        level = len(open_items)
        if depth > level:
            raise fail(
                f"indented {depth} levels under a line at level {level - 1}" if open_items
                else "the first node line is indented", number, line, 1,
                "at most one level (two spaces) deeper than the line above",
            )
        if depth:
            parent = open_items[depth - 1]
            if type(parent) is _Reference or parent.type_name in _LEAF_TYPES:
                raise _childless(parent, number, line)
        else:
            parent = None
        while level > depth:
            item = pop()
            if type(item) is _Record:
                item.position = len(order)
                close(item)
            level -= 1
        if type_name is None:
            if definition:
                raise fail("a '~' definition block needs a node type", number, line, 1,
                           "'~ [serial] ['name'] [shape] Type [payload]'")
            item = _Reference(number, line, serial, name)
            found.append((parent, len(parent.children) if parent is not None else len(roots), item))
        else:
            item = _Record(number, line, serial, name, shape, type_name, payload, column)
            records.append(item)
            if type_name == "GeneralFunction":
                item.function = functions.get(payload) or _function(item, functions)
        if parent is not None:
            parent.children.append(item)
        elif not definition:
            roots.append(item)
        elif type(item) is _Reference:  # pragma: no cover - refused above
            raise AssertionError
        open_items.append(item)
    for item in reversed(open_items):
        if type(item) is _Record:
            item.position = len(order)
            order.append(item)
    return records, roots, found, order


def _childless(parent, number, line):
    if type(parent) is _Reference:
        return fail(f"line {parent.line_number} refers to a node defined elsewhere, so it cannot "
                    "have children", number, line, 1, "children only under a line with a node type")
    return fail(f"line {parent.line_number} is an {parent.type_name}, which has no children",
                number, line, 1, "children only under a node that takes them")


def _function(record, cache):
    from ..functions import family_grammars, lookup

    name = record.payload
    if name is None:
        raise record.error("a GeneralFunction needs its function's name", "e.g. 'GeneralFunction softmax'")
    spec = cache.get(name)
    if spec is None:
        try:
            spec = lookup(name)
        except CircuitError:  # not registered, and no family's name
            raise record.error(f"unknown GeneralFunction {name!r}",
                               "a registered function name (circuits.functions.registered_names()) or "
                               + " or ".join(family_grammars()),
                               record.payload_column + 1) from None
        cache[name] = spec
    return spec


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
        record = _Record(None, None, None, name, None, node.type_name, None, 0)
        record.node = node
        table[name] = record
    return table


def _resolve(records, roots, found, externals):
    by_serial: dict = {}
    by_name: dict = {}
    for r in records:
        if r.serial is not None:
            other = by_serial.get(r.serial)
            if other is not None:
                raise r.error(f"serial {r.serial} is already used on line {other.line_number}",
                              "a serial number no other node has", 1)
            by_serial[r.serial] = r
        if r.name is not None:
            by_name.setdefault(r.name, []).append(r)

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
    seen = set()
    stack = []
    for r in records:
        spec = r.function
        if spec is not None and spec.index_arg is not None and spec.index_arg < len(r.children):
            stack.append(r.children[spec.index_arg])
    while stack:
        r = stack.pop()
        if id(r) in seen:
            continue
        seen.add(id(r))
        if r.type_name in ("Array", "Symbol"):
            r.int_index = True
        elif r.type_name in _INDEX_PATH_TYPES:
            stack.extend(r.children)


# ---------------------------------------------------------------------------- pass 4: nodes
def _build(order, store):
    """Build every record.  ``order`` already puts indented children before their parents, so
    only references to nodes not yet built (defined later in the text) need a walk."""
    for top in order:
        if top.node is None:
            if top.waits:
                _build_walk(top, store)
            else:
                top.node = _node(top, store)


def _build_walk(top, store):
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
        r.node = _node(r, store)


def _node(r, store):
    builder = _BUILDERS[r.type_name]
    kids = [k.node for k in r.children]
    try:
        node = builder(r, kids, store)
    except ParseError:
        raise
    except CircuitError as e:  # a constructor refusing the node: ShapeError, ...  (anything else
        # is a bug in the library, and is left to say so)
        raise r.error(f"cannot build this {r.type_name}: {e}",
                      "children and payload that fit together") from None
    if r.shape is not None and node.shape != r.shape:
        if r.type_name == "Array":
            raise r.error(
                f"the tensor with this hash has shape {shape_text(node.shape)}, not {shape_text(r.shape)}",
                f"shape {shape_text(node.shape)} or another hash")
        raise r.error(
            f"the line says shape {shape_text(r.shape)} but the node computes {shape_text(node.shape)}",
            f"shape {shape_text(node.shape)} (or none: it is implied)")
    return node


def _payload(r, what, expected):
    if r.payload is None:
        raise r.error(f"{r.type_name} needs {what}", expected)
    return r.payload


def _leaf(r, kids):
    if r.shape is None:
        raise r.error(f"an {r.type_name} line needs its shape", f"a shape like [300,256] before {r.type_name}")


def _one_child(r, kids):
    if len(kids) != 1:
        raise r.error(f"{r.type_name} takes one child, got {len(kids)}", "one indented child line")


def _array(r, kids, store):
    _leaf(r, kids)
    digest = _payload(r, "its content hash", "hex digits, e.g. 'Array 26cf3704c325241f6eb75ce7'")
    if not _HEX.issuperset(digest):
        raise r.error(f"{digest!r} is not a hex hash", "hex digits (0-9, a-f)", r.payload_column + 1)
    if store is not None:
        try:
            full = store.find(digest.lower())
        except StoreError as e:
            raise r.error(str(e), "a longer hash prefix, unique in the store", r.payload_column + 1) from None
        if full is not None:
            return Array(store.get(full), name=r.name)
        known = getattr(store, "placeholder", None)
        node = None if known is None else known(digest.lower(), r.shape, r.name)
        if node is not None:
            return node
    dtype = "int64" if r.int_index else "float32"
    return Array.placeholder(r.shape, digest, name=r.name, dtype=dtype)


def _scalar(r, kids, store):
    _leaf(r, kids)
    text = _payload(r, "its value", "a number like 1, -10000, 0.00001, nan or inf")
    try:
        value = float(text)
    except ValueError:
        raise r.error(f"{text!r} is not a number", "a number like 1, -10000, 0.00001, nan or inf",
                      r.payload_column + 1) from None
    return Scalar(value, r.shape, name=r.name)


def _symbol(r, kids, store):
    _leaf(r, kids)
    dtype, uid = read_symbol_payload(r.payload, r.line_number, r.line, r.payload_column)
    # Without a dtype, a Symbol that indexes a gather is int64 (rust_circuit prints no dtypes:
    # its loss module's label Symbol is one), any other float32.
    return Symbol(r.shape, name=r.name, dtype=dtype or ("int64" if r.int_index else "float32"), uuid=uid)


_SPECS: dict = {}


def _einsum(r, kids, store):
    spec = _payload(r, "its spec", "a spec like ab,bc->ac")
    axes = _SPECS.get(spec)
    if axes is None:
        try:
            axes = parse_spec(spec)
        except CircuitError as e:
            raise r.error(str(e), "a spec like qc,kc,,qk->qk", r.payload_column + 1) from None
        remember_payload(_SPECS, spec, axes)
    in_axes = axes[0]
    if not in_axes and len(kids) == 1:
        in_axes = ((),)  # '->' is both no operand and one scalar operand: the children decide
    return Einsum(*kids, in_axes=in_axes, out_axes=axes[1], name=r.name)


def _add(r, kids, store):
    if r.payload is not None:
        raise r.error(f"Add takes no payload, got {r.payload!r}", "nothing after 'Add'", r.payload_column + 1)
    return Add(*kids, name=r.name)


def _general_function(r, kids, store):
    return GeneralFunction(r.function, *kids, name=r.name)


def _index(r, kids, store):
    text = _payload(r, "its index", "an index like [0,:,:]")
    index = read_index(text, r.line_number, r.line, r.payload_column)
    _one_child(r, kids)
    return Index(kids[0], index, name=r.name)


_REARRANGE_SPECS: dict = {}


def _rearrange(r, kids, store):
    text = _payload(r, "its spec", "a spec like '(h d) s -> h s d h=2'")
    _one_child(r, kids)
    spec = _REARRANGE_SPECS.get(text)
    if spec is None:
        words = text.split()
        sizes = {}
        while words and "=" in words[-1]:
            k, _, v = words.pop().partition("=")
            try:
                sizes[k] = int(v)
            except ValueError:
                raise r.error(f"size {k}={v!r} is not an int", "sizes like h=2",
                              r.payload_column + 1) from None
        try:
            groups = parse_rearrange_spec(" ".join(words))
        except CircuitError as e:
            raise r.error(str(e), "a spec like '(h d) s -> h s d h=2'", r.payload_column + 1) from None
        spec = (groups, sizes)
        remember_payload(_REARRANGE_SPECS, text, spec)
    return Rearrange(kids[0], spec[0], name=r.name, **spec[1])


def _concat(r, kids, store):
    text = _payload(r, "its axis", "an int axis, e.g. 'Concat 0'")
    try:
        axis = int(text)
    except ValueError:
        raise r.error(f"{text!r} is not an axis", "an int axis, e.g. 'Concat 0'", r.payload_column + 1) from None
    return Concat(*kids, axis=axis, name=r.name)


def _tag(r, kids, store):
    text = _payload(r, "its uuid", "a uuid like 00000000-0000-0000-0000-000000000001")
    try:
        uid = uuid_module.UUID(text)
    except ValueError:
        raise r.error(f"{text!r} is not a uuid", "a uuid like 00000000-0000-0000-0000-000000000001",
                      r.payload_column + 1) from None
    _one_child(r, kids)
    return Tag(kids[0], uid, name=r.name)


_BUILDERS = {
    "Array": _array, "Scalar": _scalar, "Symbol": _symbol, "Einsum": _einsum, "Add": _add,
    "GeneralFunction": _general_function, "Index": _index, "Rearrange": _rearrange,
    "Concat": _concat, "Tag": _tag,
}
