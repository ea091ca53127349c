"""JAX's persistent compilation cache (circuits.backend.cache.persistent): on in a private directory,
moved or switched off by CIRCUITS_COMPILATION_CACHE, and an unusable directory is one warning
naming it, never a failed evaluation.  Each case runs in a fresh process (the cache is set up
once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

from circuits.backend.cache.cachedir import make_root
from circuits.backend.cache.persistent import KEPT_MAGIC

PROBE = r"""
import json, warnings
import numpy as np
import circuits as C
from circuits.backend.cache.persistent import persistent_cache_info
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    value = C.evaluate(C.GeneralFunction('exp', C.Array(np.zeros(3, np.float32))), mode='jit')
info = persistent_cache_info()
print(json.dumps({"value": value.tolist(), "directory": info["directory"], "reason": info["reason"],
                  "warnings": [str(w.message) for w in caught if 'compilation cache' in str(w.message)]}))
"""


def probe(setting: str | None, tmp_path):
    env = dict(os.environ)
    env.pop("CIRCUITS_COMPILATION_CACHE", None)
    if setting is not None:
        env["CIRCUITS_COMPILATION_CACHE"] = setting
    env["HOME"] = str(tmp_path / "home")  # the default directory lands under a private home
    env["XDG_CACHE_HOME"] = str(tmp_path / "home" / ".cache")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_on_by_default_in_a_private_user_cache_directory_and_written(tmp_path):
    got = probe(None, tmp_path)
    assert got["value"] == [1.0, 1.0, 1.0] and got["warnings"] == []
    directory = got["directory"]
    assert directory.startswith(str(tmp_path / "home")) and os.path.isdir(directory)
    assert os.stat(directory).st_mode & 0o077 == 0  # private
    assert os.listdir(directory)  # the compiled program went to disk


def test_moved_and_switched_off_by_the_environment(tmp_path):
    target = tmp_path / "mine"
    assert probe(str(target), tmp_path)["directory"] == str(target)
    off = probe("off", tmp_path)
    assert off["directory"] is None and "switched off" in off["reason"] and off["value"] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("kind", ["file", "shared", "unwritable"])
def test_an_unusable_directory_warns_and_evaluation_goes_on(tmp_path, kind):
    path = tmp_path / "cache"
    if kind == "file":
        path.write_text("not a directory")
        expect = "not a folder"
    elif kind == "shared":
        path.mkdir()
        path.chmod(0o777)
        expect = "others can write"
    else:  # under a file: cannot be created (a read-only directory would not stop root)
        (tmp_path / "afile").write_text("x")
        path = tmp_path / "afile" / "cache"
        expect = "not a folder"
    got = probe(str(path), tmp_path)
    assert got["value"] == [1.0, 1.0, 1.0] and got["directory"] is None
    assert len(got["warnings"]) == 1 and expect in got["warnings"][0] and "CIRCUITS_COMPILATION_CACHE" in got["warnings"][0]


NEW_PROCESS = r"""
import json
import numpy as np
import circuits as C
from circuits.backend import last_run
from circuits.backend.tiers import configure
configure(host=False)  # the route under test: numpy's first run (tiers.host) skips it while JAX is not imported
x = C.Array(np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3), name='x_new_process')
c = C.Add(C.GeneralFunction('exp', C.Einsum.from_spec('ab->ba', x)), C.Scalar(1.0), name='out')
value = C.evaluate(c)
first = last_run()['tier']
traced = C.cache_stats()['compilations']  # whole programs traced by this first evaluation
from circuits.backend.cache.background import wait_for_background
wait_for_background(120)
variant = C.Add(c.children[0], C.Scalar(2.0), name='out')
changed = C.evaluate(variant)
print(json.dumps({"value": np.asarray(value).tolist(), "tier": first,
                  "variant": {k: last_run()[k] for k in ("tier", "computed", "reused")},
                  "changed": np.asarray(changed).tolist(), "traced": traced}))
