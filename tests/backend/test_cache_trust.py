"""The on-disk compilation cache trusts only what this user wrote (issue 33, items 1, 2, 4, 9).

Compiled code read from the cache runs, so another local user must not be able to put code
there, and the cache must never delete a file that is not one of its entries.  Another user's
files are planted as root and handed to ``nobody`` (uid 65534); what that user does while a
process runs, it does in a subprocess of its own uid.  These tests need root (CI runs as root;
elsewhere they skip, saying so).  Each evaluation that sets the cache up runs in a fresh process
(the cache is set up once per process).

A planted entry is a legitimate entry's header with a pickle that makes a folder (the canary)
when unpickled: the canary's absence after the victim's run is what every attack test checks,
with the right value computed.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from circuits.backend.cache import cachedir, executables, persistent
from circuits.backend.cache.background import wait_for_background
from circuits.backend.cache.cachedir import MARKER, SUBFOLDER, Untrusted, make_root
from circuits.backend.cache.compiling import counted_jit
from circuits.backend.cache.executables import KeptKernel, executable_info, stable_key
from circuits.backend.cache.persistent import FOLDER

NOBODY = 65534
root_only = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                               reason="planting another user's files needs root (CI runs as root)")

# Evaluates tanh(x * x) op by op for x of 3 values, lets an attacker act (ATTACK: a command run as
# nobody), then for x of 5 values (new kernels: read from the cache after the attack).
SCRIPT = r"""
import json, os, subprocess, sys, warnings
if os.environ.get("UMASK"):
    os.umask(int(os.environ["UMASK"], 8))
import numpy as np
caught = warnings.catch_warnings(record=True)
record = caught.__enter__()
warnings.simplefilter("always")
import jax
import circuits as C
from circuits.backend.cache.executables import executable_info
from circuits.backend.cache.persistent import persistent_cache_info
from circuits.backend.cache.background import wait_for_background

def run(n):
    x = C.Array(np.linspace(0, 1, n, dtype=np.float32), name=f"x{n}")
    out = C.evaluate(C.GeneralFunction("tanh", C.Einsum.from_spec("a,a->a", x, x)), mode="eager")
    return np.asarray(out).tolist()

first = run(3)
wait_for_background()
attack = os.environ.get("ATTACK")
if attack:
    subprocess.run(json.loads(attack), user=65534, group=65534, extra_groups=[], check=True)
second = run(5)
wait_for_background()
if os.environ.get("SET_SIZE"):
    C.backend.set_cache_size(disk_bytes=int(os.environ["SET_SIZE"]))
print(json.dumps({"first": first, "second": second, "jax_dir": jax.config.jax_compilation_cache_dir,
                  "jax_on": jax.config.jax_enable_compilation_cache, "directory": persistent_cache_info()["directory"],
                  "warnings": [str(w.message) for w in record if str(w.message).startswith("circuits:")],
                  **executable_info()}))
"""

WANT = {3: np.tanh(np.linspace(0, 1, 3, dtype=np.float32) ** 2), 5: np.tanh(np.linspace(0, 1, 5, dtype=np.float32) ** 2)}


def run(tmp_path, cache=None, attack=None, jax_dir=None, umask=None, cwd=None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CIRCUITS_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # this test's key
    env["HOME"] = str(tmp_path / "home")
    env.pop("XDG_CACHE_HOME", None)
    if cache is not None:
        env["CIRCUITS_COMPILATION_CACHE"] = str(cache)
    if jax_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(jax_dir)
    if attack is not None:
        env["ATTACK"] = json.dumps([str(a) for a in attack])
    env.update({k: str(v) for k, v in extra.items()})
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    if umask is not None:
        env["UMASK"] = oct(umask)[2:]
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                         cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got["first"], WANT[3], rtol=1e-6)  # the right value, every time
    np.testing.assert_allclose(got["second"], WANT[5], rtol=1e-6)
    return got


class Evil:
    """Unpickled, makes the folder ``canary``."""

    def __init__(self, canary):
        self.canary = str(canary)

    def __reduce__(self):
        return os.mkdir, (self.canary,)


def forge(data: bytes, canary) -> bytes:
    """A legitimate entry's header (anyone can copy it) with a payload that runs code."""
    evil = pickle.dumps(Evil(canary))
    if data.startswith(b"circuits-kernel 1\n"):  # the format before authentication
        (n,) = struct.unpack_from("<q", data, 18)
        return data[:26 + n] + evil
    start = len(persistent.KEPT_MAGIC) + executables._DIGEST
    (n,) = struct.unpack_from("<q", data, start)
    (m,) = struct.unpack_from("<q", data, start + 8 + n)
    return data[:start + 16 + n + m] + evil


