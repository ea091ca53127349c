"""SAELens SAE folders: ``load_sae`` and ``save_sae`` (``cfg.json`` + ``sae_weights.safetensors``), and the
SAEs shipped for the induction model (``induction_saes``).

The two files of a folder are one SAE only when they were written together, so ``save_sae``
writes them as a pair that cannot be torn and can be checked:

- **one directory rename.**  Both files (and any other file the folder already held, hard-linked)
  go into a hidden sibling directory ``.<name>.<random>.tmp``, fsynced, which then takes the
  folder's place in one step: ``rename`` onto a missing or empty folder, else Linux's
  ``renameat2(RENAME_EXCHANGE)``, which swaps the two directories atomically (the old one is
  then deleted).  A reader that opened the folder sees the old pair or the new one, never one
  file of each; a failed or killed save leaves the old folder as it was.  (Where the exchange is
  missing, not Linux, the old folder is renamed away just before the new one moves in: a reader
  in that instant finds no SAE, still never a mix.)
- **a digest of the weights in the config**: ``cfg.json``'s ``metadata.circuits_weights_digest``
  is a blake3 digest over the tensors' names and content hashes, checked by ``load_sae`` (at no
  extra read: tensors are hashed as they are read), so a pair mixed by any other means (files
  copied by hand, another tool's partial write) is refused, not silently used.  SAELens reads
  the folder as its own (its metadata takes any extra key); a folder SAELens wrote has no
  digest and loads unchecked.

``load_sae`` opens the folder once and reads both files relative to it, so a save that swaps the
folder meanwhile cannot hand it a mix either.  Every problem is a ``CircuitError`` naming the file
and the key (``StoreError`` for a file that cannot be read or written; ``ShapeError`` for shapes),
never the temporary directory; cfg values of the wrong JSON type (``"apply_b_dec_to_input":
"no"``) are refused rather than read by their truthiness.  Files keep their mode across a re-save
(a private 0600 folder stays private).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import secrets
import shutil
import stat
import sys
from pathlib import Path

import blake3
import numpy as np

from ..errors import CircuitError, ShapeError, StoreError
from ..io.localfs import describe_os_error, open_dir, open_file
from ..io.store import read_safetensors_from, safetensors_writer
from .sae import ARCHITECTURES, SAE, TRANSCODER_ARCHITECTURES, tensors_needed

CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
DIGEST_KEY = "circuits_weights_digest"
# A cfg.json larger than this is no SAE config.
_MAX_CFG_BYTES = 16 << 20


def weights_digest(hashes: dict) -> str:
    """The digest of a weights file: blake3 over its tensors' names and content hashes, sorted.

    >>> len(weights_digest({'W_enc': 'ab' * 32}))
    64
    """
    h = blake3.blake3()
    for name in sorted(hashes):
        h.update(f"{len(name)}:{name}={hashes[name]};".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


# ---------------------------------------------------------------------------- loading
def load_sae(path):
    """Read a SAELens SAE folder: ``cfg.json`` and ``sae_weights.safetensors`` (numpy only:
    neither torch nor sae-lens is imported).

    Unknown architectures, reshaping (``hook_z``), unsupported normalisation and missing tensors
    are ``CircuitError``s naming the file and the key; a pre-6.0 config (``hook_point``,
    ``activation_fn_str``, ``log_threshold``) is read as SAELens reads it; a folder whose weights
    do not match the digest its config records is refused.

    >>> import tempfile
    >>> from circuits.interp import SAE
    >>> d = tempfile.mkdtemp()
    >>> save_sae(SAE.random(4, 8, 'jumprelu', hook_name='b0'), d)
    >>> s = load_sae(d)
    >>> s.architecture, s.d_sae, s.hook_name
    ('jumprelu', 8, 'b0')
    """
    folder = _folder(path, "load_sae")
    cfg_path, weights_path = folder / CFG_FILE, folder / WEIGHTS_FILE
    cfg_source, weights_source = _open_pair(folder)
    with cfg_source, weights_source:
        cfg = _read_cfg(cfg_source, cfg_path)
        hashes: dict = {}
        _, tensors = read_safetensors_from(weights_source, hashes)
    meta = cfg.get("metadata")
    recorded = meta.get(DIGEST_KEY) if isinstance(meta, dict) else None
    if recorded is not None and recorded != weights_digest(hashes):
        raise CircuitError(
            f"load_sae: {weights_path} is not the weights {cfg_path} was saved with (its digest "
            f"{DIGEST_KEY} differs): the folder mixes two SAEs' files; save the SAE again")
    cfg = _from_pre_6(cfg, cfg_path)
    arch = cfg.get("architecture")
    if arch not in ARCHITECTURES:
        raise CircuitError(f"load_sae: {cfg_path}: architecture {_short(arch)} is not supported; "
                           f"supported: {', '.join(ARCHITECTURES)}")
    if cfg.get("reshape_activations", "none") not in ("none", None):
        raise CircuitError(f"load_sae: {cfg_path}: reshape_activations={_short(cfg['reshape_activations'])} "
                           "(hook_z SAEs) is not supported; splice the SAE at a site that is already [..., d_in]")
    dtype = _dtype_name(cfg.get("dtype"), cfg_path)
    if "log_threshold" in tensors and "threshold" not in tensors:
        tensors["threshold"] = np.exp(tensors.pop("log_threshold").astype(np.float64))
    missing = [k for k in tensors_needed(arch) if k not in tensors]
    if missing:
        raise CircuitError(f"load_sae: {weights_path} lacks {', '.join(map(repr, missing))}, which a {arch} SAE "
                           f"needs (it holds {', '.join(sorted(map(_short, tensors)))})")
    w_enc = tensors["W_enc"]
    if w_enc.ndim != 2:
        raise ShapeError(f"load_sae: {weights_path}: W_enc must be [d_in, d_sae], got shape {list(w_enc.shape)}")
    for key, axis in (("d_in", 0), ("d_sae", 1)):
        value = _setting(cfg, key, int, cfg_path)
        if value is not None and value != w_enc.shape[axis]:
            raise ShapeError(f"load_sae: {cfg_path} says {key}={value} but W_enc has shape {list(w_enc.shape)}")
    kw = {}
    for k in tensors_needed(arch):
        t = tensors[k]
        if t.dtype.kind not in "fiub" and t.dtype.name != "bfloat16":
            raise CircuitError(f"load_sae: {weights_path}: tensor {k!r} has dtype {t.dtype}, not a number")
        kw[k] = np.asarray(t).astype(dtype)
    meta = cfg.get("metadata") or {}
    transcoder = arch in TRANSCODER_ARCHITECTURES
    k = _setting(cfg, "k", int, cfg_path)
    apply_b_dec = _setting(cfg, "apply_b_dec_to_input", bool, cfg_path)
    return SAE(architecture=arch, k=k,
               rescale_acts_by_decoder_norm=bool(_setting(cfg, "rescale_acts_by_decoder_norm", bool, cfg_path)),
               apply_b_dec_to_input=False if transcoder else (True if apply_b_dec is None else apply_b_dec),
               normalize_activations=_setting(cfg, "normalize_activations", str, cfg_path) or "none",
               hook_name=_setting(meta, "hook_name", str, cfg_path, "metadata."),
               hook_name_out=_setting(meta, "hook_name_out", str, cfg_path, "metadata."), dtype=dtype, **kw)


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _folder(path, what) -> Path:
    try:
        folder = Path(os.fspath(path))
    except TypeError:
        raise CircuitError(f"{what}: a folder path is a str or os.PathLike, got {type(path).__name__}") from None
    if "\0" in str(folder):
        raise StoreError(f"{what}: {str(folder)!r} contains a NUL character, which no file name can")
    return folder


def _open_pair(folder: Path, tries: int = 50):
    """The folder's two files, opened through one opened directory, so both are of one save.
    A save that swaps the folder meanwhile deletes the old one: then the new one is opened."""
    for _ in range(tries):
        try:
            dir_fd = open_dir(folder, name=str(folder))
        except FileNotFoundError:
            raise CircuitError(f"load_sae: {folder / CFG_FILE} is missing; a SAELens SAE folder holds {CFG_FILE} "
                               f"and {WEIGHTS_FILE}") from None
        except NotADirectoryError:
            raise CircuitError(f"load_sae: {folder} is not a directory; a SAELens SAE folder holds {CFG_FILE} "
                               f"and {WEIGHTS_FILE}") from None
        opened = []
        try:
            for name in (CFG_FILE, WEIGHTS_FILE):
                opened.append(open_file(name, dir_fd=dir_fd, name=str(folder / name)))
            return opened
        except FileNotFoundError:
            for source in opened:
                source.close()
            if not _replaced(dir_fd, folder):
                raise CircuitError(f"load_sae: {folder / name} is missing; a SAELens SAE folder holds {CFG_FILE} "
                                   f"and {WEIGHTS_FILE}") from None
        except BaseException:
            for source in opened:
                source.close()
            raise
        finally:
            os.close(dir_fd)
    raise CircuitError(f"load_sae: {folder} kept being replaced while being read ({tries} tries); try again")


def _replaced(dir_fd: int, folder: Path) -> bool:
    """Whether the directory opened as ``dir_fd`` is no longer the one at ``folder``."""
    try:
        mine, now = os.fstat(dir_fd), os.stat(folder)
    except OSError:
        return True
    return mine.st_nlink == 0 or (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino)


def _read_cfg(source, cfg_path) -> dict:
    if source.size > _MAX_CFG_BYTES:
        raise CircuitError(f"load_sae: {cfg_path} is {source.size} bytes; an SAE config is a few hundred")
    raw = source.read(source.size)
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CircuitError(f"load_sae: {cfg_path} is not UTF-8 text ({e})") from None
    except json.JSONDecodeError as e:
        raise CircuitError(f"load_sae: {cfg_path} is not valid JSON ({e})") from None
    except RecursionError:
        raise CircuitError(f"load_sae: {cfg_path} is not an SAE config (JSON nested too deeply)") from None
    if not isinstance(cfg, dict):
        raise CircuitError(f"load_sae: {cfg_path} must hold a JSON object")
    return cfg


def _setting(cfg: dict, key: str, kind, cfg_path, prefix=""):
    """``cfg[key]`` checked to be a JSON value of ``kind`` (None when absent or null)."""
    value = cfg.get(key)
    if value is None:
        return None
    if kind is int and type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not kind:
        want = {bool: "true or false", int: "an integer", str: "a string"}[kind]
        raise CircuitError(f"load_sae: {cfg_path}: {prefix}{key} is {_short(value)}; it must be {want}")
    return value


def _dtype_name(value, cfg_path) -> str:
    text = str(value or "float32").replace("torch.", "")
    if not isinstance(value, (str, type(None))) or text not in ("float32", "float64", "float16", "bfloat16"):
        raise CircuitError(f"load_sae: {cfg_path}: dtype {_short(value)} is not a float dtype")
    return "float32" if text in ("float16", "bfloat16") else text


def _from_pre_6(cfg: dict, cfg_path) -> dict:
    """A pre-6.0 SAELens config (flat keys) in the 6.x layout."""
    out = dict(cfg)
    meta = cfg.get("metadata") or {}
    if not isinstance(meta, dict):
        raise CircuitError(f"load_sae: {cfg_path}: metadata is {_short(meta)}; it must be a JSON object")
    meta = dict(meta)
    if "hook_point" in cfg and "hook_name" not in cfg:
        meta["hook_name"] = cfg["hook_point"]
    if "hook_name" in cfg:
        meta["hook_name"] = cfg["hook_name"]
    if "architecture" not in cfg:
        act = cfg.get("activation_fn_str", cfg.get("activation_fn", "relu"))
        out["architecture"] = "topk" if act == "topk" else "standard"
        if act == "topk":
            kwargs = cfg.get("activation_fn_kwargs") or {}
            if not isinstance(kwargs, dict):
                raise CircuitError(f"load_sae: {cfg_path}: activation_fn_kwargs is {_short(kwargs)}; it must be "
                                   "a JSON object")
            out["k"] = kwargs.get("k", cfg.get("k"))
    norm = cfg.get("normalize_activations", "none")
    if isinstance(norm, (bool, type(None))):
        norm = "expected_average_only_in" if norm else "none"
    out["normalize_activations"] = norm
    if "hook_z" in str(meta.get("hook_name", "")):
        out["reshape_activations"] = "hook_z"
    out["metadata"] = meta
    return out


# ---------------------------------------------------------------------------- saving
def save_sae(sae, path) -> None:
    """Write ``sae`` as a SAELens folder (``cfg.json``, ``sae_weights.safetensors``) that replaces
    any folder at ``path`` in one step (see the module docstring): never half of one save and
    half of another.  Other files already in the folder are kept.

    >>> import tempfile, os
    >>> from circuits.interp import SAE
    >>> d = tempfile.mkdtemp()
    >>> save_sae(SAE.random(4, 8), d)
    >>> sorted(os.listdir(d))
    ['cfg.json', 'sae_weights.safetensors']
    """
    if not isinstance(sae, SAE):
        raise CircuitError(f"save_sae: expected an SAE, got {type(sae).__name__}")
    folder = _folder(path, "save_sae")
    if not folder.name or folder.name in (".", ".."):
        folder = Path(os.path.abspath(folder))
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        old = os.stat(folder, follow_symlinks=True) if os.path.lexists(folder) else None
    except OSError as e:
        raise StoreError(f"save_sae: cannot write {folder} ({describe_os_error(e)})") from None
    if old is not None and not stat.S_ISDIR(old.st_mode):
        raise StoreError(f"save_sae: {folder} exists and is not a directory")
    tensors = {k: np.ascontiguousarray(v) for k, v in sae.tensors().items()}
    from ..hashing import content_hash

    cfg = sae.cfg()
    cfg["metadata"][DIGEST_KEY] = weights_digest({k: content_hash(v) for k, v in tensors.items()})
    writer = safetensors_writer(tensors)
    tmp = folder.parent / f".{folder.name}.{secrets.token_hex(6)}.tmp"
    try:
        os.mkdir(tmp, 0o700)
        if old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
        else:
            os.chmod(tmp, 0o777 & ~_umask())
        _write(tmp / WEIGHTS_FILE, writer, _mode_of(folder / WEIGHTS_FILE))
        _write(tmp / CFG_FILE, lambda f: f.write(json.dumps(cfg, indent=2).encode()), _mode_of(folder / CFG_FILE))
        if old is not None:
            _carry_over(folder, tmp)
        _fsync(tmp)
        _put_in_place(tmp, folder)
        _fsync(folder.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, StoreError):
            raise
        raise StoreError(f"save_sae: cannot write {folder} ({describe_os_error(e)})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _umask() -> int:
    from ..io.localfs import _umask

    return _umask()


def _mode_of(path: Path) -> int:
    """The mode a file written to ``path`` gets: the one it has (a re-save keeps 0600 private),
    else the usual ``0o666 & ~umask``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return 0o666 & ~_umask()
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o666 & ~_umask()


