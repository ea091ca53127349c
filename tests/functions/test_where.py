"""where(condition, x, y) against numpy's, broadcasting included; it prints and parses."""

import numpy as np

import circuits as C


def test_where_is_numpy_where_with_broadcasting():
    rng = np.random.default_rng(0)
    cond = rng.random((3, 1)) > 0.5
    x, y = rng.normal(size=(1, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
    c = C.GeneralFunction("where", C.Array(cond, name="c"), C.Array(x, name="x"), C.Array(y, name="y"))
    assert c.shape == (3, 4) and c.dtype == "float32"
    np.testing.assert_array_equal(C.evaluate(c), np.where(cond, x, y))
    ints = C.GeneralFunction("where", C.Array(np.array([0, 2, 0]), name="i"), C.Scalar(1.0), C.Scalar(-1.0, (3,)))
    np.testing.assert_array_equal(C.evaluate(ints), [-1.0, 1.0, -1.0])
    # Printed and parsed (the text does not carry dtypes: a float condition round-trips exactly).
    f = C.GeneralFunction("where", C.Array(cond.astype(np.float32), name="c"), C.Array(x, name="x"),
                          C.Array(y, name="y"))
    assert C.bind(C.parse(f.to_text()), {"c": cond.astype(np.float32), "x": x, "y": y}) == f
    np.testing.assert_array_equal(C.evaluate(f), np.where(cond, x, y))