@pytest.fixture(scope="module")
def legit_run(tmp_path_factory):
    """A folder where a legitimate process ran SCRIPT: its cache (``cache``) and key (``data``)."""
    tmp = tmp_path_factory.mktemp("legit")
    run(tmp, cache=tmp / "cache")
    return tmp


@pytest.fixture
def legit(legit_run):
    """The entries a legitimate process keeps for SCRIPT's kernels: {name: bytes}."""
    folder = legit_run / "cache" / FOLDER
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and len(p.name) == 64}


@pytest.fixture
def warm(tmp_path, legit_run):
    """``tmp_path/cache``: a copy of the legitimate run's cache, with its key (as if this test's
    user had run SCRIPT once)."""
    for name in ("cache", "data"):
        shutil.copytree(legit_run / name, tmp_path / name, symlinks=True)
    return tmp_path / "cache"


def plant(folder: Path, legit: dict, canary, owner=NOBODY) -> Path:
    """A folder of forged entries under the legitimate names, owned by ``owner``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in legit.items():
        (folder / name).write_bytes(forge(data, canary))
        os.chown(folder / name, owner, owner)
    os.chown(folder, owner, owner)
    return folder


@pytest.fixture
def world():
    """A folder another user can reach (pytest's folders are root's, 0700), private otherwise."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="circuits-trust-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def no_code_ran(canary, got, loads=0):
    assert not canary.exists(), "a planted pickle ran"
    assert got["loads"] == loads


def one_warning(got, *needles):
    assert len(got["warnings"]) == 1, got["warnings"]
    for needle in needles:
        assert needle in got["warnings"][0], (needle, got["warnings"][0])


# ---------------------------------------------------------------------------- item 1: five set-ups
@root_only
def test_a_world_writable_jax_cache_dir_gets_no_kept_kernels_and_one_warning(tmp_path, legit):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    canary = tmp_path / "canary"
    plant(shared / FOLDER, legit, canary)
    got = run(tmp_path, jax_dir=shared)
    no_code_ran(canary, got)
    one_warning(got, str(shared), "others can write", "JAX_COMPILATION_CACHE_DIR")
    assert got["stores"] == 0 and got["jax_dir"] == str(shared)  # the user's setting is left to JAX


@root_only
@pytest.mark.parametrize("kind", ["link", "foreign"])
def test_a_kernels_folder_that_is_a_link_or_another_users_is_not_used(tmp_path, legit, warm, kind):
    cache = warm  # a private cache, made by a legitimate run
    shutil.rmtree(cache / FOLDER)
    canary = tmp_path / "canary"
    if kind == "link":
        target = plant(tmp_path / "theirs", legit, canary)
        os.symlink(target, cache / FOLDER)
        os.lchown(cache / FOLDER, NOBODY, NOBODY)
        problem = "symbolic link"
    else:
        plant(cache / FOLDER, legit, canary).chmod(0o777)
        problem = "another user"
    got = run(tmp_path, cache=cache)
    no_code_ran(canary, got)
    one_warning(got, str(cache / FOLDER), problem)
    assert got["directory"] is None and not got["jax_on"]  # JAX's cache there is switched off too


@root_only
def test_a_cache_path_through_another_users_link_is_refused_before_and_after_it_moves(tmp_path, legit, world):
    sticky = world / "tmp"  # like /tmp: anyone may add a name, only its owner may move it
    sticky.mkdir()
    sticky.chmod(0o1777)
    mine = tmp_path / "mine"  # the victim's private cache, where the link points at first
    mine.mkdir(mode=0o700)
    link = sticky / "cache"
    os.symlink(mine, link)
    os.lchown(link, NOBODY, NOBODY)
    canary = tmp_path / "canary"
    evil = world / "evil"
    plant(evil / FOLDER, legit, canary)
    os.chown(evil, NOBODY, NOBODY)
    got = run(tmp_path, cache=link, attack=["ln", "-sfn", evil, link])  # re-pointed after the first evaluation
    no_code_ran(canary, got)
    one_warning(got, str(link), "symbolic link", "another user")
    assert got["jax_dir"] is None  # JAX's cache was never switched on there


