"""Training a sparse autoencoder on a site's activations, in JAX (Adam written here, no optax).

``train_sae(circuit, site, data, d_sae=..., architecture='topk'|'standard', ...)`` evaluates the
site on every row of ``data`` (batched, as ``ablate(kind='mean')`` does), flattens the leading
axes into one set of activation vectors, and trains:

- ``'topk'``: ``f = relu(h) * topk_mask_k(h)``, loss = mean squared reconstruction error;
- ``'standard'``: ``f = relu(h)``, loss = MSE + ``l1`` * mean over vectors of ``sum_i f_i``;

with ``z = x - b_dec``, ``h = z W_enc + b_enc``, ``x_hat = f W_dec + b_dec``.  Initialisation:
decoder rows random of unit norm, ``W_enc = W_dec^T``, ``b_dec`` the data mean, ``b_enc = 0``;
after every Adam step the decoder rows are renormalised to unit norm (so sparsity cannot be bought
by shrinking activations).  Everything is seeded (``seed``: initialisation and batch order), so a
run is reproducible on one machine; the progress bar shows the loss (``progress=None`` shows it
in a terminal or notebook only).

>>> import numpy as np
>>> from circuits import Symbol, Einsum, Array
>>> x = Symbol((4,), name='x')
>>> c = Einsum.from_spec('a,ab->b', x, Array(np.eye(4, dtype=np.float32), name='w'), name='y')
>>> data = {'x': np.random.default_rng(0).standard_normal((64, 4))}
>>> sae = train_sae(c, 'y', data, d_sae=8, k=2, steps=50, batch_size=32, progress=False)
>>> sae.architecture, sae.d_sae, sae.hook_name
('topk', 8, 'y')
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import CircuitError
from ..nodes import Circuit
from .interventions import values_over_batch
from .sae import SAE
from .sites import resolve_sites

__all__ = ["train_sae", "train_sae_on"]


def _adam(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    """``(init, update)`` of Adam (Kingma & Ba) on a dict of arrays."""
    import jax.numpy as jnp

    def init(params):
        zeros = {k: jnp.zeros_like(v) for k, v in params.items()}
        return {"m": zeros, "v": dict(zeros), "t": jnp.zeros((), jnp.int32)}

    def update(params, grads, state):
        t = state["t"] + 1
        m = {k: b1 * state["m"][k] + (1 - b1) * grads[k] for k in params}
        v = {k: b2 * state["v"][k] + (1 - b2) * grads[k] ** 2 for k in params}
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        new = {k: params[k] - lr * (m[k] / c1) / (jnp.sqrt(v[k] / c2) + eps) for k in params}
        return new, {"m": m, "v": v, "t": t}

    return init, update


def train_sae_on(x: np.ndarray, *, d_sae: int, architecture: str = "topk", k: int | None = None, l1: float = 1e-3,
                 steps: int = 2000, batch_size: int = 256, lr: float = 1e-3, seed: int = 0, progress=None,
                 hook_name: str | None = None) -> SAE:
    """Train an SAE on activation vectors ``x`` ([n, d_in]); the arguments as for ``train_sae``.

    >>> x = np.random.default_rng(0).standard_normal((128, 6)).astype(np.float32)
    >>> train_sae_on(x, d_sae=12, architecture='standard', steps=20, progress=False).d_sae
    12
    """
    import jax
    import jax.numpy as jnp

    from ..progress import progress as bar_of

    if architecture not in ("topk", "standard"):
        raise CircuitError(f"train_sae: architecture={architecture!r}; train 'topk' or 'standard'")
    x = np.asarray(x, np.float32)
    if x.ndim != 2 or x.shape[0] == 0:
        raise CircuitError(f"train_sae: activations must be [n, d_in] with n >= 1, got shape {list(x.shape)}")
    if architecture == "topk":
        k = k if k is not None else max(1, d_sae // 16)
        if not 1 <= k <= d_sae:
            raise CircuitError(f"train_sae: k={k} must be in 1..d_sae={d_sae}")
    n, d_in = x.shape
    rng = np.random.default_rng(seed)
    w_dec = rng.standard_normal((d_sae, d_in)).astype(np.float32)
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    params = {"W_enc": jnp.asarray(w_dec.T.copy()), "W_dec": jnp.asarray(w_dec), "b_enc": jnp.zeros(d_sae, jnp.float32),
              "b_dec": jnp.asarray(x.mean(axis=0))}
    scale = float(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1)))  # normalises the loss to ~1 at the start
    init, update = _adam(lr)
    state = init(params)

    def encode(p, xb):
        h = (xb - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
        if architecture == "standard":
            return jax.nn.relu(h)
        _, idx = jax.lax.top_k(h, k)
        mask = jnp.sum(jax.nn.one_hot(idx, d_sae, dtype=h.dtype), axis=-2)
        return jax.nn.relu(h) * jax.lax.stop_gradient(mask)

    def loss_fn(p, xb):
        f = encode(p, xb)
        err = jnp.mean(jnp.sum((f @ p["W_dec"] + p["b_dec"] - xb) ** 2, axis=-1)) / scale
        return err + (l1 * jnp.mean(jnp.sum(f, axis=-1)) if architecture == "standard" else 0.0)

    @jax.jit
    def step(p, s, xb):
        loss, g = jax.value_and_grad(loss_fn)(p, xb)
        p, s = update(p, g, s)
        p = dict(p, W_dec=p["W_dec"] / jnp.linalg.norm(p["W_dec"], axis=1, keepdims=True))
        return p, s, loss

    batch_size = min(batch_size, n)
    with bar_of(range(steps), desc="train_sae", enabled=progress) as bar:
        order = rng.permutation(n)
        at = 0
        for i in bar:
            if at + batch_size > n:
                order, at = rng.permutation(n), 0
            params, state, loss = step(params, state, jnp.asarray(x[order[at:at + batch_size]]))
            at += batch_size
            if i % 100 == 0 or i == steps - 1:
                bar.set_postfix(loss=float(loss))
    p = {key: np.asarray(v, np.float32) for key, v in params.items()}
    return SAE(architecture=architecture, W_enc=p["W_enc"], W_dec=p["W_dec"], b_enc=p["b_enc"], b_dec=p["b_dec"],
               k=k if architecture == "topk" else None, apply_b_dec_to_input=True, hook_name=hook_name)


def train_sae(circuit: Circuit, site, data: Mapping, *, d_sae: int, architecture: str = "topk", k: int | None = None,
              l1: float = 1e-3, steps: int = 2000, batch_size: int = 256, lr: float = 1e-3, seed: int = 0,
              progress=None, eval_batch_size: int | None = None) -> SAE:
    """An SAE trained on ``site``'s values over ``data`` (a mapping from input names to batched
    values, as for ``ablate(kind='mean')``); see the module docstring.  ``steps`` Adam steps of
    ``batch_size`` vectors at learning rate ``lr``; ``d_sae`` latents; ``k`` (topk) active per
    vector (default ``d_sae // 16``) or ``l1`` (standard).  Returns an ``SAE`` whose
    ``hook_name`` is the site's name, ready for ``splice`` and ``save_sae``."""
    (label, node), = resolve_sites(circuit, site)
    values = values_over_batch(circuit, [(label, node)], data, "float32", eval_batch_size, "auto")[0]
    x = np.asarray(values, np.float32).reshape(-1, node.shape[-1])
    return train_sae_on(x, d_sae=d_sae, architecture=architecture, k=k, l1=l1, steps=steps, batch_size=batch_size,
                        lr=lr, seed=seed, progress=progress, hook_name=label)
