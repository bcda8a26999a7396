"""One pass over a CSR matrix on the GPU: whether it is canonical, the fingerprint's sums, its NaN and Inf values.

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
kernel, which this one extends). :func:`canonical_reference` is the same count
in NumPy (the tests hold both to SciPy's ``has_canonical_format``).

The same pass can add up the fingerprint's sums (:mod:`tuner.matrix.fingerprint`
defines them, and mixes them into the name): each word of ``indptr`` and
``indices`` is read there anyway, so ``plan()`` checks a new CuPy matrix and
names it in one launch and one read-back rather than two of each: 0.22-0.32 ms
of ``plan()`` against 0.42-0.54 for the two apart (an H100, four unseen
matrices in both dtypes, ``bench/results/..._ab_plan-a0e28ed.txt``); and, given
the values, count those that are NaN or Inf (a matrix's values may change while
its structure stays, so the pass runs on every ``plan()`` and nothing is
remembered of a matrix between two). It also counts the entries of the rows whose
columns span fewer than :data:`kernels._narrow.OFFSET_LIMIT` (a sorted row's span is
its last column less its first, both read for the check): whether a row family's
16-bit columns pay is then known before its preparation, which launches their
kernel without waiting for a count of its own (:func:`kernels._narrow.attach`); and
the nonempty rows, for csr_vector's the same way (:func:`kernels.csr_vector.note_empty_rows`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from kernels._cuda import device_attributes
from kernels._narrow import OFFSET_LIMIT
from tuner.matrix.readback import ReadBack, part_of

__all__ = ["Structure", "canonical_reference", "queue_structure_pass", "structure_pass"]


class Structure(NamedTuple):
    """What :func:`structure_pass` finds."""

    canonical: bool
    sums: list[int]
    """The fingerprint's four sums where tags were given, else none."""
    nonfinite: int
    """NaN and Inf values where values were given, else 0."""
    narrow_rows: int
    """Entries of the nonempty rows whose last column is less than :data:`~kernels._narrow.OFFSET_LIMIT` past
    their first: those of the rows that span fewer columns where the matrix is canonical."""
    nonempty_rows: int
    """Rows holding an entry (csr_vector runs over those alone where most are empty,
    :func:`kernels.csr_vector.note_empty_rows`)."""

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
// Whether entry j's value is NaN or Inf: its exponent bits all set. ``words`` are the values as 32-bit words,
// ``step`` words a value (1: float, 2: double, whose exponent is in its second, high word), ``mask`` the exponent.
__device__ __forceinline__ bool nonfinite(const unsigned int* __restrict__ words, int step, unsigned int mask,
                                          long long j) {
    return (words[j * step + step - 1] & mask) == mask;
}
// out[0] += pairs (j, j + 1) of entries whose column does not increase; out[1] += those where j + 1 opens a
// nonempty row (the pair spans two rows). With hash != 0 also the fingerprint's sums: out[2], out[3] over
// indptr (lanes tagged p0, p1), out[4], out[5] over indices (i0, i1). With words (not null), out[6] += the
// values that are NaN or Inf. out[7] += the entries of the nonempty rows whose last column is less than
// limit past their first; out[8] += the nonempty rows.
extern "C" __global__ void csr_structure(const int* __restrict__ indptr, const int* __restrict__ indices,
                                         long long m, long long nnz, int hash,
                                         unsigned long long p0, unsigned long long p1,
                                         unsigned long long i0, unsigned long long i1,
                                         const unsigned int* __restrict__ words, int step, unsigned int mask,
                                         int limit, unsigned long long* __restrict__ out) {
    unsigned long long pairs = 0, across = 0, sp0 = 0, sp1 = 0, si0 = 0, si1 = 0, bad = 0, narrow = 0, filled = 0;
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
            if (words) bad += nonfinite(words, step, mask, j + k * stride);
        }
    }
    for (; j < nnz; j += stride) {
        const int v = indices[j];
        if (j + 1 < nnz) pairs += indices[j + 1] <= v;
        if (hash) add_word(j, v, i0, i1, si0, si1);
        if (words) bad += nonfinite(words, step, mask, j);
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i <= m; i += stride) {
        const int s = indptr[i];
        if (hash) add_word(i, s, p0, p1, sp0, sp1);
        if (i < m) {
            const int e = indptr[i + 1];
            if (s < e) {
                ++filled;
                const int first = indices[s];
                across += s > 0 && first <= indices[s - 1];
                if ((long long)indices[e - 1] - first < limit) narrow += e - s;
            }
        }
    }
    pairs = warp_sum(pairs);
    across = warp_sum(across);
    bad = warp_sum(bad);
    narrow = warp_sum(narrow);
    filled = warp_sum(filled);
    if (hash) {
        sp0 = warp_sum(sp0); sp1 = warp_sum(sp1); si0 = warp_sum(si0); si1 = warp_sum(si1);
    }
    if ((threadIdx.x & 31) == 0) {
        if (pairs || across) {
            atomicAdd(&out[0], pairs);
            atomicAdd(&out[1], across);
        }
        if (bad) atomicAdd(&out[6], bad);
        if (narrow) atomicAdd(&out[7], narrow);
        if (filled) atomicAdd(&out[8], filled);
        if (hash) {
            atomicAdd(&out[2], sp0); atomicAdd(&out[3], sp1); atomicAdd(&out[4], si0); atomicAdd(&out[5], si1);
        }
    }
}
"""


@functools.cache
def _kernel(cupy: Any, device: int) -> Any:
    """The kernel, compiled once per device and process."""
    return cupy.RawKernel(_SOURCE, "csr_structure")


_EXPONENT = {np.dtype(np.float32): (np.int32(1), np.uint32(0x7F800000)),
             np.dtype(np.float64): (np.int32(2), np.uint32(0x7FF00000))}
"""Per value dtype: 32-bit words a value, and the exponent's bits in its last (high, little-endian) word (as the
kernel takes them: the launch's NumPy scalars are made once, not each plan, as are those below)."""
_NO_VALUES = (np.int32(0), np.uint32(0))
_HASH = (np.int32(0), np.int32(1))
_LIMIT = np.int32(OFFSET_LIMIT)


