"""``from_torch(module, example_inputs)``: an arbitrary PyTorch module as a circuit, via torch.export.

``torch.export.export`` traces the module into an ATen graph (the form of seed ``000_…``); this
module walks that graph once, in its order, and gives every op a value:

- parameters become named Arrays (``'transformer.h.0.attn.c_attn.weight'``), user inputs named
  Symbols (``'input_ids'``, bound at evaluation);
- an op whose tensor arguments are all known at import time (buffers, constants, ``arange``,
  ``full``, masks, rotary tables) runs in torch right away: its result is a constant, made into a
  node only where a circuit op needs it, so masks and rotary tables end up as single Arrays;
- every other op goes through the converter table of ``aten_ops`` (one small function per op);
- ops with no converter are collected, and one ``CircuitError`` lists them all with their module
  paths.

Nodes are named after the module that ran the op (``nn_module_stack``): an op alone in its module
takes the module's path (``'model.decoder.layers.0.self_attn.q_proj'``), otherwise the path and
the op (``'transformer.h.0.attn.matmul_1'``); nodes a converter makes on the way extend that name
(``'….ln_1.rsqrt'``).  torch is imported only when ``from_torch`` is called.

>>> import torch, numpy as np, circuits as C
>>> from circuits.importers import from_torch
>>> layer = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.GELU())
>>> x = torch.ones(4, 3)
>>> c = from_torch(layer, (x,))
>>> print(c.to_text())  # doctest: +ELLIPSIS
'1' GeneralFunction gelu
  '0' Add
    '0.matmul' Einsum ab,cb->ac
      'input' [4,3] Symbol
      '0.weight' [2,3] Array ...
    '0.bias' [2] Array ...
>>> bool(np.allclose(C.evaluate(c, {'input': x.numpy()}), layer(x).detach().numpy(), atol=1e-6))
True
"""

from __future__ import annotations

import operator
from collections import Counter, OrderedDict

import numpy as np

from ..errors import CircuitError
from ..nodes import Array, Circuit, Scalar, Symbol
from .aten_ops import CONVERTERS, Const, Site, Unsupported

# Ops that only pass their input on (no node of their own): they take no name.
_PASS_THROUGH = {"contiguous", "clone", "alias", "detach", "dropout", "feature_dropout", "alpha_dropout",
                 "to", "_to_copy", "type_as", "lift_fresh_copy", "lift_fresh", "_assert_tensor_metadata"}
# Ops whose result on a constant is a view of it (see _fold).
_VIEWS = {"unsqueeze", "squeeze", "view", "reshape", "_unsafe_view", "expand", "permute", "transpose", "t",
          "slice", "select", "flatten", "unflatten", "contiguous", "clone", "alias", "detach"}
# Ops whose result depends only on the shape and dtype of their tensor arguments: they fold even
# when an argument is computed (a zero tensor of its shape and dtype stands in for it).
_METADATA_ONLY = {"new_ones", "new_zeros", "new_full", "zeros_like", "ones_like", "full_like",
                  "_assert_tensor_metadata", "sym_size", "sym_numel", "sym_stride"}


class _Poisoned:
    """The value of an op that could not be converted (and of everything computed from it)."""


_POISONED = _Poisoned()


