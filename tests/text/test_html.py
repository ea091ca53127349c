"""The notebook view: structure checked with html.parser, behaviour in a real headless Chromium."""

import json
import os
import select
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import circuits as C
from circuits import Add, Array, Einsum, GeneralFunction, Index, Scalar, Symbol
from circuits.text.html import to_html

SEED = Path(__file__).resolve().parents[1] / "golden" / "attn_only_loss.txt"  # the seed file, byte for byte
VOID = {"br", "hr", "img", "input", "meta", "link", "wbr"}


class Element:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children = []
        self.text = ""

    def classes(self):
        return set((self.attrs.get("class") or "").split())

    def iter(self):
        stack = [self]
        while stack:
            e = stack.pop()
            yield e
            stack.extend(reversed(e.children))

    def all_text(self):
        return "".join(e.text for e in self.iter())

    def depth(self):
        d, e = 0, self
        while e.parent is not None:
            d, e = d + 1, e.parent
        return d


class TreeBuilder(HTMLParser):
    """A strict DOM builder: every element must be closed, in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {}, None)
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        e = Element(tag, attrs, self.current)
        self.current.children.append(e)
        if tag not in VOID:
            self.current = e

    def handle_endtag(self, tag):
        assert self.current.tag == tag, f"</{tag}> closes <{self.current.tag}>"
        self.current = self.current.parent

    def handle_data(self, data):
        self.current.text += data


def dom(page):
    b = TreeBuilder()
    b.feed(page)
    b.close()
    assert b.current is b.root, f"<{b.current.tag}> never closed"
    return b.root


def node_entries(root):
    """(kind, element) for each node line in document order: 'tree' (details), 'leaf' or 'ref'."""
    out = []
    for e in root.iter():
        if e.tag == "details":
            out.append(("tree", e))
        elif e.tag == "div" and "leaf" in e.classes():
            out.append(("leaf", e))
        elif e.tag == "div" and "ref" in e.classes():
            out.append(("ref", e))
    return out


def line_text(kind, e):
    if kind == "tree":
        return next(c for c in e.children if c.tag == "summary").all_text()
    return e.all_text()


def expected_preorder(root):
    """Oracle: written independently (recursive is fine for small test circuits)."""
    seen, out = set(), []

    def visit(n):
        if n in seen:
            out.append(("ref", n))
            return
        seen.add(n)
        out.append(("tree" if n.children else "leaf", n))
        for c in n.children:
            visit(c)

    visit(root)
    return out


def small_dag():
    x = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name="x")
    h = Einsum.from_spec("ab,ab->a", x, x, name="h")
    g = GeneralFunction("exp", h, name="g")
    s = Add(g, h, Scalar(1.0), name="s")
    return Add(s, Index(s, (slice(0, 1),)), Einsum.from_spec("a->", g), name="out")


def test_tree_matches_a_preorder_walk_with_links_to_first_appearances():
    c = small_dag()
    root = dom(to_html(c, open_depth=1))
    got = node_entries(root)
    want = expected_preorder(c)
    assert [k for k, _ in got] == [k for k, _ in want]
    ids = {}
    for (kind, e), (_, node) in zip(got, want):
        text = line_text(kind, e)
        if kind == "ref":
            (a,) = [x for x in e.iter() if x.tag == "a"]
            target = ids[node]
            assert a.attrs["href"] == "#" + target.attrs["id"]
            assert (node.name or "(unnamed)") in text and node.type_name in text
            continue
        ids[node] = e
        assert node.type_name in text
        if node.name:
            assert f"'{node.name}'" in text
        assert "[" + ",".join(map(str, node.shape)) + "]" in text
        if node.payload_text():
            assert node.payload_text() in text
        if kind == "tree":  # children sit inside the node's own <details>
            kids = [k for k in e.children if k.tag == "div" and "kids" in k.classes()]
            assert len(kids) == 1
            assert ("open" in e.attrs) == (e.depth() <= 2)  # root div > details: only the root open
    all_ids = [e.attrs["id"] for e in root.iter() if "id" in e.attrs]
    assert len(all_ids) == len(set(all_ids))


def test_dtypes_placeholders_and_escaping():
    hole = Array.placeholder((4,), "0123abcd", name="w<b>&'")
    toks = Symbol((4,), name="</div><script>alert(1)</script>", dtype="int64")
    ints = Array(np.arange(4, dtype=np.int64), name="ints")
    c = Add(hole, GeneralFunction("sigmoid", hole), Index(toks, (slice(None),)), ints, name="top")
    page = to_html(c)
    root = dom(page)
    assert not [e for e in root.iter() if e.tag == "script"]
    assert "&lt;script&gt;" in page
    text = root.all_text()
    assert "'w<b>&\\''" in text  # quoted as the text format quotes names, then HTML-escaped
    assert "0123abcd" in text and "(placeholder)" in text
    assert "[4] int64" in text
    assert text.count("[4] int64") == 3  # the Symbol, the Index of it and the int Array


def test_long_payloads_are_shortened():
    x = Array(np.arange(1000, dtype=np.float32), name="x")
    picked = Index(x, (np.arange(0, 1000, 3),), name="every_third")
    page = to_html(picked)
    assert picked.payload_text()[:50] in page
    assert picked.payload_text() not in page and "…" in page


def test_self_contained_and_no_script():
    page = to_html(C.parse(SEED.read_text()))
    low = page.lower()
    for needle in ("<script", "<link", "src=", "http://", "https://", "@import", "url("):
        assert needle not in low
    root = dom(page)
    assert [e for e in root.iter() if e.tag == "style"]


def test_seed_renders_fully_within_defaults():
    c = C.parse(SEED.read_text())
    got = node_entries(dom(to_html(c, max_nodes=10_000, max_depth=100)))
    assert [k for k, _ in got] == [k for k, _ in expected_preorder(c)]
    assert "showing the first" not in to_html(c, max_nodes=10_000, max_depth=100)


def test_max_nodes_caps_a_wide_circuit_and_says_so():
    wide = Add(*[Scalar(float(i)) for i in range(20_000)], name="wide")
    page = to_html(wide, max_nodes=50)
    entries = node_entries(dom(page))
    assert len(entries) == 50
    assert "19951 more children not shown" in page
    assert "max_nodes=" in page and "to_text()" in page


def test_max_nodes_caps_a_bushy_dag_and_keeps_html_well_formed():
    layer = [Array(np.full(2, i, np.float32), name=f"leaf{i}") for i in range(6)]
    for depth in range(8):
        layer = [Add(layer[i], layer[(i + 1) % len(layer)], name=f"d{depth}.{i}") for i in range(len(layer))]
    c = Add(*layer, name="top")
    want = [k for k, _ in expected_preorder(c)]
    for cap in (1, 2, 7, 33, len(want) - 1, len(want), 1000):
        page = to_html(c, max_nodes=cap, max_depth=100)
        assert [k for k, _ in node_entries(dom(page))] == want[:cap]
        assert ("showing the first" in page) == (cap < len(want))


@pytest.mark.usefixtures("low_recursion_limit")
def test_a_50000_deep_chain_renders_without_recursion(deep_chain):
    page = deep_chain._repr_html_()  # to_html must not need the stack depth a recursive walk would
    assert len(page) < 100_000
    root = dom(page)
    details = [e for e in root.iter() if e.tag == "details"]
    assert len(details) == 40
    assert max(e.depth() for e in root.iter()) < 200  # browsers flatten nesting beyond ~512
    assert "below depth 40 not shown" in page
    assert "'n49999'Add" in line_text("tree", details[0])  # the top node's line (its spans, text only)


def test_argument_checks():
    with pytest.raises(ValueError):
        to_html(Scalar(1.0), max_nodes=0)


# ---------------------------------------------------------------------------- real browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = ("no chromium or chromium-browser on PATH: `make test` installs Debian's chromium when run as "
               "root with apt (make system-deps); elsewhere install it by hand")


class DevTools:
    """Minimal Chrome DevTools Protocol client over --remote-debugging-pipe (fds 3 and 4)."""

    def __init__(self, exe, profile_dir):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        # Chromium reads commands on fd 3 and writes replies on fd 4.  A shell moves our pipe
        # ends there, so no Python runs in the forked child (JAX's threads make that unsafe).
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-default-apps", "--disable-extensions", "--remote-debugging-pipe",
                 f"--user-data-dir={profile_dir}", "about:blank"]
        self.proc = subprocess.Popen(
            # (bash, not sh: dash cannot redirect file descriptors above 9)
            [shutil.which("bash") or "/bin/bash", "-c", f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', "sh", exe,
             *flags],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(to_chrome_r, from_chrome_w),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events = []

    def send(self, method, params=None, session=None, timeout=30):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_event(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read(max(0.1, deadline - time.monotonic())))
            if time.monotonic() > deadline:
                raise TimeoutError(method)

    def _read(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_chrome], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("no reply from Chromium")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_tree_in_headless_chromium_expands_on_click_and_follows_links(tmp_path):
    c = C.parse(SEED.read_text())
    page = tmp_path / "view.html"
    page.write_text("<!doctype html><meta charset='utf-8'><title>circuit</title><body>"
                    + to_html(c) + "</body>", encoding="utf-8")
    chrome = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        target = chrome.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = chrome.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        chrome.send("Page.enable", session=session)
        chrome.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 900, "deviceScaleFactor": 1,
                                                           "mobile": False}, session=session)
        chrome.send("Network.enable", session=session)
        chrome.send("Page.navigate", {"url": page.as_uri()}, session=session)
        chrome.wait_event("Page.loadEventFired")

        def js(expression):
            result = chrome.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                 session=session)
            assert "exceptionDetails" not in result, result
            return result["result"].get("value")

        def click(selector):
            box = js(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
                e.scrollIntoView({{block: 'center', inline: 'center'}}); const r = e.getClientRects()[0];
                return [r.left + Math.min(r.width / 2, 20), r.top + r.height / 2]; }})()""")
            for kind in ("mousePressed", "mouseReleased"):
                chrome.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1],
                                                         "button": "left", "clickCount": 1}, session=session)

        counts = js("""[document.querySelectorAll('.circuits-html details').length,
                         document.querySelectorAll('.circuits-html details[open]').length,
                         document.querySelectorAll('.circuits-html .ref a').length]""")
        assert counts[0] == len([n for n in c.toposort() if n.children]) and 0 < counts[1] < counts[0]
        assert counts[2] > 0
        # The root's line is laid out; a node inside a closed <details> is not rendered.
        assert js("document.querySelector('.circuits-html > details > summary').getClientRects().length") == 1
        closed = js("""(() => { const d = [...document.querySelectorAll('.circuits-html details')]
            .find(d => !d.open && d.parentElement.closest('details').open); d.id ||= 'x';
            return d.id; })()""")
        inner = f"document.querySelector('#{closed} > .kids > *')"
        height = "document.querySelector('.circuits-html').getBoundingClientRect().height"
        assert js(f"{inner}.checkVisibility()") is False
        before = js(height)
        click(f"#{closed} > summary")  # a real mouse click, dispatched by the browser
        assert js(f"document.getElementById('{closed}').open") is True
        assert js(f"{inner}.checkVisibility()") is True
        assert js(f"{inner}.getBoundingClientRect().height") > 0
        assert js(height) > before  # the page laid out the opened children
        click(f"#{closed} > summary")
        assert js(f"document.getElementById('{closed}').open") is False
        assert js(f"{inner}.checkVisibility()") is False

        # A link to a node first shown inside closed <details>: following it reveals the node.
        # Pick a link whose target hides in a closed <details> that does not also hold the link;
        # open the link's own ancestors (set-up), then follow it with a click.
        link = js("""(() => {
            const closedAbove = e => { const out = []; let d = e.parentElement.closest('details');
                while (d) { if (!d.open) out.push(d); d = d.parentElement.closest('details'); }
                return out; };
            const a = [...document.querySelectorAll('.circuits-html .ref a')].find(a => {
                const t = document.getElementById(a.getAttribute('href').slice(1));
                const mine = closedAbove(a);
                return closedAbove(t).some(d => !mine.includes(d)); });
            closedAbove(a).forEach(d => { d.open = true; });
            a.id = 'the-link'; return a.getAttribute('href').slice(1); })()""")
        assert js("document.getElementById('the-link').checkVisibility()") is True
        assert js(f"document.getElementById('{link}').checkVisibility()") is False
        click("#the-link")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and js("location.hash") != "#" + link:
            time.sleep(0.05)
        assert js("location.hash") == "#" + link
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not js(f"document.getElementById('{link}').checkVisibility()"):
            time.sleep(0.05)
        assert js(f"document.getElementById('{link}').checkVisibility()") is True
        assert js(f"document.getElementById('{link}').parentElement.closest('details').open") is True

        requested = {e["params"]["request"]["url"] for e in chrome.events
                     if e.get("method") == "Network.requestWillBeSent"}
        assert requested <= {page.as_uri(), page.as_uri() + "#" + link}, requested
    finally:
        chrome.close()


