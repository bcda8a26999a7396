"""The fingerprint that names a matrix's structure in the store, computed where the matrix lives.

A fingerprint is 128 bits (32 hex digits) of the shape and the ``indptr`` and
``indices`` arrays; values are left out on purpose: speed depends on the
structure and the dtype, not on the numbers, so new values reuse the tuning
already stored. Each of its two 64-bit lanes mixes (splitmix64) the shape and
two sums, one per array: over every element ``w`` at position ``i``, the mix
of ``(i << 32) | w`` with a tag of its array and lane, added modulo 2**64.
A sum needs no order, so the GPU computes it in one pass over the arrays in
place (about one SpMV's time, where hashing on the CPU costs a thousand and a
copy to the host; :mod:`tuner.matrix.structure_gpu`, in the pass that checks a
new matrix's canonical form), and the chunked NumPy twin gives the same bits
anywhere.

Stores written before this scheme name their matrices by BLAKE2b of the same
arrays (:func:`legacy_fingerprint`, scheme 1); ``plan()`` computes that one
only where the store holds a scheme-1 matrix of the same shape and nonzeros.

>>> import scipy.sparse as sp
>>> fingerprint(sp.eye(3, format="csr")) == fingerprint(sp.eye(3, format="csr"))
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels._narrow import note_narrow_rows
from kernels.csr_vector import note_empty_rows
from tuner.matrix.features import QueuedFeatures, csr_arrays, queue_features
from tuner.matrix.io import as_device_csr, dtype_name, kept_on_device, stays_on_device, value_dtype
from tuner.matrix.readback import ReadBack
from tuner.matrix.structure_gpu import Structure, queue_structure_pass, structure_pass

__all__ = ["SCHEME", "device_csr_and_fingerprint", "fingerprint", "legacy_fingerprint"]

SCHEME = 2
"""The fingerprint scheme :func:`fingerprint` computes (the store records it per matrix)."""

_MASK = (1 << 64) - 1
_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_SEEDS = (0x452821E638D01377, 0xBE5466CF34E90C6C)  # per lane (hex digits of pi, as in many hashes)
_TAGS = ((0x243F6A8885A308D3, 0x13198A2E03707344),  # indptr: lane 0, lane 1
         (0xA4093822299F31D0, 0x082EFA98EC4E6C89))  # indices
_ALL_TAGS = (*_TAGS[0], *_TAGS[1])
_CHUNK = 1 << 22  # elements per NumPy step: bounds the temporaries at 32 MB each


def _mix(z: int) -> int:
    """splitmix64's finalizer on a Python int (``mix`` of :mod:`tuner.matrix.structure_gpu`'s kernel)."""
    z = (z + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def _sums_numpy(w: np.ndarray, tags: tuple[int, int]) -> tuple[int, int]:
    """Both lanes' sums of one array, in chunks (uint64 arithmetic wraps as the kernel's does)."""
    sums = [0, 0]
    words = w.view(np.uint32)
    for start in range(0, words.size, _CHUNK):
        part = words[start:start + _CHUNK].astype(np.uint64)
        keys = (np.arange(start, start + part.size, dtype=np.uint64) << np.uint64(32)) | part
        for lane, tag in enumerate(tags):
            z = (keys ^ np.uint64(tag)) + np.uint64(_GOLDEN)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
            z ^= z >> np.uint64(31)
            sums[lane] = (sums[lane] + int(z.sum(dtype=np.uint64))) & _MASK
    return sums[0], sums[1]


def fingerprint(A: Any) -> str:
    """The scheme-2 fingerprint of a canonical CSR matrix: on the GPU for a CuPy one, else in NumPy."""
    xp, m, n, indptr, indices = csr_arrays(A)
    if xp is np:
        sums = [*_sums_numpy(indptr, _TAGS[0]), *_sums_numpy(indices, _TAGS[1])]
    else:
        sums = structure_pass(indptr, indices, tags=_ALL_TAGS)[1]
    return _name(m, n, int(indices.size), sums)


def device_csr_and_fingerprint(A: Any, *, dtype: Any = None,
                               describe_if: Callable[[int, int, int, str], bool] | None = None,
                               meanwhile: Callable[[str, QueuedFeatures, Any], object] | None = None
                               ) -> tuple[Any, str, dict[str, float] | None]:
    """:func:`~tuner.matrix.io.as_device_csr` of ``A``, its fingerprint and, where ``describe_if(rows, cols,
    nnz, values' dtype)`` holds (``plan()``: the store holds no matrix of that shape and nonzeros, so none can be
    this one; it asks the store for its selector of that dtype in the same statement),
    its features (:func:`~tuner.matrix.features.extract_features`), else None: what ``plan()`` starts from.
    A CuPy CSR matrix of int32 arrays is checked (canonical, values finite) and fingerprinted in one pass
    over it (:func:`~tuner.matrix.structure_gpu.structure_pass`), its features' kernels queued behind that
    pass and read back with it: one wait for the GPU, not two; ``meanwhile`` is called with the values' dtype,
    the queued features and the matrix they describe once they are queued, before that wait (``plan()`` finds the
    selector while the GPU works, and queues the ranking behind the features). Where it is not
    canonical, its canonical form is fingerprinted and described. The matrix returned carries the pass's count of
    entries in rows narrow enough for 16-bit columns (:func:`kernels._narrow.note_narrow_rows`) and its empty rows
    (:func:`kernels.csr_vector.note_empty_rows`)."""
    if stays_on_device(A):
        check, features = _queued(A, dtype=dtype, values=A.data, describe_if=describe_if, meanwhile=meanwhile)
        found = check()
        if found.canonical:
            B = kept_on_device(A, dtype, found)
            return B, _name(*B.shape, int(B.indices.size), found.sums), features()
    B = as_device_csr(A, dtype=dtype)
    check, features = _queued(B, dtype=dtype, values=None, describe_if=describe_if, meanwhile=meanwhile)
    found = check()
    note_narrow_rows(B, found.narrow_rows)
    note_empty_rows(B, B.shape[0] - found.nonempty_rows)
    return B, _name(*B.shape, int(B.indices.size), found.sums), features()


def _queued(A: Any, *, dtype: Any, values: Any, describe_if: Callable[[int, int, int, str], bool] | None,
            meanwhile: Callable[[str, QueuedFeatures, Any], object] | None
            ) -> tuple[Callable[[], Structure], Callable[[], dict[str, float] | None]]:
    """:func:`device_csr_and_fingerprint`'s GPU work on ``A`` queued: the structure pass (the fingerprint's sums,
    and ``values``' check where given) and, where ``describe_if`` holds, the features (used only where the
    pass finds ``A`` canonical); ``meanwhile`` called before any wait. Both, and what ``meanwhile`` queues behind
    them into the features' read-back (:class:`~tuner.matrix.readback.ReadBack`), are copied back at once, at the
    first of the two functions returned."""
    m, n = A.shape
    read_back = ReadBack(kept=True) if describe_if is not None else None
    check = queue_structure_pass(A.indptr, A.indices, tags=_ALL_TAGS, values=values, into=read_back)
    of = dtype_name(value_dtype(A.dtype, dtype))
    if describe_if is None or not describe_if(m, n, int(A.indices.size), of):
        return check, lambda: None
    features = queue_features(A, checked_apart=True, into=read_back)
    if meanwhile is not None:
        meanwhile(of, features, A)
    return check, features


def _name(m: int, n: int, nnz: int, sums: list[int]) -> str:
    """The fingerprint of a matrix of shape (m, n) and ``nnz`` entries from its four sums (indptr's two lanes,
    then indices')."""
    lanes = []
    for lane, seed in enumerate(_SEEDS):
        h = _mix(seed ^ m)
        h = _mix(h ^ n)
        h = _mix(h ^ nnz)
        h = _mix((h + sums[lane]) & _MASK)
        lanes.append(_mix((h + sums[2 + lane]) & _MASK))
    return f"{lanes[0]:016x}{lanes[1]:016x}"


def legacy_fingerprint(A: Any) -> str:
    """Scheme 1: hex BLAKE2b-128 of the shape (2 x LE int64), indptr and indices (LE int32), on the CPU."""
    xp, m, n, indptr, indices = csr_arrays(A)
    if xp is not np:
        indptr, indices = indptr.get(), indices.get()
    h = hashlib.blake2b(digest_size=16)
    h.update(np.array([m, n], dtype="<i8"))
    h.update(np.ascontiguousarray(indptr, dtype="<i4"))
    h.update(np.ascontiguousarray(indices, dtype="<i4"))
    return h.hexdigest()