@root_only
def test_a_private_cache_in_a_folder_others_can_write_is_refused(tmp_path, legit, world):
    parent = world / "open"
    parent.mkdir()
    parent.chmod(0o777)
    cache = parent / "cache"
    canary = tmp_path / "canary"
    evil = parent / "evil"
    plant(evil / FOLDER, legit, canary)
    (evil / MARKER).write_bytes(cachedir.MARKER_TEXT)
    # swapped after the first evaluation: the private cache moved away, the attacker's in its place
    swap = ["sh", "-c", f"mv {cache} {parent}/gone 2>/dev/null; mv {evil} {cache}"]
    got = run(tmp_path, cache=cache, attack=swap)
    no_code_ran(canary, got)
    one_warning(got, str(parent), "others can write")
    assert got["jax_dir"] is None


def test_a_forged_entry_in_a_private_cache_is_removed_before_anything_unpickles_it(tmp_path, warm):
    """Every folder passes; the entry's bytes (a copied header, a pickle) fail the keyed digest."""
    cache = warm
    canary = tmp_path / "canary"
    names = [p.name for p in (cache / FOLDER).iterdir() if p.is_file()]
    for name in names:
        (cache / FOLDER / name).write_bytes(forge((cache / FOLDER / name).read_bytes(), canary))
    got = run(tmp_path, cache=cache)
    assert not canary.exists() and got["rejected"] == len(names) and got["stores"] == len(names)
    assert got["warnings"] == []


@root_only
def test_another_users_entry_in_a_private_folder_is_not_read(tmp_path):
    root = make_root(str(tmp_path / "cache"))
    fd = persistent.open_folder(root, FOLDER, create=True)
    try:
        cachedir.write_file(fd, "e", b"data")
        assert cachedir.read_file(fd, "e") == b"data"
        os.chown(f"{root}/{FOLDER}/e", NOBODY, NOBODY)
        with pytest.raises(Untrusted, match="another user"):
            cachedir.read_file(fd, "e")
        os.chown(f"{root}/{FOLDER}/e", 0, 0)
        os.chmod(f"{root}/{FOLDER}/e", 0o666)
        with pytest.raises(Untrusted, match="others can write"):
            cachedir.read_file(fd, "e")
        os.unlink(f"{root}/{FOLDER}/e")
        os.symlink(f"{root}/{MARKER}", f"{root}/{FOLDER}/e")
        with pytest.raises(Untrusted, match="cannot be opened"):
            cachedir.read_file(fd, "e")
    finally:
        os.close(fd)


def test_the_folders_are_checked_again_before_each_compilation(tmp_path):
    """A cache that passed at start-up and then became writable by others is not used from the
    next compilation on: one warning, JAX's cache switched off, nothing more written there."""
    cache = tmp_path / "cache"
    probe = r"""
import json, os, warnings
import numpy as np
warnings.simplefilter("always")
import jax
import circuits as C
from circuits.backend.cache.executables import executable_info
x = C.Array(np.ones(3, np.float32), name='x')
C.evaluate(C.GeneralFunction('exp', x), mode='eager')
os.chmod(os.environ['CIRCUITS_COMPILATION_CACHE'], 0o777)
before = sorted(os.listdir(os.environ['CIRCUITS_COMPILATION_CACHE']))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    y = C.Array(np.ones(5, np.float32), name='y')
    C.evaluate(C.GeneralFunction('exp', y), mode='jit')
    C.evaluate(C.GeneralFunction('tanh', y), mode='eager')
print(json.dumps({"warnings": [str(w.message) for w in caught if str(w.message).startswith('circuits:')],
                  "on": jax.config.jax_enable_compilation_cache, "same": before == sorted(os.listdir(
                      os.environ['CIRCUITS_COMPILATION_CACHE'])), **executable_info()}))
"""
    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(cache), XDG_DATA_HOME=str(tmp_path / "data"))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(got["warnings"]) == 1 and str(cache) in got["warnings"][0] and "others can write" in got["warnings"][0]
    assert got["on"] is False and got["same"]


