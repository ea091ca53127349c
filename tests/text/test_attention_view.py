"""The token-level attention view: its page checked with html.parser, its behaviour in headless
Chromium (thumbnails, the focused head's pixels against numpy, hover values, click to focus, the
token strip, no network), and ``interp.attention_patterns`` against the circuit's own values."""

import json
import time

import numpy as np
import pytest

import circuits as C
from circuits.errors import SelectionError, ShapeError
from circuits.models import attn_only, gpt2, random_weights
from circuits.models.gpt2 import random_gpt2_weights
from circuits.text.attention import SCALE, AttentionView

from .test_html import CHROMIUM, NO_CHROMIUM, DevTools, dom


def _patterns(layers=2, heads=3, n=6, seed=0):
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((layers, heads, n, n)) * 2
    scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_page_is_well_formed_self_contained_and_holds_every_value():
    p = _patterns()
    tokens = ["<BOS>", " The", " cat", " sat", " </script>", " & co"]
    page = AttentionView(p, tokens).to_html()
    root = dom(page)
    canvases = [e for e in root.iter() if e.tag == "canvas"]
    assert len(canvases) == 2 * 3 + 1  # one thumbnail per head, the focused head
    strip = [e.all_text() for e in root.iter() if e.tag == "span" and "data-k" in e.attrs]
    assert strip == tokens  # escaped in the page, the strings themselves in the DOM
    (meta,) = [e for e in root.iter() if e.tag == "script" and "attn-meta" in e.attrs.get("class", "")]
    data = json.loads(meta.text)
    assert data["keys"] == tokens and data["shape"] == [2, 3, 6, 6]
    import base64

    decoded = np.frombuffer(base64.b64decode(data["data"]), "<u2").reshape(p.shape) / SCALE
    np.testing.assert_allclose(decoded, p, atol=1 / SCALE)
    assert "http" not in page and "src=" not in page  # nothing fetched


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ShapeError, match="layers, heads, queries, keys"):
        AttentionView(np.zeros((4, 4)))
    with pytest.raises(ShapeError, match="one per key position"):
        AttentionView(np.zeros((1, 1, 3, 3)), ["a"])
    with pytest.raises(ShapeError, match="last tokens of the keys"):
        AttentionView(np.zeros((1, 1, 4, 3)))
    big = AttentionView(_patterns(layers=3, heads=4))
    with pytest.raises(ShapeError, match=r"show fewer layers or heads \(view.select"):
        big.to_html(max_values=100)
    part = big.select(layers=[1], heads=[3, 0])
    assert (part.layers, part.heads) == (["layer 1"], ["head 3", "head 0"])
    np.testing.assert_array_equal(part.patterns[0, 0], big.patterns[1, 3])


