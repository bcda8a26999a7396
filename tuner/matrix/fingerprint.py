"""The fingerprint that names a matrix's structure in the store, computed where the matrix lives.

A fingerprint is 128 bits (32 hex digits) of the shape and the ``indptr`` and
``indices`` arrays; values are left out on purpose: speed depends on the
structure and the dtype, not on the numbers, so new values reuse the tuning
already stored. Each of its two 64-bit lanes mixes (splitmix64) the shape and
two sums, one per array: over every element ``w`` at position ``i``, the mix
of ``(i << 32) | w`` with a tag of its array and lane, added modulo 2**64.
A sum needs no order, so the GPU computes it in one pass over the arrays in
place (about one SpMV's time, where hashing on the CPU costs a thousand and a
copy to the host), and the chunked NumPy twin gives the same bits anywhere.

Stores written before this scheme name their matrices by BLAKE2b of the same
arrays (:func:`legacy_fingerprint`, scheme 1); ``plan()`` computes that one
only where the store holds a scheme-1 matrix of the same shape and nonzeros.

>>> import scipy.sparse as sp
>>> fingerprint(sp.eye(3, format="csr")) == fingerprint(sp.eye(3, format="csr"))
True
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np

from tuner.matrix.features import csr_arrays

__all__ = ["SCHEME", "fingerprint", "legacy_fingerprint"]

SCHEME = 2
"""The fingerprint scheme :func:`fingerprint` computes (the store records it per matrix)."""

_MASK = (1 << 64) - 1
_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_SEEDS = (0x452821E638D01377, 0xBE5466CF34E90C6C)  # per lane (hex digits of pi, as in many hashes)
_TAGS = ((0x243F6A8885A308D3, 0x13198A2E03707344),  # indptr: lane 0, lane 1
         (0xA4093822299F31D0, 0x082EFA98EC4E6C89))  # indices
_CHUNK = 1 << 22  # elements per NumPy step: bounds the temporaries at 32 MB each

_KERNEL = r"""
__device__ __forceinline__ unsigned long long mix(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
extern "C" __global__ void fingerprint_sums(const unsigned int* __restrict__ w, long long n,
                                            unsigned long long tag0, unsigned long long tag1,
                                            unsigned long long* __restrict__ out) {
    unsigned long long s0 = 0, s1 = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {  // four loads in flight a thread, then their mixes (2-13 %
        // less time than one at a time on an H100: 0.12-0.17 ms for a matrix of 19-32 M entries)
        unsigned int v[4];
        #pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = w[i + j * stride];
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            unsigned long long k = ((unsigned long long)(i + j * stride) << 32) | v[j];
            s0 += mix(k ^ tag0);
            s1 += mix(k ^ tag1);
        }
    }
    for (; i < n; i += stride) {
        unsigned long long k = ((unsigned long long)i << 32) | w[i];
        s0 += mix(k ^ tag0);
        s1 += mix(k ^ tag1);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        s0 += __shfl_down_sync(0xffffffffu, s0, offset);
        s1 += __shfl_down_sync(0xffffffffu, s1, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(out, s0);
        atomicAdd(out + 1, s1);
    }
}
"""


def _mix(z: int) -> int:
    """splitmix64's finalizer on a Python int (the kernel's ``mix``)."""
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


def _sums_cupy(w: Any, tags: tuple[int, int], out: Any) -> None:
    """Both lanes' sums of one CuPy array, on the GPU, added into ``out`` (two zeroed uint64; not yet read)."""
    import cupy

    from kernels._cuda import device_attributes

    n = int(w.size)
    if n:
        blocks = max(1, min(-(-n // 256), 8 * device_attributes()["MultiProcessorCount"]))
        _kernel()((blocks,), (256,), (w.view(cupy.uint32), np.int64(n), np.uint64(tags[0]), np.uint64(tags[1]), out))


def _kernel() -> Any:
    from kernels._cuda import require_cupy

    cupy = require_cupy()
    return _compiled(cupy, cupy.cuda.Device().id)


@functools.cache
def _compiled(cupy: Any, device: int) -> Any:
    """The sums' kernel, compiled once per device and process."""
    return cupy.RawKernel(_KERNEL, "fingerprint_sums")


def fingerprint(A: Any) -> str:
    """The scheme-2 fingerprint of a canonical CSR matrix: on the GPU for a CuPy one, else in NumPy."""
    xp, m, n, indptr, indices = csr_arrays(A)
    if xp is np:
        sums = [*_sums_numpy(indptr, _TAGS[0]), *_sums_numpy(indices, _TAGS[1])]
    else:
        both = xp.zeros(4, dtype=xp.uint64)  # indptr's two lanes, then indices'
        _sums_cupy(indptr, _TAGS[0], both[:2])
        _sums_cupy(indices, _TAGS[1], both[2:])
        sums = [int(s) for s in both.get()]
    lanes = []
    for lane, seed in enumerate(_SEEDS):
        h = _mix(seed ^ m)
        h = _mix(h ^ n)
        h = _mix(h ^ int(indices.size))
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
