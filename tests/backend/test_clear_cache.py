"""``clear_cache('all')`` reaches every cache the backend keeps in memory (each registers itself
where it is created: ``circuits.backend.cache.bounded``), leaves the compilation cache on disk alone,
and sticks: work in flight in the background puts nothing back."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from circuits import Add, Array, Eager, Einsum, GeneralFunction, Scalar, Symbol, compile
from circuits.backend import (
    cache_stats,
    clear_cache,
    evaluate,
    evaluate_batched,
    evaluation,
    grad,
    last_run,
    tiers,
)
from circuits.backend.cache.background import wait_for_background
from circuits.backend.cache.bounded import registered
from circuits.backend.cache.persistent import persistent_cache_info
from circuits.backend.tiers import groups
from circuits.traversal import toposort

rng = np.random.default_rng(41)


def model(tag: str):
    """A small circuit of its own structure (``tag`` names its Symbol and shapes nothing else)."""
    x = Symbol((3, 5), name=f"x_{tag}")
    w = Array(rng.standard_normal((5, 4)).astype(np.float32), name=f"w_{tag}")
    h = GeneralFunction("tanh", Einsum.from_spec("ab,bc->ac", x, w), name=f"h_{tag}")
    g = GeneralFunction("exp", GeneralFunction("sin", Add(h, Scalar(0.5, (3, 4)))))
    return Einsum.from_spec("ac->", Add(g, Array(np.ones((3, 4), np.float32))), name=f"out_{tag}"), x, w


def computed_nodes(circuit) -> int:
    return sum(1 for n in toposort(circuit) if n.children)


def disk_listing() -> dict:
    """``{path: modification time}`` of the files in the compilation cache's directory."""
    directory = persistent_cache_info()["directory"]
    if directory is None:
        return {}
    out = {}
    for folder, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(folder, name)
            try:
                out[path] = os.stat(path).st_mtime_ns
            except OSError:
                pass
    return out


def held_entries() -> dict:
    return {name: cache.info()["entries"] for name, cache in registered().items() if cache.info()["entries"]}


def test_clear_cache_all_empties_every_registered_cache_and_leaves_the_disk():
    circuit, x, w = model("clear_all")
    inputs = {x: rng.standard_normal((3, 5)).astype(np.float32)}
    with tiers.configure(groups=True, background=False):
        for k in range(tiers.JIT_AFTER + 1):  # op by op, then the whole program
            evaluate(circuit, {x: inputs[x] + k})
        groups.wait_for_groups()
        evaluate(circuit, inputs)
    evaluate(circuit, inputs, also=["h_clear_all"])
    evaluate_batched(circuit, {x: np.stack([inputs[x]] * 4)})
    grad(circuit, w, inputs)
    grad(circuit, w, inputs, mode="jit")
    compile(circuit)(inputs)
    ev = Eager(circuit, inputs)
    ev(circuit)
    wait_for_background()
    held = held_entries()
    for name in ("compiled", "programs", "values", "kernels", "ops", "device arrays", "binders", "tiers"):
        assert held.get(name, 0) > 0, f"the scenario left the cache {name!r} empty: it proves nothing there"
    on_disk = disk_listing()

    clear_cache("all")

    assert held_entries() == {}
    assert all(info["entries"] == 0 for info in cache_stats()["caches"].values())
    assert on_disk.keys() <= disk_listing().keys()  # nothing removed (other processes may add)
    value = evaluate(circuit, inputs)
    assert {k: last_run()[k] for k in ("tier", "computed", "reused")} == {"tier": "ops", "computed": computed_nodes(circuit), "reused": 0}
    np.testing.assert_allclose(value, ev(circuit), rtol=1e-5)


def test_each_kind_clears_its_own_caches():
    circuit, x, _ = model("clear_kind")
    evaluate(circuit, {x: np.ones((3, 5), np.float32)}, mode="jit")
    evaluate(circuit, {x: np.zeros((3, 5), np.float32)})
    for kind in ("compiled", "values", "kernels"):
        clear_cache(kind)
        left = {name for name, n in held_entries().items() if registered()[name].kind == kind}
        assert left == set(), kind
    with pytest.raises(Exception, match="clear_cache"):
        clear_cache("everything")


def test_a_compilation_in_flight_puts_nothing_back_after_a_clear(monkeypatch):
    """The whole program compiling in the background when the caches are cleared: its compiled
    function, lowered program and device values are not put back (the compilation itself ran)."""
    started, go = threading.Event(), threading.Event()
    real = evaluation._compile_whole

    def held(*args, **kwargs):
        started.set()
        go.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "_compile_whole", held)
    circuit, x, _ = model("in_flight")
    for k in range(tiers.JIT_AFTER):  # the last run starts the compilation in the background
        evaluate(circuit, {x: np.full((3, 5), float(k), np.float32)})
    assert started.wait(120)
    compilations = cache_stats()["compilations"]
    clear_cache("all")
    go.set()
    wait_for_background()
    assert cache_stats()["compilations"] > compilations  # it did compile
    assert held_entries() == {}
    evaluate(circuit, {x: np.full((3, 5), 9.0, np.float32)})
    assert last_run()["tier"] == "ops"  # the circuit is tracked afresh: nothing ready


def test_a_fused_group_in_flight_puts_nothing_back_after_a_clear(monkeypatch):
    monkeypatch.setattr(groups, "IDLE", 1e9)  # the worker waits for a pause that never comes
    x = Symbol((7,), name="x_group_flight")
    y = GeneralFunction("exp", GeneralFunction("sin", GeneralFunction("tanh", x)))
    with tiers.configure(groups=True):
        evaluate(y, {x: np.ones(7)})
    assert groups.group_info()["groups"] >= 1
    clear_cache("all")
    monkeypatch.setattr(groups, "IDLE", 0.0)
    groups.wait_for_groups()
    assert held_entries() == {}
