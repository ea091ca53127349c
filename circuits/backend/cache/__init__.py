"""What the backend keeps, in memory and on disk: the pipeline's first stage (it imports nothing
from ``lower`` or ``tiers``).

- ``bounded``: the one bounded-cache class, and the registry every in-memory cache joins where it
  is created (what ``cache_stats`` and ``clear_cache`` reach);
- ``background``: the background threads (whole programs compiling, fused groups, warm-ups), each
  working for the cache epoch it was started in;
- ``cachedir``: the compilation cache's folders and files, checked at each use (ours, private, no
  link); ``persistent``: JAX's compilation cache on disk, across processes, and its budget;
- ``compiling``: ``counted_jit``, every XLA compilation counted; ``executables``: the op kernels'
  executables kept on disk, loaded without tracing; ``compiled``: the one compile cache of whole
  programs' functions (``cached_jit``).
"""
