"""Splicing an SAE (or a transcoder in place of an MLP) into a circuit, with an explicit error node.

``splice(circuit, site, sae)`` replaces the site's value ``x`` by ``recon + error`` where
``recon = decode(encode(x))`` and ``error = x - decode(encode(x))``, so the circuit's value is
unchanged (to rounding: float64 within 1e-12).  The new nodes, for a site named ``s``:

- ``'s.sae.acts'`` [..., d_sae]: the latents, a site like any other (``ablate``, ``patch``,
  ``path_patch``, ``attribute``); ``'s.sae.pre'`` the pre-activations; ``'s.sae.recon'``;
- ``'s.sae.error'``: ``x - decode(encode(x))`` read from a copy of the SAE of its own
  (``'s.sae.error.acts'``...), so an intervention on ``'s.sae.acts'`` is *not* cancelled by the
  error: with ``error='live'`` (default) the error follows the circuit's inputs (as SAELens's
  ``use_error_term``), ``error='frozen'`` makes it a constant Array of its clean value
  (``inputs=`` binds Symbols for that), and ``ablate(c, 's.sae.error')`` removes it on purpose;
- ``'s.sae.out'``: ``recon + error``, read by everything that read ``s``.  The original ``s``
  stays in the circuit under its name, read only by the encoder and the error.
- ``features=[i, ...]``: each feature ``i`` is its own node ``'s.sae.f{i}'`` [...] (its
  activation at every leading position; ``feature_site(s, i)`` spells the name), so one feature is
  ablated, patched or attributed alone; ``'s.sae.acts'`` is rebuilt exactly from them.

A transcoder (``sae.is_transcoder``) replaces an MLP: ``site`` is the MLP's output (``'h0.mlp'``
in the GPT-2/OPT/Llama builders) and it reads the MLP's input (``input=``; found by itself when
the site's own nodes, ``'<site>.*'``, read exactly one outside node of width ``d_in``, e.g.
``'h0.ln2'``); the error is ``mlp(x) - transcoder(x)``.

>>> import numpy as np
>>> import circuits as C
>>> from circuits.interp.sae import SAE
>>> x = C.Array(np.arange(8, dtype=np.float64).reshape(2, 4) / 8, name='x')
>>> c = C.Einsum.from_spec('ab->a', C.GeneralFunction('exp', x, name='s'), name='out')
>>> spliced = splice(c, 's', SAE.random(4, 16, seed=1), features=[3])
>>> abs(float(C.evaluate(spliced, dtype='float64')[0] - C.evaluate(c, dtype='float64')[0])) < 1e-12
True
>>> spliced.get_unique('s.sae.acts').shape, spliced.get_unique(feature_site('s', 3)).shape
((2, 16), (2,))
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..errors import CircuitError, ShapeError
from ..nodes import Add, Array, Circuit, Einsum, Index, Scalar
from ..traversal import replace, toposort
from .sae import SAE, sae_nodes
from .sites import resolve_site, site_label

__all__ = ["splice", "feature_site", "ERROR_MODES"]

ERROR_MODES = ("live", "frozen")


def feature_site(site: str, index: int) -> str:
    """The name of feature ``index``'s node after ``splice(..., site, sae, features=[index])``.

    >>> feature_site('b0', 7)
    'b0.sae.f7'
    """
    return f"{site}.sae.f{int(index)}"


def _mlp_input(circuit: Circuit, mlp: Circuit, label: str, d_in: int) -> Circuit:
    """The one node outside the MLP's own named nodes (``'<label>.*'``) that they read."""
    inside = lambda n: n is mlp or (n.name is not None and n.name.startswith(label + "."))  # noqa: E731
    frontier = {}
    for node in toposort(mlp, stop=lambda n: not inside(n)):
        if not inside(node) and not isinstance(node, (Array, Scalar)) and node.shape[-1:] == (d_in,):
            frontier[node.hash] = node
    if len(frontier) != 1:
        found = ", ".join(n.line() for n in frontier.values()) or "none"
        raise CircuitError(f"splice: cannot tell the input of {label!r} ({mlp.line()}): the nodes it reads of "
                           f"width {d_in} are {found}; pass input= (e.g. the MLP's LayerNorm, 'h0.ln2')")
    return next(iter(frontier.values()))


