"""GeneralFunction: a registered function (softmax, rsqrt, gen_index_at_0_c, ...) of its children."""

from __future__ import annotations

from .. import functions as _functions  # a module object: circuits.functions imports this package
from ..errors import CircuitError, ShapeError
from .base import Circuit, check_children, dtype_of, int_tuple, quote_name, shape_error, shape_of


class GeneralFunction(Circuit):
    """A function from the registry in ``circuits.functions`` applied to the children.

    >>> import numpy as np
    >>> from circuits import Array
    >>> GeneralFunction('softmax', Array(np.zeros((3, 4), np.float32)), name='p').shape
    (3, 4)
    """

    __slots__ = ("function",)
    type_name = "GeneralFunction"

    def _setup(self, function, *children, name=None):
        if isinstance(function, _functions.FunctionSpec):
            spec = function
        else:
            try:
                spec = _functions.lookup(str(function))
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
        try:
            shape = int_tuple(spec.shape_rule(list(map(shape_of, children))))
            dtype = spec.result_dtype(list(map(dtype_of, children)))
        except ShapeError as e:
            raise shape_error("GeneralFunction", name, spec.name, children, str(e)) from None
        self.function = spec
        self._set_common(children, shape, dtype, name)

    @property
    def function_name(self) -> str:
        return self.function.name

    def _payload_bytes(self):
        return self.function.name.encode()

    def payload_text(self):
        return self.function.name

    def _rebuild(self, children):
        return GeneralFunction(self.function, *children, name=self.name)

    def _with_name(self, name):
        return GeneralFunction(self.function, *self.children, name=name)
