"""A selector's ranking of one matrix on the GPU, queued behind the matrix's feature kernels.

:meth:`tuner.select.model.KernelSelector.rank` is a hundred-odd NumPy calls on
one row; run once a matrix, in a process whose caches the GPU work before it
has just emptied, they took 0.7-1.3 ms of each ``plan()`` on the GPU machines'
hosts (0.3 ms in a loop on the development VM): the largest step of
``plan(effort="predict")`` after the features. Here one kernel of one block
ranks where the features' counters already lie
(:class:`~tuner.matrix.features_gpu.DeviceCounters`): it turns them into the
feature vector (as :func:`tuner.matrix.features._from_raw`), the design row
(:func:`~tuner.select.model.design_matrix`), walks the forest (a thread a tree),
weighs the training rows by proximity, draws the outcomes (and, for a selector with
``near_share``, draws again by the squared weights and blends the two quantiles), takes each config's
quantile of them (a warp a config) and orders the configs, and writes the order,
expected times, votes, draws, features and, for ``plan(effort="predict")``, the config
:func:`~tuner.select.model.predicted` picks (so the host reads one config, not a ranking) into the features' read-back
(:class:`~tuner.matrix.readback.ReadBack`), behind their kernels on the same stream: the structure
pass, the features and the ranking come back to the host in one copy. Against
stop 52's NumPy ranking, ``plan(effort="predict")`` took 0.4-1.0 ms less on the
same machine (``bench/results/2026-11-28_predict-rank-gpu-53.txt``; the ranking then ran on a stream of its
own and was read back apart). That kernel took 155 us of an H100 (one block of 256 threads, clocks at each
barrier: 40 us the proximity weights, a thread a training row scanning every tree's leaf, 61 us the mean, a
memory load at a time, 23 us the quantiles); since stop 55 one warp adds each tree's share to the rows of its leaf,
tree by tree (bincount's order still), the mean keeps eight rows' loads in flight over the rows of nonzero weight,
and the block has 1,024 threads (768 for ``rank_from_counters``, its registers' limit): 66-69 us, the same bits
(``bench/results/2026-11-28_predict-host-55.txt``). So the features' read-back can wait for it.

The kernel repeats NumPy's floating-point operations in NumPy's order, with
fused multiply-adds off (NVRTC's ``--fmad=false``): the features, the walk, the
proximity weights, the forest's mean (row after row,
:meth:`~tuner.select.forest.CompactForest.mean_under`), the draws and the quantiles
are NumPy's to the bit. Not guaranteed to the last bit: CUDA's ``log``, ``log1p``
and ``exp`` against NumPy's (the design row is rounded to float32 before a tree
compares it, so a difference there shows only for a value within a double's last
bit of a float32 rounding edge; ``exp`` gives the expected times, which order
configs only where their quantiles tie). The host compares the features the
kernel used with its own (:func:`~tuner.matrix.features.extract_features`'s) and
ranks in NumPy where they differ; ``tests/test_rank_gpu.py`` holds the rankings
to NumPy's on every shipped selector.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import BASELINE, REGISTRY, canonical
from kernels._narrow import PickGate, reads_row_columns
from tuner.matrix.features import CF_WIDTHS, FEATURE_NAMES
from tuner.matrix.features_gpu import DeviceCounters
from tuner.matrix.readback import Part, ReadBack, part_of
from tuner.select.model import (
    COUNT_FEATURES,
    DEPART_SHARE,
    DERIVED_FEATURES,
    NEAR_POWER,
    OUTCOME_SAMPLES,
    DeviceSpec,
    KernelSelector,
    compulsory_bytes,
    predict_columns,
)

__all__ = ["SHARED_BYTES", "QueuedRank", "RankParts", "queue_rank", "queue_rank_of_features", "takes"]

SHARED_BYTES = 47 * 1024
"""The kernel keeps the proximity weights (a double a training row), the drawn outcomes and each tree's leaf in
shared memory, within the 48 KB a block gets without opting in (less its own arrays): a selector whose forest
needs more (some 3,000 training rows) ranks in NumPy."""

_THREADS = 1024
"""The kernel's block at most (as many as its registers allow): its quantiles take a warp a config (stop 55, an H100:
19 us of the kernel with 256 threads, 13 with 1,024)."""

_SOURCE = r"""
// NumPy's linear interpolation for percentiles (common/percentile.py's lerp)
__device__ double lerp_np(double a, double b, double t) { return t >= 0.5 ? b - (b - a) * (1 - t) : a + (b - a) * t; }

