"""EAP-IG-mask's batched steps (discovery._scores: uniform_circuit, EdgeScores.integrated) against the
step-by-step computation they replace, independent of them: the gradient of patch_edges' masked
circuit with respect to its mask, one mask alpha * 1 (and one example row) at a time, through
the backend's plain value_and_grad; in float64, whatever the chunk of steps run at once."""

import numpy as np
import pytest

import circuits as C
from circuits.interp import discover, edges, patch_edges
from circuits.interp.discovery import _scores as edge_scores
from circuits.interp.discovery._discover import _eap_ig_mask
from circuits.interp.discovery._scores import uniform_circuit
from circuits.models import attn_only, random_weights

SMALL = dict(vocab=13, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
CLEAN = np.array([3, 4, 5, 9, 2, 6, 5, 3])
CORRUPT = np.array([3, 11, 8, 12, 1, 8, 5, 4])
SRC = {"toks_int_var": CORRUPT}


@pytest.fixture(scope="module")
def model():
    w = random_weights(0, dtype=np.float64, **SMALL)
    weights = np.random.default_rng(3).uniform(-1, 1, len(CLEAN) - 2)
    return w, attn_only(w, CLEAN, unique_names=True), weights


def step_by_step(loss, source, weights, steps):
    """The mean over alpha = k/steps of d(weights . masked output)/d mask at the mask alpha * 1
    (alpha in float32, as the mask Symbol holds it)."""
    masked = patch_edges(loss, None, source, mask=True)
    n = len(edges(loss))
    grads = [C.value_and_grad(masked, "edges.mask", {"edges.mask": np.full(n, k / steps, np.float32)}, cotangent=weights,
                              dtype="float64", mode="ops")[1] for k in range(steps + 1)]
    return np.mean(np.asarray(grads, np.float64), axis=0)


@pytest.mark.parametrize("ablation", ["resample", "zero", "mean"])
def test_uniform_circuit_is_the_masked_circuit_at_alpha(model, ablation):
    w, loss, _ = model
    g = edges(loss)
    source = {"resample": SRC, "zero": None, "mean": {"toks_int_var": np.stack([CORRUPT, CLEAN[::-1]])}}[ablation]
    circuit, _, _, _, alpha = uniform_circuit(g, source, ablation)
    masked = patch_edges(loss, None, source, ablation=ablation, mask=True)
    for a in (0.0, 0.3, 1.0):
        got = C.evaluate(circuit, {alpha: np.float32(a)}, dtype="float64", mode="ops")
        want = C.evaluate(masked, {"edges.mask": np.full(len(g), a, np.float32)}, dtype="float64", mode="ops")
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_chunked_steps_equal_step_by_step(model, chunk):
    """steps=4: five masks, run 1, 2 (padded), 3 (padded) or all 5 at a time."""
    w, loss, weights = model
    g = edges(loss)
    got = _eap_ig_mask(g, SRC, "resample", weights, None, {}, 4, "float64", chunk=chunk, mode="jit")
    np.testing.assert_allclose(got, step_by_step(loss, SRC, weights, 4), rtol=1e-8, atol=1e-11)
    assert np.abs(got).max() > 1e-3


def test_default_chunk_and_a_batch_equal_step_by_step(model, monkeypatch):
    """Through discover: the chunk from the program's size (all steps at once on this model, one
    at a time with no memory to spare) and a batch of rows (the mean of each row's steps)."""
    w, loss, weights = model
    want = step_by_step(loss, SRC, weights, 3)
    r = discover(loss, SRC, weights, method="eap-ig-mask", steps=3, dtype="float64", mode="jit")
    np.testing.assert_allclose(r.scores, want, rtol=1e-8, atol=1e-11)
    monkeypatch.setattr(edge_scores, "STEPS_BYTES", 1)
    r1 = discover(attn_only(w, CLEAN, unique_names=True), SRC, weights, method="eap-ig-mask", steps=3,
                  dtype="float64", mode="jit")
    np.testing.assert_allclose(r1.scores, want, rtol=1e-8, atol=1e-11)

    tokens = C.Symbol((len(CLEAN),), name="toks_int_var", dtype="int64")
    clean_rows, corrupt_rows = np.stack([CLEAN, CORRUPT, CLEAN[::-1]]), np.stack([CORRUPT, CLEAN, CORRUPT[::-1]])
    rows = [step_by_step(attn_only(w, c, unique_names=True), {"toks_int_var": x}, weights, 2)
            for c, x in zip(clean_rows, corrupt_rows)]
    for budget in (1, 1 << 40):  # a step at a time; all at once
        monkeypatch.setattr(edge_scores, "STEPS_BYTES", budget)
        rb = discover(attn_only(w, tokens, unique_names=True), {"toks_int_var": corrupt_rows}, weights,
                      method="eap-ig-mask", steps=2, dtype="float64", inputs={"toks_int_var": clean_rows}, mode="jit")
        np.testing.assert_allclose(rb.scores, np.mean(rows, axis=0), rtol=1e-8, atol=1e-11)
    # op by op (row by row, step by step): the same mean
    re = discover(attn_only(w, tokens, unique_names=True), {"toks_int_var": corrupt_rows}, weights,
                  method="eap-ig-mask", steps=2, dtype="float64", inputs={"toks_int_var": clean_rows}, mode="ops")
    np.testing.assert_allclose(re.scores, np.mean(rows, axis=0), rtol=1e-8, atol=1e-11)


def test_steps_that_fit_follow_the_budget(model, monkeypatch):
    w, loss, weights = model
    g = edges(loss)
    _eap_ig_mask(g, SRC, "resample", weights, None, {}, 2, "float32", mode="jit")
    scorer = next(s for k, s in g._scorers.items() if k[0] == "eap-ig-mask")
    alpha = uniform_circuit(g, SRC, "resample")[4]
    monkeypatch.setattr(edge_scores, "STEPS_BYTES", 1)
    assert scorer.steps_that_fit(alpha) == 1
    monkeypatch.setattr(edge_scores, "STEPS_BYTES", 1 << 30)
    many = scorer.steps_that_fit(alpha)
    assert many > 100 and scorer.steps_that_fit(alpha, rows=4) == many // 4


BATCH = dict(inputs={"toks_int_var": np.stack([CLEAN, CORRUPT, CLEAN[::-1]])})
BATCH_SRC = {"toks_int_var": np.stack([CORRUPT, CLEAN, CORRUPT[::-1]])}


@pytest.mark.parametrize("method", ["eap", "eap-ig", "eap-ig-mask"])
@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
def test_op_by_op_tier_equals_the_compiled_program(model, method, batch):
    """``mode='ops'`` (the senders and the gradients through the per-operation kernels, row by
    row and step by step) gives the compiled program's scores, in float64 to rounding."""
    w, _, weights = model
    tokens = C.Symbol((len(CLEAN),), name="toks_int_var", dtype="int64")
    circuit = attn_only(w, tokens if batch else CLEAN, unique_names=True)
    source, extra = (BATCH_SRC, BATCH) if batch else (SRC, {})
    metric = None if method == "eap" else weights  # eap: the loss's sum; the others: a weighted one
    got = {mode: discover(circuit, source, metric, method=method, steps=3, dtype="float64", mode=mode, **extra)
           for mode in ("ops", "jit")}
    np.testing.assert_allclose(got["ops"].scores, got["jit"].scores, rtol=1e-9, atol=1e-12)
    assert np.abs(got["jit"].scores).max() > 1e-3
    if method == "eap-ig-mask" and not batch:
        np.testing.assert_allclose(got["ops"].scores, step_by_step(circuit, SRC, weights, 3), rtol=1e-8, atol=1e-11)


@pytest.mark.unpinned
def test_auto_runs_op_by_op_until_the_compiled_program_is_ready(model):
    """The first EAP call compiles nothing whole; the second starts the program's compilation in
    the background; once it is ready, calls run it; every tier gives the same scores."""
    from circuits.backend.cache.background import wait_for_background
    from circuits.backend.tiers import last_run

    w, _, _ = model
    circuit = attn_only(w, CLEAN[::-1].copy(), unique_names=True)  # a program no other test compiled
    first = discover(circuit, SRC, method="eap", dtype="float64")
    assert last_run()["tier"] == "ops"
    second = discover(circuit, SRC, method="eap", dtype="float64")
    assert last_run()["tier"] == "ops"
    wait_for_background()
    third = discover(circuit, SRC, method="eap", dtype="float64")
    assert last_run()["tier"] == "jit"
    np.testing.assert_allclose(first.scores, third.scores, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(first.scores, second.scores)
    with pytest.raises(C.EvaluationError, match="mode='fast'"):
        discover(circuit, SRC, method="eap", mode="fast")


@pytest.mark.unpinned
def test_auto_keeps_a_program_over_jit_max_ops_op_by_op(model):
    """As for evaluate: a program larger than caller_max_ops() (JIT_MAX_OPS on a CPU of few cores)
    is not compiled in the background (a GPT-2's EAP program takes half a minute of the cores the
    calls run on); mode='jit' still compiles it."""
    from circuits.backend import tiers
    from circuits.backend.cache.background import wait_for_background
    from circuits.backend.tiers import last_run

    w, _, _ = model
    circuit = attn_only(w, np.roll(CLEAN, 1), unique_names=True)
    # (cold_start off: an earlier run of this test compiled the program whole, which a new
    # process loads at once, test_a_program_another_process_compiled_whole_is_loaded_at_once)
    with tiers.configure(jit_max_ops=10, caller_max_ops=10, cold_start=False):
        runs = [discover(circuit, SRC, method="eap-ig", steps=2, dtype="float64") for _ in range(3)]
        wait_for_background()
        runs.append(discover(circuit, SRC, method="eap-ig", steps=2, dtype="float64"))
        assert last_run()["tier"] == "ops"
        compiled = discover(circuit, SRC, method="eap-ig", steps=2, dtype="float64", mode="jit")
        assert last_run()["tier"] == "jit"
    for r in runs:
        np.testing.assert_allclose(r.scores, compiled.scores, rtol=1e-9, atol=1e-12)


@pytest.mark.unpinned
def test_auto_compiles_at_once_for_more_runs_than_op_by_op_takes(model, monkeypatch):
    """Steps over OP_BY_OP_MAX_RUNS: the compiled program runs at the first call (op by op, many
    steps would cost more than compiling); a batch's rows run at once, one run a step."""
    from circuits.backend.tiers import last_run

    w, _, _ = model
    tokens = C.Symbol((len(CLEAN),), name="toks_int_var", dtype="int64")
    circuit = attn_only(w, tokens, unique_names=True)
    monkeypatch.setattr(edge_scores, "OP_BY_OP_MAX_RUNS", 1)
    small = discover(circuit, BATCH_SRC, method="eap", dtype="float64", **BATCH)  # 1 run: the rows at once
    assert last_run()["tier"] == "ops"
    big = discover(circuit, BATCH_SRC, method="eap-ig", steps=2, dtype="float64", **BATCH)  # 2 runs: the steps
    assert last_run()["tier"] == "jit"
    assert np.abs(small.scores).max() > 1e-3 and np.isfinite(big.scores).all()


@pytest.mark.unpinned
def test_on_an_accelerator_or_many_cores_a_large_program_compiles_in_the_background(model, monkeypatch):
    """Where the compilation leaves the calls their cores (a GPU, a CPU of SPARE_CORES cores), a
    program over jit_max_ops is compiled whole in the background as a small one is (its op-by-op
    tier dispatches one kernel per node); on a CPU of few cores it stays op by op."""
    from circuits.backend import tiers
    from circuits.backend.cache.background import wait_for_background
    from circuits.backend.tiers import last_run, policy

    monkeypatch.setattr(policy.os, "cpu_count", lambda: 2)
    with tiers.configure(jit_max_ops=10):
        assert tiers.caller_max_ops() == 10
    monkeypatch.setattr(policy.os, "cpu_count", lambda: policy.SPARE_CORES)
    w, _, _ = model
    circuit = attn_only(w, CLEAN[:7], unique_names=True)  # a program of its own (7 tokens)
    source = {"toks_int_var": CORRUPT[:7]}
    with tiers.configure(jit_max_ops=10, cold_start=False):
        assert tiers.caller_max_ops() == tiers.CALLER_MAX_OPS
        runs = [discover(circuit, source, method="eap", dtype="float64") for _ in range(2)]
        assert last_run()["tier"] == "ops"
        wait_for_background()
        runs.append(discover(circuit, source, method="eap", dtype="float64"))
        assert last_run()["tier"] == "jit"
    np.testing.assert_allclose(runs[0].scores, runs[2].scores, rtol=1e-9, atol=1e-12)


EARLIER = """
import json, sys, numpy as np
from circuits.backend import cache_stats, tiers
from circuits.backend.cache.background import wait_for_background
from circuits.backend.cache.executables import executable_info
from circuits.interp import discover
from circuits.models import attn_only, random_weights
w = random_weights(0, dtype=np.float64, **{small})
circuit = attn_only(w, np.roll({clean}, 4), unique_names=True)
if sys.argv[3:] == ["accelerator"]:  # as on a GPU (what the op-by-op tier's policy reads)
    import jax
    from circuits.backend.tiers import policy
    jax.devices()
    policy._accelerator[0] = True
with tiers.configure(jit_max_ops=10, caller_max_ops=10, cold_start=sys.argv[2] == "cold"):
    r = discover(circuit, {{"toks_int_var": {corrupt}}}, method="eap", dtype="float64", mode=sys.argv[1])
    tier = tiers.last_run()["tier"]
    wait_for_background()  # under these settings
    again = discover(circuit, {{"toks_int_var": {corrupt}}}, method="eap", dtype="float64", mode=sys.argv[1])
print(json.dumps(dict(scores=r.scores.tolist(), again_scores=again.scores.tolist(), tier=tier,
                      again=tiers.last_run()["tier"], **cache_stats(), **executable_info())))
"""


@pytest.mark.unpinned
def test_a_large_program_another_process_compiled_whole_is_loaded_in_the_background(tmp_path):
    """A new process's first EAP call of a program over the sizes compiled whole by themselves
    (GPT-2 small's EAP on a CPU of few cores) that an earlier process compiled whole runs op by op
    and starts loading the program from the disk cache in the background (no trace, no
    compilation); once loaded, calls run it, with the scores of the op-by-op run.  On an
    accelerator it is loaded and run at the first call.  Without the earlier process, or with
    the cold start's rule off, it stays op by op."""
    import json
    import os
    import subprocess
    import sys

    script = EARLIER.format(small=SMALL, clean=CLEAN.tolist(), corrupt=CORRUPT.tolist())
    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(tmp_path / "cache"))

    def run(mode, cold="cold", *more):
        out = subprocess.run([sys.executable, "-c", script, mode, cold, *more], capture_output=True, text=True,
                             timeout=300, env=env)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run("auto")
    assert (first["tier"], first["again"]) == ("ops", "ops")  # nothing compiled it before
    earlier = run("jit")
    assert earlier["tier"] == "jit" and earlier["compilations"] > 0 and earlier["stores"] == 1
    now = run("auto")
    assert (now["tier"], now["again"]) == ("ops", "jit")  # loaded in the background after the first call
    assert now["compilations"] == 0 and now["loads"] >= 1  # loaded (with the op-by-op kernels), not compiled
    assert now["again_scores"] == earlier["scores"]
    np.testing.assert_allclose(now["scores"], earlier["scores"], rtol=1e-9, atol=1e-12)
    gpu = run("auto", "cold", "accelerator")  # on an accelerator: loaded and run at the first call
    assert (gpu["tier"], gpu["again"], gpu["compilations"]) == ("jit", "jit", 0)
    np.testing.assert_allclose(gpu["scores"], earlier["scores"], rtol=1e-9, atol=1e-12)
    off = run("auto", "warm")  # the cold start's rule switched off
    assert (off["tier"], off["again"]) == ("ops", "ops")


def test_two_circuits_of_one_structure_are_two_programs_on_disk(model):
    """The mark a process leaves for a program compiled whole names the circuit's content, not
    only its structure: op_tier's key is value-blind, so a circuit of the same shape with other
    clean tokens (or weights) must not find the first one's mark."""
    from circuits.backend.tiers import policy

    w, _, _ = model
    g_a, g_b = (edges(attn_only(w, np.roll(CLEAN, k), unique_names=True)) for k in (5, 6))  # graphs of their own
    for g in (g_a, g_b):
        discover(g.circuit, SRC, method="eap", dtype="float64", mode="ops")
    (a,), (b,) = (list(g.__dict__["_scorers"].values()) for g in (g_a, g_b))
    assert a.program.key == b.program.key
    key = (a.program.key, *a.tag, 1)
    marks = [policy._mark(key, scorer.roots, scorer.fdt) for scorer in (a, b, a)]
    assert marks[0] != marks[1] and marks[0] == marks[2] and None not in marks
