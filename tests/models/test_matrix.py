"""The verification matrix (``circuits.models.matrix``): no silently wrong cell.  Two rows run in
the everyday suite (GPT-2 in float32, Gemma-2, the family with the most variants, in float64);
the whole matrix, every family in both precisions, is marked slow.  A builder made wrong on
purpose shows that a cell can fail."""

import pytest

from circuits.models import matrix

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _assert_all_ok(row):
    bad = {k: str(v) for k, v in row.cells.items() if v.status != "ok"}
    assert not bad, f"{row.family} {row.dtype}: {bad}"
    assert set(row.cells) == {"logits", "head ablation", "head sum", "generation"}


@pytest.mark.parametrize("family, dtype", [("gpt2", "float32"), ("gemma2", "float64")])
def test_matrix_rows(family, dtype):
    _assert_all_ok(matrix.check(family, dtype))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("family", sorted(matrix.FAMILIES))
def test_the_whole_matrix(family, dtype):
    _assert_all_ok(matrix.check(family, dtype))


def test_a_wrong_builder_is_caught(monkeypatch):
    import importlib

    gemma2 = importlib.import_module("circuits.models.gemma2")  # the module (the package exports the function)
    real = gemma2.gemma2_spec

    def without_softcap(config):
        spec = real(config)
        spec.attn_softcap = None  # what a builder that ignored attn_logit_softcapping would compute
        return spec

    monkeypatch.setattr(gemma2, "gemma2_spec", without_softcap)
    row = matrix.check("gemma2", "float64", cells=("logits",))
    assert row.cells["logits"].status == "WRONG"


def test_markdown_table():
    row = matrix.Row("gpt2", "float32", {"logits": matrix.Cell("ok", "1.0e-07"), "generation": matrix.Cell("refused", "x")})
    assert matrix.markdown([row]).splitlines() == [
        "| family | dtype | logits | generation |", "|---|---|---|---|", "| gpt2 | float32 | ok (1.0e-07) | refused (x) |"]
