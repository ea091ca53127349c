"""A 50,000-deep chain: hashing, toposort, deep_map, strip_names, structure hashes and garbage
collection all work without recursion (no RecursionError, no interpreter crash)."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import circuits as C
from circuits.traversal import count_nodes, deep_map, replace, strip_names, toposort
from tests.deep import DEPTH, build_deep_chain


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_chain_hashes_and_toposorts(deep_chain):
    chain = deep_chain
    order = toposort(chain)
    assert len(order) == DEPTH + 2 and count_nodes(chain) == DEPTH + 2
    assert order[-1] is chain and order[0].name == "x"
    position = {n: i for i, n in enumerate(order)}
    assert all(position[c] < position[n] for n in order for c in n.children)
    assert len({n.hash for n in order}) == len(order)
    # building it again gives the very same nodes (interned), so equality is immediate
    assert build_deep_chain() is chain


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_chain_deep_map_and_replace(deep_chain):
    chain = deep_chain
    assert deep_map(chain, lambda n: None) is chain
    x = chain
    while x.children:
        x = x.children[0]
    assert x.name == "x"
    y = C.Array(np.full((2,), 0.25, np.float32), name="y")
    moved = replace(chain, {x: y})
    assert moved != chain and count_nodes(moved) == DEPTH + 2
    renamed = deep_map(chain, lambda n: n.rename(n.name + "!") if n.name and n.name.startswith("n") else None)
    assert renamed.name == chain.name + "!" and count_nodes(renamed) == DEPTH + 2


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_chain_strip_names_and_structure_hash(deep_chain):
    chain = deep_chain
    stripped = strip_names(chain)
    assert stripped.name is None and count_nodes(stripped) == DEPTH + 2
    assert all(n.name is None for n in toposort(stripped))
    assert stripped.structure_hash == chain.structure_hash
    other = build_deep_chain(tag="other.")
    assert other != chain and other.structure_hash == chain.structure_hash


def test_deep_chain_is_garbage_collected_without_crashing():
    # A subprocess: a recursive deallocation would crash the interpreter, not raise.
    script = textwrap.dedent("""
        import gc, sys, weakref
        sys.setrecursionlimit(1000)
        from tests.deep import build_deep_chain
        from circuits.nodes import base
        before = len(base._INTERNED)
        for _ in range(2):
            chain = build_deep_chain()
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