@functools.lru_cache(maxsize=4)
def _tag_words(tags: tuple[int, ...] | None) -> tuple[np.uint64, ...]:
    """The kernel's four tag arguments (zeros where no sums are asked for)."""
    return tuple(np.uint64(t) for t in (tags if tags is not None else (0, 0, 0, 0)))


def structure_pass(indptr: Any, indices: Any, tags: Sequence[int] | None = None, values: Any = None
                   ) -> Structure:
    """Whether the CSR structure of CuPy int32 arrays ``indptr`` (nondecreasing from 0 to nnz) and ``indices``
    is canonical; with ``tags`` (indptr's two lanes, then indices') the fingerprint's four sums (else none);
    with ``values`` (one a column index) how many of them are NaN or Inf (else, and for values neither float32
    nor float64, 0); the entries of the rows narrow enough for 16-bit columns and the nonempty rows
    (:class:`Structure`): one
    kernel, one read-back. The values' check reads each value's exponent where the entry is read anyway:
    a CuPy reduction of ``isfinite`` took 0.38 ms of an H100's time on two unseen matrices of 32-46 M entries
    (``bench/results/..._prof48-9891656.txt``)."""
    return queue_structure_pass(indptr, indices, tags, values)()


def queue_structure_pass(indptr: Any, indices: Any, tags: Sequence[int] | None = None, values: Any = None,
                         into: ReadBack | None = None) -> Callable[[], Structure]:
    """:func:`structure_pass` launched now, its read-back when the returned function is called: work queued
    in between (``plan()``: the features of a matrix new to the store, and the ranking) is waited for by the
    same read-back, and read back by it where it writes into the same ``into``."""
    import cupy

    nnz, m = int(indices.size), int(indptr.size) - 1
    part = part_of(into, 9)
    out = part.device
    if nnz > 0 or tags is not None:
        blocks = max(1, min(-(-max(nnz, m + 1) // 256), 16 * device_attributes()["MultiProcessorCount"]))
        step, mask = _EXPONENT.get(values.dtype, _NO_VALUES) if values is not None else _NO_VALUES
        _kernel(cupy, cupy.cuda.Device().id)(
            (blocks,), (256,), (indptr, indices, np.int64(m), np.int64(nnz), _HASH[tags is not None],
                                *_tag_words(None if tags is None else tuple(tags)), values if step else None, step,
                                mask, _LIMIT, out))

    def result() -> Structure:
        pairs, across, *sums, nonfinite, narrow, filled = part.read().tolist()
        return Structure(pairs == across, sums if tags is not None else [], nonfinite, narrow, filled)

    return result


def canonical_reference(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """:func:`structure_pass`'s canonical check in NumPy (the reference)."""
    if indices.size < 2:
        return True
    pairs = int(np.count_nonzero(indices[1:] <= indices[:-1]))
    starts = indptr[:-1][(indptr[:-1] > 0) & (indptr[:-1] < indptr[1:])]
    across = int(np.count_nonzero(indices[starts] <= indices[starts - 1]))
    return pairs == across
