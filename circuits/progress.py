"""Progress bars for long loops: tqdm's notebook or terminal form, or nothing.

``progress(iterable, total=, desc=, enabled=)`` wraps an iterable like ``tqdm.auto.tqdm`` (a
widget in Jupyter, a text bar in a terminal) and returns a bar object with ``update(n)``,
``set_postfix(**values)`` and ``close()``; it is also a context manager.  When ``enabled`` is
false, or tqdm is not installed, it returns a silent bar with the same methods, so callers
never branch on whether a bar is shown.  ``enabled=None`` (the default) shows a bar only when
stderr is a terminal or the code runs in a notebook, so test logs and pipes stay clean; the
environment variable ``CIRCUITS_PROGRESS`` changes that default for every bar and notice
(``0``: never shown, ``1``: always).

``notice_after(seconds, message)`` says ``message`` once on stderr if the work it announces is
still going on ``seconds`` later (cancel it when the work ends): a long compilation says
``circuits: compiling 14 kernels…`` this way, shown and silenced as the bars are.

>>> from circuits.progress import progress
>>> with progress(range(3), desc="steps", enabled=False) as bar:
...     total = 0
...     for i in bar:
...         total += i
...     bar.set_postfix(loss=0.5)
>>> total
3
>>> bar = progress(total=10, enabled=False)
>>> bar.update(4); bar.n
4
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Iterable

__all__ = ["progress", "SilentBar", "notice_after", "shown"]


class SilentBar:
    """A bar that shows nothing: iterates its iterable and counts ``n`` like tqdm's bar does."""

    def __init__(self, iterable: Iterable | None = None, total: int | None = None, desc: str | None = None):
        self.iterable = iterable
        self.total = total
        self.desc = desc
        self.n = 0
        self.postfix: dict = {}

    def __iter__(self):
        if self.iterable is None:
            raise TypeError("this progress bar was made without an iterable: call update(n) instead")
        for item in self.iterable:
            yield item
            self.n += 1

    def __len__(self):
        if self.total is not None:
            return self.total
        return len(self.iterable)

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **values) -> None:
        self.postfix = dict(values)

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except AttributeError:
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _default_enabled() -> bool:
    choice = os.environ.get("CIRCUITS_PROGRESS", "").strip().lower()
    if choice in ("0", "false", "no", "off"):
        return False
    if choice in ("1", "true", "yes", "on"):
        return True
    stream = sys.stderr
    return _in_notebook() or bool(getattr(stream, "isatty", lambda: False)())


def shown() -> bool:
    """Whether bars and notices are shown by default here (``CIRCUITS_PROGRESS``, else a terminal
    or a notebook)."""
    return _default_enabled()


class _Notice:
    """A message said once after a delay unless cancelled first (``notice_after``)."""

    def __init__(self, seconds: float, message: str):
        self.message = message
        self._timer = threading.Timer(seconds, self._say)
        self._timer.daemon = True
        self._timer.start()

    def _say(self) -> None:
        tqdm = _tqdm_class()
        if tqdm is not None:
            tqdm.write(self.message, file=sys.stderr)
        else:
            print(self.message, file=sys.stderr, flush=True)

    def cancel(self) -> None:
        self._timer.cancel()


class _Silent:
    def cancel(self) -> None:
        pass


def notice_after(seconds: float, message: str, enabled: bool | None = None):
    """Say ``message`` on stderr once, ``seconds`` from now, unless ``.cancel()`` is called
    first; ``enabled`` as for ``progress`` (None: shown where bars are).

    >>> notice_after(1.0, 'compiling 3 kernels…', enabled=False).cancel()
    """
    if enabled is None:
        enabled = _default_enabled()
    return _Notice(seconds, message) if enabled else _Silent()


def _tqdm_class():
    """``tqdm.auto.tqdm``, or None when tqdm is not installed."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str | None = None,
             enabled: bool | None = None, leave: bool = True, **tqdm_options):
    """A progress bar over ``iterable`` (or one driven by ``update(n)`` up to ``total``).

    ``enabled``: True shows a bar (when tqdm is installed), False never does, None (default)
    shows one in a terminal or a notebook only.  Extra keyword options go to tqdm.

    >>> bar = progress([1, 2], enabled=False)
    >>> list(bar), bar.n
    ([1, 2], 2)
    """
    if enabled is None:
        enabled = _default_enabled()
    tqdm = _tqdm_class() if enabled else None
    if tqdm is None:
        return SilentBar(iterable, total=total, desc=desc)
    return tqdm(iterable, total=total, desc=desc, leave=leave, **tqdm_options)