def _split_features(acts: Circuit, features: Sequence[int], prefix: str) -> Circuit:
    """``acts`` rebuilt as (the rest, masked) + sum over features of ``f_i * onehot_i``, each
    ``f_i`` a named node: the value is the same bit for bit (products by 1 and 0, sums with 0)."""
    d = acts.shape[-1]
    features = [int(i) for i in features]
    bad = [i for i in features if not 0 <= i < d]
    if bad or len(set(features)) != len(features):
        raise CircuitError(f"splice: features={features} must be distinct indices in 0..{d - 1}")
    raw = acts.rename(f"{prefix}.acts.raw")
    lead = "abcdefghijklmnopqrstuvwxyz"[: len(acts.shape) - 1]
    mask = np.ones(d, np.dtype(acts.dtype))
    mask[features] = 0
    rest = Einsum.from_spec(f"{lead}z,z->{lead}z", raw, Array(mask, name=f"{prefix}.acts.rest_mask"),
                            name=f"{prefix}.acts.rest")
    parts = [rest]
    for i in features:
        f = Index(raw, (slice(None),) * len(lead) + (i,), name=f"{prefix}.f{i}")
        hot = np.zeros(d, np.dtype(acts.dtype))
        hot[i] = 1
        parts.append(Einsum.from_spec(f"{lead},z->{lead}z", f, Array(hot, name=f"{prefix}.f{i}.onehot"),
                                      name=f"{prefix}.f{i}.placed"))
    return Add(*parts, name=f"{prefix}.acts")


def splice(circuit: Circuit, site, sae: SAE, *, input=None, error: str = "live", features: Sequence[int] = (),
           inputs: Mapping | None = None, dtype: str = "float64") -> Circuit:
    """The circuit with ``sae`` spliced in at ``site`` (a name, matcher or node): see the module
    docstring for the nodes it adds.  ``input`` (transcoders only) names the MLP input;
    ``error='live'|'frozen'``; ``features`` gives chosen features nodes of their own;
    ``inputs`` and ``dtype`` (frozen errors only) bind Symbols and pick the precision of the
    error's clean value.

    >>> import numpy as np
    >>> import circuits as C
    >>> from circuits.interp.sae import SAE
    >>> x = C.Symbol((3, 4), name='x')
    >>> c = C.GeneralFunction('tanh', x, name='t')
    >>> s = splice(c, 'x', SAE.random(4, 8, 'jumprelu'))
    >>> s.name, [n.name for n in s.children]
    ('t', ['x.sae.out'])
    """
    if not isinstance(sae, SAE):
        raise CircuitError(f"splice: expected an SAE (circuits.interp.load_sae), got {type(sae).__name__}")
    if error not in ERROR_MODES:
        raise CircuitError(f"splice: error={error!r}; use one of {', '.join(map(repr, ERROR_MODES))}")
    node = resolve_site(circuit, site)
    label = site_label(node, site)
    prefix = f"{label}.sae"
    taken = {n.name for n in toposort(circuit) if n.name is not None and n.name.startswith(prefix + ".")}
    if f"{prefix}.acts" in taken:
        raise CircuitError(f"splice: {label!r} already has an SAE spliced in ({prefix}.acts exists)")
    if sae.is_transcoder:
        x = resolve_site(circuit, input, "input") if input is not None else _mlp_input(circuit, node, label, sae.d_in)
        if x.shape[-1:] != (sae.d_in,):
            raise ShapeError(f"splice: the transcoder reads [..., {sae.d_in}] but its input {x.line()} has shape "
                             f"{list(x.shape)}")
        if node.shape[:-1] != x.shape[:-1] or node.shape[-1:] != (sae.d_out,):
            raise ShapeError(f"splice: the transcoder writes [..., {sae.d_out}] in place of {node.line()} "
                             f"(shape {list(node.shape)}); its input has shape {list(x.shape)}")
    else:
        if input is not None:
            raise CircuitError("splice: input= is for transcoders; an SAE reads the site itself")
        x = node
        if x.shape[-1:] != (sae.d_in,):
            raise ShapeError(f"splice: site {label!r} ({node.line()}) has shape {list(node.shape)}; the SAE reads "
                             f"[..., {sae.d_in}] (its cfg hook_name: {sae.hook_name!r})")
    main = sae_nodes(x, sae, prefix)
    acts = main["acts"]
    if features:
        acts = _split_features(acts, features, prefix)
        main = sae_nodes(x, sae, prefix, acts=acts)
    if error == "live":
        copy = sae_nodes(x, sae, f"{prefix}.error", weights=prefix)
        neg = Einsum.from_spec(_same(node) + ",->" + _same(node), copy["recon"], Scalar(-1.0, name=f"{prefix}.error.neg"))
        err = Add(node, neg, name=f"{prefix}.error")
    else:
        from ..backend import evaluate

        _, values = evaluate(Add(node, main["recon"]), inputs, dtype=dtype, also=[node, main["recon"]])
        diff = np.asarray(values[node], np.float64) - np.asarray(values[main["recon"]], np.float64)
        err = Array(diff.astype(np.dtype(node.dtype)), name=f"{prefix}.error")
    out = Add(main["recon"], err, name=f"{prefix}.out")
    return replace(circuit, {node: out})


def _same(node: Circuit) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[: len(node.shape)]