# ---------------------------------------------------------------------------- open=, values=, search
def test_open_expands_exactly_the_paths_to_the_chosen_nodes():
    c = C.parse(SEED.read_text())
    page = to_html(c, open_depth=0, open=["b1.a.head3", C.select.Regex(r"^a0\.w\.k$")], max_nodes=10_000,
                   max_depth=100)
    root = dom(page)
    marked = [e for e in root.iter() if "target" in e.classes()]
    assert sorted(e.all_text().split("'")[1] for e in marked) == ["a0.w.k", "b1.a.head3"]
    # Oracle from the DOM: the <details> above each marked line, and no other, are open.
    want = set()
    for e in marked:
        d = e.parent if e.tag == "summary" else e  # a summary's own <details> is the node itself
        d = d.parent
        while d is not None:
            if d.tag == "details":
                want.add(id(d))
            d = d.parent
    opened = {id(e) for e in root.iter() if e.tag == "details" and "open" in e.attrs}
    assert opened == want and len(want) > 3


def test_values_show_statistics_checked_against_numpy():
    from circuits.text.html import value_stats

    rng = np.random.default_rng(0)
    v = rng.standard_normal((3, 50)).astype(np.float32)
    text = value_stats(v)
    assert text.startswith("[3,50] ")
    for word, want in [("mean", v.mean()), ("std", v.std()), ("min", v.min()), ("max", v.max())]:
        got = float(text.split(word + " ")[1].split()[0])
        assert abs(got - want) <= 5e-3 * max(1, abs(want)), (word, got, want)
    counts, _ = np.histogram(v, bins=8)
    spark = text.split()[-1]
    assert len(spark) == 8 and spark.index("█") == int(np.argmax(counts))
    assert "2 non-finite" in value_stats(np.array([1.0, np.nan, np.inf, 2.0]))
    x = Array(np.arange(6, dtype=np.float32), name="x")
    c = GeneralFunction("exp", x, name="y")
    page = to_html(c, values={"x": np.arange(6.0), c: np.exp(np.arange(6.0))})
    stats = [e.all_text() for e in dom(page).iter() if "stats" in e.classes()]
    assert len(stats) == 2 and any("mean 2.5" in s for s in stats)