# ---------------------------------------------------------------------------- the key
def test_the_key_is_private_made_once_and_refused_when_it_is_not_ours(tmp_path):
    folder = str(tmp_path / "data" / "circuits")
    key = cachedir.mac_key(folder)
    path = Path(folder) / cachedir.KEY_NAME
    assert len(key) == 32 and cachedir.mac_key(folder) == key
    assert path.stat().st_mode & 0o777 == 0o600 and Path(folder).stat().st_mode & 0o777 == 0o700
    path.chmod(0o644)
    with pytest.raises(Untrusted, match="others can read it"):
        cachedir.mac_key(folder)
    path.unlink()
    os.symlink(tmp_path / "elsewhere", path)
    (tmp_path / "elsewhere").write_bytes(key)
    with pytest.raises(Untrusted, match="cannot be opened"):  # O_NOFOLLOW: a link is not the key
        cachedir.mac_key(folder)


@root_only
def test_a_key_of_another_user_is_refused(tmp_path):
    folder = str(tmp_path / "data" / "circuits")
    cachedir.mac_key(folder)
    os.chown(Path(folder) / cachedir.KEY_NAME, NOBODY, NOBODY)
    with pytest.raises(Untrusted, match="another user"):
        cachedir.mac_key(folder)


def test_a_cache_folder_holding_the_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with pytest.raises(Untrusted, match="key folder"):
        persistent._key_outside(make_root(str(tmp_path / "data")))


