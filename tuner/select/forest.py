"""A fitted scikit-learn forest of regression trees in a few flat NumPy arrays: small to ship, fast to ask.

scikit-learn's ExtraTreesRegressor keeps, for every leaf of every tree, the mean
of its training targets: with one output per config of the portfolio (about 70)
and a few hundred trees, a pickle of tens of MB. But a leaf's value is only the
mean of the targets of the training rows that fall in it (no bootstrap: every
tree sees every row), so :class:`CompactForest` keeps instead the targets once
(float32, rows x outputs) and, per leaf, which training rows it holds: each row
is in one leaf of each tree, so that is trees x rows small integers. Beside
them, the inner nodes of all trees concatenated: the feature (int16), the
threshold (float32), where a missing value goes, and both children (int32; a
negative child ``-(leaf + 1)`` is a leaf).

scikit-learn compares ``float32(x) <= threshold`` with a float64 threshold;
the threshold kept is the largest float32 not above it, which sends every
float32 the same way. A prediction walks all trees at once, one level per
step (NumPy over every (row, tree) pair: a leaf is its own child, so no step
tracks which pairs are done), then averages the training targets of the rows
that share its leaves (:meth:`CompactForest.proximity`, :meth:`CompactForest.mean_under`):
the forest's own prediction, up to float32 rounding of the targets
(:meth:`CompactForest.from_sklearn` checks every leaf). A table of every
leaf's means (leaves x outputs: 9 MB for a shipped selector, built on the first
ask, never pickled) serves each tree's own prediction
(:meth:`CompactForest.tree_outputs`); a ranking needs only each leaf's best
output (:meth:`CompactForest.leaf_argmin`), so a process that only ranks does
not keep it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CompactForest"]


class CompactForest:
    """The trees of a fitted forest of regressors, predicting as it does (see the module's doc)."""

    def __init__(self, *, feature: np.ndarray, threshold: np.ndarray, nan_left: np.ndarray, children: np.ndarray,
                 roots: np.ndarray, leaf_start: np.ndarray, members: np.ndarray, targets: np.ndarray) -> None:
        self.feature = feature  # (inner nodes,) int16: the feature each inner node splits on
        self.threshold = threshold  # (inner nodes,) float32: left when x <= threshold
        self.nan_left = nan_left  # (inner nodes,) bool: where a missing value (NaN) goes
        self.children = children  # (2, inner nodes) int32: left, right; -(leaf + 1) for a leaf
        self.roots = roots  # (trees,) int32: each tree's first node, coded as a child is
        self.leaf_start = leaf_start  # (leaves + 1,) int32: leaf k holds members[leaf_start[k]:leaf_start[k + 1]]
        self.members = members  # (trees x training rows,) int16 or int32: training rows, leaf by leaf
        self.targets = targets  # (training rows, outputs) float32

    @property
    def n_trees(self) -> int:
        return len(self.roots)

    @property
    def n_outputs(self) -> int:
        return self.targets.shape[1]

    @classmethod
    def from_sklearn(cls, forest: Any, X: np.ndarray, y: np.ndarray) -> CompactForest:
        """The trees of ``forest``, a fitted ExtraTreesRegressor (no bootstrap) on ``X`` and ``y``, the very
        rows it was fitted on. ValueError when a leaf's value is not the mean of its rows' targets (a forest
        fitted with bootstrap or sample weights, or on other rows)."""
        y = np.asarray(y, dtype=np.float64).reshape(len(X), -1)
        leaves_of_rows = forest.apply(X)  # (rows, trees): the node each row ends in
        feature, threshold, nan_left, left, right, roots, leaf_rows, values = [], [], [], [], [], [], [], []
        inner_base = leaf_base = 0
        for t, estimator in enumerate(forest.estimators_):
            tree = estimator.tree_
            is_leaf = tree.children_left < 0
            rank = np.cumsum(~is_leaf) - 1  # an inner node's index among its tree's inner nodes
            leaf_rank = np.cumsum(is_leaf) - 1
            code = np.where(is_leaf, -(leaf_base + leaf_rank) - 1, inner_base + rank).astype(np.int64)
            inner = np.flatnonzero(~is_leaf)
            feature.append(tree.feature[inner])
            threshold.append(_floor32(tree.threshold[inner]))
            nan_left.append(np.asarray(getattr(tree, "missing_go_to_left", np.zeros(tree.node_count)),
                                       dtype=bool)[inner])
            left.append(code[tree.children_left[inner]])
            right.append(code[tree.children_right[inner]])
            roots.append(code[0])
            leaf_rows.append(-code[leaves_of_rows[:, t]] - 1)  # each training row's leaf, globally numbered
            values.append(tree.value[is_leaf][:, :, 0])
            inner_base += len(inner)
            leaf_base += int(is_leaf.sum())
        leaf_of = np.concatenate(leaf_rows)  # tree by tree: the leaf of row i of tree t at t * rows + i
        order = np.argsort(leaf_of, kind="stable")
        start = np.concatenate([[0], np.cumsum(np.bincount(leaf_of, minlength=leaf_base))])
        if (np.diff(start) == 0).any():
            raise ValueError("a leaf holds no training row: the forest was not fitted on these rows")
        index_type = np.int16 if len(X) <= np.iinfo(np.int16).max else np.int32
        out = cls(feature=np.concatenate(feature).astype(np.int16), threshold=np.concatenate(threshold),
                  nan_left=np.concatenate(nan_left), children=np.array([np.concatenate(left), np.concatenate(right)],
                                                                      dtype=np.int32).reshape(2, -1),
                  roots=np.asarray(roots, dtype=np.int32), leaf_start=start.astype(np.int32),
                  members=(order % len(X)).astype(index_type), targets=y.astype(np.float32))
        kept = out.leaf_means()
        if not np.allclose(kept, np.concatenate(values), rtol=1e-5, atol=1e-5):
            raise ValueError("the forest's leaves are not the means of their training rows (bootstrap or weights?)")
        return out

    def apply(self, X: np.ndarray) -> np.ndarray:
        """The leaf (global number) each row of X ends in, in each tree: (rows, trees)."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float32))
        walk = self._walk()
        flat = X.ravel()
        node = np.tile(walk.roots, len(X))  # (row, tree) pairs, row-major
        start = np.repeat(np.arange(len(X)) * X.shape[1], self.n_trees)
        missing = bool(np.isnan(flat).any())
        for _ in range(walk.depth):  # a leaf is its own child: every pair takes depth steps
            x = flat[start + walk.feature[node]]
            right = x > walk.threshold[node]
            if missing:
                right |= np.isnan(x) & ~walk.nan_left[node]
            node = walk.child[node + right]
        return (node // 2 - walk.inner).reshape(len(X), self.n_trees)

    def proximity(self, leaves: np.ndarray) -> np.ndarray:
        """How near the rows whose leaves (:meth:`apply`'s) are given are to each training row in the forest's
        eyes: the share of the trees in which they fall in one leaf, each leaf's share split evenly among its
        training rows (rows x training rows, each row summing to 1). The weights of Meinshausen's quantile
        regression forests: the training targets' mean under them is the forest's prediction, and they give
        the spread around it."""
        start, size = self.leaf_start[leaves], np.diff(self.leaf_start)[leaves]
        size, start = size.ravel(), start.ravel()
        offsets = np.repeat(start - np.cumsum(size) + size, size) + np.arange(size.sum())
        row = np.repeat(np.repeat(np.arange(len(leaves)), self.n_trees), size)
        n = len(self.targets)
        out = np.bincount(row * n + self.members[offsets], weights=np.repeat(1.0 / (size * self.n_trees), size),
                          minlength=len(leaves) * n)
        return out.reshape(len(leaves), n)

    def _walk(self) -> _Walk:
        """:class:`_Walk`, built on the first prediction (a pickle leaves it out)."""
        return self._cached("_walk_cache", lambda: _Walk(self))

    def _cached(self, name: str, build: Any) -> Any:
        """A table built from the arrays on its first use and kept (``name`` starts with ``_``: never pickled)."""
        if (table := self.__dict__.get(name)) is None:
            table = self.__dict__[name] = build()
        return table

    def __getstate__(self) -> dict[str, Any]:
        """What a pickle keeps: the arrays given to the constructor, not the tables built from them."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def leaf_means(self) -> np.ndarray:
        """Every leaf's mean training targets: (leaves, outputs), float64 (the members are stored leaf by leaf,
        so each leaf's sum is a difference of two running sums)."""
        running = np.zeros((len(self.members) + 1, self.n_outputs))
        np.cumsum(self.targets[self.members], axis=0, dtype=np.float64, out=running[1:])
        return (running[self.leaf_start[1:]] - running[self.leaf_start[:-1]]) / np.diff(self.leaf_start)[:, None]

    def tree_outputs(self, X: np.ndarray) -> np.ndarray:
        """Each tree's prediction for each row of X: (trees, rows, outputs)."""
        return self.outputs_of(self.apply(X))

    def outputs_of(self, leaves: np.ndarray) -> np.ndarray:
        """Each tree's prediction for the rows whose leaves (:meth:`apply`'s) are given: (trees, rows, outputs)."""
        return self._cached("_means", self.leaf_means)[leaves].transpose(1, 0, 2)

    def mean_under(self, weights: np.ndarray) -> np.ndarray:
        """The training targets averaged under :meth:`proximity`'s weights (rows x training rows): the forest's
        prediction for those rows, (rows, outputs) float64. Summed training row after training row, every
        output alike (a matrix product's blocked sums differ from one output to the next in the last bits,
        which orders configs of equal targets at random), as the GPU's ranking sums them; a few rows at a time,
        so that the products held at once stay near 32 MB."""
        targets = self._cached("_targets64", lambda: self.targets.astype(np.float64))
        out = np.empty((len(weights), self.n_outputs))
        step = max(1, (1 << 22) // targets.size)
        for i in range(0, len(weights), step):
            out[i:i + step] = (weights[i:i + step, :, None] * targets).sum(axis=1)
        return out

    def leaf_argmin(self, start: int = 0) -> np.ndarray:
        """Each leaf's output of least mean among outputs ``start`` onwards, counted from ``start``: (leaves,)
        int. What the tree a leaf belongs to puts first (built once from :meth:`leaf_means`)."""
        return self._cached(f"_argmin{start}", lambda: self.leaf_means()[:, start:].argmin(axis=1))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The forest's prediction (the mean of its trees'): (rows, outputs)."""
        return self.mean_under(self.proximity(self.apply(X)))

    def nbytes(self) -> int:
        """Bytes of the arrays (what a pickle holds)."""
        return sum(a.nbytes for a in self.__getstate__().values())

    def __repr__(self) -> str:
        return (f"CompactForest({self.n_trees} trees, {len(self.feature)} inner nodes, {len(self.leaf_start) - 1} "
                f"leaves, {len(self.targets)} rows x {self.n_outputs} outputs)")


class _Walk:
    """The forest as :meth:`CompactForest.apply` walks it: inner nodes then leaves in one numbering, node ``k``
    at position ``2k``; every array holds two entries a node: ``child[2k]`` is the position of its left child
    and ``child[2k + 1]`` of its right, the others repeat the node's feature, threshold and NaN direction, so a
    step is ``node = child[node + (x > threshold[node])]``. A leaf splits on feature 0 at +inf with itself as
    both children: every walk takes ``depth`` steps and no step tracks which are done."""

    def __init__(self, forest: CompactForest) -> None:
        inner, leaves = len(forest.feature), len(forest.leaf_start) - 1
        self.inner = inner

        def unified(code: np.ndarray) -> np.ndarray:  # a child's code -> its position
            return 2 * np.where(code >= 0, code, inner - code - 1).astype(np.int64)

        own = 2 * np.arange(inner, inner + leaves, dtype=np.int64)
        self.feature = np.repeat(np.concatenate([forest.feature, np.zeros(leaves, np.int16)]).astype(np.intp), 2)
        self.threshold = np.repeat(np.concatenate([forest.threshold, np.full(leaves, np.inf, np.float32)]), 2)
        self.nan_left = np.repeat(np.concatenate([forest.nan_left, np.zeros(leaves, bool)]), 2)
        self.child = np.empty(2 * (inner + leaves), dtype=np.int64)
        self.child[0::2] = np.concatenate([unified(forest.children[0]), own])
        self.child[1::2] = np.concatenate([unified(forest.children[1]), own])
        self.roots = unified(forest.roots)
        self.depth, frontier = 0, self.roots
        while (frontier := frontier[frontier < 2 * inner]).size:  # inner nodes left on some path
            frontier = np.concatenate([self.child[frontier], self.child[frontier + 1]])
            self.depth += 1


def _floor32(threshold: np.ndarray) -> np.ndarray:
    """The largest float32 not above each float64 threshold: ``float32(x) <= it`` iff ``float32(x) <= threshold``."""
    out = threshold.astype(np.float32)
    above = out.astype(np.float64) > threshold
    out[above] = np.nextafter(out[above], np.float32(-np.inf))
    return out