def _write(path: Path, write, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _carry_over(folder: Path, tmp: Path) -> None:
    """Every entry of the old folder but the two SAE files, into the new one (hard links where
    the filesystem allows: no copy of the data)."""
    for entry in os.scandir(folder):
        if entry.name in (CFG_FILE, WEIGHTS_FILE):
            continue
        target = tmp / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            shutil.copytree(entry.path, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry.path, target)


def _link_or_copy(src, dst):
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)
    return dst


def _fsync(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # not every filesystem syncs directories
        pass
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux ``renameat2``); False where that is unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # an older C library
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # kernel or filesystem without it
        return False
    raise OSError(err, os.strerror(err))


def _put_in_place(tmp: Path, folder: Path) -> None:
    """Move the complete new folder ``tmp`` to ``folder`` in one step."""
    try:
        os.rename(tmp, folder)  # no folder there, or an empty one: replaced at once
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if _exchange(tmp, folder):
        shutil.rmtree(tmp, ignore_errors=True)  # (the old folder, now under the temporary name)
        return
    old = folder.parent / f".{folder.name}.{secrets.token_hex(6)}.old.tmp"
    os.rename(folder, old)
    try:
        os.rename(tmp, folder)
    except OSError:
        os.rename(old, folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------- shipped SAEs
INDUCTION_SAE_DIR = Path(__file__).parent / "data"


def induction_saes() -> dict[str, SAE]:
    """The SAEs shipped for ``circuits.models.induction_weights()``: ``{'b0': SAE, 'b1': SAE}``,
    TopK (256 latents, k = 8) on each layer's residual stream output, trained by
    ``examples/train_induction_saes.py``.

    >>> saes = induction_saes()
    >>> sorted(saes), saes['b1'].d_in, saes['b1'].d_sae, saes['b1'].k
    (['b0', 'b1'], 64, 256, 8)
    """
    return {site: load_sae(INDUCTION_SAE_DIR / f"induction_sae_{site}") for site in ("b0", "b1")}
