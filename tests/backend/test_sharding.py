"""Sharding over devices with JAX's own sharding (``circuits.backend.lower.sharding``): data parallel
over a batch axis and tensor parallel over heads and the vocabulary, on 4 CPU host devices, each
checked against the single-device result and for its placement (``.sharding``).

XLA's host device count is fixed when jax initialises, so the 4-device checks run in a fresh
Python process (``XLA_FLAGS=--xla_force_host_platform_device_count=4``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import circuits as C
from circuits.errors import EvaluationError

ROOT = Path(__file__).resolve().parents[2]

FOUR_DEVICES = textwrap.dedent(
    r"""
    import numpy as np, jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import circuits as C
    from circuits.models import attn_only, random_weights, tokens_symbol
    from circuits.select import Regex

    devices = jax.devices()
    assert len(devices) == 4, devices
    w = random_weights(0, vocab=64, d_model=16, n_heads=4, head_size=8, n_layers=1 + EXTRA, max_positions=32)
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 64, 12)
    circuit = attn_only(w, toks, logits=True)
    single = C.compile(circuit)()

    # tensor parallel: attention weights over their head axis, the unembedding over the vocabulary
    mesh = Mesh(np.array(devices), ("model",))
    heads = {Regex(r"^a\d+\.w\.[qkvo]$"): P("model"), "t.w.unembed": P("model", None)}
    f = C.compile(circuit, mesh=mesh, shard=heads)
    out = f(return_jax=True)
    np.testing.assert_allclose(np.asarray(out), single, rtol=2e-5, atol=2e-5)
    args = dict(zip([n.name for n in f.program.arg_nodes()], f.arguments()))
    for name in ("a0.w.q", "a0.w.o", "t.w.unembed"):
        s = args[name].sharding
        assert s.spec[0] == "model" and not s.is_fully_replicated, (name, s)
        assert {sh.data.shape[0] for sh in args[name].addressable_shards} == {args[name].shape[0] // 4}, name
    assert args["t.w.tok_embeds"].sharding.is_fully_replicated
    # XLA partitions the logits over the vocabulary, as the unembedding is
    assert out.sharding.spec == P(None, "model") or not out.sharding.is_fully_replicated, out.sharding
    if EXTRA:
        # a device list is a one-axis mesh named 'model'
        np.testing.assert_allclose(C.compile(circuit, mesh=devices, shard={"t.w.unembed": P("model")})(), single,
                                   rtol=2e-5, atol=2e-5)
        # the same with the heads batched off: each head's slice comes from the sharded weight
        g = C.compile(circuit, mesh=mesh, shard=heads, batch_heads=False)
        np.testing.assert_allclose(g(), single, rtol=2e-5, atol=2e-5)

    # data parallel: rows over the 4 devices
    batch = rng.integers(0, 64, (8, 12))
    sym = attn_only(w, tokens_symbol(12))
    want = np.stack([C.evaluate(attn_only(w, t)) for t in batch])  # one compile: same structure
    got = C.evaluate_batched(sym, {"toks_int_var": batch}, devices=4, return_jax=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
    assert len(got.sharding.device_set) == 4 and got.sharding.spec[0] == "batch", got.sharding

    if not EXTRA:
        print("OK")
        raise SystemExit(0)
    # both at once: a 2 x 2 mesh, rows over 'batch', heads and vocabulary over 'model'
    mesh2 = Mesh(np.array(devices).reshape(2, 2), ("batch", "model"))
    got2 = C.evaluate_batched(sym, {"toks_int_var": batch}, mesh=mesh2, shard=heads, return_jax=True)
    np.testing.assert_allclose(np.asarray(got2), want, rtol=2e-5, atol=2e-5)
    assert got2.sharding.spec[0] == "batch" and len(got2.sharding.device_set) == 4, got2.sharding
    print("OK")
    """
)


def _run_on_four_devices(extra: bool):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    script = f"EXTRA = {extra}\n" + FOUR_DEVICES
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stdout[-3000:] + run.stderr[-3000:]


def test_data_and_tensor_parallel_on_four_host_devices_match_one_device():
    _run_on_four_devices(extra=False)


@pytest.mark.slow
def test_device_list_mesh_unbatched_heads_and_a_two_by_two_mesh_on_four_host_devices():
    _run_on_four_devices(extra=True)


def _tiny():
    x = C.Symbol((2, 4), name="x")
    w = C.Array(np.arange(12, dtype=np.float32).reshape(4, 3), name="w")
    return C.Einsum.from_spec("ab,bc->ac", x, w, name="y"), {"x": np.ones((2, 4))}


def test_one_device_mesh_places_and_agrees():
    import jax
    from jax.sharding import PartitionSpec as P

    c, inputs = _tiny()
    f = C.compile(c, mesh=jax.devices()[:1], shard={"w": P("model")})
    np.testing.assert_array_equal(f(inputs), C.evaluate(c, inputs))
    assert f.placement.specs() == {"w": P("model")}
    placed = f.arguments(inputs)
    assert placed[[n.name for n in f.program.arg_nodes()].index("w")].sharding.spec == P("model")


@pytest.mark.parametrize("shard, message", [
    ({"nothing": ("model",)}, "matches none"),
    ({"w": ("model", None, None)}, "3 entries"),
    ({"w": ("data",)}, "not an axis of the mesh"),
    ({"y": ("model",)}, "matches none"),
])
def test_bad_shard_specs_name_the_node_and_the_fix(shard, message):
    import jax

    c, inputs = _tiny()
    with pytest.raises(EvaluationError, match=message):
        C.compile(c, mesh=jax.devices()[:1], shard=shard)


def test_shard_without_mesh_is_refused():
    c, inputs = _tiny()
    with pytest.raises(EvaluationError, match="needs mesh="):
        C.compile(c, shard={"w": ("model",)})
    with pytest.raises(EvaluationError, match="needs mesh="):
        C.evaluate_batched(c, {"x": np.ones((3, 2, 4))}, shard={"w": ("model",)})
