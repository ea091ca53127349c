"""Reading a HuggingFace model folder: where it is (a directory, or a hub id in the user's
HuggingFace cache) and its safetensors weights, each read once.

Weights: a safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape
and byte range) and the tensors' bytes.  Each tensor is read once, straight from the file into
new 64-byte aligned memory (bfloat16 and float16 widened to float32 on the way, exactly) that the
reader alone holds: ``circuits.models.load`` gives it to its Array as the Array's own value (no
second copy), and JAX on the CPU uses that memory in place as the device value (no third).  The
file is not memory-mapped: an Array's bytes must stay those its content hash was computed from,
and a mapped file can be rewritten under it (issue 33), so a mapped tensor would be copied anyway,
with the mapped pages resident beside the copy until the map is dropped.

Hub ids (``'EleutherAI/pythia-70m'``) go through ``huggingface_hub`` (an optional dependency:
``pip install circuits[models]``) and the user's own cache (``HF_HUB_CACHE``, ``HF_HOME``);
``HF_HUB_OFFLINE=1`` makes it offline: only the cache is read, and a model missing from it is an
error that says so.  Nothing is downloaded when the cache holds the files.

>>> import tempfile, numpy as np
>>> from safetensors.numpy import save_file
>>> folder = tempfile.mkdtemp()
>>> save_file({'w': np.arange(6, dtype=np.float32).reshape(2, 3)}, folder + '/model.safetensors')
>>> read_safetensors(folder + '/model.safetensors')['w'].tolist()
[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

import numpy as np

from ..errors import CircuitError

# safetensors dtype -> (numpy dtype held as is, or None: widened to float32)
DTYPES = {"F64": np.float64, "F32": np.float32, "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
          "U8": np.uint8, "BOOL": np.bool_, "F16": None, "BF16": None}
ALIGN = 64
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
FILES = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json",
         "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def regular_file(path: Path) -> None:
    """Refuse anything but a regular file (a FIFO named ``*.safetensors`` would block a read)."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise CircuitError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise CircuitError(f"{path}: not a regular file (a FIFO, device or directory); a checkpoint holds files")


