"""A 50,000-deep chain goes through every whole-circuit operation without recursion: print,
parse, evaluate, rewrite, optimize, save/load, the notebook view, selection and maps — run with
Python's recursion limit lowered so that any recursive walk would fail."""

import numpy as np
import pytest

import circuits as C
import rewrites
from circuits.select import Name, get, paths, update
from tests.deep import DEPTH, X, deep_chain_value


@pytest.mark.usefixtures("low_recursion_limit")
def test_deep_chain_everywhere(deep_chain, tmp_path):
    chain = deep_chain
    want = deep_chain_value(DEPTH)
    text = chain.to_text()
    parsed = C.parse(text)  # placeholders: binding the true value gives the chain itself
    assert parsed != chain and C.bind(parsed, {"x": X}) == chain
    np.testing.assert_allclose(C.evaluate(chain, dtype="float64"), want, rtol=1e-9)
    np.testing.assert_allclose(C.evaluate(rewrites.simp(chain), dtype="float64"), want, rtol=1e-9)
    np.testing.assert_allclose(C.evaluate(rewrites.optimize(chain), dtype="float64"), want, rtol=1e-9)
    rewrites.check(chain)
    path = tmp_path / "deep.circuit"
    C.save(chain, path)
    assert C.load(path) == chain
    assert "<details" in chain._repr_html_()
    assert str(chain) and repr(chain)
    assert C.strip_names(chain).structure_hash == chain.structure_hash
    assert len(get(chain, Name("n1"))) == 1
    (p,) = paths(chain, "x")
    assert len(p) == DEPTH + 1
    zero = update(chain, "x", lambda n: C.Array(np.zeros(2, np.float32), name="x"))
    np.testing.assert_allclose(C.evaluate(zero, dtype="float64"), deep_chain_value(DEPTH, x=np.zeros(2)), rtol=1e-9)
    assert C.Eager(chain)(chain).shape == (2,)
