"""Reproducible cases: ``CircuitWithInputs``, a circuit with values for its Symbols whose repr is a
call that rebuilds it, and ``describe_case``, that repr — what a failing property test prints, ready
to paste and run."""

from __future__ import annotations

import numpy as np

from ..dtypes import DEFAULT_FLOAT
from ..errors import CircuitError
from ..nodes import Array, Circuit, Symbol


class CircuitWithInputs(tuple):
    """What ``circuits_with_inputs`` draws: a circuit and a value for each of its Symbols.  A
    pair (``circuit, inputs = case``; ``case.circuit``, ``case.inputs``) whose repr — the one
    hypothesis prints for a falsifying example — is a call that rebuilds it (see ``describe_case``):
    pasted after ``from circuits.testing import CircuitWithInputs``, it runs.

    ``circuit`` is a circuit or its text; ``arrays`` gives values to its Arrays by the content hash
    the text prints (``'8dca9d37…': [1.0, 2.0]``, or ``('int64', [0, 1])`` for another dtype than
    float32), so that unnamed and same-named Arrays are bound too; ``inputs`` maps each Symbol — or
    its name, or for an unnamed or same-named one its line (``'[2] Symbol'``) — to its value.

    >>> case = CircuitWithInputs("0 Add\\n  'x' [2] Symbol\\n  1 [2] Array 8dca9d37eb1d6a2b9a1a2ba9",
    ...                          arrays={'8dca9d37eb1d6a2b9a1a2ba9': [1.0, 2.0]}, inputs={'x': [0.5, -1.0]})
    >>> circuit, inputs = case
    >>> circuit.evaluate(inputs).tolist()
    [1.5, 1.0]
    >>> again = eval(repr(case))
    >>> again.circuit == circuit, again.inputs[circuit.get_unique('x')].tolist()
    (True, [0.5, -1.0])
    """

    __slots__ = ()

    def __new__(cls, circuit, inputs=None, arrays=None):
        if isinstance(circuit, str):
            from ..text import parse

            circuit = parse(circuit.strip("\n"))
        if not isinstance(circuit, Circuit):
            raise CircuitError(f"CircuitWithInputs takes a circuit or its text, not {type(circuit).__name__}")
        if arrays:
            circuit = _with_arrays(circuit, arrays)
        return tuple.__new__(cls, (circuit, _symbol_keys(circuit, inputs or {})))

    def __getnewargs__(self):
        return tuple(self)

    @property
    def circuit(self) -> Circuit:
        return self[0]

    @property
    def inputs(self) -> dict:
        return self[1]

    def __repr__(self):
        return describe_case(self.circuit, self.inputs)

    def _repr_pretty_(self, p, cycle):
        p.text(repr(self))


def _with_arrays(circuit, arrays):
    """``circuit`` with its Arrays given the values of ``arrays`` (printed content hash -> values,
    or (dtype, values)): a parsed circuit's placeholders become the Arrays that printed it."""
    from ..traversal import replace, toposort

    found = {n: k for n in toposort(circuit) if type(n) is Array
             for k in arrays if n.content_hash.lower().startswith(k.lower()) or k.lower().startswith(n.content_hash.lower())}
    unknown = sorted(set(arrays) - set(found.values()))
    if unknown:
        raise CircuitError(f"CircuitWithInputs: no Array of this circuit prints the hash {', '.join(unknown)}")
    mapping = {}
    for node, key in found.items():
        value = arrays[key]
        dtype = node.dtype
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
            dtype, value = value
        if isinstance(value, str):
            raise CircuitError(f"CircuitWithInputs: arrays[{key!r}] is {value}, not its values (it was too big "
                               "to print): give the values, or a store when parsing the text")
        try:
            array = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as e:
            raise CircuitError(f"CircuitWithInputs: arrays[{key!r}] is no {dtype} array: {e}") from None
        if array.shape != node.shape:
            raise CircuitError(f"CircuitWithInputs: arrays[{key!r}] has shape {list(array.shape)}; "
                               f"{node.line()} has shape {list(node.shape)}")
        mapping[node] = Array(array, name=node.name)
    return replace(circuit, mapping)


