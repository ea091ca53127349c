"""Content hashes for tensors and structural hashes for nodes.

Tensors are hashed once, by content (blake3 over dtype, shape and bytes); a node's hash combines
its type, payload, its children's hashes and its name (blake2b, 128 bits), so hashing a parent
never re-reads tensor bytes.
"""

from __future__ import annotations

import hashlib

import blake3
import numpy as np

NODE_HASH_BYTES = 16
# How many hex digits of an array's content hash the text format prints (and node identity uses).
PRINTED_HASH_HEX = 24


def content_hash(value) -> str:
    """Hex blake3 digest (64 digits) of an array's dtype, shape and C-ordered bytes.

    >>> len(content_hash(np.zeros((2,), np.float32)))
    64
    """
    arr = np.ascontiguousarray(np.asarray(value))
    h = blake3.blake3(max_threads=blake3.blake3.AUTO if arr.nbytes > (1 << 22) else 1)
    h.update(f"{arr.dtype.str}|{','.join(map(str, arr.shape))}|".encode())
    h.update(memoryview(arr).cast("B") if arr.nbytes else b"")
    return h.hexdigest()


def node_hash(parts: bytes) -> bytes:
    return hashlib.blake2b(parts, digest_size=NODE_HASH_BYTES).digest()
