"""rust_circuit's parametrised GeneralFunctions (``circuits.functions.rust``): ``cast_from_…_to_…``
and ``multinomial[_no_replace]_[…]``, against numpy; and the rust function names that were there
before (step, log_exp_p_1, gaussian_pdf, gaussian_cdf, logit, gen_index_…_no_batch_index)."""

import math

import numpy as np
import pytest

import circuits as C
import rewrites
from circuits import Array, GeneralFunction, parse

CAST_INT = "cast_from_{device:None,dtype:None}_to_{device:None,dtype:int64}"


def test_cast_converts_as_numpy_does():
    x = np.array([[1.7, -2.2, 0.0], [3.5, -0.5, 9.9]], np.float32)
    c = GeneralFunction(CAST_INT, Array(x, name="x"))
    assert c.dtype == "int64" and c.shape == (2, 3)
    np.testing.assert_array_equal(C.evaluate(c), x.astype(np.int64))
    to64 = GeneralFunction("cast_from_{device:cpu,dtype:float32}_to_{device:cuda,dtype:float64}", Array(x))
    assert to64.dtype == "float64"
    np.testing.assert_allclose(C.evaluate(to64, dtype="float64"), x.astype(np.float64))
    keep = GeneralFunction("cast_from_{device:None,dtype:None}_to_{device:cuda,dtype:None}", Array(x))
    assert keep.dtype == "float32"
    # the input dtype it requires, and dtypes rust does not have, are errors naming the function
    with pytest.raises(C.errors.ShapeError, match="takes a int64 argument, got float32"):
        GeneralFunction("cast_from_{device:None,dtype:int64}_to_{device:None,dtype:float32}", Array(x))
    with pytest.raises(C.errors.ShapeError, match="unknown dtype 'float7'"):
        GeneralFunction("cast_from_{device:None,dtype:None}_to_{device:None,dtype:float7}", Array(x))


def test_cast_text_and_rewrites():
    # rust_circuit's module_library: token ids cast to int64 before the embedding gather
    text = f"""'upcast_toks' GeneralFunction {CAST_INT}
  'toks' [5] Scalar 3.25"""
    c = parse(text)
    assert c.to_text() == text and c.dtype == "int64"
    for rewrite in (rewrites.simp, rewrites.optimize):
        out = rewrite(c)
        assert out.dtype == "int64"
        np.testing.assert_array_equal(C.evaluate(out), np.full(5, 3))


@pytest.mark.parametrize("sizes,text", [((100,), "[100]"), ((2, 3), "[2, 3]"), ((), "[]")])
def test_multinomial_names_shapes_and_range(sizes, text):
    probs = np.random.default_rng(0).random((4, 7)).astype(np.float32)
    m = GeneralFunction(f"multinomial_{text.replace(' ', '')}", Array(probs, name="p"),
                        Array(np.array(5), name="seed"))
    assert m.function_name == f"multinomial_{text}"  # rust's spelling: the Debug form of a shape
    assert m.shape == (4, *sizes) and m.dtype == "int64"
    v = C.evaluate(m)
    assert v.shape == (4, *sizes) and v.min() >= 0 and v.max() < 7
    assert parse(m.to_text(), store=C.testing.store_of(m)) == m


def test_multinomial_draws_follow_the_probabilities():
    # proportional to probs (unnormalised, as torch.multinomial), one row per leading index
    probs = np.array([[1.0, 3.0, 0.0, 4.0], [0.0, 0.0, 2.0, 0.0]], np.float32)
    m = GeneralFunction("multinomial_[20000]", Array(probs, name="p"), Array(np.array(11), name="seed"))
    v = C.evaluate(m)
    freq = np.stack([np.bincount(row, minlength=4) / row.size for row in v])
    np.testing.assert_allclose(freq, probs / probs.sum(1, keepdims=True), atol=0.02)
    assert (v[1] == 2).all()
    # the seed decides the draws: the same seed the same, another seed others
    again = C.evaluate(GeneralFunction("multinomial_[20000]", Array(probs, name="p"), Array(np.array(11), name="s")))
    other = C.evaluate(GeneralFunction("multinomial_[20000]", Array(probs, name="p"), Array(np.array(12), name="s")))
    np.testing.assert_array_equal(v, again)
    assert (v != other).any()


def test_multinomial_without_replacement_draws_distinct_categories():
    probs = np.ones((3, 6), np.float32)
    m = GeneralFunction("multinomial_no_replace_[6]", Array(probs), Array(np.array(2)))
    v = C.evaluate(m)
    for row in v:
        assert sorted(row.tolist()) == list(range(6))
    with pytest.raises(C.errors.ShapeError, match="7 draws without replacement from 6"):
        GeneralFunction("multinomial_no_replace_[7]", Array(probs), Array(np.array(2)))
    with pytest.raises(C.errors.ShapeError, match="the seed must be 0-d"):
        GeneralFunction("multinomial_[2]", Array(probs), Array(np.array([2])))


def test_rust_sampler_text_parses():
    # rust_circuit's test_simplify_sampled prints this (its names stripped)
    c = parse("""0 GeneralFunction gen_index_at_-2_batch_x_no_batch_index_c
  1 [12,37] Array rand
  2 GeneralFunction multinomial_[100]
    3 [12] Scalar 0.08333333333333333
    4 Tag 00000000-0000-0000-0000-000000000000
      'seed_11' [] Array rand""")
    assert c.shape == (100, 37)
    x = c.children[0].value
    idx = C.evaluate(c.children[1])
    assert idx.shape == (100,) and 0 <= idx.min() and idx.max() < 12
    np.testing.assert_allclose(C.evaluate(c), np.asarray(x)[idx])


@pytest.mark.parametrize("name,ref", [
    ("step", lambda x: (x > 0).astype(np.float64)),
    ("log_exp_p_1", lambda x: np.log(np.exp(x) + 1)),
    ("gaussian_pdf", lambda x: np.exp(-x * x / 2) / math.sqrt(2 * math.pi)),
    ("gaussian_cdf", lambda x: 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    ("logit", lambda x: np.log(x / (1 - x))),
])
def test_rust_elementwise_names_exist_and_match_numpy(name, ref):
    x = np.linspace(0.05, 0.95, 7) if name == "logit" else np.linspace(-3, 3, 7)
    c = GeneralFunction(name, Array(x, name="x"))
    np.testing.assert_allclose(C.evaluate(c, dtype="float64"), ref(x), rtol=1e-6, atol=1e-12)


def test_gen_index_no_batch_index_matches_numpy():
    x = np.arange(24.0).reshape(2, 3, 4)
    idx = np.array([3, 0, 2])
    c = GeneralFunction("gen_index_at_-1_no_batch_index", Array(x, name="x"), Array(idx, name="i"))
    np.testing.assert_allclose(C.evaluate(c, dtype="float64"), x[..., idx])
