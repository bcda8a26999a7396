"""A :class:`~tuner.select.forest.CompactForest` asked on the GPU: one kernel walks every tree for a matrix.

``plan()`` ranks one matrix at a time, on a GPU. In NumPy the walk is some 17 steps
of six small array operations each, a hundred calls of a few microseconds: 0.6 ms of
the 0.9 ms a ranking took on an H100's host in ``plan()`` (stop 51, a timeline of
``plan(effort="predict")`` on unseen matrices), where the same calls take 0.1 ms in a
warm loop. Here a block a row walks its trees (a thread a tree), then averages
the trees' leaves and counts which config each tree puts first, and the host reads
back one array: four CuPy calls. :meth:`CompactForest.summary
<tuner.select.forest.CompactForest.summary>` is the reference, in NumPy: the same leaves
and votes, the same means up to the order of the sums.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tuner.select.forest import CompactForest

__all__ = ["summary_on_gpu"]

_SOURCE = r"""
// One block a row of X (rows x features, float32). Thread t walks trees t, t + blockDim.x, ...: left where
// x <= threshold, or where x is NaN and the node sends NaN left; a negative child -(leaf + 1) is a leaf. Then
// out = [mean (rows x outputs) | votes (rows x (outputs - 1)) | leaves (rows x trees)], float64: the mean of the
// trees' leaf values per output, how many trees put each config first (the lowest of outputs 1.., the first on
// ties, as NumPy's argmin), and each tree's leaf.
extern "C" __global__ void forest_summary(const float* __restrict__ X, int features, int rows,
                                          const short* __restrict__ feature, const float* __restrict__ threshold,
                                          const unsigned char* __restrict__ nan_left,
                                          const int* __restrict__ left, const int* __restrict__ right,
                                          const int* __restrict__ roots, int trees,
                                          const double* __restrict__ values, int outputs,
                                          double* __restrict__ out) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* x = X + (long long)row * features;
    double* mean = out + (long long)row * outputs;
    double* votes = out + (long long)rows * outputs + (long long)row * (outputs - 1);
    double* leaves = out + (long long)rows * (2 * outputs - 1) + (long long)row * trees;
    for (int t = threadIdx.x; t < trees; t += blockDim.x) {
        int node = roots[t];
        while (node >= 0) {
            const float v = x[feature[node]];
            const bool go_right = v > threshold[node] || (isnan(v) && !nan_left[node]);
            node = go_right ? right[node] : left[node];
        }
        const int leaf = -node - 1;
        leaves[t] = leaf;
        const double* own = values + (long long)leaf * outputs;
        int first = 1;
        for (int j = 2; j < outputs; ++j) if (own[j] < own[first]) first = j;
        atomicAdd(&votes[first - 1], 1.0);
    }
    __syncthreads();  // every tree's leaf written (global memory, seen by the block after the barrier)
    for (int j = threadIdx.x; j < outputs; j += blockDim.x) {
        double sum = 0.0;
        for (int t = 0; t < trees; ++t) sum += values[(long long)leaves[t] * outputs + j];
        mean[j] = sum / trees;
    }
}
"""

_BLOCK = 128


class _OnDevice:
    """A forest's arrays on one GPU (uploaded once: some 9 MB for a shipped selector, mostly the leaves' means)."""

    def __init__(self, forest: CompactForest, cupy: Any) -> None:
        self.feature = cupy.asarray(forest.feature, dtype=cupy.int16)
        self.threshold = cupy.asarray(forest.threshold, dtype=cupy.float32)
        self.nan_left = cupy.asarray(forest.nan_left, dtype=cupy.uint8)
        self.left = cupy.asarray(forest.children[0], dtype=cupy.int32)
        self.right = cupy.asarray(forest.children[1], dtype=cupy.int32)
        self.roots = cupy.asarray(forest.roots, dtype=cupy.int32)
        self.values = cupy.asarray(forest.leaf_means(), dtype=cupy.float64)


@functools.cache
def _kernel(cupy: Any, device: int) -> Any:
    """The kernel, compiled once per device and process."""
    return cupy.RawKernel(_SOURCE, "forest_summary")


def summary_on_gpu(forest: CompactForest, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:meth:`CompactForest.summary <tuner.select.forest.CompactForest.summary>` of the rows of ``X`` on the
    current GPU: each row's leaf in each tree (rows x trees), the forest's prediction (rows x outputs) and the
    share of the trees that put each config first (rows x (outputs - 1))."""
    import cupy

    device = cupy.cuda.Device().id
    cached = forest.__dict__.setdefault("_on_gpu", {})  # left out of a pickle, as the walk's tables are
    if (arrays := cached.get(device)) is None:
        arrays = cached[device] = _OnDevice(forest, cupy)
    X = np.atleast_2d(np.asarray(X, dtype=np.float32))
    rows, trees, outputs = len(X), forest.n_trees, forest.n_outputs
    out = cupy.zeros(rows * (2 * outputs - 1 + trees), dtype=cupy.float64)
    _kernel(cupy, device)((rows,), (_BLOCK,), (
        cupy.asarray(X), np.int32(X.shape[1]), np.int32(rows), arrays.feature, arrays.threshold, arrays.nan_left,
        arrays.left, arrays.right, arrays.roots, np.int32(trees), arrays.values, np.int32(outputs), out))
    host = out.get()
    mean = host[:rows * outputs].reshape(rows, outputs)
    votes = host[rows * outputs:rows * (2 * outputs - 1)].reshape(rows, outputs - 1) / trees
    leaves = host[rows * (2 * outputs - 1):].reshape(rows, trees).astype(np.int64)
    return leaves, mean, votes
