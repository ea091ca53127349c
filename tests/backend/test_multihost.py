"""Several hosts through ``jax.distributed``, simulated by two processes on this machine (each a
"host" with two CPU devices, talking through JAX's coordination service and its gloo collectives):
the same script in every process, a mesh over ``jax.devices()`` (all four), weights sharded over
heads and the vocabulary and rows over a batch axis, each result gathered with
``multihost_utils.process_allgather`` and checked against one device — the recipe of the README's
"Heads and devices" paragraph."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    r"""
    import sys
    import numpy as np
    import jax

    process_id, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=process_id)
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, PartitionSpec as P
    import circuits as C
    from circuits.models import attn_only, random_weights, tokens_symbol
    from circuits.select import Regex

    assert jax.process_count() == 2 and len(jax.devices()) == 4 and len(jax.local_devices()) == 2
    w = random_weights(0, vocab=64, d_model=16, n_heads=4, head_size=8, n_layers=2, max_positions=32)
    rng = np.random.default_rng(0)  # the same values in every process
    toks = rng.integers(0, 64, 12)
    circuit = attn_only(w, toks, logits=True)
    single = C.compile(circuit, mesh=jax.local_devices()[:1])()

    # tensor parallel over all four devices of both hosts
    mesh = Mesh(np.array(jax.devices()), ("model",))
    f = C.compile(circuit, mesh=mesh, shard={Regex(r"^a\d+\.w\.[qkvo]$"): P("model"), "t.w.unembed": P("model", None)})
    out = f(return_jax=True)
    assert not out.is_fully_addressable  # no one process holds the whole result
    np.testing.assert_allclose(np.asarray(multihost_utils.process_allgather(out, tiled=True)), single,
                               rtol=2e-5, atol=2e-5)

    # data parallel: rows over the four devices
    batch = rng.integers(0, 64, (8, 12))
    want = np.stack([C.compile(attn_only(w, t), mesh=jax.local_devices()[:1])() for t in batch])
    got = C.evaluate_batched(attn_only(w, tokens_symbol(12)), {"toks_int_var": batch},
                             mesh=Mesh(np.array(jax.devices()), ("batch",)), return_jax=True)
    np.testing.assert_allclose(np.asarray(multihost_utils.process_allgather(got, tiled=True)), want,
                               rtol=2e-5, atol=2e-5)
    print("OK", process_id, flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_with_jax_distributed_match_one_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), port], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            p.kill()
    for i, (code, out, err) in enumerate(outs):
        assert code == 0 and f"OK {i}" in out, f"process {i} exited {code}:\n{out[-3000:]}\n{err[-3000:]}"
