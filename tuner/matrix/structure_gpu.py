"""One pass over a CSR matrix's structure on the GPU: whether it is canonical, and the fingerprint's sums.

Canonical (each row's columns strictly increasing): CuPy's
``has_canonical_format`` gives each row a thread that walks its entries, then
reduces the rows' answers: 0.17-0.31 ms of an H100's time on the unseen rgg and
sawtooth (24 and 32 M entries, ``bench/unseen.py``), 1.5 ms on bursts (24 M
rows, the longest of 49,290 entries). Here one kernel runs over the entries and
the rows at once: a pair of neighbouring entries whose column does not increase
is either within a row (the matrix is not canonical) or the last entry of a row
and the first of the next nonempty one; so the matrix is canonical exactly when
the pairs that do not increase are as many as the nonempty rows (after the first
entry) whose first entry does not increase on the entry before it. Two counters,
one read-back: 0.11-0.17 ms on the same matrices, bursts included (stop 42's
kernel, which this one extends). A matrix found canonical is remembered while
it lives, as CuPy remembers its own answer.
:func:`canonical_reference` is the same count in NumPy (the tests hold both to
SciPy's ``has_canonical_format``).

The same pass can add up the fingerprint's sums (:mod:`tuner.matrix.fingerprint`
defines them, and mixes them into the name): each word of ``indptr`` and
``indices`` is read there anyway, so ``plan()`` checks a new CuPy matrix and
names it in one launch and one read-back rather than two of each: 0.22-0.32 ms
of ``plan()`` against 0.42-0.54 for the two apart (an H100, four unseen
matrices in both dtypes, ``bench/results/..._ab_plan-a0e28ed.txt``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from kernels._cuda import device_attributes

__all__ = ["canonical_reference", "is_canonical", "remember_canonical", "structure_pass"]

_SOURCE = r"""
__device__ __forceinline__ unsigned long long mix(unsigned long long z) {  // splitmix64's finalizer
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ void add_word(long long i, int word, unsigned long long tag0, unsigned long long tag1,
                                         unsigned long long& s0, unsigned long long& s1) {
    const unsigned long long k = ((unsigned long long)i << 32) | (unsigned int)word;
    s0 += mix(k ^ tag0);
    s1 += mix(k ^ tag1);
}
__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}
// out[0] += pairs (j, j + 1) of entries whose column does not increase; out[1] += those where j + 1 opens a
// nonempty row (the pair spans two rows). With hash != 0 also the fingerprint's sums: out[2], out[3] over
// indptr (lanes tagged p0, p1), out[4], out[5] over indices (i0, i1).
extern "C" __global__ void csr_structure(const int* __restrict__ indptr, const int* __restrict__ indices,
                                         long long m, long long nnz, int hash,
                                         unsigned long long p0, unsigned long long p1,
                                         unsigned long long i0, unsigned long long i1,
                                         unsigned long long* __restrict__ out) {
    unsigned long long pairs = 0, across = 0, sp0 = 0, sp1 = 0, si0 = 0, si1 = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (; j + 3 * stride + 1 < nnz; j += 4 * stride) {  // four entries and their right neighbours in flight
        int v[4], next[4];
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[k] = indices[j + k * stride];
            next[k] = indices[j + k * stride + 1];
        }
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            pairs += next[k] <= v[k];
            if (hash) add_word(j + k * stride, v[k], i0, i1, si0, si1);
        }
    }
    for (; j < nnz; j += stride) {
        const int v = indices[j];
        if (j + 1 < nnz) pairs += indices[j + 1] <= v;
        if (hash) add_word(j, v, i0, i1, si0, si1);
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i <= m; i += stride) {
        const int s = indptr[i];
        if (hash) add_word(i, s, p0, p1, sp0, sp1);
        if (i < m) across += s > 0 && s < indptr[i + 1] && indices[s] <= indices[s - 1];
    }
    pairs = warp_sum(pairs);
    across = warp_sum(across);
    if (hash) {
        sp0 = warp_sum(sp0); sp1 = warp_sum(sp1); si0 = warp_sum(si0); si1 = warp_sum(si1);
    }
    if ((threadIdx.x & 31) == 0) {
        if (pairs || across) {
            atomicAdd(&out[0], pairs);
            atomicAdd(&out[1], across);
        }
        if (hash) {
            atomicAdd(&out[2], sp0); atomicAdd(&out[3], sp1); atomicAdd(&out[4], si0); atomicAdd(&out[5], si1);
        }
    }
}
"""


_CANONICAL: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
"""The matrices found canonical, by id, while they live."""


@functools.cache
def _kernel(cupy: Any, device: int) -> Any:
    """The kernel, compiled once per device and process."""
    return cupy.RawKernel(_SOURCE, "csr_structure")


def structure_pass(indptr: Any, indices: Any, tags: Sequence[int] | None = None) -> tuple[bool, list[int]]:
    """Whether the CSR structure of CuPy int32 arrays ``indptr`` (nondecreasing from 0 to nnz) and ``indices``
    is canonical, and with ``tags`` (indptr's two lanes, then indices') the fingerprint's four sums (else none):
    one kernel, one read-back."""
    import cupy

    nnz, m = int(indices.size), int(indptr.size) - 1
    out = cupy.zeros(6, dtype=cupy.uint64)
    if nnz > 1 or tags is not None:
        blocks = max(1, min(-(-max(nnz, m + 1) // 256), 16 * device_attributes()["MultiProcessorCount"]))
        words = [np.uint64(t) for t in (tags if tags is not None else (0, 0, 0, 0))]
        _kernel(cupy, cupy.cuda.Device().id)((blocks,), (256,), (indptr, indices, np.int64(m), np.int64(nnz),
                                                                 np.int32(tags is not None), *words, out))
    pairs, across, *sums = out.get().tolist()
    return pairs == across, sums if tags is not None else []


def is_canonical(A: Any) -> bool:
    """Whether each row's columns strictly increase (sorted, no duplicates), for a CuPy CSR matrix with int32
    ``indptr`` (nondecreasing from 0 to nnz) and ``indices``. A matrix found canonical is remembered while it
    lives (by identity, as CuPy's own flag is kept on it): a later ``plan()`` of it asks nothing of the GPU."""
    if _CANONICAL.get(id(A)) is A:
        return True
    if A.indices.size > 1 and not structure_pass(A.indptr, A.indices)[0]:
        return False
    remember_canonical(A)
    return True


def remember_canonical(A: Any) -> None:
    """Remember ``A`` as canonical while it lives (found so by :func:`structure_pass`)."""
    _CANONICAL[id(A)] = A


def canonical_reference(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """:func:`is_canonical`'s count in NumPy (the reference)."""
    if indices.size < 2:
        return True
    pairs = int(np.count_nonzero(indices[1:] <= indices[:-1]))
    starts = indptr[:-1][(indptr[:-1] > 0) & (indptr[:-1] < indptr[1:])]
    across = int(np.count_nonzero(indices[starts] <= indices[starts - 1]))
    return pairs == across