"""


def test_a_new_process_runs_whole_what_an_earlier_one_compiled(tmp_path):
    """A process's first op-by-op evaluation of a small program compiles it whole in the
    background and marks it; the next process's first evaluation of it runs whole at once
    (its compilation from JAX's cache) with the same value."""
    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", NEW_PROCESS], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert [r["tier"] for r in runs] == ["ops", "jit"]
    assert os.listdir(tmp_path / "cache" / "circuits-programs")
    # the first process kept the program's executable: the second loads it, tracing nothing
    assert runs[1]["traced"] == 0
    import numpy as np

    np.testing.assert_allclose(runs[1]["value"], runs[0]["value"], rtol=1e-6)
    # the first process computed the variant over the values kept by its op-by-op run; in the
    # second, the whole program left no values, and a background op-by-op run below the root
    # kept them: the variant computes only its new root there too
    assert runs[0]["variant"] == runs[1]["variant"] == {"tier": "ops", "computed": 1, "reused": 1}
    np.testing.assert_allclose(runs[1]["changed"], np.asarray(runs[1]["value"]) + 1.0, rtol=1e-6)
    off = dict(env, CIRCUITS_COMPILATION_CACHE="off")
    out = subprocess.run([sys.executable, "-c", NEW_PROCESS], env=off, capture_output=True, text=True, timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1])["tier"] == "ops"  # no cache, no marks


def test_a_program_computing_a_users_function_is_not_kept_across_processes():
    """A new process's first program is kept on disk under the circuit's hash, unless it computes
    a function a user registered: the next process may register other code under that name."""
    import jax.numpy as jnp
    import numpy as np

    import circuits as C
    from circuits.backend.evaluation import _kept_as
    from circuits.functions import register_elementwise, unregister_function

    x = C.Array(np.ones(3, np.float32), name='x')
    assert _kept_as(C.GeneralFunction('exp', x), "float32", True) is not None
    register_elementwise("softsign_test_kept", lambda v: v / (1 + jnp.abs(v)))
    try:
        assert _kept_as(C.Add(C.GeneralFunction('softsign_test_kept', x), x), "float32", True) is None
    finally:
        unregister_function("softsign_test_kept")


