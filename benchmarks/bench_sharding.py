"""Sharding over the devices there are (``circuits.backend.lower.sharding``): the seed model's loss
split over a one-axis mesh, against the same circuit on one device, in the same process.

- **tensor parallel**: ``compile(c, mesh=devices, shard={attention weights: P('model')})`` (the
  heads split over the devices) vs ``compile(c)``;
- **data parallel**: ``evaluate_batched(c, batch, devices='all')`` vs ``evaluate_batched(c,
  batch)`` on a batch of 32 sequences.

The mesh takes as many devices as divide the 8 heads (all of them up to 8; on one GPU or this CPU
the one-device mesh: then the ratios show what placing the arguments on a mesh costs, not a
speed-up).  Each result is checked against the one-device one first.  Run with several CPU host
devices: ``XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m benchmarks.bench_sharding``.

Run: ``.venv/bin/python -m benchmarks.bench_sharding``.
"""

from __future__ import annotations

import jax
import numpy as np

import circuits as C
from circuits.models import attn_only, random_weights, tokens_symbol
from circuits.select import Regex

from .common import agreement_tolerance, interleaved_medians, report

HEAD_WEIGHTS = Regex(r"^a\d+\.w\.[qkvo]$")


def mesh_devices(n_heads: int = 8) -> list:
    """The most devices (a prefix of ``jax.devices()``) whose count divides ``n_heads``."""
    devs = jax.devices()
    k = max(d for d in range(1, min(len(devs), n_heads) + 1) if n_heads % d == 0)
    return devs[:k]


def main(runs: int = 10, batch: int = 32, positions: int = 300):
    from jax.sharding import PartitionSpec as P

    w = random_weights(0, max_positions=positions)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 50259, positions + 2)
    circuit = attn_only(w, toks)
    devs = mesh_devices()
    plain = C.compile(circuit)
    sharded = C.compile(circuit, mesh=devs, shard={HEAD_WEIGHTS: P("model")})
    tol = agreement_tolerance()
    np.testing.assert_allclose(sharded(), plain(), rtol=tol, atol=1e-4)
    one = interleaved_medians({"sharded": lambda: sharded(return_jax=True).block_until_ready(),
                               "plain": lambda: plain(return_jax=True).block_until_ready()}, runs=runs)
    sym = attn_only(w, tokens_symbol(positions + 2))
    rows_in = {"toks_int_var": rng.integers(0, 50259, (batch, positions + 2))}
    n_all = len(jax.devices())

    def spread():
        return C.evaluate_batched(sym, rows_in, devices="all")

    def single():
        return C.evaluate_batched(sym, rows_in)

    np.testing.assert_allclose(spread(), single(), rtol=tol, atol=1e-4)
    many = interleaved_medians({"spread": spread, "single": single}, runs=max(2, runs // 3))
    rows = [
        (f"tensor parallel over {len(devs)} device(s), one sequence",
         f"{one['sharded'] * 1e3:8.1f} ms vs {one['plain'] * 1e3:8.1f} ms on one device: ratio "
         f"{one['sharded'] / one['plain']:.3f}"),
        (f"data parallel over {n_all} device(s), batch of {batch}",
         f"{many['spread'] * 1e3:8.1f} ms vs {many['single'] * 1e3:8.1f} ms on one device: ratio "
         f"{many['spread'] / many['single']:.3f}"),
    ]
    dev = jax.devices()[0]
    report(f"seed model loss sharded, {n_all} x {dev.platform} ({dev.device_kind})", rows)
    return rows


if __name__ == "__main__":
    main()
