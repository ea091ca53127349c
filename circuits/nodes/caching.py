"""Memo caches bounded by size as well as by entries, for the pure helpers node constructors call
over and over (spec parsing, shape rules).

``functools.lru_cache(maxsize=4096)`` bounds the number of entries, not their bytes: a text that
holds one 10 MB einsum spec leaves that spec and its parse in the cache after the parse failed,
and a few dozen such texts keep a gigabyte.  ``small_cache`` remembers only calls whose arguments
are small (``max_cost``: characters of a string, items of a tuple, counted through nested
tuples), so an entry stays small and the cache holds at most about ``maxsize * max_cost`` items;
a large call is computed every time, which costs nothing next to reading its large input.  The
size is measured only when a result is stored (a miss): a hit costs one dict lookup, as with
``lru_cache``.

>>> calls = []
>>> @small_cache(maxsize=8, max_cost=10)
... def length(text):
...     calls.append(text)
...     return len(text)
>>> length("ab"), length("ab"), length("x" * 50), length("x" * 50)
(2, 2, 50, 50)
>>> calls == ["ab", "x" * 50, "x" * 50], length.cache_len()
(True, 1)
"""

from __future__ import annotations

import functools


def argument_cost(args, limit: int) -> int:
    """How large ``args`` are: characters of strings and bytes, items of tuples (nested tuples
    counted through), 1 for anything else; counting stops once past ``limit``.

    >>> argument_cost(("ab,bc->ac", ((1, 2), (3,))), 100)  # 2 + 9 + 2 + 2 + 1
    16
    """
    cost = 0
    stack = [args]
    while stack:
        a = stack.pop()
        if isinstance(a, (str, bytes)):
            cost += len(a)
        elif isinstance(a, (tuple, frozenset)):
            cost += len(a)
            stack.extend(x for x in a if isinstance(x, (str, bytes, tuple, frozenset)))
        else:
            cost += 1
        if cost > limit:
            break
    return cost


def small_cache(maxsize: int = 4096, max_cost: int = 256):
    """A memo decorator for pure functions of hashable positional arguments that remembers only
    small calls (see the module docstring); when full it forgets its oldest entry."""

    def decorate(function):
        cache: dict = {}

        @functools.wraps(function)
        def cached(*args):
            try:
                return cache[args]
            except KeyError:
                pass
            value = function(*args)
            if argument_cost(args, max_cost) <= max_cost:
                if len(cache) >= maxsize:
                    try:
                        del cache[next(iter(cache))]
                    except (KeyError, RuntimeError, StopIteration):  # another thread got there first
                        pass
                cache[args] = value
            return value

        cached.cache_clear = cache.clear
        cached.cache_len = cache.__len__
        return cached

    return decorate