def _entry(path, size, when, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((data * size)[:size])
    os.utime(path, (when, when))
    return path


def jax_name(tag: str) -> str:
    """A file name of JAX's persistent cache (jax/_src/cache_key.py, lru_cache.py)."""
    return f"jit_{tag}-{blake3.blake3(tag.encode()).hexdigest()}-cache"


def kept_entry(root, tag: str, size: int, when: float):
    """A kept executable's file (its name and header: what the trim recognises)."""
    name = blake3.blake3(tag.encode()).hexdigest()
    return _entry(root / "circuits-kernels" / name, size, when, data=KEPT_MAGIC + b"x" * size)


@pytest.fixture
def root(tmp_path):
    """A cache folder circuits made (marked)."""
    return Path(make_root(str(tmp_path / "cache")))


def test_trim_removes_the_entries_used_longest_ago_down_to_80_percent(root):
    """JAX's entries and the kept executables count; the oldest go first until the directory
    holds at most 80% of the budget; marks of programs and the stamp stay."""
    from circuits.backend.cache.persistent import trim

    old = _entry(root / jax_name("a"), 400, 1000)
    kept_old = kept_entry(root, "k1", 300, 1001)
    newer = _entry(root / jax_name("b"), 200, 2000)
    kept_new = kept_entry(root, "k2", 100, 3000)
    mark = _entry(root / "circuits-programs" / "m", 0, 10)
    assert trim(str(root), 2000) == {"bytes": 1000, "removed": 0, "freed": 0}  # under the budget
    got = trim(str(root), 500)  # over: down to 400 bytes
    assert got == {"bytes": 1000, "removed": 2, "freed": 700}
    assert not old.exists() and not kept_old.exists() and newer.exists() and kept_new.exists() and mark.exists()


def test_the_directory_is_trimmed_at_most_once_a_day_in_the_background(root, monkeypatch):
    import threading
    import time

    from circuits.backend.cache import persistent

    monkeypatch.setattr(persistent, "_budget", [500])

    def run():
        persistent._trim_later(str(root))
        for t in threading.enumerate():
            if t.name == "circuits-trim":
                t.join(30)

    first = _entry(root / jax_name("a"), 1000, 1000)
    run()
    assert not first.exists()
    again = _entry(root / jax_name("b"), 1000, 1000)
    run()  # the stamp is fresh: no look today
    assert again.exists()
    # a look started and never finished (its process ended first) is due again a few minutes later
    stamp = root / "circuits-trimmed"
    day_ago = time.time() - persistent.TRIM_EVERY - 10
    os.utime(stamp, (day_ago, day_ago))
    real_trim = persistent.trim
    monkeypatch.setattr(persistent, "trim", lambda *a: 1 / 0)  # a look that does not finish
    run()
    monkeypatch.setattr(persistent, "trim", real_trim)
    run()  # started moments ago: not yet due again
    assert again.exists()
    moved = stamp.stat().st_mtime - persistent.TRIM_RETRY - 10
    os.utime(stamp, (moved, moved))
    run()
    assert not again.exists()
    again = _entry(root / jax_name("c"), 1000, 1000)
    run()  # that look finished: the stamp says now
    assert again.exists()
    day_ago = time.time() - persistent.TRIM_EVERY - 10
    os.utime(root / "circuits-trimmed", (day_ago, day_ago))
    run()
    assert not again.exists()


@pytest.mark.parametrize("bad", [-1, 1 << 51, 2.5, True, "1G"])
def test_a_bad_disk_budget_is_a_clear_error(bad):
    import circuits as C

    with pytest.raises(C.EvaluationError, match="disk_bytes"):
        C.backend.set_cache_size(disk_bytes=bad)


TRIM_PROBE = r"""
import json, threading, warnings
import numpy as np
import circuits as C
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    C.evaluate(C.GeneralFunction('exp', C.Array(np.zeros(3, np.float32))), mode='jit')
    budget = C.cache_stats()['disk']['max_bytes']
for t in threading.enumerate():
    if t.name == "circuits-trim":
        t.join(60)
print(json.dumps({"budget": budget, "last_trim": C.cache_stats()['disk']['last_trim'],
                  "warnings": [str(w.message) for w in caught if 'MAX_BYTES' in str(w.message)]}))
"""


@pytest.mark.parametrize("setting", ["100000", "lots"])
def test_a_new_process_trims_an_old_cache_to_the_budget_the_environment_sets(tmp_path, setting):
    """The first process of the day looks through the directory; over the budget that
    CIRCUITS_COMPILATION_CACHE_MAX_BYTES sets, the oldest entries go.  A value that is not a
    number of bytes is one warning naming it, and the default budget holds."""
    cache = Path(make_root(str(tmp_path / "cache")))
    junk = _entry(cache / jax_name("old"), 1 << 20, 1000)
    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(cache), CIRCUITS_COMPILATION_CACHE_MAX_BYTES=setting)
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if setting == "lots":
        assert got["budget"] == 2 << 30 and len(got["warnings"]) == 1 and "'lots'" in got["warnings"][0]
        assert junk.exists()
    else:
        assert got["budget"] == 100000 and got["warnings"] == []
        assert not junk.exists() and got["last_trim"]["removed"] >= 1


def test_set_cache_size_trims_our_directory_and_never_one_the_user_gave_jax(root, monkeypatch):
    import circuits as C
    from circuits.backend.cache import persistent

    monkeypatch.setattr(persistent, "_budget", [])
    monkeypatch.setattr(persistent, "_state", {"done": True, "directory": str(root), "reason": "on", "mode": "ours"})
    old = _entry(root / jax_name("a"), 1000, 1000)
    new = _entry(root / jax_name("b"), 300, 2000)
    C.backend.set_cache_size(disk_bytes=500)
    disk = C.cache_stats()["disk"]
    assert disk["max_bytes"] == 500 and disk["last_trim"] == {"bytes": 1300, "removed": 1, "freed": 1000}
    assert not old.exists() and new.exists()
    monkeypatch.setattr(persistent, "_state", {"done": True, "directory": str(root), "mode": "user",
                                               "reason": "configured by the user (jax_compilation_cache_dir)"})
    C.backend.set_cache_size(disk_bytes=0)
    assert new.exists()