def test_search_box_only_when_asked():
    c = small_dag()
    assert "<input" not in to_html(c)
    page = to_html(c, search=True)
    (box,) = [e for e in dom(page).iter() if e.tag == "input"]
    assert box.attrs["type"] == "search" and "closest" in box.attrs["oninput"]


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_search_and_open_in_headless_chromium(tmp_path):
    c = C.parse(SEED.read_text())
    page = tmp_path / "search.html"
    page.write_text("<!doctype html><meta charset='utf-8'><body>"
                    + to_html(c, open_depth=1, search=True, open=["b0.a.head5"]) + "</body>", encoding="utf-8")
    chrome = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        target = chrome.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = chrome.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        chrome.send("Page.enable", session=session)
        chrome.send("Page.navigate", {"url": page.as_uri()}, session=session)
        chrome.wait_event("Page.loadEventFired")

        def js(expression):
            result = chrome.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                 session=session)
            assert "exceptionDetails" not in result, result
            return result["result"].get("value")

        # open=: the chosen head's line is laid out (every <details> above it open).
        head = "[...document.querySelectorAll('.circuits-html .target')][0]"
        assert js(f"{head}.textContent.startsWith(\"'b0.a.head5'\")") is True
        assert js(f"{head}.checkVisibility()") is True
        assert js(f"{head}.parentElement.querySelector('.kids > *').checkVisibility()") is False  # itself closed
        other = """[...document.querySelectorAll('.circuits-html summary, .circuits-html .leaf')]
            .find(s => s.textContent.startsWith("'a0.w.q.head6'"))"""
        assert js(f"{other}.checkVisibility()") is False  # opening one head's path leaves others closed
        # Typing in the search box (real key events) highlights and reveals the matches.
        js("document.querySelector('.circuits-html input').focus()")
        chrome.send("Input.insertText", {"text": "head6"}, session=session)
        hits = js("[...document.querySelectorAll('.circuits-html .hit')].map(e => e.textContent.split(' ')[0])")
        expected = [n for n in c.toposort() if n.name and "head6" in n.name]
        assert len(hits) >= len({n.name for n in expected}) > 0
        assert all("head6" in h for h in hits)
        assert js(f"{other}.checkVisibility()") is True
        assert js("document.querySelector('.circuits-html .search-count').textContent").endswith("matches")
        js("(() => { const b = document.querySelector('.circuits-html input'); b.value = '';"
           " b.dispatchEvent(new Event('input')); })()")
        assert js("document.querySelectorAll('.circuits-html .hit').length") == 0
    finally:
        chrome.close()


