"""circuits.profile: the segments compute the circuit's value, times add up along the tree."""

import numpy as np
import pytest

import circuits as C
from circuits.models import attn_only, random_weights


def test_profile_of_a_small_model_agrees_with_evaluate_and_its_times_add_up():
    w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
    c = attn_only(w, np.array([1, 2, 3, 4, 5, 6, 7]))
    p = C.profile(c, repeat=2, baseline=True)
    np.testing.assert_allclose(p.value, C.evaluate(c), rtol=1e-5, atol=1e-6)
    assert p.rows[0].node is c and p.rows[0].depth == 0
    assert all(r.calls == 2 for r in p.rows)
    assert len({r.node.hash for r in p.rows}) == len(p.rows) == p.segments
    # the root's total is every segment's self time; each total covers its own self time
    assert p.rows[0].total_seconds == pytest.approx(sum(r.self_seconds for r in p.rows))
    assert all(r.total_seconds >= r.self_seconds > 0 for r in p.rows)
    # every named computed node of the circuit has its row
    named = {n.hash for n in C.toposort(c) if n.name and type(n) not in (C.Array, C.Scalar, C.Symbol)}
    assert named <= {r.node.hash for r in p.rows}
    table = p.table()
    assert table.splitlines()[0].split(" | ")[1:] == ["Self CPU total", "CPU total", "Number of Calls"] or \
        p.device != "CPU"
    assert "├── " in table and "'t.loss'" in table.splitlines()[2]
    assert p.plain_seconds is not None and "one plain compiled evaluation" in table
    assert "'a.q'" in p.by_name() and "<table>" in p._repr_html_()


def test_shared_unnamed_node_gets_its_own_segment():
    x = C.Symbol((4,), name="x")
    shared = C.GeneralFunction("exp", x)                   # unnamed, used by two named nodes
    a = C.GeneralFunction("sin", shared, name="a")
    b = C.GeneralFunction("cos", shared, name="b")
    p = C.profile(C.Add(a, b, name="out"), {"x": np.arange(4.0)})
    labels = [r.label for r in p.rows]
    assert labels == ["'out'", "'a'", "<GeneralFunction exp>", "'b'"]
    assert [r.depth for r in p.rows] == [0, 1, 2, 1]
    np.testing.assert_allclose(p.value, np.sin(np.exp(np.arange(4.0))) + np.cos(np.exp(np.arange(4.0))), rtol=1e-5)
    assert p["a"].total_seconds == pytest.approx(p["a"].self_seconds + p.rows[2].self_seconds)


def test_profile_errors():
    x = C.Symbol((2,), name="x")
    with pytest.raises(C.EvaluationError, match="x"):
        C.profile(C.GeneralFunction("exp", x, name="e"))          # x is not bound
    with pytest.raises(C.EvaluationError, match="repeat=0"):
        C.profile(C.GeneralFunction("exp", x, name="e"), {"x": np.zeros(2)}, repeat=0)
    with pytest.raises(C.CircuitError, match="give a circuit"):
        C.profile("not a circuit")


@pytest.mark.usefixtures("low_recursion_limit")
def test_a_deep_chain_of_names_profiles_with_totals_row_by_row():
    """Thousands of named nodes, one below the other: every row's total is its self time plus the
    total of the row below it (each segment reads the one below; given only the heads it reads,
    a circuit of n names lowers in O(n), not O(n^2))."""
    from tests.deep import build_deep_chain, deep_chain_value

    chain = build_deep_chain(5999)  # its top is the Add 'n5998'
    p = C.profile(chain)
    np.testing.assert_allclose(p.value, deep_chain_value(5999), rtol=1e-5)
    assert len(p.rows) == p.segments == 2000 and [r.depth for r in p.rows[:3]] == [0, 1, 2]
    assert [r.label for r in p.rows[:2]] == ["'n5998'", "'n5995'"]
    for upper, lower in zip(p.rows, p.rows[1:]):
        assert upper.total_seconds == pytest.approx(upper.self_seconds + lower.total_seconds, rel=1e-9, abs=1e-12)
    assert p.rows[-1].total_seconds == pytest.approx(p.rows[-1].self_seconds)
