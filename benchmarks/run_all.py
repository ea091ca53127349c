"""Run every benchmark, one fresh process each (so one benchmark's caches and garbage do not
colour the next), and write what each printed into docs/benchmarks.md.

``make bench`` or ``python -m benchmarks.run_all [name ...]`` (``--no-write`` only prints).

Regression guard: before a section is rewritten, every ratio its benchmark printed (a line whose
label says ``ratio`` and that ends in a number: ``  ratio circuit / hand  0.97``) is compared
with the same line as last recorded in docs/benchmarks.md; the ratios that grew by more than
``--tolerance`` (default 10%: the machine is shared) are listed at the end as got worse (every
ratio here is a time against a baseline: lower is better).  ``--strict`` makes that an error.

Registering a benchmark: add a module ``benchmarks/bench_<name>.py`` whose ``main()`` prints its
figures (ratios against a hand-written baseline run in the same process) and which runs as
``python -m benchmarks.bench_<name>``; that is all: every ``bench_*.py`` is found.  Its output goes
into docs/benchmarks.md between the markers ``<!-- bench:bench_<name> -->`` and
``<!-- /bench:bench_<name> -->`` (added at the end of the file the first time), with the command,
machine and date; the text outside the markers is left as it is.  A benchmark that needs another
environment (the TransformerLens / auto-circuit side by side: ``bench_autocircuit``,
``bench_latency_tl``, ``bench_gpt2_first``) exits with status 77 where its packages are missing, and is skipped.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from .tl_models import SKIPPED  # the exit status of a benchmark that cannot run in this environment

HERE = Path(__file__).resolve().parent
BENCHMARKS_MD = HERE.parent / "docs" / "benchmarks.md"  # the history (BENCHMARKS.md: its summary)


def discover() -> list[str]:
    """Every ``bench_*.py`` module here, sorted."""
    return sorted(p.stem for p in HERE.glob("bench_*.py"))


def machine() -> str:
    try:
        import jax

        dev = jax.devices()[0]
        device = f"{dev.platform} ({dev.device_kind})"
    except Exception:  # noqa: BLE001 - jax missing or no device: say so in the header
        device = "no jax device"
    return f"{platform.node() or 'host'}, {platform.machine()}, {os.cpu_count()} CPUs, {device}, Python {platform.python_version()}"


def section(name: str, output: str, when: str, where: str) -> str:
    return (f"<!-- bench:{name} -->\n"
            f"`python -m benchmarks.{name}` ({where}; {when})\n\n```\n{output.rstrip()}\n```\n"
            f"<!-- /bench:{name} -->")


def write_section(text: str, name: str, block: str) -> str:
    """``text`` with the section of ``name`` replaced by ``block`` (appended if it has none)."""
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    return text.rstrip("\n") + "\n\n" + block + "\n"


_RATIO_LINE = re.compile(r"^\s*(.*?ratio.*?)\s{2,}(-?\d+(?:\.\d+)?)\s*$", re.I)


def ratios(text: str) -> dict[str, float]:
    r"""``{label: value}`` of the ratio lines in a benchmark's output (or its recorded section).

    >>> ratios("title\n  ratio a / b (target <= 1.05)   0.970\n  other  3 ms\n  ratio c / d  1.2")
    {'ratio a / b (target <= 1.05)': 0.97, 'ratio c / d': 1.2}
    """
    out = {}
    for line in text.splitlines():
        m = _RATIO_LINE.match(line)
        if m:
            out[m.group(1).strip()] = float(m.group(2))
    return out


def recorded(text: str, name: str) -> str:
    """The last recorded output of ``name`` in docs/benchmarks.md's text ('' if none)."""
    m = re.search(rf"<!-- bench:{re.escape(name)} -->(.*?)<!-- /bench:{re.escape(name)} -->", text, re.S)
    return m.group(1) if m else ""


def got_worse(old: dict, new: dict, tolerance: float = 0.10) -> list[tuple[str, float, float]]:
    """``(label, old, new)`` for each ratio in both that grew by more than ``tolerance``.

    >>> got_worse({"ratio x": 1.0, "ratio y": 1.0}, {"ratio x": 1.2, "ratio y": 1.05, "ratio z": 9.0})
    [('ratio x', 1.0, 1.2)]
    """
    return [(k, old[k], v) for k, v in new.items() if k in old and v > old[k] * (1 + tolerance)]


def _option(args: list, name: str, default: str) -> str:
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return default


def main(argv=None):
    args = list(argv if argv is not None else sys.argv[1:])
    write = "--no-write" not in args
    tolerance = float(_option(args, "tolerance", "0.10"))
    worse: list = []
    compared = 0
    names = [a for a in args if not a.startswith("--")] or discover()
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    where = machine()
    failed = []
    for name in names:
        print(f"\n=== benchmarks.{name}", flush=True)
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}"], stdout=subprocess.PIPE, text=True)
        print(proc.stdout, end="", flush=True)
        if proc.returncode == SKIPPED:  # needs another environment (it said which on stderr)
            print(f"skipped benchmarks.{name}: it runs in its own environment", flush=True)
            continue
        if proc.returncode != 0:
            failed.append(name)
            continue
        text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else "# Benchmarks\n"
        old, new = ratios(recorded(text, name)), ratios(proc.stdout)
        compared += len(old.keys() & new.keys())
        worse += [(name, *w) for w in got_worse(old, new, tolerance)]
        if write:
            BENCHMARKS_MD.write_text(write_section(text, name, section(name, proc.stdout, when, where)))
    print(f"\nregression guard: {compared} ratios compared with docs/benchmarks.md's last record "
          f"(tolerance {tolerance:.0%})")
    for name, label, before, now in worse:
        print(f"  got worse: {name}: {label}: {before:g} -> {now:g}")
    if not worse:
        print("  none got worse")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
    if worse and "--strict" in args:
        sys.exit(f"{len(worse)} ratio(s) got worse")


if __name__ == "__main__":
    main()
