"""SAE folders you can trust (issue 21 items 3 and 15): ``save_sae`` replaces a folder's pair of
files in one step and records a digest of the weights that ``load_sae`` checks, so no load ever
returns one SAE's weights under another's config; bad folders and cfg values are library errors;
a re-save keeps the files' modes and any other file; the folder stays SAELens's layout."""

import json
import os
import stat
import threading
import time

import numpy as np
import pytest
import safetensors.numpy

from circuits.errors import CircuitError, ShapeError, StoreError
from circuits.interp import SAE, load_sae, sae_files, save_sae


def two_saes():
    return SAE.random(6, 12, "jumprelu", seed=1, hook_name="a"), SAE.random(6, 12, "jumprelu", seed=2, hook_name="b")


def which(sae, a, b):
    """'a' or 'b' when every tensor and setting is that SAE's, else 'mix'."""
    for name, ref in (("a", a), ("b", b)):
        if sae.hook_name == ref.hook_name and all(np.array_equal(getattr(sae, k), v) for k, v in ref.tensors().items()):
            return name
    return "mix"


# ---------------------------------------------------------------------------- item 3
def test_a_folder_mixing_two_saves_is_refused(tmp_path):
    a, b = two_saes()
    save_sae(a, tmp_path / "a")
    save_sae(b, tmp_path / "b")
    os.replace(tmp_path / "b" / "sae_weights.safetensors", tmp_path / "a" / "sae_weights.safetensors")
    with pytest.raises(CircuitError, match="mixes two SAEs"):
        load_sae(tmp_path / "a")


def test_a_failed_save_leaves_the_old_folder_whole(tmp_path, monkeypatch):
    a, b = two_saes()
    save_sae(a, tmp_path / "s")

    def broken_cfg(self):
        raise KeyboardInterrupt  # e.g. interrupted while writing the config
    monkeypatch.setattr(SAE, "cfg", broken_cfg)
    with pytest.raises(KeyboardInterrupt):
        save_sae(b, tmp_path / "s")
    monkeypatch.undo()
    assert which(load_sae(tmp_path / "s"), a, b) == "a"
    assert sorted(os.listdir(tmp_path)) == ["s"]  # no temporary left behind


def test_loads_during_re_saves_see_one_sae_or_the_other(tmp_path):
    a, b = two_saes()
    folder = tmp_path / "s"
    save_sae(a, folder)
    stop = threading.Event()

    def keep_saving():
        while not stop.is_set():
            save_sae(b, folder)
            save_sae(a, folder)
    writer = threading.Thread(target=keep_saving, daemon=True)
    writer.start()
    seen = []
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            seen.append(which(load_sae(folder), a, b))
    finally:
        stop.set()
        writer.join()
    assert "mix" not in seen and len(seen) > 10
    assert [n for n in os.listdir(tmp_path) if n != "s"] == []


