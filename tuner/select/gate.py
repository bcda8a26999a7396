"""A second opinion on a kernel family the selector does not rank: where its race config beats the ranking's first.

csr5 is raced on every matrix (:meth:`kernels.Family.unranked_configs`) and won the race on 85 of the 204 cells of
the H200's unseen benchmark, but no selector ranks it: trained with csr5's seven sigmas among the configs it ranks,
the H200's selector put csr5 first on a third of the large matrices of families it had not seen, and its first
config fell from 0.837 to 0.825 of the tuned best in float64, 0.838 to 0.762 in float32
(``bench/results/2026-11-29_lofo-first-csr5-73.txt``). Its times teach the ranking little about when csr5 is the
better answer; what a recommendation needs is narrower: is the race's csr5 config faster than the config the
ranking puts first? :class:`SecondOpinion` learns that alone, as ``log(t_first / t_gated)`` on each training matrix,
the first being the selector's out of fold (fitted without the matrix's structure family, as on a matrix of a
structure it has never seen), and answers with the family's race config where the expected gain is above 0.

Leaving each structure family of the H200's corpus out (the selector and its second opinion both fitted without
it, the second opinion's own first configs out of fold within the other families), the recommendation went from
0.840 to 0.874 of the tuned best in float64 and from 0.847 to 0.879 in float32 on the 91 matrices of 1 M nonzeros
and more, from 0.928 to 0.938 and 0.932 to 0.942 on all 351, its worst 5 % up in both (0.708 -> 0.734, 0.710 ->
0.773); it lost on one family, lp in float64 (0.911 -> 0.810 on its 11 large matrices), where csr5 is slow on
rows of a hundred entries or more scattered over a wide x (``bench/results/2026-11-29_gate-74.txt``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
from sklearn.ensemble import ExtraTreesRegressor

from tuner.select.forest import CompactForest

__all__ = ["GATE_LEAF", "SecondOpinion", "out_of_fold_gains"]

GATE_LEAF = 3
"""The second opinion's trees' smallest leaf: its target is one noisy ratio a matrix, not the ranking's seventy."""


def out_of_fold_gains(times: Sequence[Mapping[str, float]], gated: Sequence[str | None],
                      splits: Iterable[tuple[np.ndarray, np.ndarray]],
                      firsts: Callable[[np.ndarray, np.ndarray], Sequence[str | None]]) -> np.ndarray:
    """``log(t_first / t_gated)`` of each row: ``t_first`` the time of the config that ``firsts(train, test)``
    (a selector fitted on the rows ``train``) puts first on each row of ``test``, for every ``(train, test)`` of
    ``splits`` (a first never measured on a row counts as the row's slowest config times 2, as a selector learns
    it); ``t_gated`` the time of the row's ``gated`` config key. NaN where either is None, or the latter not
    measured."""
    out = np.full(len(times), np.nan)
    for train, test in splits:
        for i, key in zip(test.tolist(), firsts(train, test), strict=True):
            row, gated_key = times[i], gated[i]
            if key is not None and gated_key is not None and gated_key in row:
                out[i] = np.log(row.get(key, 2 * max(row.values())) / row[gated_key])
    return out


class SecondOpinion:
    """A forest of regression trees from a matrix's design row (:func:`tuner.select.model.design_matrix`) to the
    expected ``log(t_first / t_gated)`` of ``family``'s race config, with what preparing that config costs."""

    def __init__(self, family: str, forest: CompactForest, prepare_spmvs: float) -> None:
        self.family = family
        self.forest = forest
        self.prepare_spmvs = prepare_spmvs  # median prepare time / SpMV time of the race config (NaN: unknown)

    @classmethod
    def fit(cls, family: str, design: np.ndarray, gains: np.ndarray, *, cap: float | None, prepare_spmvs: float,
            n_estimators: int, random_state: int | None) -> SecondOpinion:
        """Fitted on the rows of ``design`` whose ``gains`` (:func:`out_of_fold_gains`) are known, each clipped to
        ``±log(cap)`` as the ranking's slowdowns are capped (None: not clipped)."""
        known = np.isfinite(gains)
        target = gains[known] if cap is None else np.clip(gains[known], -np.log(cap), np.log(cap))
        forest = ExtraTreesRegressor(n_estimators=n_estimators, min_samples_leaf=GATE_LEAF,
                                     random_state=random_state, n_jobs=-1).fit(design[known], target)
        return cls(family, CompactForest.from_sklearn(forest, design[known], target), prepare_spmvs)

    def gain(self, design: np.ndarray) -> tuple[float, float]:
        """For ONE design row: the expected ``log(t_first / t_gated)`` (above 0: the race config is expected
        faster) and the share of the trees that expect it faster."""
        per_tree = self.forest.tree_outputs(np.atleast_2d(design))[:, 0, 0]
        return float(per_tree.mean()), float(np.mean(per_tree > 0))
