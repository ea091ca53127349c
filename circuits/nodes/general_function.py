"""GeneralFunction: a registered function (softmax, rsqrt, gen_index_at_0_c, ...) of its children."""

from __future__ import annotations

from .. import functions as _functions  # a module object: circuits.functions imports this package
from ..errors import CircuitError, ParseError, ShapeError
from ..shapes import int_tuple
from .base import Circuit, check_children, dtype_of, quote_name, shape_error, shape_of
from .expansion import ExpandError, aligned

# Shape and dtype rules are pure functions of the children's shapes and dtypes, and circuits
# apply the same function to the same shapes over and over: remember the answers.  Keyed by the
# spec's id (FunctionSpec hashes slowly) with the spec kept in the value, so a re-registered
# function never sees an old answer.
_RULE_RESULTS: dict = {}
_RULE_CACHE_SIZE = 4096


# Array content hash -> (min, max) of its values, for the index check below.
_EXTREMES: dict = {}


def _check_known_indices(spec, children, name):
    """A gather whose index is an Array with values: every value must select an entry (an
    out-of-range index would silently give NaN, e.g. a token id >= the vocabulary size).
    Indices known only at evaluation (Symbols) are checked when bound."""
    g = spec.gather
    if g is None or len(children) != 2:
        return
    x, idx = children
    value = getattr(idx, "value", None)
    if idx.type_name != "Array" or value is None or not idx.numel:
        return
    extremes = _EXTREMES.get(idx.content_hash)
    if extremes is None:
        import numpy as np

        arr = np.asarray(value)
        extremes = (int(arr.min()), int(arr.max()))
        if len(_EXTREMES) >= _RULE_CACHE_SIZE:
            _EXTREMES.clear()
        _EXTREMES[idx.content_hash] = extremes
    ax = g.axis(len(x.shape), len(idx.shape))
    lo, hi = g.valid_range(x.shape[ax])
    if lo <= extremes[0] and extremes[1] < hi:
        return
    bad = extremes[0] if extremes[0] < lo else extremes[1]
    raise shape_error(
        "GeneralFunction", name, spec.name, children,
        f"index {bad} is out of range for axis {ax} of size {x.shape[ax]} (valid: {lo} to {hi - 1})",
        "fix the index values (token ids must be below the vocabulary size)",
    )


class GeneralFunction(Circuit):
    """A function from the registry in ``circuits.functions`` applied to the children.

    >>> import numpy as np
    >>> from circuits import Array
    >>> GeneralFunction('softmax', Array(np.zeros((3, 4), np.float32)), name='p').shape
    (3, 4)
    """

    __slots__ = ("function",)

    def rebuilds_by_shape(self) -> bool:
        """A gather's index values (an Array's) are checked when it is built: not by shape."""
        return self.function.index_arg is None
    type_name = "GeneralFunction"

    def _setup(self, function, *children, name=None):
        if isinstance(function, _functions.FunctionSpec):
            spec = function
        else:
            try:
                spec = _functions.lookup(function if type(function) is str else str(function))
            except CircuitError as e:
                raise CircuitError(
                    f"GeneralFunction {quote_name(name) if name else '(unnamed)'}: {e}"
                ) from None
        children = check_children("GeneralFunction", name, children)
        lo, hi = spec.num_args
        n = len(children)
        if n < lo or (hi is not None and n > hi):
            want = str(lo) if lo == hi else f"{lo} to {hi if hi is not None else 'any'}"
            raise shape_error(
                "GeneralFunction", name, spec.name, children,
                f"{spec.name} takes {want} argument(s), got {len(children)}",
            )
        shapes = tuple(map(shape_of, children))
        dtypes = tuple(map(dtype_of, children))
        key = (id(spec), shapes, dtypes)
        known = _RULE_RESULTS.get(key)
        if known is not None and known[0] is spec:
            shape, dtype = known[1], known[2]
        else:
            try:
                shape = int_tuple(spec.shape_rule(list(shapes)))
                dtype = spec.result_dtype(list(dtypes))
            except ShapeError as e:
                raise shape_error("GeneralFunction", name, spec.name, children, str(e)) from None
            if len(_RULE_RESULTS) >= _RULE_CACHE_SIZE:
                _RULE_RESULTS.clear()
            _RULE_RESULTS[key] = (spec, shape, dtype)
        if spec.index_arg is not None:
            _check_known_indices(spec, children, name)
        self.function = spec
        return self._set_common(children, shape, dtype, name)

    @property
    def function_name(self) -> str:
        return self.function.name

    def _interchangeable_with(self, other):
        # A function re-registered under the same name (replace=True) must not hand back nodes
        # built with the old definition.
        return self.function is other.function and Circuit._interchangeable_with(self, other)

    @classmethod
    def parse_payload(cls, text):
        """The function's registered name -> its ``FunctionSpec``."""
        if text is None:
            raise ParseError("a GeneralFunction needs its function's name", expected="e.g. 'GeneralFunction softmax'")
        try:
            return _functions.lookup(text)
        except CircuitError:  # not registered, and no family's name
            raise ParseError(f"unknown GeneralFunction {text!r}", column=1,
                             expected="a registered function name (circuits.functions.registered_names()) or "
                             + " or ".join(_functions.family_grammars())) from None

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        return cls(payload, *children, name=name)

    @classmethod
    def index_children(cls, payload, n_children, is_index):
        # a gather's index argument, whatever the gather's own dtype
        arg = None if payload is None else payload.index_arg
        return (arg,) if arg is not None and arg < n_children else ()

    def _payload_bytes(self):
        return self.function.name.encode()

    def payload_text(self):
        return self.function.name

    def expanded(self, children, gained, size_map, replacements=None):
        """Batched only where the function maps leading axes one to one (``core_ndim`` or
        elementwise), or a gather batched only in its indices."""
        f = self.function
        kids = children
        if any(gained):
            if f.core_ndim is None and not f.elementwise:
                if f.index_arg is None or any(nb for i, nb in enumerate(gained) if i != f.index_arg):
                    raise ExpandError(f"expand: {self.line()}: function {f.name} cannot be batched "
                                      "(it does not map leading axes one to one)")
            elif len(kids) > 1:
                kids, _ = aligned(self, kids, gained)
        return GeneralFunction(f, *kids, name=self.name)

    def _rebuild(self, children, name):
        return GeneralFunction(self.function, *children, name=name)
