"""Circuit files: one self-contained file holding a circuit's text and all its tensors.

A circuit file is a safetensors file.  Its tensors are keyed by their full content hash, so a
tensor two Arrays share is stored once; the circuit in the text format is one more tensor,
``__circuit_text__`` (its UTF-8 bytes as uint8), in the file's body rather than in its header,
so a text of any size loads (headers are capped at 100 MB); the header's metadata holds the format
version, the number of roots and the text's checksum.  Format 2 is this layout; format 1 files
(the text in the header's metadata) still load.  ``load`` needs nothing but the file; it never
executes code from it (safetensors is raw bytes plus a JSON header, and the text is parsed, not
evaluated) and checks every tensor against its hash.  It checks the header against the file's
size before reading anything else, so a damaged file is refused at once, then copies each tensor
into memory of its own, hashing it in the same pass.  It never maps the file: a loaded value was
verified and stays that value, whatever later happens to the file (overwritten in place, or
truncated: a memory map would show other numbers, or kill the process with SIGBUS).

``save`` is atomic: it writes a hidden temporary file beside ``path`` and renames it into place,
so a failed or interrupted save leaves any existing file at ``path`` as it was and never a
truncated file there.  A file saved over keeps its mode (a private 0600 file stays private).  A
failed save removes its temporary file; a process killed mid-write leaves it behind, and the
next save to the same path removes it (see ``circuits.io.localfs``).  ``path`` may also be an
fsspec URL (``s3://...``, ``memory://...``; ``https://`` for loading), see ``circuits.io.remotefs``.

>>> import os, tempfile, numpy as np
>>> from circuits import Array, Einsum
>>> w = Array(np.arange(6, dtype=np.float32).reshape(2, 3), name='w')
>>> c = Einsum.from_spec('ab,ab->a', w, w, name='norms')
>>> path = os.path.join(tempfile.mkdtemp(), 'norms.circuit')
>>> save(c, path)
>>> back = load(path)
>>> back == c, np.array_equal(back.children[0].value, w.value)
(True, True)

Placeholder Arrays (shape, dtype and hash, no value) have no tensor to save: ``save`` refuses
them by default, naming them, because a teammate loading the file could not evaluate it.  With
``allow_placeholders=True`` they are saved as placeholders (their name, shape, dtype and hash) and
load back as the same placeholders, to be filled with ``circuits.bind``.

The arrays ``load`` returns are read-only and each owns its memory (64-byte aligned, so JAX on the
CPU uses it in place: the device value never aliases the file).  A file that uses a
GeneralFunction you registered yourself loads once the same function is registered again.
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path

import blake3
import numpy as np

from ..errors import ParseError, StoreError
from ..hashing import PRINTED_HASH_HEX
from ..nodes.leaves import FRESH_VALUE_STORES
from .localfs import atomic_write, open_file
from .remotefs import is_url, local_path, open_url, redact, write_url
from .store import host_array, read_safetensors_from, safetensors_writer

FORMAT = "circuits"
FORMAT_VERSION = 2
# Reserved tensor names (every other name in a circuit file is a 64-digit content hash).
TEXT_TENSOR = "__circuit_text__"
PLACEHOLDERS_TENSOR = "__circuit_placeholders__"


def save(circuit, path, *, allow_placeholders: bool = False, storage_options: dict | None = None) -> None:
    """Write ``circuit`` (text and tensors) to one file at ``path`` (or an fsspec URL), atomically.

    Raises ``StoreError`` naming the placeholder Arrays (no value) unless ``allow_placeholders``,
    for a text ``load`` would refuse to parse under the same allocation budget
    (``circuits.text.parser.check_text_size``: the message names the setting to raise), and for
    any failure to write (naming ``path``).
    """
    save_many([circuit], path, allow_placeholders=allow_placeholders, storage_options=storage_options)


def save_many(circuits, path, *, allow_placeholders: bool = False, storage_options: dict | None = None) -> None:
    """Write several circuits to one file; shared subtrees and tensors are stored once.

    >>> import os, tempfile
    >>> from circuits import Scalar, Add
    >>> one = Scalar(1.0, name='one')
    >>> path = os.path.join(tempfile.mkdtemp(), 'two.circuit')
    >>> save_many([Add(one, name='a'), Add(one, one, name='b')], path)
    >>> [c.name for c in load_many(path)]
    ['a', 'b']
    """
    from ..nodes.base import Circuit
    from ..nodes.leaves import Array
    from ..text.parser import check_text_size
    from ..text.printer import print_many
    from ..traversal import toposort

    roots = list(circuits)
    if not roots:
        raise ValueError("save_many needs at least one circuit")
    for r in roots:
        if not isinstance(r, Circuit):
            raise TypeError(f"save takes circuit nodes, got {type(r).__name__}")
    tensors: dict = {}
    placeholders = []
    for node in toposort(*roots):
        if not isinstance(node, Array):
            continue
        if node.value is None:
            placeholders.append(node)
        elif node.content_hash not in tensors:
            tensors[node.content_hash] = host_array(node.value)
    if placeholders and not allow_placeholders:
        listed = ", ".join(p.line() for p in placeholders[:10])
        more = f" and {len(placeholders) - 10} more" if len(placeholders) > 10 else ""
        raise StoreError(
            f"cannot save {len(placeholders)} placeholder Array(s) with no value: {listed}{more}; "
            "give them values (circuits.bind or circuits.fill_random) or save them as "
            "placeholders with allow_placeholders=True"
        )
    printed: dict = {}
    for p in placeholders:
        twin = printed.setdefault((p.short_hash, p.shape, p.name), p)
        if twin is not p:  # the same line in the text: only their dtypes differ
            raise StoreError(
                f"cannot save placeholders {p.line()} ({twin.dtype} and {p.dtype}): they differ only "
                "in dtype, which the text does not show, so loading could not tell them apart; "
                "rename one or give it a value (circuits.bind)"
            )
    text = print_many(roots)
    try:  # a file save writes must load under the same settings (issue 33 item 12)
        check_text_size(text)
    except ParseError as e:
        raise StoreError(f"cannot save to {redact(str(path))}: load would refuse the file: {e}") from None
    text = text.encode("utf-8", "surrogatepass")
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "roots": str(len(roots)),
        # The text is not covered by the tensors' hashes: this catches a damaged or edited text.
        "text_blake3": blake3.blake3(text).hexdigest(),
    }
    tensors[TEXT_TENSOR] = np.frombuffer(text, np.uint8)
    if placeholders:
        listed = json.dumps([[p.name, list(p.shape), p.dtype, p.content_hash] for p in placeholders])
        tensors[PLACEHOLDERS_TENSOR] = np.frombuffer(listed.encode("utf-8", "surrogatepass"), np.uint8)
    write = safetensors_writer(tensors, metadata)
    if is_url(path):
        write_url(path, write, storage_options)
        return
    path = Path(local_path(os.fspath(path)))
    if "\0" in str(path):
        raise StoreError(f"cannot save to {str(path)!r}: a file name cannot contain a NUL character")
    if not path.parent.is_dir():
        raise StoreError(f"cannot save to {path}: directory {path.parent} does not exist")
    atomic_write(path, write)


def load(path, *, storage_options: dict | None = None):
    """The circuit saved in the file at ``path`` (or an fsspec URL), every tensor checked against
    its hash.  Anything but a circuit file raises ``StoreError``."""
    roots = load_many(path, storage_options=storage_options)
    if len(roots) != 1:
        raise StoreError(f"{redact(str(path))} holds {len(roots)} circuits; use circuits.io.files.load_many")
    return roots[0]


def load_many(path, *, storage_options: dict | None = None) -> list:
    """Every circuit saved in the file at ``path`` (by ``save`` or ``save_many``), in order."""
    from ..nodes.leaves import Array
    from ..text.parser import check_text_size, parse_many
    from ..traversal import toposort

    if is_url(path):
        source = open_url(path, storage_options)
        path = source.name  # the URL as messages show it (passwords and tokens redacted)
    else:
        path = Path(local_path(os.fspath(path)))
        try:
            source = open_file(path)
        except FileNotFoundError:
            raise StoreError(f"{path}: no such file") from None
    hashes: dict = {}
    with source:
        metadata, raw = read_safetensors_from(source, hashes)
    text, placeholder_list = _text(path, metadata, raw)
    try:
        check_text_size(text)
    except ParseError as e:
        raise StoreError(f"{path}: {e}") from None
    tensors = _FileTensors(path, raw, hashes)
    # The parser asks ``tensors.placeholder`` for each Array the file has no tensor for, and gets
    # these: the saved dtype (part of an Array's identity) and full hash, not a guessed dtype.
    placeholders = tensors.placeholders(placeholder_list)
    try:
        roots = parse_many(text, store=tensors)
    except ParseError as e:
        tensors.verify_all()  # tampered tensors explain a text that does not fit them
        raise StoreError(f"{path}: the circuit text in this file does not parse: {e}") from e
    expected_roots = metadata.get("roots")
    if expected_roots is not None and expected_roots != str(len(roots)):
        raise StoreError(f"{path}: corrupted circuit file ({len(roots)} circuits, header says {expected_roots})")
    used = set()
    for node in toposort(*roots):
        if not isinstance(node, Array):
            continue
        if node.value is None:
            if node.hash not in placeholders:
                raise StoreError(
                    f"{path}: {node.line()} has no tensor in this file (truncated or tampered file?)"
                )
            continue
        bad = tensors.mismatched.get(id(node.value))
        if bad is not None:
            raise tensors.mismatch(bad[0], node.content_hash, node.line())
        key = node.content_hash
        if key not in tensors.raw:
            raise StoreError(f"{path}: {node.line()} has no tensor in this file")
        # (a node the parser got back from the intern table holds the live equal value, not
        # the file's: the file's bytes are checked here all the same)
        tensors.verify(key, node.line())
        used.add(key)
    for key in tensors.raw.keys() - used:
        tensors.verify(key)
    return roots


def _text(path, metadata: dict, raw: dict) -> tuple[str, str | None]:
    """The circuit text and the placeholder list (JSON or None) of a circuit file, checked;
    removes their tensors from ``raw``."""
    if metadata.get("format") != FORMAT:
        raise StoreError(f"{path}: a safetensors file, but not a circuit file (no circuit text in it)")
    try:
        version = int(metadata.get("format_version", ""))
    except ValueError:
        raise StoreError(f"{path}: corrupted circuit file (format_version {str(metadata.get('format_version'))[:40]!r})") from None
    if version > FORMAT_VERSION:
        raise StoreError(f"{path}: written by a newer circuits (file format {version}); upgrade circuits")
    text_tensor = raw.pop(TEXT_TENSOR, None)
    placeholder_tensor = raw.pop(PLACEHOLDERS_TENSOR, None)
    if version >= 2:
        for t, what in ((text_tensor, "text"), (placeholder_tensor, "placeholder list")):
            if t is not None and (t.dtype != np.uint8 or t.ndim != 1):
                raise StoreError(f"{path}: corrupted circuit file (the {what} is not a uint8 vector)")
        if text_tensor is None:
            raise StoreError(f"{path}: corrupted circuit file (no circuit text)")
        data = text_tensor.tobytes()
        placeholders = None if placeholder_tensor is None else placeholder_tensor.tobytes()
    else:  # format 1: both in the header
        if "text" not in metadata:
            raise StoreError(f"{path}: corrupted circuit file (no circuit text)")
        data = metadata["text"].encode("utf-8", "surrogatepass")
        placeholders = metadata.get("placeholders")
    if blake3.blake3(data).hexdigest() != metadata.get("text_blake3"):
        raise StoreError(f"{path}: the circuit text in this file does not match its checksum (corrupted or edited)")
    try:
        text = data.decode("utf-8", "surrogatepass")
        if isinstance(placeholders, bytes):
            placeholders = placeholders.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise StoreError(f"{path}: corrupted circuit file (text is not UTF-8: {e})") from None
    return text, placeholders


class _FileTensors:
    """The tensors of one circuit file seen as a store (``find``, ``get``) for the parser.

    Every tensor was hashed as it was read (``read_safetensors_from``); when the one ``get``
    hands out hashes to its key (``hashes_verified``), the parser builds its Array without
    hashing it again: one pass over the bytes in all.
    """

    def __init__(self, path, raw: dict, hashes: dict):
        self.path = path
        self.raw = raw
        self.hashes = hashes  # key -> the content hash of the bytes read under it
        self._verified = False
        self.mismatched: dict = {}  # id(array handed out) -> (its key, the array kept alive)
        self.keys = sorted(raw)
        self.short_placeholder_digests: set = set()
        self.by_line: dict = {}  # (printed hash, shape, name) -> saved placeholder

    def find(self, prefix: str):
        if prefix in self.short_placeholder_digests:
            return None  # a placeholder printed with a short hash, not a prefix of a tensor here
        i = bisect.bisect_left(self.keys, prefix)
        found = []
        while i < len(self.keys) and self.keys[i].startswith(prefix) and len(found) < 11:
            found.append(self.keys[i])
            i += 1
        if len(found) > 1:
            raise StoreError(f"{self.path}: hash prefix {prefix!r} is ambiguous: {', '.join(found[:10])}")
        return found[0] if found else None

    @property
    def hashes_verified(self) -> bool:
        """Whether the tensor ``get`` handed out last hashes to its key (else the Array built
        from it hashes it itself, and ``load_many`` names it in the error)."""
        return self._verified

    def get(self, key: str) -> np.ndarray:
        arr = self.raw[key]
        self._verified = self.hashes[key] == key
        if not self._verified:
            self.mismatched[id(arr)] = (key, arr)
        return arr

    def placeholders(self, text) -> dict:
        from ..nodes.leaves import Array

        if not text:
            return {}
        try:
            entries = json.loads(text)
            nodes = [Array.placeholder(shape, h, name=name, dtype=dtype) for name, shape, dtype, h in entries]
        except RecursionError:
            raise StoreError(f"{self.path}: corrupted placeholder list (nested too deeply)") from None
        except Exception as e:  # any malformed entry: json, unpacking, Array.placeholder's checks
            raise StoreError(f"{self.path}: corrupted placeholder list ({str(e)[:200]})") from None
        self.short_placeholder_digests = {n.short_hash for n in nodes if len(n.short_hash) < PRINTED_HASH_HEX}
        self.by_line = {(n.short_hash, n.shape, n.name): n for n in nodes}
        return {n.hash: n for n in nodes}

    def placeholder(self, prefix: str, shape, name):
        """The saved placeholder a printed Array line stands for (the parser's hook), or None."""
        return self.by_line.get((prefix, shape, name))

    def mismatch(self, key, actual, what) -> StoreError:
        return StoreError(
            f"{self.path}: tensor {key} (for {what}) hashes to {actual}: the file is corrupted or "
            "was tampered with"
        )

    def verify(self, key, what="no Array"):
        actual = self.hashes[key]
        if actual != key:
            raise self.mismatch(key, actual, what)

    def verify_all(self):
        for key in self.keys:
            self.verify(key)


# Its tensors were read into memory of their own, held by nothing after ``load_many`` returns.
FRESH_VALUE_STORES.add(_FileTensors)
