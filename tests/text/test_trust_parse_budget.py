"""The parser honours the allocation budget (issue 21 item 2): rust_circuit's random Arrays (an
Array line without a hash, or ``Array rand``) are refused before anything is allocated when one
of them, or all of a text's together, would take more than ``CIRCUITS_MAX_ALLOC_BYTES``; the
values drawn are what one ``standard_normal(shape)`` gives."""

import tracemalloc

import blake3
import numpy as np
import pytest

import circuits as C
from circuits.errors import ParseError, StoreError
from circuits.io.files import load
from circuits.io.store import write_safetensors


@pytest.fixture
def budget_1mb(monkeypatch):
    monkeypatch.setenv("CIRCUITS_MAX_ALLOC_BYTES", str(1 << 20))


@pytest.mark.parametrize("line", ["'r' [1000,1000] Array", "'r' [1000,1000] Array rand", "[1000,1000] Array"])
def test_one_random_array_over_the_budget_is_refused_before_allocating(budget_1mb, line):
    C.parse("'warm' [2] Array")  # (first-use imports and caches are not the tensor)
    tracemalloc.start()
    try:
        with pytest.raises(ParseError, match="budget of 1.0 MiB") as info:
            C.parse(line)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the tensor (4 MB, 8 MB as float64) was never allocated
    assert info.value.line_number == 1 and "CIRCUITS_MAX_ALLOC_BYTES" in str(info.value)


def test_an_enormous_random_array_is_refused_at_once():
    with pytest.raises(ParseError, match="budget"):
        C.parse("'r' [60000,60000] Array")


def test_random_arrays_of_one_text_share_the_budget(budget_1mb):
    one = "'a{}' [200,200] Array rand"  # 160 KB each: 6 fit, 7 do not
    six = "'s' Add\n" + "\n".join("  " + one.format(i) for i in range(6))
    assert C.parse(six).shape == (200, 200)
    seven = "'s' Add\n" + "\n".join("  " + one.format(i) for i in range(7))
    with pytest.raises(ParseError, match="random tensors to 1.1 MiB, over the allocation budget") as info:
        C.parse(seven)
    assert info.value.line_number == 8


def test_a_circuit_file_with_random_arrays_honours_the_budget(tmp_path, budget_1mb):
    text = b"'r' [1000,1000] Array"  # a 258-byte file that asked for 730 MB
    path = tmp_path / "rand.circuit"
    write_safetensors(path, {"__circuit_text__": np.frombuffer(text, np.uint8)},
                      {"format": "circuits", "format_version": "2", "roots": "1",
                       "text_blake3": blake3.blake3(text).hexdigest()})
    with pytest.raises(StoreError, match="budget"):
        load(path)


def test_random_values_are_one_standard_normal_draw():
    c = C.parse("'s' Add\n  'a' [3,4] Array rand\n  'b' [3,4] Array", seed=5)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    np.testing.assert_array_equal(c.children[0].value, a.astype(np.float32))
    np.testing.assert_array_equal(c.children[1].value, b.astype(np.float32))
    assert c.children[0].value.dtype == np.float32


# ---------------------------------------------------------------------------- item 10
def test_failed_parses_of_big_specs_leave_nothing_in_the_caches():
    """Caches remember small calls only: an entry never holds a big spec (issue 21 item 10)."""
    import gc

    def big_einsum(j):  # a 15 KB spec over one child: refused for its operand count
        return "'e' Einsum " + ",".join(["ab"] * (5000 + j)) + "->ab\n  'x' [2,2] Symbol"

    def big_add(j):  # an Add of many children whose shapes do not broadcast
        return "'a' Add\n" + "".join(f"  'x{i}' [{i % 7 + 1}] Symbol\n" for i in range(1000 + j))

    from circuits.backend.cache.background import wait_for_background

    for make in (big_einsum, big_add):
        with pytest.raises(ParseError):
            C.parse(make(99))  # first use: imports, interned names
        # tracemalloc counts every thread: an earlier test's kernels being made in the background
        # (the numpy first run queues them) would count as kept here (10 MB once, in the full suite)
        wait_for_background()
        gc.collect()
        tracemalloc.start()
        try:
            for j in range(4):
                with pytest.raises(ParseError):
                    C.parse(make(j))
            gc.collect()
            kept, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert kept < 200_000, (make.__name__, kept)


# ---------------------------------------------------------------------------- item 7
def test_a_text_too_big_to_parse_within_the_budget_is_refused_at_once(tmp_path, budget_1mb, monkeypatch):
    from circuits.io.files import save
    from circuits.text import parser

    monkeypatch.setattr(parser, "PARSE_FREE_CHARS", 1000)  # (1 MiB of text always parses)

    c = C.Add(*[C.Scalar(float(i), name=f"term.{i}") for i in range(2000)], name="sum")
    text = c.to_text()
    assert 25_000 < len(text) < 1 << 20  # fits the budget itself, but not 40 bytes per character of it
    with pytest.raises(ParseError, match="parsing it needs about .* over the allocation budget of 1.0 MiB"):
        C.parse(text)
    # save refuses what load would refuse under the same budget (issue 33 item 12); written under
    # a larger one, the file is refused by a load under the smaller one
    with pytest.raises(StoreError, match="cannot save to .*c.circuit: load would refuse the file: this text is "):
        save(c, tmp_path / "c.circuit")
    monkeypatch.setenv("CIRCUITS_MAX_ALLOC_BYTES", str(1 << 30))
    save(c, tmp_path / "c.circuit")
    monkeypatch.setenv("CIRCUITS_MAX_ALLOC_BYTES", str(1 << 20))
    with pytest.raises(StoreError, match="c.circuit: this text is .*CIRCUITS_MAX_ALLOC_BYTES"):
        load(tmp_path / "c.circuit")