// tuner.matrix.features._from_raw, the same operations in the same order; s: the host's numbers of the shape
// (m, n, nnz, density, mean, col_mean, m * nnz, min(m, n), the quartiles' weights, cbrt(m))
__device__ void features_of(const unsigned long long* raw, const double* s, double* f) {
    const double m = s[0], n = s[1], nnz = s[2], density = s[3], mean = s[4], col_mean = s[5], m_nnz = s[6];
    const double diag_len = s[7], t25 = s[8], t75 = s[9], cbrt_m = s[10];
    const long long mi = (long long)m;  // rows: below 2**31, exact as a double
    const double lo = (double)raw[40], hi = (double)raw[41];
    const double npr_std = sqrt(fmax((double)raw[37] / m - mean * mean, 0.0));
    const double col_std = sqrt(fmax((double)raw[38] / n - col_mean * col_mean, 0.0));
    const double q25 = lerp_np((double)raw[42], (double)raw[43], t25);
    const double q75 = lerp_np((double)raw[44], (double)raw[45], t75);
    const long long ilo = (long long)raw[40], ihi = (long long)raw[41];
    const double iqr = q75 - q25;
    long long k = 1;  // kernels.suraa_segments.segments_of_quartiles
    if (!(mi < 2 || iqr == 0 || ihi == ilo)) {
        k = (long long)ceil((double)(ihi - ilo) / (2 * iqr / cbrt_m));
        if (k < 1) k = 1;
        if (k > mi) k = mi;
    }
    f[0] = m; f[1] = n; f[2] = nnz; f[3] = density; f[4] = lo; f[5] = hi; f[6] = mean; f[7] = npr_std;
    f[8] = npr_std / mean;
    f[9] = lo == hi ? 0.0 : (double)(long long)raw[39] / m_nnz;
    f[10] = (double)raw[0] / m; f[11] = (double)raw[1] / m;
    f[12] = (double)k; f[13] = ceil(m / (double)k);
    f[14] = (double)raw[3];
    f[15] = diag_len > 0 ? (double)raw[2] / diag_len : 0.0;
    f[16] = col_std; f[17] = col_std / col_mean;
    double suffix[33], sum = 0.0;  // changes of bit length >= b, summed from the top as NumPy's reversed cumsum
    for (int b = 32; b >= 0; --b) { sum += (double)raw[4 + b]; suffix[b] = sum; }
    for (int i = 0; i < N_FEATURES - 18; ++i) f[18 + i] = nnz / (1.0 + suffix[CF_FIRST_BIT + i]);
}

__device__ double count_log(double x) { return log1p(x != x ? x : fmax(x, 0.0)); }  // NumPy: log1p(maximum(x, 0))

// tuner.select.model.design_matrix of one row, rounded to float32 as the forest compares it. d: the host's
// numbers of the device and dtype (itemsize, L2 bytes or NaN, SMs)
__device__ void design_of(const double* f, const double* d, unsigned long long counts, float* x) {
    const double rows = f[0], cols = f[1], nnz = f[2], mean = fmax(f[6], 1e-9), v = d[0], l2 = d[1], sms = d[2];
    const double nbytes = nnz * (v + 4) + (rows + 1) * 4 + cols * v + rows * v;
    double all[N_DESIGN];
    for (int i = 0; i < N_FEATURES; ++i) all[i] = f[i];
    all[31] = cols * v / l2; all[32] = nbytes / l2; all[33] = log(nbytes); all[34] = log((rows + 1) / (cols + 1));
    all[35] = f[14] / fmax(cols, 1.0); all[36] = f[CF_1K] / mean; all[37] = f[CF_64K] / mean; all[38] = f[5] / mean;
    all[39] = rows / sms;
    for (int i = 0; i < N_DESIGN; ++i) x[i] = (float)((counts >> i) & 1ull ? count_log(all[i]) : all[i]);
}

// np.cumsum of the weights v, where it rises: the rows of no weight between add +0 (every tree's leaf holds a row,
// so n_kept >= 1). One thread.
__device__ void running_sum(double* v, const int* kept, int n_kept) {
    for (int i = 1; i < n_kept; ++i) v[kept[i]] += v[kept[i - 1]];
}

// KernelSelector._draws over the running sums v: np.searchsorted, side left, whose first sum >= at is at a row of
// weight. The block's threads.
__device__ void systematic_draw(const double* v, const int* kept, int n_kept, int rows, int* drawn) {
    const double total = v[kept[n_kept - 1]];
    for (int s = threadIdx.x; s < SAMPLES; s += blockDim.x) {
        const double at = ((double)s + 0.5) / SAMPLES * total;
        int lo = 0, hi = n_kept;
        while (lo < hi) { const int mid = (lo + hi) >> 1; if (v[kept[mid]] < at) lo = mid + 1; else hi = mid; }
        drawn[s] = lo < n_kept ? kept[lo] : rows - 1;
    }
}

