"""A warm ``C.evaluate`` of a circuit it has seen vs a call of ``C.compile``'s function (issue 9).

Run: ``.venv/bin/python -m benchmarks.bench_evaluate_cache``.  Target: ratio ≤ 1.10 on the seed model
(300 positions).  The second table is the per-call cost itself on a small circuit (where the
computation is negligible), split into its parts: lowering the circuit to a ``Program`` (the
walk, the key) was what ``evaluate`` paid on every call before programs of live circuits were
cached; binding the arguments and dispatching are paid by both.
"""

from __future__ import annotations

import numpy as np

import circuits as C
from circuits.backend.lower.binding import bind_arguments
from circuits.backend.lower.program import Program
from circuits.models import attn_only, random_weights

from .common import interleaved_medians, median_time, report


def main(runs: int = 20):
    w = random_weights(0)
    toks = np.random.default_rng(0).integers(0, 50259, 302)
    circuit = attn_only(w, toks)
    compiled = C.compile(circuit)
    # the first evaluate may run op by op (a new cache): the tiers agree to float rounding
    np.testing.assert_allclose(C.evaluate(circuit), compiled(), rtol=1e-5)
    seed = interleaved_medians({"evaluate": lambda: C.evaluate(circuit), "compiled": lambda: compiled()}, runs=runs)

    small_w = random_weights(0, vocab=50, d_model=16, n_heads=2, head_size=8, max_positions=16)
    small = attn_only(small_w, np.arange(12) % 50)
    small_compiled = C.compile(small)
    tiny = interleaved_medians({"evaluate": lambda: C.evaluate(small), "compiled": lambda: small_compiled()},
                               runs=200)
    lower = median_time(lambda: Program([circuit], "float32"), runs=runs)
    program = Program([circuit], "float32")
    bind = median_time(lambda: bind_arguments(program, None, "float32"), runs=runs)
    report("warm evaluate vs compile's function (CPU)", [
        ("seed model, C.evaluate (warm)", f"{seed['evaluate'] * 1e3:8.2f} ms"),
        ("seed model, C.compile(c)()", f"{seed['compiled'] * 1e3:8.2f} ms"),
        ("ratio (target <= 1.10)", f"{seed['evaluate'] / seed['compiled']:8.3f}"),
        (f"small model ({small.count_nodes()} nodes), C.evaluate (warm)", f"{tiny['evaluate'] * 1e3:8.3f} ms"),
        ("small model, C.compile(c)()", f"{tiny['compiled'] * 1e3:8.3f} ms"),
        ("ratio", f"{tiny['evaluate'] / tiny['compiled']:8.3f}"),
        ("seed model: Program(...) (lowering, now paid once per circuit)", f"{lower * 1e3:8.3f} ms"),
        ("seed model: bind_arguments (paid by both)", f"{bind * 1e3:8.3f} ms"),
    ])


if __name__ == "__main__":
    main()
