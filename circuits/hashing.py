"""Every identity recipe, side by side: tensor content hash, node hash, name-blind structure hash
and program key.

A leaf module: it sees bytes, never nodes.  Callers take the fields from a node and pass them in
(``circuits.nodes.base`` when a node is built, ``circuits.traversal`` for the structure hash,
``circuits.backend.lower.program`` for the program key), and ``circuits.check`` re-hashes every node
through the very function that made its hash, so the recipes cannot drift apart.

============================  ========================================  ======================================
recipe                        goes in                                   left out, and why
============================  ========================================  ======================================
``content_hash`` (tensor)     dtype, shape, C-ordered bytes             byte order (equal values hash equal)
``node_hash`` (identity)      type, payload, children's node hashes     nothing that a computation or the
                              in order, name                            printed text can see
``structure_hash``            type, structure payload, children's       names (to compare structure, sort
                              structure hashes in order                 canonically), an Array's having a value
``program_key`` (compiled     float dtype, per slot: op type and        names, argument values (Array
code)                         payload, or argument kind, dtype and      contents, Scalar values), Tag uuids:
                              shape; wiring; output slots               patched circuits reuse compiled code
============================  ========================================  ======================================

Every variable-length field is length-prefixed (or last), so two different inputs never give the
same bytes to hash: a name cannot be mistaken for shape entries, nor a payload for child hashes.

>>> a = node_hash(type_prefix('Add'), b'', b'', 'x')
>>> len(a), a == node_hash(type_prefix('Add'), b'', b'', None)
(16, False)
>>> structure_hash(type_prefix('Add'), b'', b'') == node_hash(type_prefix('Add'), b'', b'', None)
True
"""

from __future__ import annotations

import hashlib
import struct

import blake3
import numpy as np

NODE_HASH_BYTES = 16
# How many hex digits of an array's content hash the text format prints (and node identity uses).
PRINTED_HASH_HEX = 24

_blake2b = hashlib.blake2b
# 4-byte little-endian counts, precomputed for the small ones (the hot path builds one per node).
_U32 = tuple(n.to_bytes(4, "little") for n in range(256))
_INT_STRUCTS: dict[int, struct.Struct] = {}


def _u32(n: int) -> bytes:
    return _U32[n] if n < 256 else n.to_bytes(4, "little")


def pack_ints(values) -> bytes:
    """Signed 64-bit little-endian ints, one after another (shapes, axes, slots in hash inputs).

    >>> pack_ints((1, -1)).hex()
    '0100000000000000ffffffffffffffff'
    """
    n = len(values)
    packer = _INT_STRUCTS.get(n)
    if packer is None:
        packer = _INT_STRUCTS[n] = struct.Struct(f"<{n}q")
    return packer.pack(*values)


# ---------------------------------------------------------------------------- tensors
def content_hash(value) -> str:
    """Hex blake3 digest (64 digits) of an array's dtype, shape and C-ordered bytes.

    Tensors are hashed once, by content; a node's hash combines its children's hashes, so
    hashing a parent never re-reads tensor bytes.

    >>> len(content_hash(np.zeros((2,), np.float32)))
    64
    """
    # order="C", not ascontiguousarray: that one turns a 0-d array into shape (1,), which would
    # give a scalar and a one-element vector the same hash.
    arr = np.asarray(value, order="C")
    if arr.dtype.str[0] == ">":  # equal values hash equal whatever their byte order
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    h = content_hasher(arr.dtype, arr.shape, arr.nbytes)
    # Viewed as bytes first: memoryview cannot export ml_dtypes types such as bfloat16.
    h.update(memoryview(arr.reshape(-1).view(np.uint8)) if arr.nbytes else b"")
    return h.hexdigest()


def content_hasher(dtype, shape, nbytes: int):
    """A blake3 hasher primed with an array's dtype and shape: feed it the array's C-ordered
    bytes (in pieces, e.g. as they are read from a file) and its ``hexdigest()`` is
    ``content_hash`` of the array.  ``dtype`` is a little-endian numpy dtype.

    >>> a = np.arange(6, dtype=np.float32)
    >>> h = content_hasher(a.dtype, a.shape, a.nbytes)
    >>> for piece in (a[:2], a[2:]):
    ...     _ = h.update(piece.tobytes())
    >>> h.hexdigest() == content_hash(a)
    True
    """
    h = blake3.blake3(max_threads=blake3.blake3.AUTO if nbytes > (1 << 22) else 1)
    h.update(f"{np.dtype(dtype).str}|{','.join(map(str, shape))}|".encode())
    return h