# ---------------------------------------------------------------------------- item 2: what the trim deletes
def test_a_users_folder_holds_the_cache_in_a_marked_subfolder_and_its_files_survive_every_trim(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    files = {"thesis.tex": b"\\documentclass{article}" * 30000, "results.npy": b"\x93NUMPY" * 350000,
             "data.bin": b"\0" * 300000}
    for name, data in files.items():
        (docs / name).write_bytes(data)
        os.utime(docs / name, (1000, 1000))  # used longest ago: first to go, were they entries
    got = run(tmp_path, cache=docs, CIRCUITS_COMPILATION_CACHE_MAX_BYTES=1000000, SET_SIZE=100000)
    assert got["directory"] == str(docs / SUBFOLDER) and (docs / SUBFOLDER / MARKER).is_file()
    assert {name: (docs / name).read_bytes() for name in files} == files
    # a budget of 0: every entry goes, the marker and the user's files stay
    assert persistent.trim(str(docs / SUBFOLDER), 0)["removed"] > 0
    assert {name: (docs / name).read_bytes() for name in files} == files and (docs / SUBFOLDER / MARKER).is_file()


def test_the_trim_deletes_entries_only_never_through_a_link(tmp_path):
    root = Path(make_root(str(tmp_path / "cache")))
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious" * 1000)
    entry = root / ("jit_f-" + "0" * 64 + "-cache")
    entry.write_bytes(b"x" * 1000)
    kept = root / FOLDER / ("1" * 64)
    kept.parent.mkdir()
    kept.write_bytes(persistent.KEPT_MAGIC + b"x" * 1000)
    strangers = [root / "notes.txt", root / FOLDER / ("2" * 64), root / "jit_g-cache"]  # no header / not JAX's name
    for path in strangers:
        path.write_bytes(b"y" * 1000)
    link = root / ("jit_h-" + "3" * 64 + "-cache")
    os.symlink(victim, link)
    for path in [entry, kept, *strangers]:
        os.utime(path, (1000, 1000))
    got = persistent.trim(str(root), 0)
    assert got == {"bytes": 2000 + len(persistent.KEPT_MAGIC), "removed": 2, "freed": 2000 + len(persistent.KEPT_MAGIC)}
    assert not entry.exists() and not kept.exists()
    assert all(p.exists() for p in strangers) and link.is_symlink() and victim.read_bytes() == b"precious" * 1000


def test_a_folder_the_library_did_not_mark_is_never_trimmed(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir(mode=0o700)
    entry = plain / ("jit_f-" + "0" * 64 + "-cache")
    entry.write_bytes(b"x" * 1000)
    got = persistent.trim(str(plain), 0)
    assert got["removed"] == 0 and "marker" in got["skipped"] and entry.exists()


@root_only
def test_another_users_link_in_tmp_to_the_victims_documents_is_not_followed(tmp_path):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    documents = tmp_path / "documents"
    documents.mkdir(mode=0o700)
    files = {f"chapter{i}.tex": bytes([65 + i]) * 400000 for i in range(3)}
    for name, data in files.items():
        (documents / name).write_bytes(data)
        os.utime(documents / name, (1000, 1000))
    link = sticky / "circuits-cache"  # a predictable path
    os.symlink(documents, link)
    os.lchown(link, NOBODY, NOBODY)
    got = run(tmp_path, cache=link, CIRCUITS_COMPILATION_CACHE_MAX_BYTES=100000, SET_SIZE=100000)
    one_warning(got, str(link), "symbolic link")
    assert {name: (documents / name).read_bytes() for name in files} == files
    assert sorted(os.listdir(documents)) == sorted(files)


def test_a_jax_cache_dir_the_user_set_is_never_trimmed(tmp_path):
    mine = tmp_path / "jaxcache"
    mine.mkdir(mode=0o700)
    entry = mine / ("jit_f-" + "0" * 64 + "-cache")
    entry.write_bytes(b"x" * 500000)
    os.utime(entry, (1000, 1000))
    got = run(tmp_path, jax_dir=mine, CIRCUITS_COMPILATION_CACHE_MAX_BYTES=100000, SET_SIZE=0)
    assert entry.exists() and got["warnings"] == [] and got["directory"] == str(mine)
    assert got["stores"] > 0 and (mine / FOLDER).is_dir()  # a private folder: kernels are kept there


# ---------------------------------------------------------------------------- item 4: digests and crashes
def test_a_flipped_bit_is_caught_by_the_digest_before_anything_loads(tmp_path, monkeypatch):
    from jax.experimental import serialize_executable

    def make():
        fn = lambda a: a * 3 + 1  # noqa: E731
        return KeptKernel(fn, counted_jit(fn, "kernel_compilations"), stable_key(("flip-test",)),
                          make_root(str(tmp_path / "cache")))

    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(make()(x)), x * 3 + 1)
    wait_for_background()  # (kept in the background when JAX's cache held the compilation)
    (entry,) = [p for p in (tmp_path / "cache" / FOLDER).iterdir() if p.is_file()]
    data = bytearray(entry.read_bytes())
    data[len(data) * 2 // 3] ^= 0x10
    entry.write_bytes(bytes(data))
    calls = []
    real = serialize_executable.deserialize_and_load
    monkeypatch.setattr(serialize_executable, "deserialize_and_load", lambda *a, **k: calls.append(1) or real(*a, **k))
    before = executable_info()
    np.testing.assert_array_equal(np.asarray(make()(x)), x * 3 + 1)
    wait_for_background()
    after = executable_info()
    assert calls == [] and after["rejected"] == before["rejected"] + 1 and after["stores"] == before["stores"] + 1
    assert entry.read_bytes() != bytes(data)  # removed, then written afresh
    np.testing.assert_array_equal(np.asarray(make()(x)), x * 3 + 1)
    assert calls == [1] and executable_info()["loads"] == after["loads"] + 1


CRASH = r"""
import os, signal
from jax.experimental import serialize_executable
def crash(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # between the loading mark and its removal
serialize_executable.deserialize_and_load = crash
""" + SCRIPT


def test_a_crash_while_loading_an_entry_does_not_repeat_in_the_next_process(tmp_path, warm, legit):
    cache = warm
    kept = len(legit)
    env = dict(os.environ, CIRCUITS_COMPILATION_CACHE=str(cache), XDG_DATA_HOME=str(tmp_path / "data"))
    out = subprocess.run([sys.executable, "-c", CRASH], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL  # died loading its first entry
    assert os.listdir(cache / FOLDER / "loading")  # ... leaving its mark
    got = run(tmp_path, cache=cache)
    assert got["quarantined"] == 1 and got["loads"] == kept - 1 and got["stores"] == 1
    assert os.listdir(cache / FOLDER / "loading") == []
    again = run(tmp_path, cache=cache)
    assert again["loads"] == kept and again["quarantined"] == 0


def _mark(cache, pid: int, start: str) -> str:
    """A loading mark for the first entry, as process ``pid`` (started at ``start``) writes it."""
    folder = cache / FOLDER
    entry = sorted(p.name for p in folder.iterdir() if p.is_file())[0]
    mark = folder / "loading" / f"{entry}.{pid}.1.loading"
    mark.write_text(f"{pid} {start}\n")
    mark.chmod(0o600)
    return entry


@pytest.mark.parametrize("who", ["live", "dead", "reused pid"])
def test_a_live_loader_is_not_a_crash_a_dead_one_is(tmp_path, warm, legit, who):
    cache = warm
    kept = len(legit)
    if who == "live":  # this test's own process, loading at the same time
        pid, start = os.getpid(), cachedir._process_start(os.getpid())
    elif who == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        pid, start = gone.pid, "12345@" + "0" * 36
    else:  # this pid, but a process that started at another time
        pid, start = os.getpid(), "1@" + (cachedir._process_start(os.getpid()) or "@").split("@")[1]
    entry = _mark(cache, pid, start)
    got = run(tmp_path, cache=cache)
    if who == "live":
        assert got["quarantined"] == 0 and got["loads"] == kept
        assert os.listdir(cache / FOLDER / "loading")  # its mark is its own to remove
    else:
        assert got["quarantined"] == 1 and got["loads"] == kept - 1 and (cache / FOLDER / entry).exists()
        assert os.listdir(cache / FOLDER / "loading") == []


# ---------------------------------------------------------------------------- item 9: paths and modes
def test_a_tilde_that_names_no_user_is_refused_and_makes_no_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    got = run(tmp_path, cache="~nouser_circuits_test/x", cwd=work)
    one_warning(got, "~nouser_circuits_test", "names no user")
    assert os.listdir(work) == [] and got["directory"] is None and got["jax_dir"] is None


def test_a_relative_path_is_taken_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert persistent.cache_directory({"CIRCUITS_COMPILATION_CACHE": "rel/cache"}) == str(tmp_path / "rel" / "cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert persistent.cache_directory({"CIRCUITS_COMPILATION_CACHE": "~/c"}) == str(tmp_path / "home" / "c")
    with pytest.raises(Untrusted, match="empty or only spaces"):
        persistent.cache_directory({"CIRCUITS_COMPILATION_CACHE": "a/  /b"})


def test_every_folder_made_is_private_whatever_the_umask(tmp_path):
    got = run(tmp_path, umask=0o002)  # the default folders, under a home that does not exist yet
    home = tmp_path / "home"
    assert got["directory"].startswith(str(home)) and got["stores"] > 0
    made = [Path(d) for d, _, _ in os.walk(home)] + [Path(d) for d, _, _ in os.walk(tmp_path / "data")]
    assert {str(d): oct(d.stat().st_mode & 0o777) for d in made if d.stat().st_mode & 0o077} == {}
    assert len(made) >= 6  # home, .cache, circuits, the cache, its kernels; the key's folders


def test_folders_made_for_a_named_cache_are_private_and_the_root_is_marked(tmp_path):
    old = os.umask(0o002)
    try:
        root = make_root(str(tmp_path / "a" / "b" / "cache"))
    finally:
        os.umask(old)
    assert root == str(tmp_path / "a" / "b" / "cache") and (Path(root) / MARKER).read_bytes() == cachedir.MARKER_TEXT
    for d in (tmp_path / "a", tmp_path / "a" / "b", Path(root)):
        assert d.stat().st_mode & 0o777 == 0o700
    assert make_root(root) == root  # marked: the same root again
    # an existing folder of the user's: a marked subfolder; one named so but not marked: refused
    assert make_root(str(tmp_path)) == str(tmp_path / SUBFOLDER)
    other = tmp_path / "other"
    (other / SUBFOLDER).mkdir(parents=True)
    with pytest.raises(Untrusted, match="not made by circuits"):
        make_root(str(other))
