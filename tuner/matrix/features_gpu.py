"""The feature vector of a CSR matrix on the GPU in a handful of launches and one read-back.

:func:`tuner.matrix.features.extract_features` defines the features (its NumPy
path is the definition); this module computes the same numbers for a CuPy
matrix without a pass per feature, so that ``plan()`` pays a few SpMVs' worth
of time for them, not a hundred: one kernel over the rows (lengths, bandwidth,
diagonal, the entries that open a row), one over the entries (the bit length
of each XOR of neighbouring columns, a 33-bin histogram in shared memory:
every clustering factor at once), one counting the entries of each column
(a warp's lanes on one column adding once where rows are short),
one sort of the row lengths (the quartiles of the Freedman–Diaconis rule and
the Gini weights), one over the sorted lengths and the column counts (the sums
of squares and the Gini sum, in exact integers, and the quartiles' neighbours),
all into one buffer of 64-bit counters read back in one copy: a dozen launches
in all (the NumPy-style tail before took thirty, about 0.7 ms of the H200's
host). Bandwidth and diagonal need no pass over the entries: columns are
sorted within a row, so a row's farthest entry is its first or its last, and
its diagonal entry is found by binary search.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.percentile import lerp, positions
from kernels._cuda import device_attributes
from tuner.matrix.readback import ReadBack, part_of

_SOURCE = r"""
extern "C" __global__ void feature_rows(const int* __restrict__ indptr, const int* __restrict__ indices, int m,
                                        int long_row, unsigned char* __restrict__ opens,
                                        unsigned long long* __restrict__ counts,
                                        unsigned long long* __restrict__ extent) {
    // counts: [empty rows, long rows, diagonal entries]; extent: [largest |row - col|]
    __shared__ unsigned long long s_counts[3];
    __shared__ int s_extent;
    if (threadIdx.x < 3) s_counts[threadIdx.x] = 0;
    if (threadIdx.x == 0) s_extent = 0;
    __syncthreads();
    unsigned long long empty = 0, longr = 0, diag = 0;
    int far = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) {
        int s = indptr[i], e = indptr[i + 1];
        if (s == e) { ++empty; continue; }
        if (e - s > long_row) ++longr;
        if (s > 0) opens[s - 1] = 1;  // the entry before a row's first opens no segment with it
        int first = indices[s], last = indices[e - 1];
        far = max(far, max(i - first, last - i));
        int lo = s, hi = e;  // binary search for column i
        while (lo < hi) { int mid = (lo + hi) >> 1; if (indices[mid] < i) lo = mid + 1; else hi = mid; }
        if (lo < e && indices[lo] == i) ++diag;
    }
    atomicAdd(&s_counts[0], empty); atomicAdd(&s_counts[1], longr); atomicAdd(&s_counts[2], diag);
    atomicMax(&s_extent, far);
    __syncthreads();
    if (threadIdx.x < 3) atomicAdd(&counts[threadIdx.x], s_counts[threadIdx.x]);
    if (threadIdx.x == 0) atomicMax(extent, (unsigned long long)s_extent);
}

extern "C" __global__ void feature_xor_bits(const int* __restrict__ indices, long long nnz,
                                            const unsigned char* __restrict__ opens,
                                            unsigned long long* __restrict__ hist) {
    // hist[b]: entries j < nnz - 1 whose change to entry j + 1 (XOR of the columns, or a full change
    // where j + 1 opens a row) has bit length b
    // A warp's lanes with the same bit length add once, their count (neighbouring entries of a row often
    // change by as many bits: one shared bin taking 32 adds in turn was half of the features' time).
    // blockDim is a multiple of 32, so every lane of a warp runs the loop as often.
    __shared__ unsigned long long s_hist[33];
    if (threadIdx.x < 33) s_hist[threadIdx.x] = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    for (long long w = blockIdx.x * (long long)blockDim.x + (threadIdx.x - lane); w + 1 < nnz;
         w += (long long)gridDim.x * blockDim.x) {
        const long long j = w + lane;
        int bits = -1;
        if (j + 1 < nnz) {
            unsigned int change = opens[j] ? 0x7fffffffu : (unsigned int)(indices[j + 1] ^ indices[j]);
            bits = 32 - __clz(change);
        }
        const unsigned int peers = __match_any_sync(0xffffffffu, bits);
        if (bits >= 0 && lane == __ffs(peers) - 1) atomicAdd(&s_hist[bits], (unsigned long long)__popc(peers));
    }
    __syncthreads();
    if (threadIdx.x < 33) atomicAdd(&hist[threadIdx.x], s_hist[threadIdx.x]);
}