def from_torch(module, example_inputs=(), example_kwargs=None, *, strict: bool = False):
    """The circuit of ``module(*example_inputs, **example_kwargs)``, captured with torch.export.

    ``module`` is a ``torch.nn.Module`` (put it in eval mode: dropout in training mode is refused)
    or an ``ExportedProgram`` already made.  Tensor inputs become Symbols named after the forward
    arguments; evaluate with ``C.evaluate(c, {'input_ids': ids})``.  Shapes are those of the
    example inputs.  Returns one circuit, a tuple when the module returns several tensors, or a
    dict of circuits by the module's keys, in its order, when it returns a dict.
    Ops the importer cannot convert raise one ``CircuitError`` naming each with its module path.

    A transformers model as loaded (``use_cache=True`` in its config) is exported with
    ``use_cache=False`` unless ``example_kwargs`` says otherwise: its KV cache is no tensor, and
    the circuit is that of the logits.  An output torch.export cannot flatten (a cache object)
    is a ``CircuitError`` saying what to pass instead.

    >>> import torch, circuits as C
    >>> from circuits.importers import from_torch
    >>> c = from_torch(torch.nn.Softmax(dim=0), (torch.zeros(3),))
    >>> C.evaluate(c, {'input': [1.0, 1.0, 1.0]}).tolist()
    [0.3333333432674408, 0.3333333432674408, 0.3333333432674408]
    """
    import torch

    if isinstance(module, torch.export.ExportedProgram):
        program = module
    elif isinstance(module, torch.nn.Module):
        if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
            raise CircuitError(f"from_torch: example_inputs is a {type(example_inputs).__name__}; give a tuple of "
                               "the forward's positional arguments (one tensor x: (x,))")
        if example_kwargs is not None and not isinstance(example_kwargs, dict):
            raise CircuitError(f"from_torch: example_kwargs is a {type(example_kwargs).__name__}; give a dict")
        program = _export(module, tuple(example_inputs), _without_cache(module, example_kwargs), strict)
    else:
        raise CircuitError(
            f"from_torch takes a torch.nn.Module or a torch.export.ExportedProgram, got {type(module).__name__}"
        )
    with torch.no_grad():
        return _Importer(program).run()


def _export(module, args: tuple, kwargs, strict: bool):
    """``torch.export.export`` of the module, its failures as one ``CircuitError``."""
    import torch

    try:
        return torch.export.export(module, args, kwargs=kwargs, strict=strict)
    except Exception as e:  # noqa: BLE001 - torch.export fails with many types (RuntimeError, TypeError, UserError...)
        if "which is not a known type" in str(e):
            raise CircuitError(
                f"from_torch: torch.export cannot flatten a value {type(module).__name__} takes or returns: "
                f"{str(e).split(' If this type')[0]}\nFix: pass example_kwargs={{'use_cache': False}} "
                "(a transformers KV cache is no tensor), or wrap the module so that it takes and "
                "returns tensors only (e.g. the logits)"
            ) from None
        message = str(e).strip().split("\n\n")[0]
        if len(message) > 600:
            message = message[:600] + " ..."
        raise CircuitError(
            f"from_torch: torch.export could not capture {type(module).__name__} on the example inputs "
            f"({type(e).__name__}: {message})\nFix: check that the example inputs are what forward takes; "
            "control flow on tensor values (if x.sum() > 0) cannot be captured: write it with torch.where "
            "or torch.cond"
        ) from e


def _without_cache(module, kwargs):
    """``kwargs`` with ``use_cache=False`` added for a module whose forward takes ``use_cache``
    and whose config turns it on (a transformers model as loaded), unless the caller chose."""
    import inspect

    kwargs = dict(kwargs or {})
    if "use_cache" in kwargs or not getattr(getattr(module, "config", None), "use_cache", False):
        return kwargs
    try:
        takes = "use_cache" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):  # a forward with no readable signature
        takes = False
    if takes:
        kwargs["use_cache"] = False
    return kwargs


def _op_name(target) -> str:
    """``'add'`` for ``aten.add.Tensor``; the function's name for anything else."""
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(target, "__name__", str(target))