// The drawn rows' targets side by side, config by config (configs x SAMPLES). The block's threads.
__device__ void drawn_targets(const float* __restrict__ targets, int outputs, int configs, const int* drawn,
                              float* drawn_t) {
    for (int i = threadIdx.x; i < configs * SAMPLES; i += blockDim.x) {
        const int s = i / configs, j = i % configs;
        drawn_t[j * SAMPLES + s] = targets[(long long)drawn[s] * outputs + 1 + j];
    }
}

// model._quantile: of each config's sorted outcomes, the two at the quantile's place, interpolated, into key. A warp
// a config: each lane ranks two outcomes.
__device__ void quantiles(const float* drawn_t, int configs, double quantile, double* key) {
    const double at = quantile * (SAMPLES - 1);
    const int low = (int)at, high = low + 1 < SAMPLES ? low + 1 : SAMPLES - 1;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int j = threadIdx.x >> 5; j < configs; j += warps) {
        const float* v = drawn_t + j * SAMPLES;
        float a = 0.0f, b = 0.0f;
        bool has_a = false, has_b = false;
        for (int half = 0; half < 2; ++half) {
            const int s = lane + 32 * half;
            int place = 0;  // its place in a stable sort
            for (int u = 0; u < SAMPLES; ++u) place += v[u] < v[s] || (v[u] == v[s] && u < s);
            if (place == low) { a = v[s]; has_a = true; }
            if (place == high) { b = v[s]; has_b = true; }
        }
        const unsigned int with_a = __ballot_sync(0xffffffffu, has_a), with_b = __ballot_sync(0xffffffffu, has_b);
        a = __shfl_sync(0xffffffffu, a, __ffs(with_a) - 1);
        b = __shfl_sync(0xffffffffu, b, __ffs(with_b) - 1);
        if (lane == 0) key[j] = (double)a + ((double)b - (double)a) * (at - low);
    }
}

