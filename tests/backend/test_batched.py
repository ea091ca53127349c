"""Batched evaluation: equal to looping over rows, chunked with one compilation, sharded over
several (host) devices with jax.sharding."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from circuits import Add, Array, Einsum, EvaluationError, GeneralFunction, Symbol, evaluate
from circuits.backend import cache_stats, evaluate_batched
from circuits.backend.cache.background import wait_for_background

ROOT = pathlib.Path(__file__).resolve().parents[2]

rng = np.random.default_rng(0)
X = Symbol((3,), name="x")
Y = Symbol((3,), name="y")
TOK = Symbol((4,), name="tok", dtype="int64")
W = Array(rng.standard_normal((3, 5)).astype(np.float32), name="w")
EMBED = Array(rng.standard_normal((6, 3)).astype(np.float32), name="embed")
H = GeneralFunction("tanh", Einsum.from_spec("a,ab->b", Add(X, Y, name="xy"), W), name="h")
OUT = GeneralFunction("log_softmax", H, name="out")
# token model: embed tokens, score them against x
EMB = GeneralFunction("gen_index_at_0_c", EMBED, TOK, name="emb")
SCORE = Einsum.from_spec("ta,a->t", EMB, X, name="score")


def loop(circuit, rows: list[dict], **kw):
    """Row by row with ``evaluate``; its 'auto' tier compiles the whole program in the background
    from the second row on: waited for, so that counts of compilations taken next are this test's."""
    out = np.stack([evaluate(circuit, r, **kw) for r in rows])
    wait_for_background()
    return out


def test_batched_equals_loop_with_a_shared_input_and_one_compilation():
    xs = rng.standard_normal((7, 3)).astype(np.float32)
    y = rng.standard_normal(3).astype(np.float32)
    expected = loop(OUT, [{"x": x, "y": y} for x in xs])
    before = cache_stats()["compilations"]
    got = evaluate_batched(OUT, {"x": xs, "y": y}, batch_size=3, mode="jit")  # chunks 3, 3, 1 (padded to 3)
    assert cache_stats()["compilations"] - before <= 1
    assert got.shape == (7, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    # a second dataset of another length, same chunk size: no new compilation
    before = cache_stats()["compilations"]
    evaluate_batched(OUT, {"x": xs[:5], "y": y}, batch_size=3, mode="jit")
    assert cache_stats()["compilations"] == before


def test_all_inputs_batched_int_tokens_and_float64():
    xs = rng.standard_normal((5, 3))
    toks = rng.integers(0, 6, (5, 4))
    rows = [{"x": x, "tok": t} for x, t in zip(xs, toks)]
    got = evaluate_batched(SCORE, {"x": xs, "tok": toks}, dtype="float64", batch_size=2)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, loop(SCORE, rows, dtype="float64"), rtol=1e-12, atol=1e-12)
    # independent oracle: numpy gather and dot
    emb = EMBED.numpy().astype(np.float64)
    np.testing.assert_allclose(got, np.einsum("bta,ba->bt", emb[toks], xs), rtol=1e-12)