def _module_path(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path if isinstance(path, str) else ""


def _names(graph) -> dict:
    """A readable, unique-per-site name for each op node (see the module docstring)."""
    ops = [n for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    alone = Counter(_module_path(n) for n in ops if _op_name(n.target) not in _PASS_THROUGH)
    seen, names = Counter(), {}
    for n in ops:
        path, op = _module_path(n), _op_name(n.target).lstrip("_") or "op"
        if path and alone[path] == 1 and _op_name(n.target) not in _PASS_THROUGH:
            names[n] = path
            continue
        k = seen[(path, op)]
        seen[(path, op)] += 1
        base = f"{op}_{k}" if k else op
        names[n] = f"{path}.{base}" if path else base
    return names


def _dtype_name(torch_dtype) -> str:
    return str(torch_dtype).replace("torch.", "")


def _numpy(tensor) -> np.ndarray:
    t = tensor.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()
    return t.numpy()


def _flat(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flat(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flat(v)
    else:
        yield value


def _map(value, fn):
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return fn(value)


class _Importer:
    def __init__(self, program):
        self.program = program
        self.graph = program.graph
        self.names = _names(self.graph)
        self.values = {}
        self.unsupported = []

    # ------------------------------------------------------------------ inputs
    def _inputs(self):
        import torch.export.graph_signature as gs

        program = self.program
        specs = program.graph_signature.input_specs
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        for node, spec in zip(placeholders, specs):
            if spec.kind == gs.InputKind.PARAMETER:
                value = program.state_dict[spec.target]
                self.values[node] = Array(_numpy(value), name=spec.target)
            elif spec.kind in (gs.InputKind.BUFFER, gs.InputKind.CONSTANT_TENSOR):
                store = program.state_dict if spec.target in program.state_dict else program.constants
                self.values[node] = Const(store[spec.target], spec.target)
            elif spec.kind == gs.InputKind.USER_INPUT:
                val = node.meta.get("val")
                if hasattr(val, "shape"):
                    self.values[node] = Symbol(tuple(int(s) for s in val.shape), name=node.name,
                                               dtype=_dtype_name(val.dtype))
                else:
                    self.values[node] = val
            else:
                raise CircuitError(f"from_torch: input {node.name!r} of kind {spec.kind.name} is not supported")

    # ------------------------------------------------------------------ constants
    def _materialize(self, const: Const) -> Circuit:
        if const.node is None and const.origin is not None:
            converter, args, kwargs = const.origin
            const.node = converter(Site(const.name, self._materialize), *args, **kwargs)
        if const.node is None:
            values = _numpy(const.tensor)
            flat = values.reshape(-1)
            if (values.dtype.kind == "f" and flat.size and np.isfinite(flat[0]) and (flat == flat[0]).all()):
                const.node = Scalar(float(flat[0]), values.shape, name=const.name)
            else:
                const.node = Array(np.ascontiguousarray(values), name=const.name)
        return const.node

    def _fold(self, node, op, args, kwargs, name):
        import torch

        def tensor(v):
            if isinstance(v, Const):
                return v.tensor
            if isinstance(v, Circuit):  # metadata-only ops: any values of its shape and dtype do
                return torch.zeros(v.shape, dtype=getattr(torch, v.dtype))
            return v

        result = node.target(*_map(args, tensor), **_map(kwargs, tensor))
        if isinstance(result, torch.Tensor):
            sources = [v for v in _flat((args, kwargs)) if isinstance(v, Const)]
            if op in _VIEWS and len(sources) == 1:
                # A view of one constant is made, if needed, as a view of that constant's node:
                # the rotary table unsqueezed in every layer stays one Array.
                return Const(result, name, origin=(CONVERTERS[op], args, kwargs))
            return Const(result, name)
        if isinstance(result, (list, tuple)):
            return tuple(Const(r, f"{name}.{k}") if isinstance(r, torch.Tensor) else r
                         for k, r in enumerate(result))
        return result

    # ------------------------------------------------------------------ one op
    def _convert(self, node):
        if node.target is operator.getitem:
            container, key = (self.values[a] if hasattr(a, "op") else a for a in node.args)
            return _POISONED if container is _POISONED else container[key]
        args = _map(node.args, lambda a: self.values[a] if hasattr(a, "op") else a)
        kwargs = _map(dict(node.kwargs), lambda a: self.values[a] if hasattr(a, "op") else a)
        flat = list(_flat((args, kwargs)))
        name, op = self.names[node], _op_name(node.target)
        converter = CONVERTERS.get(op)
        path = _module_path(node) or "(top level)"
        if any(v is _POISONED for v in flat):
            # Downstream of an op that failed: still report this one if it has no converter either.
            if converter is None and op not in _METADATA_ONLY:
                self.unsupported.append(f"{node.target} in {path} (node {node.name})")
            return _POISONED
        if op in _METADATA_ONLY or not any(isinstance(v, Circuit) for v in flat):
            return self._fold(node, op, args, kwargs, name)
        if converter is None:
            self.unsupported.append(f"{node.target} in {path} (node {node.name})")
            return _POISONED
        try:
            return converter(Site(name, self._materialize), *args, **kwargs)
        except Unsupported as e:
            self.unsupported.append(f"{node.target} in {path} (node {node.name}): {e}")
            return _POISONED
        except CircuitError as e:
            raise CircuitError(f"from_torch: converting {node.target} (node {node.name}) in {path}: {e}") from e

    def run(self):
        import torch.export.graph_signature as gs

        self._inputs()
        output = None
        for node in self.graph.nodes:
            if node.op == "call_function":
                self.values[node] = self._convert(node)
            elif node.op == "output":
                output = node
            elif node.op == "get_attr":
                self.values[node] = _POISONED
                self.unsupported.append(f"get_attr {node.target} (node {node.name}): a submodule of a "
                                        "higher-order op")
        if self.unsupported:
            ops = sorted({u.split(" in ")[0] for u in self.unsupported})
            raise CircuitError(
                f"from_torch: {len(self.unsupported)} op(s) cannot be converted ({', '.join(ops)}):\n  "
                + "\n  ".join(self.unsupported)
                + "\nFix: rewrite those ops in the module, decompose them (program.run_decompositions()) and "
                "pass the ExportedProgram, or add a converter to circuits.importers.aten_ops.CONVERTERS."
            )
        specs = self.program.graph_signature.output_specs
        results = []
        for spec, value in zip(specs, output.args[0]):
            if spec.kind != gs.OutputKind.USER_OUTPUT:
                continue
            value = self.values[value] if hasattr(value, "op") else value
            results.append(self._output(value, len(results)))
        structure = getattr(getattr(self.program, "call_spec", None), "out_spec", None)
        if structure is not None and structure.type in (dict, OrderedDict) \
                and getattr(structure, "num_leaves", None) == len(results):
            # a module returning a dict: the same keys in the same order (issue 33 item 11; a tuple
            # lost them), values nested as the module nests them.  Not a transformers ModelOutput
            # (a dict subclass): a model's circuit is that of its logits, as the docstring says.
            return dict(structure.unflatten(results))
        return results[0] if len(results) == 1 else tuple(results)

    def _output(self, value, position: int) -> Circuit:
        """One output of the module as a circuit: a Python number it returns (``return 3.0``) is
        a constant, as a constant tensor would be; anything else that is not a tensor is an error."""
        if isinstance(value, Const):
            return self._materialize(value)
        if isinstance(value, Circuit):
            return value
        name = "output" if position == 0 else f"output.{position}"
        if isinstance(value, float):
            if np.isfinite(value):
                return Scalar(value, (), name=name)
            return Array(np.asarray(value, np.float32), name=name)
        if isinstance(value, bool) or (isinstance(value, int) and -(1 << 63) <= value < (1 << 63)):
            return Array(np.asarray(value, bool if isinstance(value, bool) else np.int64), name=name)
        raise CircuitError(
            f"from_torch: output {position} of the module is {type(value).__name__} {value!r:.80}, not a tensor "
            "or a number; return tensors (drop None and other values from forward's result)"
        )