// The ranking (KernelSelector.rank) from the design row in shared memory. out: order (C), expected seconds (C),
// votes (C: trees), draws (64), the features (31) and, given pick_flags, predicted's pick (1: a config or -1), as
// doubles. Shared memory (smem): see _shared_bytes.
__device__ void rank_design(const float* x, const double* f, const short* __restrict__ feature,
                            const float* __restrict__ threshold, const unsigned char* __restrict__ nan_left,
                            const int* __restrict__ left, const int* __restrict__ right, const int* __restrict__ roots,
                            int trees, const int* __restrict__ leaf_start, const int* __restrict__ members, int rows,
                            const float* __restrict__ targets, int outputs, const int* __restrict__ firsts,
                            const int* __restrict__ room, double quantile, double near_share, double t_bytes,
                            const unsigned char* __restrict__ pick_flags, int base, double depart_share,
                            double* __restrict__ out, unsigned char* smem) {
    const int configs = outputs - 1;
    double* w = (double*)smem;                 // proximity weight of each training row, then their running sum
    double* near = w + rows;                   // its square (NEAR_POWER), then their running sum (near_share > 0)
    double* mean = near + rows;                // the targets' mean under the weights (outputs)
    double* key = mean + outputs;              // each config's quantile of its drawn outcomes (configs)
    double* near_key = key + configs;          // and of those drawn by the squared weights (configs)
    double* expected = near_key + configs;     // (configs)
    double* share = expected + configs;        // what each tree adds to the weight of each row of its leaf (trees)
    float* drawn_t = (float*)(share + trees);  // the drawn rows' targets, config by config (configs x SAMPLES)
    int* leaf = (int*)(drawn_t + configs * SAMPLES);  // each tree's leaf (trees)
    int* size = leaf + trees;                  // its training rows (trees)
    int* drawn = size + trees;                 // (SAMPLES)
    int* near_drawn = drawn + SAMPLES;         // drawn by the squared weights (SAMPLES)
    int* votes = near_drawn + SAMPLES;         // (configs)
    int* staged = votes + configs;             // each tree's leaf's rows, at room[t] (room[trees] in all)
    int* kept = staged + room[trees];          // the training rows of nonzero weight, in order (rows at most)
    __shared__ int n_kept;
    __shared__ int first_pick;  // (place << 16) | config of the first config predicted may run (pick_flags' bit 1;
                                // configs < 32768)
    if (threadIdx.x == 0) first_pick = 0x7fffffff;
    for (int t = threadIdx.x; t < trees; t += blockDim.x) {  // the walk: CompactForest.apply
        int node = roots[t];
        while (node >= 0) {
            const float v = x[feature[node]];
            node = (v > threshold[node] || (v != v && !nan_left[node])) ? right[node] : left[node];
        }
        const int l = -node - 1, s = leaf_start[l];
        leaf[t] = l;
        size[t] = leaf_start[l + 1] - s;
        share[t] = 1.0 / (double)(size[t] * trees);
        for (int p = 0; p < size[t]; ++p) staged[room[t] + p] = members[s + p];
    }
    for (int j = threadIdx.x; j < configs; j += blockDim.x) votes[j] = 0;
    __syncthreads();
    for (int t = threadIdx.x; t < trees; t += blockDim.x) atomicAdd(&votes[firsts[leaf[t]]], 1);
    for (int r = threadIdx.x; r < rows; r += blockDim.x) w[r] = 0.0;
    __syncthreads();
    if (threadIdx.x < 32) {  // CompactForest.proximity: bincount's order, tree by tree (a row is in one leaf a tree)
        for (int t = 0; t < trees; ++t) {
            for (int p = threadIdx.x; p < size[t]; p += 32) w[staged[room[t] + p]] += share[t];
            __syncwarp();
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // the rows of nonzero weight listed in order (rows of no weight add +-0: the same sum)
        const int lane = threadIdx.x;
        int count = 0;
        for (int base = 0; base < rows; base += 32) {
            const bool keep = base + lane < rows && w[base + lane] != 0.0;
            const unsigned int ahead = __ballot_sync(0xffffffffu, keep);
            if (keep) kept[count + __popc(ahead & ((1u << lane) - 1))] = base + lane;
            count += __popc(ahead);
        }
        if (lane == 0) n_kept = count;
    }
    __syncthreads();
    for (int o = threadIdx.x; o < outputs; o += blockDim.x) {  // CompactForest.mean_under: row after row
        double acc = 0.0;
        int i = 0;
        for (; i + 8 <= n_kept; i += 8) {  // eight rows' loads in flight, added in their order
            float t[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) t[u] = targets[(long long)kept[i + u] * outputs + o];
#pragma unroll
            for (int u = 0; u < 8; ++u) acc += w[kept[i + u]] * (double)t[u];
        }
        for (; i < n_kept; ++i) acc += w[kept[i]] * (double)targets[(long long)kept[i] * outputs + o];
        mean[o] = acc;
    }
    __syncthreads();
    const bool blend = quantile >= 0 && near_share > 0;  // model._order's second draw, by the squared weights
    if (blend)
        for (int i = threadIdx.x; i < n_kept; i += blockDim.x) near[kept[i]] = w[kept[i]] * w[kept[i]];
    __syncthreads();
    if (threadIdx.x == 0) running_sum(w, kept, n_kept);
    // the second sum on the second warp, alongside; on the first thread after the first where a block is one warp
    if (threadIdx.x == (blockDim.x > 32 ? 32 : 0) && blend) running_sum(near, kept, n_kept);
    __syncthreads();
    systematic_draw(w, kept, n_kept, rows, drawn);
    if (blend) systematic_draw(near, kept, n_kept, rows, near_drawn);
    for (int j = threadIdx.x; j < configs; j += blockDim.x) {
        expected[j] = t_bytes * exp(mean[0] + mean[1 + j]);
        key[j] = 0.0;
    }
    __syncthreads();
    if (blend) {  // the quantiles of the second draw's outcomes first, staged where the first draw's go next
        drawn_targets(targets, outputs, configs, near_drawn, drawn_t);
        __syncthreads();
        quantiles(drawn_t, configs, quantile, near_key);
        __syncthreads();
    }
    drawn_targets(targets, outputs, configs, drawn, drawn_t);
    __syncthreads();
    if (quantile >= 0) quantiles(drawn_t, configs, quantile, key);
    __syncthreads();
    if (blend) {
        for (int j = threadIdx.x; j < configs; j += blockDim.x)
            key[j] = (1.0 - near_share) * key[j] + near_share * near_key[j];
        __syncthreads();
    }
    for (int j = threadIdx.x; j < configs; j += blockDim.x) {  // np.lexsort((expected, key)): its place
        int place = 0;
        for (int k = 0; k < configs; ++k)
            place += key[k] < key[j] || (key[k] == key[j] && (expected[k] < expected[j]
                                                              || (expected[k] == expected[j] && k < j)));
        out[place] = j;
        out[configs + j] = expected[j];
        out[2 * configs + j] = votes[j];
        if (pick_flags != nullptr && (pick_flags[j] & 1)) atomicMin(&first_pick, (place << 16) | j);
    }
    for (int s = threadIdx.x; s < SAMPLES; s += blockDim.x) out[3 * configs + s] = drawn[s];
    for (int i = threadIdx.x; i < N_FEATURES; i += blockDim.x) out[3 * configs + SAMPLES + i] = f[i];
    if (pick_flags == nullptr) return;
    __syncthreads();
    if (threadIdx.x < 32) {  // tuner.select.model.predicted: the first config it may run (bit 1), cuSPARSE's (bit 2)
        int pick = first_pick == 0x7fffffff ? -1 : (first_pick & 0xffff);  // or, for another family's, csr_alg1
        if (pick >= 0 && !(pick_flags[pick] & 2) && base >= 0) {   // (base) unless it beat that on at least
            int beaten = 0;                                         // ``depart_share`` of the drawn training matrices
            for (int at = 0; at < SAMPLES; at += 32) {
                const int s = at + threadIdx.x;
                const bool won = s < SAMPLES && drawn_t[pick * SAMPLES + s] < drawn_t[base * SAMPLES + s];
                beaten += __popc(__ballot_sync(0xffffffffu, won));
            }
            if (!((double)beaten / SAMPLES >= depart_share)) pick = base;
        }
        if (threadIdx.x == 0) out[3 * configs + SAMPLES + N_FEATURES] = pick;
    }
}

#define FOREST const short* feature, const float* threshold, const unsigned char* nan_left, const int* left, \
    const int* right, const int* roots, int trees, const int* leaf_start, const int* members, int rows, \
    const float* targets, int outputs, const int* firsts, const int* room
#define FOREST_ARGS feature, threshold, nan_left, left, right, roots, trees, leaf_start, members, rows, targets, \
    outputs, firsts, room
#define PICK const unsigned char* pick_flags, int base, double depart_share

extern "C" __global__ void rank_from_counters(const unsigned long long* __restrict__ raw, double m, double n,
                                              double nnz, double density, double mean, double col_mean,
                                              double m_nnz, double diag_len, double t25, double t75, double cbrt_m,
                                              double itemsize, double l2, double sms, unsigned long long counts,
                                              double quantile, double near_share, double t_bytes, FOREST, PICK,
                                              double* __restrict__ out) {
    extern __shared__ __align__(8) unsigned char smem[];
    __shared__ double f[N_FEATURES];
    __shared__ float x[N_DESIGN];
    if (threadIdx.x == 0) {
        const double s[11] = {m, n, nnz, density, mean, col_mean, m_nnz, diag_len, t25, t75, cbrt_m};
        const double d[3] = {itemsize, l2, sms};
        features_of(raw, s, f);
        design_of(f, d, counts, x);
    }
    __syncthreads();
    rank_design(x, f, FOREST_ARGS, quantile, near_share, t_bytes, pick_flags, base, depart_share, out, smem);
}

extern "C" __global__ void rank_from_features(const double* __restrict__ given, double itemsize, double l2,
                                              double sms, unsigned long long counts, double quantile,
                                              double near_share, double t_bytes, FOREST, PICK,
                                              double* __restrict__ out) {
    extern __shared__ __align__(8) unsigned char smem[];
    __shared__ double f[N_FEATURES];
    __shared__ float x[N_DESIGN];
    if (threadIdx.x == 0) {
        const double d[3] = {itemsize, l2, sms};
        for (int i = 0; i < N_FEATURES; ++i) f[i] = given[i];
        design_of(f, d, counts, x);
    }
    __syncthreads();
    rank_design(x, f, FOREST_ARGS, quantile, near_share, t_bytes, pick_flags, base, depart_share, out, smem);
}
"""

_DESIGN = (*FEATURE_NAMES, *DERIVED_FEATURES)
"""The design row's columns, in the order the kernel writes them (``design_matrix``'s)."""

SOURCE = (f"#define N_FEATURES {len(FEATURE_NAMES)}\n#define N_DESIGN {len(_DESIGN)}\n"
          f"#define SAMPLES {OUTCOME_SAMPLES}\n"
          + _SOURCE.replace("CF_FIRST_BIT", str(int(math.log2(CF_WIDTHS[0])) + 1))
          .replace("CF_1K", str(FEATURE_NAMES.index("cf_1024")))
          .replace("CF_64K", str(FEATURE_NAMES.index("cf_65536"))))
"""The kernels' source, its sizes (features, design columns, outcomes drawn) and the clustering factors' places
filled in from the Python side's."""

