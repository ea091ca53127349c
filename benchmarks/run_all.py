"""Run every benchmark, one fresh process each (so one benchmark's caches and garbage do not
colour the next), and write what each printed into BENCHMARKS.md.

``make bench`` or ``python -m benchmarks.run_all [name ...]`` (``--no-write`` only prints).

Registering a benchmark: add a module ``benchmarks/bench_<name>.py`` whose ``main()`` prints its
figures (ratios against a hand-written baseline run in the same process) and which runs as
``python -m benchmarks.bench_<name>``; that is all: every ``bench_*.py`` is found.  Its output goes
into BENCHMARKS.md between the markers ``<!-- bench:bench_<name> -->`` and
``<!-- /bench:bench_<name> -->`` (added at the end of the file the first time), with the command,
machine and date; the text outside the markers is left as it is.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS_MD = HERE.parent / "BENCHMARKS.md"


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


def main(argv=None):
    args = list(argv if argv is not None else sys.argv[1:])
    write = "--no-write" not in args
    names = [a for a in args if not a.startswith("--")] or discover()
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    where = machine()
    failed = []
    for name in names:
        print(f"\n=== benchmarks.{name}", flush=True)
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}"], stdout=subprocess.PIPE, text=True)
        print(proc.stdout, end="", flush=True)
        if proc.returncode != 0:
            failed.append(name)
            continue
        if write:
            text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else "# Benchmarks\n"
            BENCHMARKS_MD.write_text(write_section(text, name, section(name, proc.stdout, when, where)))
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
