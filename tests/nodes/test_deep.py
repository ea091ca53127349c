"""A 50,000-deep chain: hashing, toposort, deep_map, strip_names, structure hashes and garbage
collection all work without recursion (no RecursionError, no interpreter crash)."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import circuits as C
from circuits.traversal import count_nodes, deep_map, replace, strip_names, toposort

DEPTH = 50_000


def build_chain(depth=DEPTH, tag=""):
    """x -> exp -> Add(., s) -> exp -> ... : ``depth`` nodes above the leaf, every other one named."""
    x = C.Array(np.full((2,), 0.5, np.float32), name="x")
    s = C.Scalar(-1.0, (2,), name="s")
    node = x
    for i in range(depth):
        if i % 2:
            node = C.Add(node, s, name=f"{tag}a{i}")
        else:
            node = C.GeneralFunction("tanh", node)
    return node


@pytest.fixture(scope="module")
def chain():
    return build_chain()


def test_deep_chain_hashes_and_toposorts(chain):
    order = toposort(chain)
    assert len(order) == DEPTH + 2 and count_nodes(chain) == DEPTH + 2
    assert order[-1] is chain and order[0].name in ("x", "s")
    position = {n: i for i, n in enumerate(order)}
    assert all(position[c] < position[n] for n in order for c in n.children)
    assert len({n.hash for n in order}) == len(order)
    # building it again gives the very same nodes (interned), so equality is immediate
    assert build_chain() is chain


def test_deep_chain_deep_map_and_replace(chain):
    assert deep_map(chain, lambda n: None) is chain
    x = chain
    while x.children:
        x = x.children[0]
    assert x.name == "x"
    y = C.Array(np.full((2,), 0.25, np.float32), name="y")
    moved = replace(chain, {x: y})
    assert moved != chain and count_nodes(moved) == DEPTH + 2
    renamed = deep_map(chain, lambda n: n.rename(n.name + "!") if n.name and n.name.startswith("a") else None)
    assert renamed.name == chain.name + "!" and count_nodes(renamed) == DEPTH + 2


def test_deep_chain_strip_names_and_structure_hash(chain):
    stripped = strip_names(chain)
    assert stripped.name is None and count_nodes(stripped) == DEPTH + 2
    assert all(n.name is None for n in toposort(stripped))
    assert stripped.structure_hash == chain.structure_hash
    other = build_chain(tag="other.")
    assert other != chain and other.structure_hash == chain.structure_hash


def test_deep_chain_is_garbage_collected_without_crashing():
    # A subprocess: a recursive deallocation would crash the interpreter, not raise.
    script = textwrap.dedent(f"""
        import gc, sys, weakref
        sys.setrecursionlimit(1000)
        from tests.nodes.test_deep import build_chain
        from circuits.nodes import base
        before = len(base._INTERNED)
        for _ in range(2):
            chain = build_chain()
            ref = weakref.ref(chain)
            del chain
            gc.collect()
            assert ref() is None, "chain still alive"
        assert len(base._INTERNED) <= before + 10, len(base._INTERNED)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