def test_batched_intermediates_eager_mode_and_jax_output():
    xs = rng.standard_normal((4, 3)).astype(np.float32)
    ys = rng.standard_normal((4, 3)).astype(np.float32)
    value, extra = evaluate_batched(OUT, {"x": xs, "y": ys}, also=["h", "xy"], mode="ops")
    np.testing.assert_allclose(extra["xy"], xs + ys, rtol=1e-6)
    np.testing.assert_allclose(extra["h"], np.tanh((xs + ys) @ W.numpy()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, loop(OUT, [{"x": x, "y": y} for x, y in zip(xs, ys)]), rtol=1e-5, atol=1e-6)
    as_jax = evaluate_batched(OUT, {"x": xs, "y": ys}, return_jax=True, batch_size=2)
    assert not isinstance(as_jax, np.ndarray) and hasattr(as_jax, "sharding")
    np.testing.assert_allclose(np.asarray(as_jax), value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_row_chunks_run_the_rows_own_program(dtype):
    """A chunk of one row is the program itself on the row (the function evaluate compiles), not
    a vmap of one: same values as the loop, shared input kept, also= and return_jax as before."""
    from circuits.backend.cache.compiled import is_compiled, is_compiled_any
    from circuits.backend.lower.lowering import program_with_also

    c = GeneralFunction("log_softmax", Einsum.from_spec("a,ab->b", Add(X, Y), W), name="one_row")
    xs = rng.standard_normal((3, 3)).astype(dtype)
    y = rng.standard_normal(3).astype(dtype)
    value, extra = evaluate_batched(c, {"x": xs, "y": y}, dtype=dtype, batch_size=1, also=[c.children[0]],
                                    mode="jit")
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(value, loop(c, [{"x": x, "y": y} for x in xs], dtype=dtype), **tol)
    logits = (xs.astype(np.float64) + y) @ W.numpy().astype(np.float64)  # numpy oracle
    np.testing.assert_allclose(list(extra.values())[0], logits, **tol)
    assert value.shape == (3, 5) and value.dtype == np.dtype(dtype)
    program, _ = program_with_also(c, dtype, [c.children[0]], True)
    assert is_compiled((program.key, "run")) and not is_compiled_any((program.key, "vmap"))
    as_jax = evaluate_batched(c, {"x": xs, "y": y}, dtype=dtype, batch_size=1, return_jax=True, mode="jit")
    assert hasattr(as_jax, "sharding") and as_jax.shape == (3, 5)
    np.testing.assert_allclose(np.asarray(as_jax), value, **tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["jit", "ops"])
def test_chunks_of_large_rows_run_as_a_map_of_small_vmaps(dtype, mode, monkeypatch):
    """On the CPU a chunk of rows of large work runs as lax.map over groups of rows (every row
    here counts as large; groups of two): the same values as the loop and numpy, a short last
    chunk, an odd chunk (a group and a remainder), also= and return_jax."""
    from circuits.backend import batched
    from circuits.backend.cache.compiled import clear_compile_cache, is_compiled
    from circuits.backend.lower.lowering import program_with_also

    monkeypatch.setattr(batched, "MAP_FROM_BYTES", 0)
    monkeypatch.setattr(batched, "MAP_GROUP_MAX", 2)
    clear_compile_cache()
    c = GeneralFunction("log_softmax", Einsum.from_spec("a,ab->b", Add(X, Y), W), name="mapped")
    xs = rng.standard_normal((7, 3)).astype(dtype)
    y = rng.standard_normal(3).astype(dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    want = loop(c, [{"x": x, "y": y} for x in xs], dtype=dtype)
    logits = (xs.astype(np.float64) + y) @ W.numpy().astype(np.float64)  # numpy oracle
    for size in (3, 4, 7):
        value, extra = evaluate_batched(c, {"x": xs, "y": y}, dtype=dtype, batch_size=size, mode=mode,
                                        also=[c.children[0]])
        assert value.shape == (7, 5) and value.dtype == np.dtype(dtype)
        np.testing.assert_allclose(value, want, **tol)
        np.testing.assert_allclose(list(extra.values())[0], logits, **tol)
    program, _ = program_with_also(c, dtype, [c.children[0]], True)
    axes = tuple(0 if n is X else None for n in program.arg_nodes())
    assert is_compiled((program.key, "vmap", axes, "map", 2)) == (mode == "jit")
    as_jax = evaluate_batched(c, {"x": xs, "y": y}, dtype=dtype, batch_size=4, mode=mode, return_jax=True)
    assert hasattr(as_jax, "sharding")
    np.testing.assert_allclose(np.asarray(as_jax), want, **tol)
    clear_compile_cache()


@pytest.mark.parametrize("tall", [4, 300])
def test_map_groups_hold_more_rows_when_rows_are_short(tall, monkeypatch):
    """The map form's group is sized by how tall a row's products with the weights are: rows of
    4 positions run 16 at a time (matmuls 64 tall), rows of 300 two at a time; a group larger
    than the chunk still gives the loop's values."""
    from circuits.backend import batched
    from circuits.backend.cache.compiled import clear_compile_cache, is_compiled
    from circuits.backend.lower.lowering import program_with_also

    monkeypatch.setattr(batched, "MAP_FROM_BYTES", 0)
    clear_compile_cache()
    x = Symbol((tall, 3), name="x")
    c = GeneralFunction("tanh", Einsum.from_spec("tc,cv->tv", x, W), name="short_rows")
    xs = rng.standard_normal((5, tall, 3)).astype(np.float32)
    want = np.tanh(xs.astype(np.float64) @ W.numpy().astype(np.float64))  # numpy oracle
    got = evaluate_batched(c, {"x": xs}, batch_size=3, mode="jit")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    program, _ = program_with_also(c, "float32", None, True)
    assert batched.matmul_rows(program, [n for n in program.arg_nodes() if n.name == "x"]) == tall
    group = 16 if tall == 4 else 2
    assert batched.map_group(tall) == group
    axes = tuple(0 if n is x else None for n in program.arg_nodes())
    assert is_compiled((program.key, "vmap", axes, "map", group))
    clear_compile_cache()


def test_the_map_form_runs_the_memory_cap_in_whole_groups_without_measuring(monkeypatch):
    """With no batch_size, a chunk of the map form is the memory plan's cap rounded down to
    whole groups: nothing is measured (each size measured would compile a program) and the
    values are the loop's."""
    from circuits.backend import batched
    from circuits.backend.cache.compiled import clear_compile_cache
    from circuits.backend.tiers import batch_tuning

    monkeypatch.setattr(batched, "MAP_FROM_BYTES", 0)
    monkeypatch.setattr(batch_tuning, "TUNE_FROM_BYTES", 0)
    clear_compile_cache()
    batch_tuning.forget_tuning()
    x = Symbol((4, 3), name="x")
    c = GeneralFunction("tanh", Einsum.from_spec("tc,cv->tv", x, W), name="capped")
    xs = rng.standard_normal((40, 4, 3)).astype(np.float32)
    want = np.tanh(xs.astype(np.float64) @ W.numpy().astype(np.float64))  # numpy oracle
    seen, real_rows = [], batched.take_rows
    monkeypatch.setattr(batched, "take_rows", lambda value, start, count: seen.append(count) or real_rows(value, start, count))
    got = evaluate_batched(c, {"x": xs}, mode="jit")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert batch_tuning.tuned_chunks() == {}
    # groups of 16 (rows 4 tall); the cap (hundreds of these small rows) and the 40 rows: 32
    assert batched.map_group(4) == 16 and set(seen) == {32}
    clear_compile_cache()


def test_empty_dataset_gives_empty_result():
    got = evaluate_batched(OUT, {"x": np.zeros((0, 3)), "y": np.zeros(3)})
    assert got.shape == (0, 5) and got.dtype == np.float32


def test_batched_input_errors():
    with pytest.raises(EvaluationError, match="no input has a batch axis"):
        evaluate_batched(OUT, {"x": np.zeros(3), "y": np.zeros(3)})
    with pytest.raises(EvaluationError, match="disagree on the batch size"):
        evaluate_batched(OUT, {"x": np.zeros((2, 3)), "y": np.zeros((3, 3))})
    with pytest.raises(EvaluationError, match="batch_size=0"):
        evaluate_batched(OUT, {"x": np.zeros((2, 3)), "y": np.zeros(3)}, batch_size=0)
    with pytest.raises(EvaluationError, match=r"shape \[2, 4\]"):
        evaluate_batched(OUT, {"x": np.zeros((2, 4)), "y": np.zeros(3)})
    with pytest.raises(EvaluationError, match="devices=9"):
        evaluate_batched(OUT, {"x": np.zeros((2, 3)), "y": np.zeros(3)}, devices=9)


SHARDING_SCRIPT = textwrap.dedent(
    """
    import numpy as np, jax
    from circuits import Add, Array, Einsum, GeneralFunction, Symbol, evaluate
    from circuits.backend import evaluate_batched, cache_stats
    assert len(jax.devices()) == 4, jax.devices()
    rng = np.random.default_rng(1)
    x = Symbol((3,), name='x')
    w = Array(rng.standard_normal((3, 5)).astype(np.float32), name='w')
    out = GeneralFunction('softmax', Einsum.from_spec('a,ab->b', x, w))
    xs = rng.standard_normal((10, 3)).astype(np.float32)
    expected = np.stack([evaluate(out, {'x': r}) for r in xs])
    got = evaluate_batched(out, {'x': xs}, devices='all', batch_size=5, return_jax=True)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-7)
    # one chunk of 8 rows (5 rounded up to a multiple of 4), then padded 2 -> 8: both sharded
    one = evaluate_batched(out, {'x': xs[:8]}, devices=4, return_jax=True)
    assert len(one.sharding.device_set) == 4, one.sharding
    assert one.sharding.shard_shape(one.shape) == (2, 5), one.sharding
    two = evaluate_batched(out, {'x': xs[:6]}, devices=2)
    np.testing.assert_allclose(two, expected[:6], rtol=1e-6, atol=1e-7)
    print('sharded ok', cache_stats()['compilations'])
    """
)


def test_sharded_over_four_host_devices_in_a_subprocess():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", SHARDING_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sharded ok" in proc.stdout
