"""``metric=``: one reading for ``attribute``, ``discover`` and ``faithfulness`` (circuits.interp.metric).

The same spec is refused by every caller with the same text (only the caller's name differs),
before anything is evaluated; 'kl' needs logits, whose last axis is traced to the unembedding,
and is refused by ``attribute``, whose estimates are its gradient at the clean run (zero there,
checked here by central differences)."""

import numpy as np
import pytest

import circuits as C
from circuits.errors import CircuitError, ShapeError
from circuits.interp import attribute, discover, faithfulness
from circuits.interp.metric import metric_node, read_metric, reads_a_weight_axis
from circuits.models import attn_only, random_weights

SMALL = dict(vocab=13, d_model=8, n_heads=1, head_size=4, n_layers=2, max_positions=16)
CLEAN = np.array([3, 4, 5, 9, 2, 6, 5, 3])
SRC = {"toks_int_var": np.array([3, 11, 8, 12, 1, 8, 5, 4])}


@pytest.fixture(scope="module")
def model():
    w = random_weights(0, dtype=np.float64, **SMALL)
    return w, attn_only(w, CLEAN, unique_names=True), attn_only(w, CLEAN, unique_names=True, logits=True)


def callers(loss):
    """Each caller of the parser, as a function of the metric spec."""
    scores = np.zeros(12)
    return {
        "attribute": lambda m: attribute(loss, ["b0.a.head0"], SRC, metric=m),
        "discover": lambda m: discover(loss, SRC, m, method="exact"),
        "faithfulness": lambda m: faithfulness(loss, SRC, m, scores),
    }


BAD = [
    ("logprob", CircuitError, "metric='logprob'; the named metric is 'kl'"),
    (np.ones(3), ShapeError, r"metric weights have shape \[3\]; the output 't.loss' .* has shape \[6\]"),
    (np.array([1.0, np.nan, 0, 0, 0, 0]), CircuitError, r"weights hold NaN or inf \(at \[1\]\)"),
    (np.array([np.inf, 0, 0, 0, 0, 0]), CircuitError, r"weights hold NaN or inf \(at \[0\]\)"),
    (np.array(["a"] * 6), CircuitError, "is not numbers"),
    (lambda out: 3.0, CircuitError, r"metric\(output\) returned float"),
    (lambda out: C.Scalar(1.0), CircuitError, r"metric\(output\) returned .*Scalar.*, which does not read the output"),
]


@pytest.mark.parametrize("spec, error, text", BAD, ids=["name", "shape", "nan", "inf", "strings", "float", "unread"])
def test_every_caller_refuses_a_bad_metric_alike(model, spec, error, text):
    _, loss, _ = model
    messages = set()
    for what, call in callers(loss).items():
        with pytest.raises(error, match=text) as info:
            call(spec)
        message = str(info.value)
        assert message.startswith(f"{what}: ")
        messages.add(message.split(": ", 1)[1])
    assert len(messages) == 1  # one text, whoever asks


def test_a_node_as_metric_is_refused_alike(model):
    _, loss, _ = model
    for what, call in callers(loss).items():
        with pytest.raises(CircuitError, match=f"^{what}: metric= takes a function output -> node"):
            call(loss)


def test_a_metric_that_does_not_read_the_output_is_named_not_a_stop_iteration(model):
    # ACDC and faithfulness looked for the edge mask below the metric and raised StopIteration.
    _, loss, _ = model
    unread = lambda out: C.Einsum.from_spec("ab->", loss.get_unique("b0.a.head0"))  # noqa: E731
    with pytest.raises(CircuitError, match="does not read the output"):
        discover(loss, SRC, unread, method="acdc")
    with pytest.raises(CircuitError, match="does not read the output"):
        faithfulness(loss, SRC, unread, np.zeros(12))


def test_kl_needs_logits_whose_last_axis_is_the_vocabulary(model):
    w, loss, logits = model
    assert reads_a_weight_axis(logits) and not reads_a_weight_axis(loss)
    # the seed's per-position loss [6]: its last axis is positions, not a distribution (was read as one)
    with pytest.raises(CircuitError, match=r"metric='kl' needs logits \[..., vocab\]; the output 't.loss' .* shape \[6\]"):
        discover(loss, SRC, "kl", method="exact")
    with pytest.raises(CircuitError, match="metric='kl' needs logits"):
        faithfulness(loss, SRC, "kl", np.zeros(12))
    # logits through a bias, a softmax, an Index of positions and a Rearrange still are
    bias = C.Array(np.ones(SMALL["vocab"]), name="bias")
    for out in (C.Add(logits, bias), C.GeneralFunction("log_softmax", logits), C.Index(logits, (slice(1, None),)),
                C.Rearrange(logits, "s v -> s v")):
        assert reads_a_weight_axis(out), out.line()
    assert read_metric("kl", logits, "discover").kind == "kl"
    assert not reads_a_weight_axis(C.Index(logits, (slice(None), 0)))  # one token's logit per position


def test_attribute_refuses_kl_whose_gradient_at_the_clean_run_is_zero(model):
    w, _, logits = model
    # the KL divergence from the clean distribution has its minimum at the clean run: its
    # gradient there is zero (central differences of it along a head's output), so EAP and
    # attribution patching would report 0 for every edge and site
    clean = C.evaluate(logits, dtype="float64")
    m = metric_node(logits, "kl", clean=clean)
    head = logits.get_unique("b1.a.head0")
    step = np.random.default_rng(1).standard_normal(head.shape) * 1e-4

    def at(eps):
        moved = logits.update(head, lambda n: C.Add(n, C.Array(eps * step, name="nudge")))
        return float(C.evaluate(metric_node(moved, "kl", clean=clean), dtype="float64"))

    assert float(C.evaluate(m, dtype="float64")) == pytest.approx(0, abs=1e-12)
    assert abs(at(1.0) - at(-1.0)) / 2 < 1e-9 < at(1.0)
    with pytest.raises(CircuitError, match="^attribute: metric='kl' has a zero gradient at the clean run"):
        attribute(logits, ["b0.a.head0"], SRC, metric="kl")
    # discover's EAP takes it (its scores are that zero gradient: documented), its other methods do not
    assert np.abs(discover(logits, SRC, "kl", method="eap", dtype="float64").scores).max() < 1e-9
    assert np.abs(discover(logits, SRC, "kl", method="exact", dtype="float64").scores).max() > 1e-4


def test_weights_and_functions_mean_the_same_to_both_callers(model):
    # attribute's estimate for an edge-free site and discover's metric read the same weighted sum
    _, loss, _ = model
    weights = np.linspace(-1, 1, 6)
    m = metric_node(loss, weights)
    assert float(C.evaluate(m, dtype="float64")) == pytest.approx(float(weights @ C.evaluate(loss, dtype="float64")))
    spec = read_metric(list(weights), loss, "attribute")
    assert spec.kind == "weights" and spec.weights.dtype == np.float64
    assert read_metric(lambda out: C.Index(out, (-1,)), loss, "attribute").node.shape == ()
    assert read_metric(None, loss, "attribute").kind == "sum"