def test_the_folder_is_saelens_layout_and_keeps_other_files_and_modes(tmp_path):
    a, b = two_saes()
    folder = tmp_path / "s"
    save_sae(a, folder)
    assert sorted(os.listdir(folder)) == ["cfg.json", "sae_weights.safetensors"]
    cfg = json.loads((folder / "cfg.json").read_text())
    assert cfg["architecture"] == "jumprelu" and cfg["d_in"] == 6 and cfg["metadata"]["hook_name"] == "a"
    assert len(cfg["metadata"][sae_files.DIGEST_KEY]) == 64
    weights = safetensors.numpy.load_file(str(folder / "sae_weights.safetensors"))  # the reference reader
    assert sorted(weights) == sorted(a.tensors()) and np.array_equal(weights["W_enc"], a.W_enc)
    (folder / "sparsity.safetensors").write_bytes(b"kept")
    for name in ("cfg.json", "sae_weights.safetensors"):
        os.chmod(folder / name, 0o600)
    os.chmod(folder, 0o700)
    save_sae(b, folder)
    assert (folder / "sparsity.safetensors").read_bytes() == b"kept"
    for name in ("cfg.json", "sae_weights.safetensors"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert which(load_sae(folder), a, b) == "b"


# ---------------------------------------------------------------------------- item 15
def hand_folder(path, cfg, tensors):
    path.mkdir(parents=True, exist_ok=True)
    (path / "cfg.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    safetensors.numpy.save_file(tensors, str(path / "sae_weights.safetensors"))
    return path


def std_tensors(**changes):
    t = {k: v.astype(np.float32) for k, v in SAE.random(6, 12, seed=0).tensors().items()}
    t.update(changes)
    return t


BASE = {"architecture": "standard", "d_in": 6, "d_sae": 12}


@pytest.mark.parametrize("cfg, tensors, error, match", [
    ({**BASE, "apply_b_dec_to_input": "no"}, {}, CircuitError, "apply_b_dec_to_input is 'no'; it must be true or false"),
    ({**BASE, "architecture": "topk", "k": "3"}, {}, CircuitError, "k is '3'; it must be an integer"),
    ({**BASE, "d_in": [6]}, {}, CircuitError, "d_in is \\[6\\]"),
    ({**BASE, "d_in": "abc"}, {}, CircuitError, "d_in is 'abc'"),
    ({**BASE, "metadata": "x"}, {}, CircuitError, "metadata is 'x'"),
    ({**BASE, "metadata": {"hook_name": 3}}, {}, CircuitError, "metadata.hook_name is 3"),
    ({**BASE, "dtype": ["float32"]}, {}, CircuitError, "not a float dtype"),
    ({**BASE, "architecture": ["standard"]}, {}, CircuitError, "not supported"),
    ({"d_in": 6, "d_sae": 12, "activation_fn_str": "topk", "activation_fn_kwargs": [5]}, {}, CircuitError,
     "activation_fn_kwargs"),
    (BASE, {"W_enc": np.zeros(6, np.float32)}, ShapeError, "W_enc must be \\[d_in, d_sae\\]"),
    ("[" * 100_000, {}, CircuitError, "nested too deeply|not valid JSON"),
    ('{"architecture": "standard"}'.encode("utf-16").decode("latin1"), {}, CircuitError, "not UTF-8|not valid JSON"),
])
def test_bad_configs_are_library_errors(tmp_path, cfg, tensors, error, match):
    folder = hand_folder(tmp_path / "f", cfg, std_tensors(**tensors))
    with pytest.raises(error, match=match):
        load_sae(folder)


def test_bad_weight_files_are_store_errors(tmp_path):
    folder = hand_folder(tmp_path / "f", BASE, std_tensors())
    weights = folder / "sae_weights.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-10])
    with pytest.raises(StoreError, match="sae_weights.safetensors.*truncated"):
        load_sae(folder)
    weights.write_bytes((10**15).to_bytes(8, "little") + data[8:])
    with pytest.raises(StoreError, match="sae_weights.safetensors"):
        load_sae(folder)
    weights.write_bytes(b"")
    with pytest.raises(StoreError, match="sae_weights.safetensors"):
        load_sae(folder)


def test_bad_save_paths_are_store_errors_naming_the_folder(tmp_path):
    sae = SAE.random(4, 8)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is not a directory"):
        save_sae(sae, tmp_path / "file")
    with pytest.raises(StoreError, match="NUL"):
        save_sae(sae, str(tmp_path / "a\0b"))
    with pytest.raises(StoreError, match="NUL"):
        load_sae(str(tmp_path / "a\0b"))
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: the same save as another user
            _save_into_a_folder_nobody_may_write()
            return
        with pytest.raises(StoreError) as info:
            save_sae(sae, locked / "s")
        assert str(locked / "s") in str(info.value) and ".tmp" not in str(info.value)
    finally:
        os.chmod(locked, 0o700)


def _save_into_a_folder_nobody_may_write():
    """Run as root (CI): ``save_sae`` by the user ``nobody`` (a forked child that drops to uid
    65534) into a folder of root's, 0755."""
    import shutil
    import tempfile
    from pathlib import Path

    sae = SAE.random(4, 8)
    top = Path(tempfile.mkdtemp(prefix="sae-locked-"))
    try:
        os.chmod(top, 0o755)
        target = top / "s"
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: no JAX, only numpy and files
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                try:
                    save_sae(sae, target)
                    message = "saved"
                except StoreError as e:
                    message = f"StoreError: {e}"
                os.write(write, message.encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            message = f.read()
        os.waitpid(pid, 0)
        assert message.startswith("StoreError:"), message
        assert str(target) in message and ".tmp" not in message
        assert os.listdir(top) == []
    finally:
        shutil.rmtree(top)


def test_a_failed_write_names_the_folder_and_leaves_nothing(tmp_path, monkeypatch):
    a, b = two_saes()
    save_sae(a, tmp_path / "s")

    def full_disk(path, write, mode):
        raise OSError(28, "No space left on device", str(path))
    monkeypatch.setattr(sae_files, "_write", full_disk)
    with pytest.raises(StoreError) as info:
        save_sae(b, tmp_path / "s")
    assert str(tmp_path / "s") in str(info.value) and ".tmp" not in str(info.value)
    assert "free some space" in str(info.value)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["s"] and which(load_sae(tmp_path / "s"), a, b) == "a"


# ---------------------------------------------------------------------------- issue 33 item 6
@pytest.mark.parametrize("make, match", [
    (lambda: SAE.random(4, 8, "crosscoder"), "SAE architecture 'crosscoder' is not supported; use one of standard"),
    (lambda: SAE.random(4, 8, ["topk"]), r"SAE architecture \['topk'\] is not supported"),
    (lambda: SAE.random(4, 8, "topk", k="2"), "SAE k='2' must be an int >= 1"),
    (lambda: SAE.random(4, 8, "topk", k=True), "SAE k=True must be an int >= 1"),
    (lambda: SAE.random(4, 8, "topk", k=0), "SAE k=0 must be an int >= 1"),
    (lambda: SAE.random(4, 8, hook_name={"blocks.0.hook_resid_pre"}), "SAE hook_name={'blocks.0.hook_resid_pre'} must be a str"),
    (lambda: SAE.random(4, 8, "transcoder", hook_name_out=3), "SAE hook_name_out=3 must be a str"),
    (lambda: SAE.random(4, 8, apply_b_dec_to_input="no"), "SAE apply_b_dec_to_input='no' must be True or False"),
    (lambda: SAE("standard", [[0.0]], np.zeros((1, 1)), np.zeros(1), np.zeros(1)), "SAE tensor 'W_enc' must be an array, got a list"),
])
def test_bad_sae_settings_are_library_errors(make, match):
    with pytest.raises(CircuitError, match=match):
        make()


def test_a_weight_file_over_the_allocation_budget_is_refused_before_reading(tmp_path, monkeypatch):
    """An 8 GB SAE weight file gave a raw MemoryError: each tensor is checked against the budget
    (here 1 MiB, the tensor 2 MiB) before anything is read."""
    folder = tmp_path / "big"
    save_sae(SAE.random(4, 8), folder)
    big = {"W_enc": np.zeros((4, 1 << 17), np.float32), "W_dec": np.zeros((1 << 17, 4), np.float32),
           "b_enc": np.zeros(1 << 17, np.float32), "b_dec": np.zeros(4, np.float32)}
    safetensors.numpy.save_file(big, str(folder / "sae_weights.safetensors"))
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["d_sae"] = 1 << 17
    cfg["metadata"].pop(sae_files.DIGEST_KEY, None)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    assert load_sae(folder).d_sae == 1 << 17
    monkeypatch.setenv("CIRCUITS_MAX_ALLOC_BYTES", str(1 << 20))
    with pytest.raises(StoreError, match=r"sae_weights.safetensors: tensor 'W_dec' would allocate 2.0 MiB .*"
                                         r"over the budget of 1.0 MiB; raise it with the environment variable"):
        load_sae(folder)


def test_running_out_of_memory_while_reading_is_a_store_error(tmp_path, monkeypatch):
    from circuits.io import store

    folder = tmp_path / "f"
    save_sae(SAE.random(4, 8), folder)

    def no_memory(n):
        raise MemoryError

    monkeypatch.setattr(store, "aligned_bytes", no_memory)
    with pytest.raises(StoreError, match="sae_weights.safetensors: not enough memory to read tensor"):
        load_sae(folder)