_FIXED = ("rows", "cols", "nnz", "density", "npr_min", "npr_max", "npr_mean", "npr_std", "npr_cv", "npr_gini",
          "empty_row_frac", "long_row_frac", "fd_seg_count", "fd_seg_size", "bandwidth", "diag_frac", "col_std",
          "col_cv")
_DERIVED = ("x_l2", "matrix_l2", "log_bytes", "log_aspect", "bandwidth_rel", "cf_rel_1k", "cf_rel_64k", "maxrow_rel",
            "rows_per_sm")


class RankParts:
    """What the kernel wrote, read back: the configs' order, expected seconds, votes (shares of the trees), the
    training rows drawn (:meth:`KernelSelector.outcomes_of`), the feature vector it ranked and, where it was
    asked to, :func:`~tuner.select.model.predicted`'s pick. Each part is taken from the copy where asked for: a
    prediction reads the pick and the features only (each NumPy call costs 10-20 us on a host whose caches the
    GPU's work emptied)."""

    def __init__(self, values: np.ndarray, configs: int, trees: int) -> None:
        self._values, self._configs, self._trees = values, configs, trees

    @property
    def order(self) -> np.ndarray:
        return self._values[:self._configs].astype(np.intp)

    @property
    def expected(self) -> np.ndarray:
        return self._values[self._configs:2 * self._configs]

    @property
    def votes(self) -> np.ndarray:
        return self._values[2 * self._configs:3 * self._configs] / self._trees

    @property
    def drawn(self) -> np.ndarray:
        start = 3 * self._configs
        return self._values[start:start + OUTCOME_SAMPLES].astype(np.intp)

    @property
    def features(self) -> np.ndarray:
        start = 3 * self._configs + OUTCOME_SAMPLES
        return self._values[start:start + len(FEATURE_NAMES)]

    @property
    def pick(self) -> int | None:
        """The column of :attr:`KernelSelector.configs_` that :func:`~tuner.select.model.predicted` picks of this
        ranking, with its outcomes, for the ``prepare_budget`` the kernel was given; None where none qualifies."""
        pick = int(self._values[_pick_place(self._configs)])
        return pick if pick >= 0 else None


