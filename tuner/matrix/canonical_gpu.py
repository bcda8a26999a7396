"""Whether a CSR matrix on the GPU is canonical (each row's columns strictly increasing), in one pass.

CuPy's ``has_canonical_format`` gives each row a thread that walks its entries,
then reduces the rows' answers, the first time ``plan()`` sees a matrix: 0.17-0.31
ms of an H100's time on the unseen rgg and sawtooth (24 and 32 M entries,
``bench/unseen.py``), 1.5 ms on bursts (24 M rows, the longest of 49,290 entries). Here one kernel runs over the entries
and the rows at once: a pair of neighbouring entries whose column does not
increase is either within a row (the matrix is not canonical) or the last entry
of a row and the first of the next nonempty one; so the matrix is canonical
exactly when the pairs that do not increase are as many as the nonempty rows
(after the first entry) whose first entry does not increase on the entry before
it. Two counters, one read-back: 0.11-0.17 ms on the same matrices, bursts
included. A matrix found canonical is remembered while it lives, as CuPy remembers its own
answer. :func:`canonical_reference` is the same count in NumPy (the tests hold
both to SciPy's ``has_canonical_format``).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import numpy as np

from kernels._cuda import device_attributes

__all__ = ["canonical_reference", "is_canonical"]

_SOURCE = r"""
extern "C" __global__ void csr_descents(const int* __restrict__ indptr, const int* __restrict__ indices,
                                        int m, long long nnz, unsigned long long* __restrict__ out) {
    // out[0] += pairs (j, j + 1) of entries whose column does not increase; out[1] += those where j + 1 opens
    // a nonempty row (the pair spans two rows)
    unsigned long long pairs = 0, across = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long j = t; j + 1 < nnz; j += stride) pairs += indices[j + 1] <= indices[j];
    for (long long i = t; i < m; i += stride) {
        const int s = indptr[i];
        across += s > 0 && s < indptr[i + 1] && indices[s] <= indices[s - 1];
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        pairs += __shfl_down_sync(0xffffffffu, pairs, offset);
        across += __shfl_down_sync(0xffffffffu, across, offset);
    }
    if ((threadIdx.x & 31) == 0 && (pairs || across)) {
        atomicAdd(&out[0], pairs);
        atomicAdd(&out[1], across);
    }
}
"""


_CANONICAL: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
"""The matrices found canonical, by id, while they live."""


@functools.cache
def _kernel(cupy: Any, device: int) -> Any:
    """The kernel, compiled once per device and process."""
    return cupy.RawKernel(_SOURCE, "csr_descents")


def is_canonical(A: Any) -> bool:
    """Whether each row's columns strictly increase (sorted, no duplicates), for a CuPy CSR matrix with int32
    ``indptr`` (nondecreasing from 0 to nnz) and ``indices``. A matrix found canonical is remembered while it
    lives (by identity, as CuPy's own flag is kept on it): a later ``plan()`` of it asks nothing of the GPU."""
    import cupy

    if _CANONICAL.get(id(A)) is A:
        return True
    indptr, indices = A.indptr, A.indices
    nnz, m = int(indices.size), int(indptr.size) - 1
    if nnz > 1:
        out = cupy.zeros(2, dtype=cupy.uint64)
        blocks = max(1, min(-(-max(nnz, m) // 256), 16 * device_attributes()["MultiProcessorCount"]))
        _kernel(cupy, cupy.cuda.Device().id)((blocks,), (256,), (indptr, indices, np.int32(m), np.int64(nnz), out))
        pairs, across = out.get().tolist()
        if pairs != across:
            return False
    _CANONICAL[id(A)] = A
    return True


def canonical_reference(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """:func:`is_canonical`'s count in NumPy (the reference)."""
    if indices.size < 2:
        return True
    pairs = int(np.count_nonzero(indices[1:] <= indices[:-1]))
    starts = indptr[:-1][(indptr[:-1] > 0) & (indptr[:-1] < indptr[1:])]
    across = int(np.count_nonzero(indices[starts] <= indices[starts - 1]))
    return pairs == across
