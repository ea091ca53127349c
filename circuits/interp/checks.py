"""Argument checks shared by the interpretability functions: counts, seeds, thresholds.

Each refuses with a ``CircuitError`` that names the caller, the argument as given and what it
takes, before anything is evaluated (``True`` is not a count, ``2.5`` rows are not rows).

>>> check_count(3, 'discover', 'batch_size')
3
>>> check_count(True, 'discover', 'steps')
Traceback (most recent call last):
  ...
circuits.errors.CircuitError: discover: steps=True; give a positive int
"""

from __future__ import annotations

import math
import numbers

from ..errors import CircuitError

__all__ = ["check_count", "check_seed", "check_real"]


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_count(value, what: str, arg: str, *, minimum: int = 1, none: bool = False, fix: str = "") -> int | None:
    """``value`` as an int of at least ``minimum`` (``None`` passes where ``none``); a bool, a
    float, a string or a smaller number is an error naming ``what`` and ``arg``."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        want = "a positive int" if minimum == 1 else f"an int of at least {minimum}"
        raise CircuitError(f"{what}: {arg}={_shown(value)}; give {want}" + (" or None" if none else "")
                           + (f" ({fix})" if fix else ""))
    return int(value)


def check_seed(value, what: str, arg: str = "seed") -> int:
    """A seed for ``numpy.random.default_rng``: an int of at least 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise CircuitError(f"{what}: {arg}={_shown(value)}; give a seed, an int of at least 0")
    return int(value)


def check_real(value, what: str, arg: str, *, fix: str = "") -> float:
    """``value`` as a finite float (NaN, inf, a bool or anything not a real number refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise CircuitError(f"{what}: {arg}={_shown(value)}; give a finite number" + (f" ({fix})" if fix else ""))
    return float(value)