def _pick_place(configs: int) -> int:
    """Where the kernel writes its pick among the doubles it writes for a selector of ``configs`` configs."""
    return 3 * configs + OUTCOME_SAMPLES + len(FEATURE_NAMES)


class QueuedRank:
    """A ranking queued on the GPU (:func:`queue_rank`): calling it waits for the kernel and reads its
    :class:`RankParts` back. ``rows_gate``: where the kernel picks for a prediction and some config it may pick
    takes the rows' 16-bit columns, its pick where it lies on the GPU (:class:`kernels._narrow.PickGate`: the
    columns can be queued behind the kernel, written only where the pick takes them), else None."""

    def __init__(self, part: Part, configs: int, trees: int, row_columns: tuple[Any, np.ndarray] | None) -> None:
        self._part, self._configs, self._trees = part, configs, trees
        self.rows_gate: PickGate | None = None
        if row_columns is not None:
            on_gpu, on_host = row_columns
            self.rows_gate = PickGate(part.device, _pick_place(configs), on_gpu,
                                      lambda: (pick := self().pick) is not None and bool(on_host[pick]))

    def __call__(self) -> RankParts:
        return RankParts(self._part.read().view(np.float64), self._configs, self._trees)


def takes(selector: KernelSelector) -> bool:
    """Whether the kernel ranks for ``selector``: trained on :data:`FEATURE_NAMES` (the design row the kernel
    writes), its forest within :data:`SHARED_BYTES`, its second draw by the squared weights (the kernel squares;
    :data:`~tuner.select.model.NEAR_POWER`) (known once a selector and process)."""
    if (known := _TAKES.get(selector)) is None:
        known = _TAKES[selector] = (
            list(selector.feature_names_in_) == list(FEATURE_NAMES) and FEATURE_NAMES[:len(_FIXED)] == _FIXED
            and tuple(DERIVED_FEATURES) == _DERIVED and len(FEATURE_NAMES) == len(_FIXED) + len(CF_WIDTHS)
            and NEAR_POWER == 2.0 and _shared_bytes(selector) <= SHARED_BYTES)
    return known


_TAKES: weakref.WeakKeyDictionary[KernelSelector, bool] = weakref.WeakKeyDictionary()


