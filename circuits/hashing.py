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
    # order="C", not ascontiguousarray: that one turns a 0-d array into shape (1,), which would
    # give a scalar and a one-element vector the same hash.
    arr = np.asarray(value, order="C")
    if arr.dtype.str[0] == ">":  # equal values hash equal whatever their byte order
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    h = blake3.blake3(max_threads=blake3.blake3.AUTO if arr.nbytes > (1 << 22) else 1)
    h.update(f"{arr.dtype.str}|{','.join(map(str, arr.shape))}|".encode())
    # Viewed as bytes first: memoryview cannot export ml_dtypes types such as bfloat16.
    h.update(memoryview(arr.reshape(-1).view(np.uint8)) if arr.nbytes else b"")
    return h.hexdigest()


def node_hash(parts: bytes) -> bytes:
    return hashlib.blake2b(parts, digest_size=NODE_HASH_BYTES).digest()
