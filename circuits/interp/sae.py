"""Sparse autoencoders and transcoders: the ``SAE`` value, SAELens files, and their circuit form.

An ``SAE`` holds the weights of one sparse dictionary in SAELens's row-vector convention
(``h = z @ W_enc + b_enc``, ``x_hat = f @ W_dec + b_dec``) and the settings that change its maths:

- ``architecture``: ``standard`` (ReLU), ``topk`` / ``abstopk`` (``k``, optional rescaling of the
  pre-activations by the decoder norms), ``jumprelu`` (``relu(h) * 1[h > threshold]``, strict),
  ``gated`` (``1[z W_enc + b_gate > 0] * relu(z (W_enc * exp(r_mag)) + b_mag)``), and transcoders
  ``transcoder``, ``skip_transcoder``, ``jumprelu_transcoder``, ``jumprelu_skip_transcoder`` (read
  one site, write another: ``f @ W_dec + b_dec (+ x @ W_skip.T)``, no ``b_dec`` subtraction);
- ``apply_b_dec_to_input`` (SAEs: ``z = x - b_dec``), ``normalize_activations`` (``none``,
  ``constant_norm_rescale``: ``x * sqrt(d_in) / |x|`` in and its inverse out, ``layer_norm``: the
  input standardised with the n-1 std plus 1e-5 in and de-standardised out).

``load_sae(path)`` reads a SAELens folder (``cfg.json`` + ``sae_weights.safetensors``; also the
pre-6.0 flat config with ``hook_point`` and ``log_threshold``) with numpy only, and
``save_sae(sae, path)`` writes one SAELens reads, both files in one step
(``circuits.interp.sae_files``).  ``sae_nodes(x, sae, prefix)`` is the circuit form
that ``splice`` puts into a circuit: named nodes ``<prefix>.pre`` (pre-activations),
``<prefix>.acts`` (latents, ``[..., d_sae]``) and ``<prefix>.recon``.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> sae = SAE.random(d_in=4, d_sae=6, architecture='topk', k=2, seed=0)
>>> x = rng.standard_normal((3, 4)).astype(np.float32)
>>> f = sae.encode(x)
>>> f.shape, int((f != 0).sum(axis=-1).max()) <= 2
((3, 6), True)
>>> sae.decode(f).shape
(3, 4)
"""

from __future__ import annotations

import attrs
import numpy as np

from ..errors import CircuitError, ShapeError
from ..nodes import Add, Array, Circuit, Einsum, GeneralFunction, Scalar

__all__ = ["SAE", "ARCHITECTURES", "sae_nodes"]

SAE_ARCHITECTURES = ("standard", "topk", "abstopk", "jumprelu", "gated")
TRANSCODER_ARCHITECTURES = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")
ARCHITECTURES = SAE_ARCHITECTURES + TRANSCODER_ARCHITECTURES
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")


def tensors_needed(arch: str) -> tuple[str, ...]:
    if arch == "gated":
        return ("W_enc", "W_dec", "b_dec", "b_gate", "b_mag", "r_mag")
    keys = ("W_enc", "W_dec", "b_enc", "b_dec")
    if arch.startswith("jumprelu"):
        keys += ("threshold",)
    if "skip" in arch:
        keys += ("W_skip",)
    return keys


_TENSORS = ("W_enc", "W_dec", "b_dec", "b_enc", "threshold", "b_gate", "b_mag", "r_mag", "W_skip")