def queue_rank(selector: KernelSelector, counters: DeviceCounters, *, device: DeviceSpec | None = None,
               prepare_budget: float | None = None) -> QueuedRank:
    """Queue ``selector``'s ranking of the matrix whose feature counters are ``counters`` on ``device`` (default:
    the training one) behind them; calling what is returned reads it back (waiting for the GPU). With
    ``prepare_budget``, the kernel also picks what :func:`~tuner.select.model.predicted` picks with that budget
    (:attr:`RankParts.pick`). Check :func:`takes` first."""
    m, n, nnz = counters.m, counters.n, counters.nnz
    shape = (float(m), float(n), float(nnz), nnz / (m * n), nnz / m, nnz / n, float(m * nnz),
             float(min(m, n)), counters.q25_weight, counters.q75_weight, float(np.cbrt(m)))
    return _launch(selector, device, (m, n, nnz), "rank_from_counters", (counters.buffer, *map(np.float64, shape)),
                   prepare_budget, counters.read_back)


def queue_rank_of_features(selector: KernelSelector, features: Mapping[str, float], *,
                           device: DeviceSpec | None = None, prepare_budget: float | None = None
                           ) -> QueuedRank:
    """:func:`queue_rank` from a feature vector (copied to the GPU) rather than a matrix's counters: what the
    tests hold to :meth:`KernelSelector.rank` over many vectors."""
    import cupy

    given = cupy.asarray(np.array([float(features[name]) for name in FEATURE_NAMES]))
    shape = (features["rows"], features["cols"], features["nnz"])
    return _launch(selector, device, shape, "rank_from_features", (given,), prepare_budget)


def _launch(selector: KernelSelector, device: DeviceSpec | None, shape: tuple[float, float, float], entry: str,
            head: tuple[Any, ...], prepare_budget: float | None, into: ReadBack | None = None
            ) -> QueuedRank:
    """Launch ``entry`` (its first arguments ``head``) for ``selector`` on ``device``, for a matrix of ``shape``
    (rows, columns, nonzeros), with :func:`_pick_args` of ``prepare_budget`` where given, its output in ``into``
    where given and it has room (read back with the counters, behind which it is queued): a :class:`QueuedRank`,
    which reads it back."""
    import cupy

    gpu = cupy.cuda.Device().id
    forest = _on_gpu(selector, gpu)
    spec = selector.device_ if device is None else device
    rows, cols, nnz = map(float, shape)  # bytes_time's seconds, its float64 arithmetic
    t_bytes = compulsory_bytes(rows, cols, nnz, selector.dtype_) / (spec.bandwidth_gbs * 1e9)
    configs = len(selector.configs_)
    part = part_of(into, _pick_place(configs) + 1)
    kernel, threads = _kernels(cupy, gpu)[entry]
    pick = _NO_PICK if prepare_budget is None else _pick_args(selector, prepare_budget, gpu)
    kernel((1,), (threads,), (*head, *_spec_args(selector, spec), np.float64(t_bytes), *forest.args, *pick,
                              part.device), shared_mem=forest.shared_bytes)
    return QueuedRank(part, configs, forest.trees, None if prepare_budget is None else _row_columns(selector, gpu))


_NO_PICK = (None, np.int32(-1), np.float64(0.0))
"""The kernel's pick arguments where it picks nothing."""


@functools.lru_cache(maxsize=8)
def _pick_args(selector: KernelSelector, prepare_budget: float, gpu: int) -> tuple[Any, ...]:
    """The kernel's arguments for :func:`~tuner.select.model.predicted`'s pick with ``prepare_budget``: a byte a
    config (1: predicted may run it first, :func:`~tuner.select.model.predict_columns`; 2: cuSPARSE's, run
    whatever another family's outcomes say) on GPU ``gpu``, csr_alg1's column (-1: none), the share a config must
    beat it on (:data:`~tuner.select.model.DEPART_SHARE`). Once a selector, budget and GPU."""
    import cupy

    may, alg1 = predict_columns(selector, prepare_budget)
    flags = [int(ok) | (2 if kernel == BASELINE else 0) for ok, (kernel, _) in zip(may, selector.configs_, strict=True)]
    with cupy.cuda.Device(gpu):
        return (cupy.asarray(np.array(flags, dtype=np.uint8)), np.int32(-1 if alg1 is None else alg1),
                np.float64(DEPART_SHARE))


