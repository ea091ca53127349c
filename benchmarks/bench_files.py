"""Benchmark: loading a GPT-2-small sized circuit file against numpy loading the same arrays.

Run: ``python -m benchmarks.bench_files [--runs 7] [--scale 1.0]``.

The circuit holds arrays with GPT-2 small's parameter shapes (124M float32 values, random data),
each reduced by an Einsum, all summed by one Add.  It is saved once with ``circuits.save``; the
baseline saves the same arrays once with ``np.savez`` (uncompressed).  Timed, interleaved in one
process: ``circuits.load(path)`` (read, check every tensor's blake3 hash, parse the text, build
the nodes) against ``dict(np.load(npz))`` (read every array).  Target: ratio <= 2.0.

The original circuit is dropped before timing: a loaded node equal to a live one is handed the
live one (interning), which a teammate's fresh process would never see.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile

import numpy as np

import circuits
from circuits import Add, Array, Einsum

from .common import interleaved_medians, report


def gpt2_small_shapes(scale: float = 1.0) -> dict:
    """name -> shape of GPT-2 small's parameters (vocab, positions and widths times ``scale``)."""
    d = max(8, int(768 * scale))
    vocab, positions = max(8, int(50257 * scale)), max(8, int(1024 * scale))
    shapes = {"wte": (vocab, d), "wpe": (positions, d)}
    for i in range(12):
        p = f"h{i}."
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, 4 * d), p + "mlp.c_fc.bias": (4 * d,),
            p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,),
        })
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return shapes


def build(arrays: dict):
    sums = []
    for name, value in arrays.items():
        spec = "ab->" if value.ndim == 2 else "a->"
        sums.append(Einsum.from_spec(spec, Array(value, name=name), name=f"sum.{name}"))
    return Add(*sums, name="total")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal(shape, dtype=np.float32)
              for name, shape in gpt2_small_shapes(args.scale).items()}
    n_params = sum(a.size for a in arrays.values())
    with tempfile.TemporaryDirectory() as tmp:
        circuit_path = os.path.join(tmp, "gpt2.circuit")
        npz_path = os.path.join(tmp, "gpt2.npz")
        c = build(arrays)
        expected_hash = c.hash
        circuits.save(c, circuit_path)
        np.savez(npz_path, **arrays)
        del c
        gc.collect()

        # Correctness first: the loaded circuit is the saved one, values equal to numpy's.
        loaded = circuits.load(circuit_path)
        assert loaded.hash == expected_hash
        with np.load(npz_path) as z:
            for s in loaded.children:
                a = s.children[0]
                assert np.array_equal(a.value, z[a.name]), a.name
        del loaded, s, a
        gc.collect()

        def load_circuit():
            circuits.load(circuit_path)

        def load_npz():
            with np.load(npz_path) as z:
                {k: z[k] for k in z.files}

        times = interleaved_medians({"circuits.load": load_circuit, "np.load(npz)": load_npz},
                                    runs=args.runs, warmup=1)
        sizes = os.path.getsize(circuit_path), os.path.getsize(npz_path)

    ratio = times["circuits.load"] / times["np.load(npz)"]
    report(
        f"circuit file load, GPT-2-small shapes ({n_params / 1e6:.1f}M float32 params, "
        f"median of {args.runs})",
        [
            ("circuits.load", f"{times['circuits.load'] * 1e3:8.1f} ms  ({sizes[0] / 1e6:.0f} MB file)"),
            ("np.load(npz) baseline", f"{times['np.load(npz)'] * 1e3:8.1f} ms  ({sizes[1] / 1e6:.0f} MB file)"),
            ("ratio (target <= 2.0)", f"{ratio:8.2f}"),
        ],
    )
    return ratio


if __name__ == "__main__":
    main()