# ---------------------------------------------------------------------------- at=: start at a layer
def test_the_view_opens_at_a_chosen_layer():
    c = C.parse(SEED.read_text())
    b1 = c.get_unique("b1")
    for at in (1, "b1", b1, C.select.Regex(r"^b1$")):
        page = to_html(c, at=at, max_nodes=10_000, max_depth=100)
        root = dom(page)
        got = node_entries(root)
        want = expected_preorder(b1)  # the tree of the layer itself, not of the loss
        assert [k for k, _ in got] == [k for k, _ in want]
        assert line_text(*got[0]).split() == ["'b1'Add[300,256]"]
        (crumbs,) = [e.all_text() for e in root.iter() if "crumbs" in e.classes()]
        path = crumbs.split(" > ")
        assert path[0] == "'t.loss'" and path[-1] == "'b1'"
        node = c  # the breadcrumb is a real root-to-layer path
        for label in path[1:]:
            node = next(k for k in node.children if k.name == label.strip("'"))
        assert node is b1
    assert 'class="crumbs"' not in to_html(c)
    head = dom(to_html(c, at="b0.a.head3"))
    assert line_text(*node_entries(head)[0]).split()[0].startswith("'b0.a.head3'")
    with pytest.raises(C.SelectionError, match="layer 7"):
        to_html(c, at=7)
    assert to_html(c, at=0)._repr_html_().startswith('<div class="circuits-html">')  # a notebook shows it
