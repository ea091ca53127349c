"""Fused groups in the op-by-op tier (``circuits.backend.tiers.groups``): a variant recomputes through
the groups its clean run made, every member's value is kept, and the values agree with the
whole program and with op by op."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import circuits as C
from circuits.backend import clear_cache, evaluate, last_run, tiers
from circuits.backend.tiers import groups
from circuits.backend.tiers.symbols import prepared
from circuits.testing import circuits_with_inputs
from circuits.traversal import toposort


@pytest.fixture(autouse=True)
def grouped():
    with tiers.configure(groups=True):
        clear_cache()
        yield
        groups.wait_for_groups()
        clear_cache()


@pytest.fixture(scope="module")
def shipped():
    from circuits.models import attn_only, induction_weights

    w = induction_weights()
    return attn_only(w, np.random.default_rng(1).integers(1, 64, 34), unique_names=True)


def _plan(root, known=frozenset()):
    roots, _ = prepared([root])
    order = toposort(*roots, stop=lambda n: n.hash in known)
    todo = [n for n in order if n.children and n.hash not in known]
    return groups.plan(todo, {r.hash for r in roots}), {n.hash for n in order}


def test_a_layer0_ablation_meets_the_clean_runs_groups(shipped):
    from circuits.interp import ablate

    clean, known = _plan(shipped)
    variant, _ = _plan(ablate(shipped, "b0.a.head1"), known)
    clean_keys = {key: [m.name for m in members] for members, _, key in clean if key is not None}
    grouped = [(key, [m.name for m in members]) for members, _, key in variant if key is not None]
    # Layer 1 (its four heads, their sum and the residual), the layer norm's tail and the loss:
    # each recomputed through the very structure the clean run compiled.
    assert {names[-1] for _, names in grouped} >= {"b1", "a1.norm", "t.loss"}
    for key, names in grouped:
        assert key in clean_keys, names
    # a weight's slice for one head and the head-size constants are not members
    b1 = next(names for _, names in grouped if names[-1] == "b1")
    assert "b1.a.head2.a.q" in b1 and not any(".w." in n or ".c." in n for n in b1)


def test_groups_compile_aside_then_run_and_every_value_is_kept(shipped):
    from circuits.interp import ablate

    evaluate(shipped)  # op by op; its groups are queued
    groups.wait_for_groups()
    assert groups.group_info()["ready"] >= 3
    hits = groups.group_info()["hits"]
    for l in range(2):
        for h in range(4):
            variant = ablate(shipped, f"b{l}.a.head{h}")
            value = evaluate(variant)
            assert last_run()["tier"] == "ops"
            np.testing.assert_allclose(value, evaluate(variant, mode="jit", cache=False), rtol=2e-5, atol=2e-6)
            np.testing.assert_allclose(value, evaluate(variant, mode="ops", cache=False), rtol=2e-5, atol=2e-6)
    assert groups.group_info()["hits"] >= hits + 8
    # A member inside a group (a query of a layer-1 head) was kept: asked for, it is read, not computed.
    variant = ablate(shipped, "b0.a.head3")
    q = variant.get_unique("b1.a.head0.a.q")
    before = C.cache_stats()["values"]["hits"]
    evaluate(q)
    assert last_run()["tier"] == "cache" and C.cache_stats()["values"]["hits"] > before


def test_eager_mode_never_uses_groups(shipped):
    queued = groups.group_info()["queued"]
    evaluate(shipped, mode="ops")
    assert groups.group_info()["queued"] == queued
    clear_cache("values")
    evaluate(shipped)  # 'auto', op by op: queued
    assert groups.group_info()["queued"] > queued


def test_a_group_that_fails_to_compile_stays_op_by_op(shipped, monkeypatch):
    def broken(*args):
        raise RuntimeError("no")

    monkeypatch.setattr(groups, "_group_op", broken)
    clear_cache("kernels")
    failed = groups.group_info()["failed"]
    first = evaluate(shipped)
    groups.wait_for_groups()
    assert groups.group_info()["failed"] > failed
    clear_cache("values")
    np.testing.assert_allclose(evaluate(shipped), first, rtol=1e-6)


FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(case=circuits_with_inputs(max_nodes=12, max_depth=5))
def test_grouped_evaluation_agrees_on_generated_circuits(case):
    circuit, inputs = case
    for dtype, tol in (("float32", dict(rtol=1e-4, atol=1e-5)), ("float64", dict(rtol=1e-10, atol=1e-12))):
        whole = evaluate(circuit, inputs, mode="jit", dtype=dtype, cache=False)
        clear_cache("values")
        first = evaluate(circuit, inputs, dtype=dtype)  # op by op, groups queued
        groups.wait_for_groups()
        clear_cache("values")
        grouped = evaluate(circuit, inputs, dtype=dtype)  # through the compiled groups
        np.testing.assert_allclose(first, whole, **tol, equal_nan=True)
        np.testing.assert_allclose(grouped, whole, **tol, equal_nan=True)


def test_the_queue_is_bounded_and_a_dropped_group_is_queued_again(monkeypatch):
    from circuits import GeneralFunction, Symbol

    monkeypatch.setattr(groups, "QUEUE_SIZE", 2)

    def chain(n):
        x = Symbol((n,), name=f"qx{n}")
        return x, GeneralFunction("exp", GeneralFunction("sin", GeneralFunction("tanh", x)))

    with groups.foreground():  # no pause: nothing compiles meanwhile
        for n in range(2, 6):
            x, y = chain(n)
            evaluate(y, {x: np.ones(n)})
        assert len(groups._queue) == 2
    groups.wait_for_groups()
    assert groups.group_info()["ready"] == 2
    clear_cache("values")
    x, y = chain(2)  # dropped from the queue: met again, queued again
    queued = groups.group_info()["queued"]
    np.testing.assert_allclose(evaluate(y, {x: np.ones(2)}), np.exp(np.sin(np.tanh(np.ones(2)))), rtol=1e-6)
    assert groups.group_info()["queued"] == queued + 1


def test_a_process_exits_without_compiling_what_is_queued(tmp_path):
    import subprocess
    import sys

    script = (
        "import numpy as np\n"
        "from circuits import GeneralFunction, Symbol, evaluate\n"
        "from circuits.backend import tiers\n"
        "from circuits.backend.tiers import groups\n"
        "tiers.configure(cold_start=False)\n"
        "groups.IDLE = 1e9  # never a pause: the queued group would wait forever\n"
        "x = Symbol((3,), name='x')\n"
        "y = GeneralFunction('exp', GeneralFunction('sin', GeneralFunction('tanh', x)))\n"
        "evaluate(y, {'x': np.ones(3)})\n"
        "assert groups.group_info()['queued'] == 1\n"
        "print('done')\n"
    )
    env = {**__import__("os").environ, "CIRCUITS_COMPILATION_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
