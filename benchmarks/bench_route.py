"""How far a call wanders through the backend (issue 34): the backend modules whose functions run
while ``evaluate`` meets a new circuit (op by op) and one whose value is known (the cache), and
how many times the calls move from one module to another, counted with ``sys.setprofile``.

Run: ``.venv/bin/python -m benchmarks.bench_route``.  The route decision should be one module's
business: a call's modules are its route's stages, not a walk around the package.

The circuit is small (a layer of the seed model's shapes: an einsum, a tanh, a sum), evaluated
after a warm-up circuit of the same operations, so that the first process's cold start and the
kernels' compilation are behind it: what is counted is the op-by-op route itself.  Calls are
counted in this thread only (background threads are not followed).
"""

from __future__ import annotations

import os
import sys

import numpy as np

import circuits as C
import circuits.backend as backend
from circuits.backend.cache.background import wait_for_background

from .common import report

BACKEND = os.path.dirname(os.path.abspath(backend.__file__)) + os.sep
# the one bounded-cache class (every cache read in a per-node loop is a call into it)
CACHE_CLASS = ("bounded.py", os.path.join("cache", "bounded.py"))


def route(fn, skip: tuple = ()) -> tuple[list, int]:
    """``(modules, moves)``: the backend modules (paths under the package) whose functions ``fn()``
    calls, in the order first met, and how many calls go to another module than the call before
    (the modules in ``skip`` not counted)."""
    seen: list = []
    where: list = [None]
    moves = [0]

    def profile(frame, event, arg):
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(BACKEND):
            return
        module = path[len(BACKEND):]
        if module in skip:
            return
        if module not in seen:
            seen.append(module)
        if where[0] is not None and module != where[0]:
            moves[0] += 1
        where[0] = module

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen, moves[0]


def model(seed: int):
    rng = np.random.default_rng(seed)
    x = C.Symbol((8, 16), name="x_route")
    w = C.Array(rng.standard_normal((16, 16)).astype(np.float32), name=f"w_route{seed}")
    return C.Einsum.from_spec("ab->", C.GeneralFunction("tanh", C.Einsum.from_spec("ab,bc->ac", x, w))), x


def main():
    warm, x = model(0)
    inputs = {x: np.ones((8, 16), np.float32)}
    C.evaluate(warm, inputs)  # the cold start and the kernels' compilation
    wait_for_background()
    new, _ = model(1)
    first, first_moves = route(lambda: C.evaluate(new, inputs))
    assert backend.last_run()["tier"] == "ops", backend.last_run()
    known, known_moves = route(lambda: C.evaluate(new, inputs))
    assert backend.last_run()["tier"] == "cache", backend.last_run()
    newer, _ = model(2)
    _, first_route_moves = route(lambda: C.evaluate(newer, inputs), skip=CACHE_CLASS)
    _, known_route_moves = route(lambda: C.evaluate(newer, inputs), skip=CACHE_CLASS)
    report("backend modules a call runs in (sys.setprofile), and moves between them", [
        ("evaluate, a new circuit (op by op): modules", f"{len(first):6d}"),
        ("evaluate, a new circuit (op by op): moves", f"{first_moves:6d}"),
        ("evaluate, its value known (cache): modules", f"{len(known):6d}"),
        ("evaluate, its value known (cache): moves", f"{known_moves:6d}"),
        ("op by op: moves, calls into the cache class left out", f"{first_route_moves:6d}"),
        ("cache: moves, calls into the cache class left out", f"{known_route_moves:6d}"),
    ])
    print("  op by op, in the order first met: " + " ".join(m.removesuffix(".py") for m in first))
    print("  cache, in the order first met: " + " ".join(m.removesuffix(".py") for m in known))


if __name__ == "__main__":
    main()