# ---------------------------------------------------------------------------- nodes
def type_prefix(type_name: str) -> bytes:
    """The bytes that open a node's hash input: its type name (a node class computes this once).

    >>> type_prefix('Einsum')
    b'Einsum\\x00'
    """
    return type_name.encode() + b"\0"


def node_hash(prefix: bytes, payload: bytes, child_hashes: bytes, name: str | None) -> bytes:
    """A node's identity (16 bytes of blake2b), computed once when the node is built.

    In: ``prefix`` (``type_prefix(type_name)``), ``payload`` (the node's ``_payload_bytes()``:
    everything it carries besides children and name, e.g. an Einsum's axes, an Array's content
    hash prefix, dtype, shape and whether it has a value), ``child_hashes`` (the children's
    ``hash`` values concatenated in order) and ``name``.  Nothing is left out that a computation
    or the printed text can see: a renamed node is another node (so print and parse stay a
    bijection), and a placeholder is not the valued Array it stands for.

    >>> leaf = node_hash(type_prefix('Symbol'), b'float32|', b'', 'x')
    >>> node_hash(type_prefix('Add'), b'', leaf + leaf, None) != node_hash(type_prefix('Add'), b'', leaf, None)
    True
    """
    # The hot path of building a node: written for speed (counts inlined, no concatenation).
    if name is None:
        marker, encoded = b"\0", b""
    else:
        marker = b"\1"
        try:
            encoded = name.encode()  # plain utf-8 is much the faster call
        except UnicodeEncodeError:  # a lone surrogate (e.g. from a file name) is kept, not refused
            encoded = name.encode("utf-8", "surrogatepass")
    size, count = len(payload), len(child_hashes) >> 4
    return _blake2b(
        b"".join((
            prefix, _U32[size] if size < 256 else size.to_bytes(4, "little"), payload,
            _U32[count] if count < 256 else count.to_bytes(4, "little"), child_hashes, marker, encoded,
        )),
        digest_size=NODE_HASH_BYTES,
    ).digest()


def structure_hash(prefix: bytes, structure_payload: bytes, child_structure_hashes: bytes) -> bytes:
    """A node's name-blind structure hash: ``node_hash`` with every name left out.

    In: ``prefix``, ``structure_payload`` (the node's ``_structure_bytes()``: its payload less
    what is identity but not structure, i.e. whether an Array has its value) and the children's
    structure hashes concatenated in order.  Left out: names, at every level, so circuits that
    differ only in names (``strip_names``) have one structure hash (for comparing structure
    and for sorting children canonically), and a placeholder circuit shares it with the valued one.

    >>> structure_hash(type_prefix('Add'), b'', b'') == structure_hash(type_prefix('Einsum'), b'', b'')
    False
    """
    return node_hash(prefix, structure_payload, child_structure_hashes, None)


# ---------------------------------------------------------------------------- compiled programs
def op_key_part(type_name: str, payload: bytes) -> bytes:
    """A computed slot's part of a program key: its type and the payload the compiled code uses.

    Left out by the caller where the code does not depend on it: a Tag's uuid (an identity);
    a GeneralFunction passes its function's name and the identity of the registered function
    (a function re-registered under the same name must not reuse old code).
    """
    return type_name.encode() + b"\0" + payload


def argument_key_part(kind: str, dtype: str, shape) -> bytes:
    """An argument slot's part of a program key (``kind``: ``Array``, ``Scalar``, ``Symbol``, or
    ``Given`` for a node whose value is supplied): its dtype and shape only.

    Left out: the value (Array contents, Scalar value), the content hash and the name, which
    reach the compiled code as arguments; so a patched circuit reuses the compiled code.
    """
    return b"\1" + kind.encode() + b"\0" + dtype.encode() + b"\0" + pack_ints(shape)


def program_body_key(float_dtype: str, parts, child_slots) -> bytes:
    """The key of a program's layout: the float dtype, then per slot its part (``op_key_part`` or
    ``argument_key_part``) and the slots of its children.  Outputs come in ``program_key``, so
    one layout can be keyed for several output sets without re-walking.
    """
    out = [float_dtype.encode(), b"\0"]
    for part, kids in zip(parts, child_slots):
        out += (_u32(len(part)), part, _u32(len(kids)), pack_ints(kids))
    return _blake2b(b"".join(out), digest_size=NODE_HASH_BYTES).digest()


def program_key(body_key: bytes, output_slots) -> bytes:
    """The key of a program: its layout's ``program_body_key`` and which slots it returns.

    >>> body = program_body_key('float32', [argument_key_part('Symbol', 'float32', (2,))], [()])
    >>> program_key(body, (0,)) != program_key(body, (0, 0))
    True
    """
    return _blake2b(body_key + pack_ints(output_slots), digest_size=NODE_HASH_BYTES).digest()