def _header(path: Path, f, size: int) -> tuple[dict, int]:
    raw = f.read(8)
    if len(raw) < 8:
        raise CircuitError(f"{path}: {size} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw)
    if n > min(MAX_HEADER, size - 8):
        raise CircuitError(f"{path}: header length {n} does not fit the file ({size} bytes); not a safetensors file?")
    try:
        header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CircuitError(f"{path}: the safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CircuitError(f"{path}: the safetensors header is not an object")
    header.pop("__metadata__", None)
    return header, 8 + n


def _widened(raw: np.ndarray, kind: str) -> np.ndarray:
    """float16 or bfloat16 bytes as float32 (exact), in 64-byte aligned memory."""
    out = aligned_empty(raw.size // 2, np.float32)
    if kind == "F16":
        out[...] = raw.view(np.float16)
    else:  # bfloat16: the high half of a float32
        out.view(np.uint32)[...] = raw.view(np.uint16).astype(np.uint32) << 16
    return out


def aligned_empty(count: int, dtype) -> np.ndarray:
    """An uninitialised 1-d array of ``count`` items whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    buf = np.empty(count * dtype.itemsize + ALIGN, np.uint8)
    start = -buf.ctypes.data % ALIGN
    return buf[start:start + count * dtype.itemsize].view(dtype)


def read_safetensors(path) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file by name: each read once into new 64-byte aligned,
    read-only memory (see the module docstring).  A malformed file is a ``CircuitError`` naming
    it."""
    path = Path(path)
    regular_file(path)
    size = path.stat().st_size
    out: dict[str, np.ndarray] = {}
    with open(path, "rb") as f:
        header, start = _header(path, f, size)
        for name, info in header.items():
            try:
                kind, shape, (b, e) = info["dtype"], [int(s) for s in info["shape"]], info["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise CircuitError(f"{path}: tensor {name!r} has a malformed header entry {str(info)[:80]}") from None
            if kind not in DTYPES:
                raise CircuitError(f"{path}: tensor {name!r} has dtype {kind}, which is not supported "
                                   f"({', '.join(DTYPES)})")
            itemsize = 2 if DTYPES[kind] is None else np.dtype(DTYPES[kind]).itemsize
            count = int(np.prod(shape, dtype=np.int64))
            if any(s < 0 for s in shape) or not 0 <= b <= e <= size - start or e - b != count * itemsize:
                raise CircuitError(f"{path}: tensor {name!r} ({kind} {shape}) has byte range [{b}, {e}), which does "
                                   f"not fit its shape or the file")
            raw = aligned_empty(count * itemsize, np.uint8)
            f.seek(start + b)
            if f.readinto(memoryview(raw)) != raw.size:
                raise CircuitError(f"{path}: tensor {name!r} is cut short (the file ends early)")
            arr = _widened(raw, kind) if DTYPES[kind] is None else raw.view(DTYPES[kind])
            arr = arr.reshape(shape)
            arr.flags.writeable = False
            out[name] = arr
    return out


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of a folder's ``*.safetensors`` files (one, or shards), by name; a name in two
    files is an error."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        found = ", ".join(sorted(p.name for p in folder.iterdir())[:20])
        raise CircuitError(f"{folder}: no *.safetensors file (found: {found}); save with safe_serialization=True")
    weights: dict = {}
    for f in files:
        part = read_safetensors(f)
        dup = set(part) & set(weights)
        if dup:
            raise CircuitError(f"{f}: weights {sorted(dup)[:5]} appear in two files")
        weights.update(part)
    return weights


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_cache_dir() -> str | None:
    """The HuggingFace hub cache this process reads: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
    ``huggingface_hub``'s default (read when called, not when imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def resolve(path_or_id, *, revision: str | None = None) -> Path:
    """The local folder of a model: ``path_or_id`` itself when it is a directory, else the hub
    id's snapshot in the HuggingFace cache (fetched by ``huggingface_hub`` unless
    ``HF_HUB_OFFLINE`` is set, in which case only the cache is read)."""
    text = os.fspath(path_or_id)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    looks_like_id = text.count("/") <= 1 and not text.startswith((".", "/", "~")) and text.strip() == text and text
    if not looks_like_id or path.exists():
        raise CircuitError(f"{text!r}: no such model directory (a folder holding config.json and *.safetensors, "
                           "as save_pretrained writes it, or a hub id such as 'EleutherAI/pythia-70m')")
    try:
        import huggingface_hub
        from huggingface_hub import constants as hub_constants
        from huggingface_hub import errors as hub_errors
    except ImportError:
        raise CircuitError(f"{text!r} is not a directory, and a hub id needs huggingface_hub "
                           "(pip install 'circuits[models]')") from None
    offline = _offline()
    cache = hub_cache_dir()
    try:
        folder = huggingface_hub.snapshot_download(text, revision=revision, cache_dir=cache, allow_patterns=list(FILES),
                                                   local_files_only=offline)
    except (hub_errors.LocalEntryNotFoundError, FileNotFoundError) as e:
        where = cache or hub_constants.HF_HUB_CACHE
        why = "HF_HUB_OFFLINE is set, so only the cache is read" if offline else f"it could not be fetched ({e})"
        raise CircuitError(f"model {text!r} is not in the HuggingFace cache at {where} and {why}; download it "
                           "once online, or give the model's directory") from None
    except hub_errors.HfHubHTTPError as e:
        raise CircuitError(f"model {text!r}: the hub refused it ({e}); a private model needs `hf auth login`") from None
    except ValueError as e:  # huggingface_hub's own validation of the id
        raise CircuitError(f"{text!r}: not a model directory nor a valid hub id ({e})") from None
    return Path(folder)
