"""Progress bars for long loops: tqdm's notebook or terminal form, or nothing.

``progress(iterable, total=, desc=, enabled=)`` wraps an iterable like ``tqdm.auto.tqdm`` (a
widget in Jupyter, a text bar in a terminal) and returns a bar object with ``update(n)``,
``set_postfix(**values)`` and ``close()``; it is also a context manager.  When ``enabled`` is
false, or tqdm is not installed, it returns a silent bar with the same methods, so callers
never branch on whether a bar is shown.  ``enabled=None`` (the default) shows a bar only when
stderr is a terminal or the code runs in a notebook, so test logs and pipes stay clean; the
environment variable ``CIRCUITS_PROGRESS`` changes that default for every bar and notice
(``0``: never shown, ``1``: always).

A bar made with ``total=`` estimates the time left from the work done, not from its first step:
``Estimate`` leaves out the seconds a step spent on one-off work (``one_off=``: a clock of the
calling thread's compilation seconds, which a sweep's first chunk of each program spends on XLA)
and, once later steps are timed, the first step itself (whatever else it did once: tracing,
planning, warming caches); steps may weigh what they cost (``update(n, cost=)``), so a bar whose
first item compiled for a minute and whose others take a millisecond says "a second left" after
the second item, where tqdm's own rate (items over elapsed time) said an hour.

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
import time
from typing import Callable, Iterable

__all__ = ["progress", "SilentBar", "notice_after", "shown", "Estimate"]


class Estimate:
    """The time left in a loop of ``total`` items, from the work done so far.

    ``record(n, seconds, one_off=0.0, cost=None)`` notes a step: ``n`` items finished in
    ``seconds``, of which ``one_off`` went to work done once (XLA compilation, measured), the items
    weighing ``cost`` (default ``n``; ``total_cost`` is the whole loop's, default ``total``).  The
    rate is the cost finished per second of work, one-off seconds left out; the first step counts
    only while it is the only one (a first step does one-off work no clock sees: tracing,
    planning, filling caches).  ``remaining()`` is the seconds left (None before any step),
    ``rate()`` the items per second that gives it (what tqdm shows).

    >>> e = Estimate(total=100)
    >>> e.record(1, seconds=60.0, one_off=59.0)    # compiled for 59 s, ran for 1 s
    >>> e.remaining()
    99.0
    >>> e.record(9, seconds=0.009)                 # the next nine: 1 ms each
    >>> round(e.remaining(), 3)                    # the first step no longer counts
    0.09
    """

    def __init__(self, total: int, total_cost: float | None = None):
        self.total = int(total)
        self.total_cost = float(self.total if total_cost is None else total_cost)
        self.n = 0
        self.cost = 0.0  # cost finished
        self._first: tuple | None = None  # (cost, work seconds) of the first step
        self._later = [0.0, 0.0]  # cost and work seconds of the steps after it
        self._lock = threading.Lock()

    def record(self, n: int, seconds: float, one_off: float = 0.0, cost: float | None = None) -> None:
        """Note ``n`` items finished in ``seconds``, ``one_off`` of them spent on one-off work."""
        cost = float(n if cost is None else cost)
        work = max(float(seconds) - max(float(one_off), 0.0), 0.0)
        with self._lock:
            self.n += int(n)
            self.cost += cost
            if self._first is None:
                self._first = (cost, work)
            else:
                self._later[0] += cost
                self._later[1] += work

    def _per_second(self) -> float | None:
        """Cost finished per second of (recurring) work; None before any step."""
        if self._first is None:
            return None
        cost, work = self._later if self._later[0] > 0 else self._first
        return cost / max(work, 1e-6)

    def remaining(self) -> float | None:
        """Seconds left by the rate of the work done (None before any step)."""
        per_second = self._per_second()
        if per_second is None:
            return None
        return max(self.total_cost - self.cost, 0.0) / per_second

    def rate(self) -> float | None:
        """Items per second that give ``remaining()`` for the items left (None before any step, or
        when none is left)."""
        left = self.remaining()
        if left is None:
            return None
        items = max(self.total - self.n, 0)
        if items == 0:
            return None  # nothing left: the bar's own average is as good
        return items / max(left, 1e-6)


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

    def update(self, n: int = 1, cost: float | None = None) -> None:
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


def _now() -> float:
    return time.perf_counter()


_estimating: dict = {}  # tqdm class -> its subclass that estimates from work done


def _estimating_class(tqdm):
    """``tqdm``'s subclass whose time left comes from an ``Estimate`` (``update(n, cost=)``)."""
    found = _estimating.get(tqdm)
    if found is not None:
        return found

    class EstimatingBar(tqdm):
        def __init__(self, *args, total_cost=None, one_off: Callable[[], float] | None = None, **kwargs):
            self._estimate = None
            self._one_off = one_off
            self._last = (_now(), one_off() if one_off is not None else 0.0)
            super().__init__(*args, **kwargs)
            if self.total:
                self._estimate = Estimate(self.total, total_cost)

        def _note(self, n: int, cost=None) -> None:
            # on the calling thread: the one-off clock is that thread's
            if self._estimate is None:
                return
            now = (_now(), self._one_off() if self._one_off is not None else 0.0)
            self._estimate.record(n, now[0] - self._last[0], now[1] - self._last[1], cost)
            self._last = now

        def update(self, n=1, cost=None):
            self._note(n, cost)
            return super().update(n)

        @property
        def format_dict(self):
            values = super().format_dict
            estimate = getattr(self, "_estimate", None)
            if estimate is not None:
                if self.n > estimate.n:  # items counted by iterating (no update call)
                    self._note(self.n - estimate.n)
                rate = estimate.rate()
                if rate is not None:
                    values["rate"] = rate
            return values

    EstimatingBar.__name__ = EstimatingBar.__qualname__ = tqdm.__name__
    _estimating[tqdm] = EstimatingBar
    return EstimatingBar


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str | None = None,
             enabled: bool | None = None, leave: bool = True, total_cost: float | None = None,
             one_off: Callable[[], float] | None = None, **tqdm_options):
    """A progress bar over ``iterable`` (or one driven by ``update(n)`` up to ``total``).

    ``enabled``: True shows a bar (when tqdm is installed), False never does, None (default)
    shows one in a terminal or a notebook only.  Extra keyword options go to tqdm.  The time
    left comes from the work done (``Estimate``): ``update(n, cost=)`` weighs the items
    (``total_cost``: all of them), ``one_off`` is a clock of the seconds this thread spent on
    one-off work (compilation), left out of the rate.

    >>> bar = progress([1, 2], enabled=False)
    >>> list(bar), bar.n
    ([1, 2], 2)
    """
    if enabled is None:
        enabled = _default_enabled()
    tqdm = _tqdm_class() if enabled else None
    if tqdm is None:
        return SilentBar(iterable, total=total, desc=desc)
    return _estimating_class(tqdm)(iterable, total=total, desc=desc, leave=leave, total_cost=total_cost,
                                   one_off=one_off, **tqdm_options)