def test_attention_patterns_of_the_seed_model_are_its_softmax_values():
    w = random_weights(0, vocab=11, d_model=8, n_heads=3, head_size=4, n_layers=2, max_positions=16)
    toks = np.array([1, 4, 2, 7, 1, 4, 2, 9])
    seed_names = attn_only(w, toks)  # every head's pattern is named 'a.attn_probs': its head says which
    view = C.interp.attention_patterns(seed_names, toks)
    assert view.shape == (2, 3, 6, 6) and view.tokens == [str(t) for t in toks[:6]]
    probs = [seed_names.get_unique(C.select.Inside(f"b{l}.a.head{h}", "a.attn_probs")) for l in range(2)
             for h in range(3)]
    _, want = C.evaluate(seed_names, also=probs)
    for i, node in enumerate(probs):
        np.testing.assert_allclose(view.patterns[i // 3, i % 3], want[node], rtol=1e-6)
    with pytest.raises(SelectionError, match="no attention pattern"):
        C.interp.attention_patterns(C.Add(C.Scalar(1.0), name="x"))


def test_attention_patterns_of_fused_and_split_heads_agree():
    # GPT-2's fused heads [heads, 1, q, k] ('h1.attn.probs') and its split heads ('h1.attn.head0.probs')
    cfg = dict(n_embd=8, n_head=2, n_layer=2, vocab_size=11, n_positions=16, activation_function="gelu_new")
    gw = random_gpt2_weights(cfg)
    fused = C.interp.attention_patterns(gpt2(cfg, gw, np.array([1, 2, 3, 4])), ["a", "b", "c", "d"])
    split = C.interp.attention_patterns(gpt2(cfg, gw, np.array([1, 2, 3, 4]), split_heads=True))
    assert fused.shape == split.shape == (2, 2, 4, 4) and fused.tokens == ["a", "b", "c", "d"]
    np.testing.assert_allclose(fused.patterns, split.patterns, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fused.patterns.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_attention_view_in_headless_chromium(tmp_path):
    p = _patterns()
    tokens = ["<BOS>", " The", " cat", " sat", " on", " mat"]
    view = AttentionView(p, tokens)
    page = tmp_path / "attn.html"
    page.write_text("<!doctype html><meta charset='utf-8'><body>" + view.to_html() + view.to_html() + "</body>",
                    encoding="utf-8")
    chrome = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        target = chrome.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = chrome.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        chrome.send("Page.enable", session=session)
        chrome.send("Network.enable", session=session)
        chrome.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 900, "deviceScaleFactor": 1,
                                                           "mobile": False}, session=session)
        chrome.send("Page.navigate", {"url": page.as_uri()}, session=session)
        chrome.wait_event("Page.loadEventFired")

        def js(expression):
            result = chrome.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                 session=session)
            assert "exceptionDetails" not in result, result
            return result["result"].get("value")

        root = "document.querySelectorAll('.circuits-attn')[0]"
        assert js("document.querySelectorAll('.circuits-attn').length") == 2  # two views, one page
        assert js("document.querySelectorAll('.circuits-attn[data-ready]').length") == 2
        meta = js(f"JSON.parse({root}.querySelector('script.attn-meta').textContent)")
        cell, left, top = meta["cell"], meta["left"], meta["top"]

        def big_value(q, k):
            """The focused heatmap's colour at cell (q, k), read back as a value (white 0, blue 1)."""
            rgb = js(f"""Array.from({root}.querySelector('canvas.attn-big').getContext('2d')
                .getImageData({left + k * cell + cell // 2}, {top + q * cell + cell // 2}, 1, 1).data)""")
            return (255 - rgb[0]) / 222

        def check_focused(layer, head):
            for q in range(6):
                for k in range(6):
                    assert abs(big_value(q, k) - p[layer, head, q, k]) < 0.01, (layer, head, q, k)

        assert js(f"{root}.querySelector('.attn-focus-title').textContent") == "layer 0 · head 0"
        check_focused(0, 0)
        # every thumbnail painted its own head (its top-left cell: the first token attends to itself)
        thumbs = js(f"""Array.from({root}.querySelectorAll('canvas.attn-thumb')).map(c =>
            [+c.dataset.l, +c.dataset.h, Array.from(c.getContext('2d').getImageData(0, 0, 1, 1).data)])""")
        assert sorted((l, h) for l, h, _ in thumbs) == [(l, h) for l in range(2) for h in range(3)]
        assert all(rgb[:3] == [33, 102, 172] for _, _, rgb in thumbs)  # p[l, h, 0, 0] == 1

        def mouse(kind, selector, x, y):
            box = js(f"(() => {{ const r = {root}.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                     " return [r.left, r.top]; })()")
            chrome.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0] + x, "y": box[1] + y,
                                                     "button": "left", "clickCount": 1}, session=session)

        # a click on a thumbnail focuses that head
        mouse("mousePressed", "canvas.attn-thumb[data-l='1'][data-h='2']", 2, 2)
        mouse("mouseReleased", "canvas.attn-thumb[data-l='1'][data-h='2']", 2, 2)
        assert js(f"{root}.dataset.focus") == "1,2"
        assert js(f"{root}.querySelector('.attn-focus-title').textContent") == "layer 1 · head 2"
        assert js(f"{root}.querySelector('canvas.attn-thumb.selected').dataset.h") == "2"
        check_focused(1, 2)
        # hovering a cell shows the query token, the key token and the value
        q, k = 4, 2
        mouse("mouseMoved", "canvas.attn-big", left + k * cell + cell / 2, top + q * cell + cell / 2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not js(f"{root}.querySelector('.attn-tip').textContent"):
            time.sleep(0.05)
        tip = js(f"{root}.querySelector('.attn-tip').textContent")
        assert tip == f'query 4 " on" → key 2 " cat": {p[1, 2, q, k]:.4f}'
        # the token strip: hovering a token shows what the focused head attends to from it
        mouse("mouseMoved", "canvas.attn-big", -50, -50)
        span = "span[data-k='3']"
        box = js(f"(() => {{ const r = {root}.querySelector(\"{span}\").getBoundingClientRect();"
                 " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        chrome.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": box[0], "y": box[1]}, session=session)
        titles = js(f"Array.from({root}.querySelectorAll('.attn-tokens span')).map(s => s.title)")
        assert [float(t.rsplit(": ", 1)[1]) for t in titles] == pytest.approx(list(p[1, 2, 3]), abs=1e-4)
        assert js(f"{root}.querySelector('.attn-tokens span.query').dataset.k") == "3"
        # the second view on the page is independent: still on its first head
        assert js("document.querySelectorAll('.circuits-attn')[1].dataset.focus") == "0,0"
        requested = {e["params"]["request"]["url"] for e in chrome.events
                     if e.get("method") == "Network.requestWillBeSent"}
        assert requested <= {page.as_uri()}, requested
    finally:
        chrome.close()