extern "C" __global__ void feature_columns(const int* __restrict__ indices, long long nnz, int aggregate,
                                           unsigned int* __restrict__ counts) {
    // counts[c]: the entries in column c (CuPy's bincount, a histogram of n bins in CUB, is ten times slower).
    // With aggregate, a warp's lanes on the same column add once, their count: where rows are short a warp's
    // 32 entries span many rows, which name the same hub columns again and again (see AGGREGATE_BELOW).
    // Every lane of a warp runs that loop as often (blockDim is a multiple of 32), as __match_any_sync asks.
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (!aggregate) {
        for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < nnz; j += stride)
            atomicAdd(&counts[indices[j]], 1u);
        return;
    }
    const int lane = threadIdx.x & 31;
    for (long long w = blockIdx.x * (long long)blockDim.x + (threadIdx.x - lane); w < nnz; w += stride) {
        const long long j = w + lane;
        const int column = j < nnz ? indices[j] : -1;
        const unsigned int peers = __match_any_sync(0xffffffffu, column);
        if (column >= 0 && lane == __ffs(peers) - 1) atomicAdd(&counts[column], (unsigned int)__popc(peers));
    }
}

extern "C" __global__ void feature_tail(const int* __restrict__ ordered, int m,
                                        const unsigned int* __restrict__ columns, int n, long long q25_lo,
                                        long long q25_hi, long long q75_lo, long long q75_hi,
                                        unsigned long long* __restrict__ out) {
    // out[0..2] += sum of squared row lengths, sum of squared column counts, Gini sum (sum over the sorted
    // lengths of (2i + 1 - m) * length, two's complement); out[3..8] = shortest, longest row, and the
    // lengths at the quartiles' positions. Integers all: exact, and the same whatever the order of the adds.
    unsigned long long len_sq = 0, col_sq = 0;
    long long gini = 0;
    const int span = m > n ? m : n;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < span; i += gridDim.x * blockDim.x) {
        if (i < m) {
            const long long v = ordered[i];
            len_sq += (unsigned long long)(v * v);
            gini += (2LL * i + 1 - m) * v;
        }
        if (i < n) {
            const unsigned long long c = columns[i];
            col_sq += c * c;
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        len_sq += __shfl_down_sync(0xffffffffu, len_sq, offset);
        col_sq += __shfl_down_sync(0xffffffffu, col_sq, offset);
        gini += __shfl_down_sync(0xffffffffu, gini, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&out[0], len_sq);
        atomicAdd(&out[1], col_sq);
        atomicAdd(&out[2], (unsigned long long)gini);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[3] = ordered[0]; out[4] = ordered[m - 1];
        out[5] = ordered[q25_lo]; out[6] = ordered[q25_hi]; out[7] = ordered[q75_lo]; out[8] = ordered[q75_hi];
    }
}
"""


AGGREGATE_BELOW = 8
"""The column counts add a warp's lanes on one column once where rows hold fewer entries than this on average.
Measured on an H100 (unseen matrices, ``bench/results/..._ab_columns-*.txt``): one atomic an entry against
aggregated, 1.50 -> 0.82 ms on hubcols (5.8 entries a row), 0.51 -> 0.29 on incidence (2), 1.09 -> 0.99 on
bursts (0.8); but 0.11 -> 0.23 on skyline (31), 0.15 -> 0.33 on blockdiag (195) and 0.24 -> 0.29 on
diagonals (11), where a warp's lanes sit in one to three rows, whose columns differ, and the match is all cost."""


@functools.cache
def _kernels(cupy: Any, device: int) -> tuple[Any, Any, Any, Any]:
    """The four kernels, compiled once per device and process (each plan() asks for them)."""
    module = cupy.RawModule(code=_SOURCE)
    return tuple(module.get_function(name) for name in ("feature_rows", "feature_xor_bits", "feature_columns",
                                                          "feature_tail"))