@functools.lru_cache(maxsize=8)
def _row_columns(selector: KernelSelector, gpu: int) -> tuple[Any, np.ndarray] | None:
    """A byte a config of ``selector``, 1 where its preparation takes the rows' 16-bit columns
    (:func:`kernels._narrow.reads_row_columns`; its params as they run, defaults filled in: a config trained
    before ``indices`` was a parameter runs narrow), on GPU ``gpu`` and on the host; None where no config does.
    Once a selector and GPU."""
    import cupy

    on_host = np.array([reads_row_columns(REGISTRY.get(kernel), canonical(kernel, params))
                        for kernel, params in selector.configs_], dtype=np.uint8)
    if not on_host.any():
        return None
    with cupy.cuda.Device(gpu):
        return cupy.asarray(on_host), on_host


@functools.lru_cache(maxsize=8)
def _spec_args(selector: KernelSelector, spec: DeviceSpec) -> tuple[Any, ...]:
    """The kernel's arguments of the device and dtype (itemsize, L2 or NaN, SMs, the count columns, the quantile
    or -1, the near draw's share or 0), once a selector and device spec (the last eight kept: a process plans with
    a selector or two)."""
    counts = sum(1 << i for i, name in enumerate(_DESIGN) if name in COUNT_FEATURES)
    quantile = -1.0 if selector.risk_quantile is None else float(selector.risk_quantile)
    l2 = float(spec.l2_bytes) if spec.l2_bytes > 0 else math.nan
    return (*map(np.float64, (np.dtype(selector.dtype_).itemsize, l2, spec.sms)), np.uint64(counts),
            np.float64(quantile), np.float64(selector.near_share or 0.0))


@dataclass(frozen=True)
class _Forest:
    """A selector's forest on one GPU: the kernel's forest arguments, its trees, the shared memory it needs."""

    args: tuple[Any, ...]
    trees: int
    shared_bytes: int


_ON_GPU: weakref.WeakKeyDictionary[KernelSelector, dict[int, _Forest]] = weakref.WeakKeyDictionary()


def _room(selector: KernelSelector) -> np.ndarray:
    """Where the kernel stages each tree's leaf's rows in shared memory: tree t's at ``room[t]``, as many places as
    its largest leaf holds (``room[trees]`` in all). A tree's leaves hold every training row once, and the
    leaves are numbered tree by tree, so tree t's first leaf starts at t x rows."""
    f = selector.forest_
    first = np.searchsorted(f.leaf_start[:-1], np.arange(f.n_trees) * len(f.targets))
    largest = np.maximum.reduceat(np.diff(f.leaf_start), first)
    return np.concatenate([[0], np.cumsum(largest)]).astype(np.int32)


def _shared_bytes(selector: KernelSelector) -> int:
    """The kernel's shared memory for ``selector``'s forest (rank_design's layout)."""
    f = selector.forest_
    rows, outputs, trees = len(f.targets), f.n_outputs, f.n_trees
    configs = outputs - 1
    return (8 * (2 * rows + outputs + 3 * configs + trees) + 4 * configs * OUTCOME_SAMPLES
            + 4 * (2 * trees + 2 * OUTCOME_SAMPLES + configs + int(_room(selector)[-1]) + rows))


def _on_gpu(selector: KernelSelector, device: int) -> _Forest:
    """``selector``'s forest copied to GPU ``device`` once (a few hundred KB) and kept while the selector lives."""
    import cupy

    per_device = _ON_GPU.setdefault(selector, {})
    if (found := per_device.get(device)) is None:
        f = selector.forest_
        up = cupy.asarray
        args = (up(f.feature.astype(np.int16)), up(f.threshold.astype(np.float32)), up(f.nan_left.astype(np.uint8)),
                up(f.children[0].astype(np.int32)), up(f.children[1].astype(np.int32)), up(f.roots.astype(np.int32)),
                np.int32(f.n_trees), up(f.leaf_start.astype(np.int32)), up(f.members.astype(np.int32)),
                np.int32(len(f.targets)), up(np.ascontiguousarray(f.targets, dtype=np.float32)),
                np.int32(f.n_outputs), up(f.leaf_argmin(1).astype(np.int32)), up(_room(selector)))
        found = per_device[device] = _Forest(args, f.n_trees, _shared_bytes(selector))
    return found


@functools.cache
def _kernels(cupy: Any, device: int) -> dict[str, tuple[Any, int]]:
    """Both entries, compiled once per device and process, without fused multiply-adds (NumPy's rounding), each
    with its block's threads: :data:`_THREADS`, or fewer where its registers allow fewer (whole warps)."""
    module = cupy.RawModule(code=SOURCE, options=("--fmad=false",))
    kernels = {name: module.get_function(name) for name in ("rank_from_counters", "rank_from_features")}
    return {name: (f, min(_THREADS, f.max_threads_per_block // 32 * 32)) for name, f in kernels.items()}