def _brief(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_architecture(arch) -> None:
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise CircuitError(f"SAE architecture {_brief(arch)} is not supported; use one of {', '.join(ARCHITECTURES)}")


@attrs.frozen(eq=False, repr=False)
class SAE:
    """One sparse autoencoder or transcoder (see the module docstring).  Tensors are numpy arrays
    in ``dtype``; the ones an architecture does not use are None.  Its repr names its sizes and
    hooks, not its tensors:

    >>> z = np.zeros
    >>> SAE('standard', z((4, 6)), z((6, 4)), z(4), z(6), hook_name='blocks.0.hook_resid_pre')
    <SAE standard 4 -> 6 latents -> 4 at 'blocks.0.hook_resid_pre', float32>
    """

    architecture: str
    W_enc: np.ndarray
    W_dec: np.ndarray
    b_dec: np.ndarray
    b_enc: np.ndarray | None = None
    threshold: np.ndarray | None = None
    b_gate: np.ndarray | None = None
    b_mag: np.ndarray | None = None
    r_mag: np.ndarray | None = None
    W_skip: np.ndarray | None = None
    k: int | None = None
    rescale_acts_by_decoder_norm: bool = False
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    hook_name: str | None = None
    hook_name_out: str | None = None
    dtype: str = "float32"

    def __attrs_post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ sizes and checks
    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    @property
    def d_out(self) -> int:
        return int(self.W_dec.shape[1])

    @property
    def is_transcoder(self) -> bool:
        return self.architecture in TRANSCODER_ARCHITECTURES

    def __repr__(self) -> str:
        arch = self.architecture + (f" k={self.k}" if self.k is not None else "")
        where = f" at {self.hook_name!r}" if self.hook_name else ""
        if self.is_transcoder:
            where += f" -> {self.hook_name_out!r}" if self.hook_name_out else ""
        norm = f", normalize_activations={self.normalize_activations!r}" if self.normalize_activations != "none" else ""
        return f"<SAE {arch} {self.d_in} -> {self.d_sae} latents -> {self.d_out}{where}, {self.dtype}{norm}>"

    def validate(self) -> None:
        """Raise ``CircuitError``/``ShapeError`` naming the problem: unknown architecture or
        normalisation, a tensor the architecture needs missing, a shape that does not fit."""
        _check_architecture(self.architecture)
        if self.normalize_activations not in NORMALIZATIONS:
            fix = (" (a SAELens file marked expected_average_only_in needs its dataset scaling factor s folded in: "
                   "W_enc * s, W_dec / s, b_dec / s, then 'none')" if self.normalize_activations ==
                   "expected_average_only_in" else "")
            raise CircuitError(f"SAE normalize_activations={self.normalize_activations!r} is not supported; "
                               f"use one of {', '.join(NORMALIZATIONS)}{fix}")
        for key in ("hook_name", "hook_name_out"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise CircuitError(f"SAE {key}={_brief(value)} must be a str (a hook name such as "
                                   "'blocks.0.hook_resid_pre') or None")
        for key in ("rescale_acts_by_decoder_norm", "apply_b_dec_to_input"):
            value = getattr(self, key)
            if not isinstance(value, (bool, np.bool_)):
                raise CircuitError(f"SAE {key}={_brief(value)} must be True or False")
        for key in tensors_needed(self.architecture):
            if getattr(self, key) is None:
                raise CircuitError(f"a {self.architecture} SAE needs the tensor {key!r}")
        for key in _TENSORS:
            value = getattr(self, key)
            if value is not None and not (hasattr(value, "shape") and hasattr(value, "ndim") and hasattr(value, "dtype")):
                raise CircuitError(f"SAE tensor {key!r} must be an array, got a {type(value).__name__}; "
                                   "give numpy arrays (np.asarray)")
        k = self.k
        if k is not None and (isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1):
            raise CircuitError(f"SAE k={_brief(k)} must be an int >= 1 (how many latents a topk SAE keeps)")
        if self.architecture in ("topk", "abstopk") and k is None:
            raise CircuitError(f"a {self.architecture} SAE needs k >= 1, got k=None")
        d_in, d_sae = self.W_enc.shape if self.W_enc.ndim == 2 else (None, None)
        if d_in is None:
            raise ShapeError(f"SAE W_enc must be [d_in, d_sae], got shape {list(self.W_enc.shape)}")
        d_out = self.W_dec.shape[1] if self.W_dec.ndim == 2 else None
        want = {"W_dec": (d_sae, d_out), "b_dec": (d_out,), "b_enc": (d_sae,), "threshold": (d_sae,),
                "b_gate": (d_sae,), "b_mag": (d_sae,), "r_mag": (d_sae,), "W_skip": (d_out, d_in)}
        for key, shape in want.items():
            v = getattr(self, key)
            if v is not None and tuple(v.shape) != shape:
                raise ShapeError(f"SAE tensor {key!r} has shape {list(v.shape)}; expected {list(shape)} "
                                 f"(d_in={d_in}, d_sae={d_sae}, d_out={d_out})")
        if not self.is_transcoder and d_out != d_in:
            raise ShapeError(f"a {self.architecture} SAE reconstructs its input: W_dec must be [d_sae, d_in] = "
                             f"[{d_sae}, {d_in}], got {list(self.W_dec.shape)}")

    def tensors(self) -> dict[str, np.ndarray]:
        """The tensors SAELens saves for this architecture, by their SAELens names."""
        return {k: getattr(self, k) for k in tensors_needed(self.architecture)}

    def cfg(self) -> dict:
        """The SAELens 6 ``cfg.json`` content."""
        cfg = {"architecture": self.architecture, "d_in": self.d_in, "d_sae": self.d_sae, "dtype": self.dtype,
               "device": "cpu", "apply_b_dec_to_input": self.apply_b_dec_to_input,
               "normalize_activations": self.normalize_activations, "reshape_activations": "none",
               "metadata": {"hook_name": self.hook_name, "sae_lens_training_version": None}}
        if self.is_transcoder:
            cfg["d_out"] = self.d_out
            cfg["metadata"]["hook_name_out"] = self.hook_name_out
        if self.architecture in ("topk", "abstopk"):
            cfg["k"] = int(self.k)
            cfg["rescale_acts_by_decoder_norm"] = bool(self.rescale_acts_by_decoder_norm)
        return cfg

    # ------------------------------------------------------------------ numbers
    def encode(self, x, dtype: str | None = None, mode: str = "ops") -> np.ndarray:
        """The latents of ``x`` ([..., d_in]) from the circuit form (``sae_nodes``), evaluated
        (``mode`` as for ``evaluate``: op by op by default, as the circuit is a few large ops)."""
        from ..backend import evaluate

        dt = dtype or self.dtype
        node = sae_nodes(Array(np.asarray(x, dt), name="x"), self, "sae")["acts"]
        return evaluate(node, dtype=dt, mode=mode)

    def decode(self, f, dtype: str | None = None, x=None, mode: str = "ops") -> np.ndarray:
        """The reconstruction from latents ``f`` ([..., d_sae]); a skip transcoder or an SAE with
        input normalisation also needs the input ``x``."""
        from ..backend import evaluate

        dt = dtype or self.dtype
        f = np.asarray(f, dt)
        if x is None:
            if "skip" in self.architecture or self.normalize_activations != "none":
                raise CircuitError(f"decode of a {self.architecture} SAE with normalize_activations="
                                   f"{self.normalize_activations!r} needs the input: decode(f, x=x)")
            x = np.zeros(f.shape[:-1] + (self.d_in,), dt)
        node = sae_nodes(Array(np.asarray(x, dt), name="x"), self, "sae", acts=Array(f, name="f"))["recon"]
        return evaluate(node, dtype=dt, mode=mode)

    @staticmethod
    def random(d_in: int, d_sae: int, architecture: str = "standard", *, d_out: int | None = None, k: int | None = None,
               seed: int = 0, dtype: str = "float32", **settings) -> "SAE":
        """An SAE with random weights (tests and examples): decoder rows of unit norm, encoder
        its transpose plus noise, small biases, thresholds in [0, 0.5).

        >>> SAE.random(8, 16, 'jumprelu').threshold.shape
        (16,)
        """
        _check_architecture(architecture)
        rng = np.random.default_rng(seed)
        d_out = d_in if d_out is None else d_out
        w_dec = rng.standard_normal((d_sae, d_out))
        w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
        w_enc = (w_dec.T if d_out == d_in else rng.standard_normal((d_in, d_sae)) / np.sqrt(d_in))
        w_enc = w_enc + 0.3 * rng.standard_normal((d_in, d_sae)) / np.sqrt(d_in)
        t = {"W_enc": w_enc, "W_dec": w_dec, "b_dec": 0.1 * rng.standard_normal(d_out),
             "b_enc": 0.1 * rng.standard_normal(d_sae), "threshold": 0.5 * rng.random(d_sae),
             "b_gate": 0.1 * rng.standard_normal(d_sae), "b_mag": 0.1 * rng.standard_normal(d_sae),
             "r_mag": 0.1 * rng.standard_normal(d_sae), "W_skip": 0.1 * rng.standard_normal((d_out, d_in))}
        if architecture in ("topk", "abstopk") and k is None:
            k = max(1, d_sae // 4)
        kw = {key: t[key].astype(dtype) for key in tensors_needed(architecture)}
        if architecture in TRANSCODER_ARCHITECTURES:
            settings.setdefault("apply_b_dec_to_input", False)
        return SAE(architecture=architecture, k=k, dtype=dtype, **kw, **settings)


# ---------------------------------------------------------------------------- circuit form
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _lead(x: Circuit) -> str:
    if len(x.shape) > 20:
        raise ShapeError(f"an SAE input has at most 20 leading axes, got {x.line()}")
    return _LETTERS[: len(x.shape) - 1]


def _arr(value: np.ndarray, name: str, dtype: str) -> Array:
    return Array(np.asarray(value).astype(dtype), name=name)


def _matmul(x: Circuit, w: Circuit, name: str) -> Circuit:
    lead = _lead(x)
    return Einsum.from_spec(f"{lead}y,yz->{lead}z", x, w, name=name)


def _mul(a: Circuit, b: Circuit, name: str) -> Circuit:
    lead = _LETTERS[: len(a.shape)]
    return Einsum.from_spec(f"{lead},{lead}->{lead}", a, b, name=name)


def _row_scale(x: Circuit, s: Circuit, name: str) -> Circuit:
    lead = _lead(x)
    return Einsum.from_spec(f"{lead}y,{lead}->{lead}y", x, s, name=name)


def _normalisation(x: Circuit, sae: SAE, prefix: str):
    """``(normalised x, undo)``: the input normalisation and the function that undoes it."""
    mode, lead, n = sae.normalize_activations, _lead(x), x.shape[-1]
    if mode == "none":
        return x, lambda y: y
    if mode == "constant_norm_rescale":
        sq = Einsum.from_spec(f"{lead}y,{lead}y->{lead}", x, x, name=f"{prefix}.norm.sq")
        c = Einsum.from_spec(f"{lead},->{lead}", GeneralFunction("rsqrt", sq, name=f"{prefix}.norm.rsqrt"),
                             Scalar(float(np.sqrt(n)), name=f"{prefix}.norm.sqrt_d_in"), name=f"{prefix}.norm.scale")
        inv = Einsum.from_spec(f"{lead},->{lead}", GeneralFunction("sqrt", sq, name=f"{prefix}.norm.length"),
                               Scalar(float(1 / np.sqrt(n)), name=f"{prefix}.norm.inv_sqrt_d_in"),
                               name=f"{prefix}.norm.inv_scale")
        return _row_scale(x, c, f"{prefix}.norm.x"), lambda y: _row_scale(y, inv, f"{prefix}.norm.out")
    # layer_norm: (x - mean) / (std_{n-1} + 1e-5), undone by y * std + mean
    neg_mean = Einsum.from_spec(f"{lead}y,->{lead}", x, Scalar(-1.0 / n, name=f"{prefix}.norm.neg_inv_n"),
                                name=f"{prefix}.norm.neg_mean")
    ones = Scalar(1.0, (n,), name=f"{prefix}.norm.ones")
    centred = Add(x, Einsum.from_spec(f"{lead},y->{lead}y", neg_mean, ones), name=f"{prefix}.norm.centred")
    var = Einsum.from_spec(f"{lead}y,{lead}y,->{lead}", centred, centred,
                           Scalar(1.0 / max(n - 1, 1), name=f"{prefix}.norm.inv_n_minus_1"), name=f"{prefix}.norm.var")
    std = GeneralFunction("sqrt", var, name=f"{prefix}.norm.std")
    recip = GeneralFunction("reciprocal", Add(std, Scalar(1e-5, name=f"{prefix}.norm.eps"), name=f"{prefix}.norm.std_eps"),
                            name=f"{prefix}.norm.inv_std")
    mean = Einsum.from_spec(f"{lead},->{lead}", neg_mean, Scalar(-1.0, name=f"{prefix}.norm.neg"), name=f"{prefix}.norm.mean")
    return (_row_scale(centred, recip, f"{prefix}.norm.x"),
            lambda y: Add(_row_scale(y, std, f"{prefix}.norm.out_scaled"), Einsum.from_spec(f"{lead},y->{lead}y", mean, ones), name=f"{prefix}.norm.out"))


def sae_nodes(x: Circuit, sae: SAE, prefix: str, *, acts: Circuit | None = None, weights: str | None = None
              ) -> dict[str, Circuit]:
    """The SAE (or transcoder) applied to ``x`` ([..., d_in]) as circuit nodes:
    ``{'pre', 'acts', 'recon'}`` named ``<prefix>.pre``, ``<prefix>.acts``, ``<prefix>.recon``
    (``'gate'`` too for a gated SAE).  ``acts=`` decodes given latents instead of encoding ``x``
    (``x`` is then read only by the normalisation and the skip connection).  The weight Arrays
    are named ``<weights>.W_enc`` ... (``weights`` defaults to ``prefix``), so two copies of one
    SAE with different prefixes share their tensors.

    >>> import numpy as np
    >>> from circuits import Array
    >>> nodes = sae_nodes(Array(np.ones((2, 4), np.float32), name='x'), SAE.random(4, 8), 'x.sae')
    >>> nodes['acts'].line(), nodes['acts'].shape
    ("'x.sae.acts' GeneralFunction relu", (2, 8))
    """
    if x.shape[-1:] != (sae.d_in,):
        raise ShapeError(f"the SAE reads [..., {sae.d_in}] but {x.line()} has shape {list(x.shape)}")
    dt = "float64" if x.dtype == "float64" else "float32"
    arch, p = sae.architecture, prefix
    wp = prefix if weights is None else weights
    xn, undo = _normalisation(x, sae, p)
    z = xn
    if sae.apply_b_dec_to_input and not sae.is_transcoder:
        z = Add(xn, Einsum.from_spec("y,->y", _arr(sae.b_dec, f"{wp}.b_dec", dt), Scalar(-1.0, name=f"{p}.neg")),
                name=f"{p}.input")
    w_dec = sae.W_dec
    out: dict[str, Circuit] = {}
    if arch == "gated":
        w_enc = _arr(sae.W_enc, f"{wp}.W_enc", dt)
        gate = Add(_matmul(z, w_enc, f"{p}.gate.hidden"), _arr(sae.b_gate, f"{wp}.b_gate", dt), name=f"{p}.gate")
        w_mag = _arr(sae.W_enc * np.exp(sae.r_mag)[None, :], f"{wp}.W_mag", dt)
        pre = Add(_matmul(z, w_mag, f"{p}.hidden"), _arr(sae.b_mag, f"{wp}.b_mag", dt), name=f"{p}.pre")
        out["gate"] = gate
        make_acts = lambda: _mul(GeneralFunction("step", gate, name=f"{p}.gate.open"),  # noqa: E731
                                 GeneralFunction("relu", pre, name=f"{p}.mag"), f"{p}.acts")
    else:
        w_enc = sae.W_enc
        b_enc = sae.b_enc
        if arch in ("topk", "abstopk") and sae.rescale_acts_by_decoder_norm:
            norms = np.linalg.norm(sae.W_dec.astype(np.float64), axis=1)
            w_enc, b_enc, w_dec = w_enc * norms[None, :], b_enc * norms, w_dec / norms[:, None]
        pre = Add(_matmul(z, _arr(w_enc, f"{wp}.W_enc", dt), f"{p}.hidden"), _arr(b_enc, f"{wp}.b_enc", dt),
                  name=f"{p}.pre")
        if arch in ("standard", "transcoder", "skip_transcoder"):
            make_acts = lambda: GeneralFunction("relu", pre, name=f"{p}.acts")  # noqa: E731
        elif arch.startswith("jumprelu"):
            def make_acts():
                shifted = Add(pre, _arr(-sae.threshold, f"{wp}.neg_threshold", dt), name=f"{p}.above_threshold")
                return _mul(GeneralFunction("relu", pre, name=f"{p}.relu"),
                            GeneralFunction("step", shifted, name=f"{p}.open"), f"{p}.acts")
        elif arch == "topk":
            def make_acts():
                mask = GeneralFunction(f"topk_mask_{sae.k}", pre, name=f"{p}.topk")
                return _mul(GeneralFunction("relu", pre, name=f"{p}.relu"), mask, f"{p}.acts")
        else:  # abstopk: the k largest |h|, signed
            def make_acts():
                mask = GeneralFunction(f"topk_mask_{sae.k}", GeneralFunction("abs", pre, name=f"{p}.abs"),
                                       name=f"{p}.topk")
                return _mul(pre, mask, f"{p}.acts")
    out["pre"] = pre
    if acts is None:
        acts = make_acts()
    elif acts.shape != pre.shape:
        raise ShapeError(f"latents {acts.line()} have shape {list(acts.shape)}; the SAE's are {list(pre.shape)}")
    out["acts"] = acts
    decoded = Add(_matmul(acts, _arr(w_dec, f"{wp}.W_dec", dt), f"{p}.decoded"), _arr(sae.b_dec, f"{wp}.b_dec", dt),
                  name=f"{p}.recon" if not sae.is_transcoder and sae.normalize_activations == "none" else f"{p}.dec")
    if sae.is_transcoder:
        recon = decoded.rename(f"{p}.recon")
        if "skip" in arch:  # x @ W_skip.T stays in the reconstruction (live and linear), as circuit-tracer keeps it
            lead = _lead(x)
            skip = Einsum.from_spec(f"{lead}y,zy->{lead}z", x, _arr(sae.W_skip, f"{wp}.W_skip", dt), name=f"{p}.skip")
            recon = Add(decoded, skip, name=f"{p}.recon")
    else:
        recon = undo(decoded) if sae.normalize_activations != "none" else decoded
        if recon.name != f"{p}.recon":
            recon = recon.rename(f"{p}.recon")
    out["recon"] = recon
    return out