@dataclass(frozen=True)
class DeviceCounters:
    """The kernels' counters of one matrix, on the GPU (``buffer``, 46 uint64: the rows kernel's empty, long and
    diagonal rows and bandwidth, the XOR histogram's 33 bins, the tail's 9 numbers, in that order), with what
    turns them into features: the shape and the quartiles' interpolation weights (their positions' values are
    in the buffer). Work queued behind the kernels reads them there (:mod:`tuner.select.rank_gpu`), and writes its
    results into ``read_back`` (the one the counters are read back with) where it has room."""

    buffer: Any
    m: int
    n: int
    nnz: int
    q25_weight: float
    q75_weight: float
    read_back: ReadBack


def queue_device_features(cupy: Any, m: int, n: int, indptr: Any, indices: Any, *, long_row: int,
                          cf_widths: tuple[int, ...], into: ReadBack | None = None
                          ) -> tuple[DeviceCounters, Callable[[], dict[str, float]]]:
    """The raw numbers :func:`~tuner.matrix.features.extract_features` needs, from CuPy int32 ``indptr`` and
    ``indices`` (nnz > 0): the kernels launched now; their counters where they stay on the GPU, and their one
    read-back (``into``'s where given) when the returned function is called."""
    rows_kernel, xor_kernel, columns_kernel, tail_kernel = _kernels(cupy, cupy.cuda.Device().id)
    nnz = int(indices.size)
    sms = device_attributes()["MultiProcessorCount"]
    opens = cupy.zeros(nnz, dtype=cupy.uint8)
    # the counters: empty, long and diagonal rows (3), the bandwidth (1), the XOR histogram (33), the tail's (9)
    part = part_of(into, 46)
    out = part.device
    blocks = max(1, min(-(-m // 256), 16 * sms))
    rows_kernel((blocks,), (256,), (indptr, indices, np.int32(m), np.int32(long_row), opens, out, out[3:]))
    entry_blocks = max(1, min(-(-nnz // 256), 16 * sms))
    xor_kernel((entry_blocks,), (256,), (indices, np.int64(nnz), opens, out[4:]))
    columns = cupy.zeros(n, dtype=cupy.uint32)
    aggregate = np.int32(nnz < AGGREGATE_BELOW * m)
    columns_kernel((entry_blocks,), (256,), (indices, np.int64(nnz), aggregate, columns))
    ordered = cupy.sort(cupy.diff(indptr))
    q25, q75 = positions(m, 25.0), positions(m, 75.0)
    tail_blocks = max(1, min(-(-max(m, n) // 256), 16 * sms))
    tail_kernel((tail_blocks,), (256,), (ordered, np.int32(m), columns, np.int32(n),
                                          *(np.int64(p) for p in (*q25[:2], *q75[:2])), out[37:]))

    def result() -> dict[str, float]:
        # the one read-back, as Python ints in one call (a NumPy call costs 10-20 us on a host whose caches the
        # GPU's work emptied; Python's arithmetic on 46 numbers, well under one)
        scalars = part.read().tolist()
        empty, longr, diag, far = map(float, scalars[:4])
        gini_sum = scalars[39] - (1 << 64) if scalars[39] >> 63 else scalars[39]  # an int64 in a uint64 word
        lo, hi, a25, b25, a75, b75 = map(float, scalars[40:46])
        changes_at_least = list(itertools.accumulate(reversed(scalars[4:37])))[::-1]  # [b]: of bit length >= b
        return {
            "empty": empty, "long": longr, "diag": diag, "bandwidth": far, "npr_min": lo, "npr_max": hi,
            "npr_sum_sq": float(scalars[37]), "col_sum_sq": float(scalars[38]), "gini_sum": float(gini_sum),
            "q25": lerp(a25, b25, q25[2]), "q75": lerp(a75, b75, q75[2]),
            "segments": [1.0 + changes_at_least[int(math.log2(w)) + 1] for w in cf_widths],
        }

    return DeviceCounters(out, m, n, nnz, q25[2], q75[2], part.owner), result