def _symbol_keys(circuit, inputs):
    """``inputs`` keyed by the Symbols themselves: a name, or a Symbol's line (``'[2] Symbol'``,
    what an unnamed or same-named Symbol prints), stands for its Symbol."""
    from ..traversal import toposort

    symbols = [n for n in toposort(circuit) if type(n) is Symbol]
    by_label: dict = {}
    for n in symbols:
        by_label.setdefault(n.name, []).append(n)
        by_label.setdefault(n.line(), []).append(n)
    out = {}
    for key, value in inputs.items():
        if isinstance(key, Circuit):
            out[key] = value
            continue
        matches = by_label.get(key, [])
        if len(matches) != 1:
            have = sorted({_label(n, symbols) for n in symbols})
            raise CircuitError(f"CircuitWithInputs: inputs key {key!r} names {len(matches)} Symbols of the circuit "
                               f"(one needed); its Symbols are {have}")
        symbol = matches[0]
        if not hasattr(value, "dtype"):
            value = np.asarray(value, dtype="float32" if symbol.dtype == "bfloat16" else symbol.dtype)
        out[symbol] = value
    return out


def _label(node, nodes) -> str:
    """A Symbol's name where no other node of ``nodes`` has it, else its line."""
    if node.name is not None and sum(n.name == node.name for n in nodes) == 1:
        return node.name
    return node.line()


#: Arrays with at most this many entries have their values shown in a failing example (every
#: Array the strategies draw has fewer): a bigger one shows its dtype and shape only.
SHOWN_ARRAY_ENTRIES = 4096


def describe_case(circuit, inputs=None) -> str:
    """A circuit in the text format (in full, however deep), the values of its Arrays (by the
    content hash the text prints; up to ``SHOWN_ARRAY_ENTRIES`` entries) and of ``inputs``, as a
    ``CircuitWithInputs(...)`` call that rebuilds the case: what a failing example shows, ready
    to paste and run.

    >>> import numpy as np
    >>> from circuits import Add, Array, Symbol
    >>> x = Symbol((2,), name='x')
    >>> w = Array(np.array([1.0, 2.0], np.float32))
    >>> print(describe_case(Add(x, w, name='y'), {x: np.array([0.5, -1.0])}))
    CircuitWithInputs(circuit=r'''
    'y' Add
      'x' [2] Symbol
      0 [2] Array 8dca9d37eb1d6a2b9a1a2ba9
    ''',
    arrays={'8dca9d37eb1d6a2b9a1a2ba9': [1.0, 2.0]},
    inputs={'x': [0.5, -1.0]})
    """
    from ..traversal import toposort

    nodes = toposort(circuit)
    symbols = [n for n in nodes if type(n) is Symbol]

    def values(arr, default):
        arr = np.asarray(arr)
        if arr.size > SHOWN_ARRAY_ENTRIES:
            return repr(f"<{arr.dtype} {list(arr.shape)}>")
        shown = arr.tolist()
        return repr(shown) if arr.dtype.name == default else repr((arr.dtype.name, shown))

    arrays = {}
    for n in nodes:
        if type(n) is Array and n.value is not None:
            arrays.setdefault(n.short_hash, f"{n.short_hash!r}: {values(n.value, DEFAULT_FLOAT)}")
    given = []
    for k, v in (inputs or {}).items():
        label = _label(k, symbols) if isinstance(k, Circuit) else k
        given.append(f"{label!r}: {values(v, np.asarray(v).dtype.name)}")
    # A raw string: the text's escapes (\' \n \u202e...) paste back unchanged.
    return (f"CircuitWithInputs(circuit=r'''\n{circuit.to_text()}\n''',\n"
            f"arrays={{{', '.join(arrays.values())}}},\ninputs={{{', '.join(given)}}})")
