"""The learned selector: a matrix's features -> every config of the portfolio, ranked.

:class:`KernelSelector` follows the scikit-learn estimator API. One multi-output
ExtraTreesRegressor maps a matrix's features to, first, ``log(t_best / t_bytes)``
and then ``log(t / t_best)`` for every config of the training portfolio, where
``t_best`` is the matrix's fastest candidate and ``t_bytes`` the time its
compulsory bytes (:func:`compulsory_bytes`) take at the device's measured copy
bandwidth; a config's expected time is ``t_bytes · exp(sum of the two)``. Both
targets are scale-free, and the inputs (:func:`design_matrix`) add to the stored
features some relative to the device (x and the matrix against the L2 cache,
rows per SM): so a selector trained on one GPU can answer for another of its
architecture, in that GPU's seconds. Learning the configs relative to the
matrix's best, rather than each ``log(t / t_bytes)``, keeps the matrix's overall
speed (most of the variance) from steering the trees' splits; capping the latter (``cap``) keeps configs
far off the best from steering them. The ranking puts first the configs whose slowdown on the training
matrices nearest this one is lowest at a quantile (``risk_quantile``), rather than lowest on average; with
``near_share``, a blend of that quantile over two draws of neighbours, the second weighted to the nearest.

After fitting, the forest is kept as a :class:`tuner.select.forest.CompactForest`
(flat arrays, the leaves as the training rows they hold): a shipped selector is
well under 1.5 MB gzipped and ranks a matrix in about a millisecond.

``plan()`` races the first few configs of :meth:`KernelSelector.rank` beside
cuSPARSE; each :class:`RankedConfig` carries its expected time, what preparing
it costs in SpMVs (measured on the training matrices) and the share of the
forest's trees that rank it first (a confidence).

Selectors are stored in the ``models`` table (:func:`save_model`,
:func:`load_latest`), one versioned row per (device, dtype) training run, and
shipped inside the package (:func:`ship_model`, :mod:`tuner.select.shipped`);
:func:`find_selector` says which one answers for a device and dtype.

Example (on a synthetic table)::

    rng = np.random.default_rng(0)
    X = rng.random((60, len(FEATURE_NAMES))) * 1e4
    times = [{'csr_scalar{"block_size": 128}': 1e-5, 'csr_vector{"block_size": 256}': 2e-5}] * 60
    device = DeviceSpec("gpu", bandwidth_gbs=4000.0, l2_bytes=60 * 2**20, sms=132)
    selector = KernelSelector(n_estimators=20).fit(X, times, dtype="float64", device=device)
    selector.rank(dict(zip(FEATURE_NAMES, X[0])))[0].kernel  # 'csr_scalar'
"""

from __future__ import annotations

import functools
import io
import json
import logging
import math
import pickle
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import sklearn
from sklearn.base import BaseEstimator, clone
from sklearn.ensemble import ExtraTreesRegressor
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import KFold, LeaveOneGroupOut
from sklearn.utils.validation import check_is_fitted, validate_data

from common.errors import InvalidConfigError, StoreError
from kernels import BASELINE, BASELINE_CONFIGS, config_key, config_of, get_family
from tuner.matrix.features import FEATURE_NAMES
from tuner.measure.metrics import effective_bytes
from tuner.select.forest import CompactForest
from tuner.select.gate import SecondOpinion, out_of_fold_gains
from tuner.select.shipped import ASK_STORE, StoredRow

if TYPE_CHECKING:
    from db.store import Store
    from tuner.measure.backend import Backend

__all__ = [
    "BASELINE_PARAMS",
    "COUNT_FEATURES",
    "DEPART_SHARE",
    "DERIVED_FEATURES",
    "LARGE_NNZ",
    "MISSING_PENALTY",
    "NEAR_POWER",
    "OUTCOME_SAMPLES",
    "DeviceSpec",
    "KernelSelector",
    "Prediction",
    "RankedConfig",
    "bytes_time",
    "compulsory_bytes",
    "design_matrix",
    "device_spec",
    "find_selector",
    "latest_row",
    "load_latest",
    "load_shipped",
    "model_row",
    "pick_device",
    "predict_columns",
    "predicted",
    "save_model",
    "ship_model",
    "unpickle_blob",
]
_log = logging.getLogger(__name__)

MISSING_PENALTY = math.log(2.0)
"""A config not measured on a training matrix is taken as that matrix's slowest candidate times 2."""

OUTCOME_SAMPLES = 64
"""How many training matrices :meth:`KernelSelector.outcomes` draws for a matrix."""

NEAR_POWER = 2.0
"""With ``near_share``, the ranking's second draw weighs the training matrices by their proximity to this power:
the very nearest (those sharing a leaf with the matrix in most trees) count for more than in the first."""

LARGE_NNZ = 1_000_000
"""Preparation costs are estimated on matrices at least this large, where launch overheads do not dominate; the
evaluation also scores each strategy over them alone (:class:`~tuner.select.evaluation.StrategyScore`)."""

_L2_BY_NAME = (("H200", 60 * 2**20), ("H100", 50 * 2**20))
"""L2 bytes by device name, for device records that do not carry ``l2_bytes``."""


@dataclass(frozen=True)
class DeviceSpec:
    """What the selector knows of a GPU: its measured copy bandwidth (GB/s, read + write), L2 size (bytes, 0
    when unknown) and number of SMs."""

    id: str
    bandwidth_gbs: float
    l2_bytes: int
    sms: int

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> DeviceSpec:
        """From a store ``devices`` row (id, sms, copy_bandwidth_gbs, optionally l2_bytes). Without l2_bytes,
        the L2 of a known device name (H100, H200), else 0: unknown."""
        bandwidth, sms = record.get("copy_bandwidth_gbs"), record.get("sms")
        if not bandwidth or not sms:
            raise InvalidConfigError(f"device {record.get('id')!r} lacks copy_bandwidth_gbs or sms; probe it again")
        l2 = record.get("l2_bytes")
        if not l2:
            name = f"{record.get('name', '')} {record.get('id', '')}"
            l2 = next((size for key, size in _L2_BY_NAME if key in name), 0)
        return cls(str(record["id"]), float(bandwidth), int(l2), int(sms))


def compulsory_bytes(rows: Any, cols: Any, nnz: Any, dtype: np.dtype | str) -> Any:
    """Fewest bytes one CSR SpMV moves: values and column indices, the row pointer, x read once, y written
    (:func:`tuner.measure.metrics.effective_bytes`, which takes arrays of counts as well)."""
    return effective_bytes(rows, cols, nnz, dtype)


COUNT_FEATURES: frozenset[str] = frozenset(
    {"rows", "cols", "nnz", "npr_min", "npr_max", "npr_mean", "npr_std", "fd_seg_count", "fd_seg_size",
     "bandwidth", "col_std", "x_l2", "matrix_l2", "rows_per_sm"}
)
"""Design columns that span orders of magnitude: log1p'ed."""

DERIVED_FEATURES: dict[str, str] = {
    "x_l2": "bytes of x / L2 bytes: whether the gathered vector stays in cache (NaN: L2 unknown)",
    "matrix_l2": "compulsory bytes / L2 bytes: whether the whole product fits in cache (NaN: L2 unknown)",
    "log_bytes": "log of the compulsory bytes",
    "log_aspect": "log((rows + 1) / (cols + 1))",
    "bandwidth_rel": "matrix bandwidth / cols: how far from the diagonal, scale-free",
    "cf_rel_1k": "cf_1024 / npr_mean: nonzeros per 1024-column panel segment, as a share of the row",
    "cf_rel_64k": "cf_65536 / npr_mean: the same for 65536-column panels",
    "maxrow_rel": "npr_max / npr_mean: how much longer the longest row is than the mean",
    "rows_per_sm": "rows / SMs: the work each SM gets",
}
"""The features :func:`design_matrix` adds to the stored ones (after them, in this order), and why."""

_NEEDED = ("rows", "cols", "nnz", "npr_mean", "npr_max", "bandwidth", "cf_1024", "cf_65536")


def _as_rows(features: Any, feature_names: Sequence[str]) -> np.ndarray:
    """Feature rows as a float array in ``feature_names`` order (from arrays, or mappings)."""
    if isinstance(features, Mapping):
        features = [features]
    if isinstance(features, Sequence) and len(features) and isinstance(features[0], Mapping):
        try:
            return np.array([[float(row[n]) for n in feature_names] for row in features], dtype=np.float64)
        except KeyError as exc:
            raise InvalidConfigError(f"features lack {exc.args[0]!r}") from None
    return np.asarray(features, dtype=np.float64)


def design_matrix(features: Any, *, dtype: np.dtype | str, device: DeviceSpec,
                  feature_names: Sequence[str] = FEATURE_NAMES) -> tuple[np.ndarray, list[str]]:
    """The model's inputs: the stored features then :data:`DERIVED_FEATURES` for ``device`` in ``dtype``, with
    log1p on :data:`COUNT_FEATURES`. ``features``: rows of values in ``feature_names`` order, or mappings.
    Returns ``(X, names)``."""
    names = list(feature_names)
    if missing := [n for n in _NEEDED if n not in names]:
        raise InvalidConfigError(f"the selector needs the features {missing}")
    F = np.atleast_2d(_as_rows(features, names))
    if F.shape[1] != len(names):
        raise InvalidConfigError(f"features have {F.shape[1]} columns but {len(names)} names")
    f = {n: F[:, i] for i, n in enumerate(names)}
    rows, cols, nnz, mean = f["rows"], f["cols"], f["nnz"], np.maximum(f["npr_mean"], 1e-9)
    nbytes = compulsory_bytes(rows, cols, nnz, dtype)
    l2 = float(device.l2_bytes) if device.l2_bytes > 0 else np.nan
    derived = {
        "x_l2": cols * np.dtype(dtype).itemsize / l2,
        "matrix_l2": nbytes / l2,
        "log_bytes": np.log(nbytes),
        "log_aspect": np.log((rows + 1) / (cols + 1)),
        "bandwidth_rel": f["bandwidth"] / np.maximum(cols, 1),
        "cf_rel_1k": f["cf_1024"] / mean,
        "cf_rel_64k": f["cf_65536"] / mean,
        "maxrow_rel": f["npr_max"] / mean,
        "rows_per_sm": rows / device.sms,
    }
    f.update(derived)
    out = [*names, *derived]
    X = np.column_stack([f[n] for n in out])
    counts = [i for i, n in enumerate(out) if n in COUNT_FEATURES]
    X[:, counts] = np.log1p(np.maximum(X[:, counts], 0))
    return X, out


def bytes_time(features: Any, *, dtype: np.dtype | str, device: DeviceSpec,
               feature_names: Sequence[str] = FEATURE_NAMES) -> np.ndarray:
    """Seconds the compulsory bytes of each row take at ``device``'s copy bandwidth (the target's unit)."""
    F = np.atleast_2d(_as_rows(features, feature_names))
    names = list(feature_names)
    rows, cols, nnz = (F[:, names.index(n)] for n in ("rows", "cols", "nnz"))
    return compulsory_bytes(rows, cols, nnz, dtype) / (device.bandwidth_gbs * 1e9)


def _quantile(drawn: np.ndarray, q: float) -> np.ndarray:
    """``np.quantile(drawn, q, axis=1)`` (its linear rule) by one sort: a quarter of its time on one matrix's
    outcomes (64 x 70), which every plan() ranks."""
    ranked = np.sort(drawn, axis=1)
    at = q * (ranked.shape[1] - 1)
    low = int(at)
    high = min(low + 1, ranked.shape[1] - 1)
    return ranked[:, low] + (ranked[:, high] - ranked[:, low]) * (at - low)


@dataclass(slots=True)
class RankedConfig:
    """One config of a matrix's ranking (not frozen: every plan() builds some seventy, and a frozen dataclass
    takes three times as long to build)."""

    kernel: str
    params: dict[str, Any]
    expected_s: float  # expected time of one SpMV on the device asked for
    prepare_spmvs: float  # median prepare time / SpMV time on the training matrices (NaN: never measured)
    votes: float  # share of the forest's trees that rank this config first
    outcomes: Sequence[float] | np.ndarray = field(default=(), repr=False, compare=False)
    """log(t / t_best) of this config on the training matrices most like this one (KernelSelector.outcomes;
    empty where not asked for)"""


BASELINE_PARAMS: dict[str, Any] = BASELINE_CONFIGS[0][1]
"""cuSPARSE's algorithm a prediction is held to (:func:`predicted`), csr_alg1: csr_alg2 is faster than it by more
than 3 % on at most one matrix of each corpus, slower by 20 % in the geometric mean."""

DEPART_SHARE = 0.5
"""``plan(effort="predict")`` runs a config other than cuSPARSE only where it beat cuSPARSE's csr_alg1 on at least
this share of the training matrices drawn nearest the matrix (:meth:`KernelSelector.outcomes`): on most of them.
A stricter share (0.7) cut the tail of the replay further, but the corpora's times are older than the 16-bit
columns of csr_vector and csr_scalar, and on the unseen benchmark it held back picks 1.1-1.3x faster than
cuSPARSE (``bench/results/2026-11-28_predict-baseline-57.txt``)."""


def predicted(ranking: Sequence[RankedConfig], prepare_budget: float, share: float = DEPART_SHARE
              ) -> RankedConfig | None:
    """What ``plan(effort="predict")`` runs of ``ranking`` (one matrix's, in the selector's order): its first
    config that is cuSPARSE (the fallback, whatever its preparation costs) or expected to prepare within
    ``prepare_budget`` SpMVs. Where that is another family's and the ranking carries outcomes, cuSPARSE's
    csr_alg1 instead, unless the config beat it on at least ``share`` of the drawn training matrices (the
    outcomes of both are over the same draws). None where no config qualifies."""
    first = next((r for r in ranking if _may_predict(r.kernel, r.prepare_spmvs, prepare_budget)), None)
    if first is None or first.kernel == BASELINE or not len(first.outcomes):
        return first
    base = next((r for r in ranking if _held_to(r.kernel, r.params)), None)
    if base is None or not len(base.outcomes):
        return first
    beaten = np.count_nonzero(np.less(first.outcomes, base.outcomes)) / len(first.outcomes)
    return first if beaten >= share else base


@functools.lru_cache(maxsize=8)
def predict_columns(selector: KernelSelector, prepare_budget: float) -> tuple[tuple[bool, ...], int | None]:
    """Which of ``selector``'s configs (columns of ``configs_``) :func:`predicted` may pick first with this
    budget (a mask), and csr_alg1's column (None where the selector has none): what the ranking kernel is given to
    make :func:`predicted`'s pick (:mod:`tuner.select.rank_gpu`; once a selector and budget)."""
    may = tuple(_may_predict(kernel, spmvs, prepare_budget)
                for (kernel, _), spmvs in zip(selector.configs_, selector.prepare_spmvs_.tolist(), strict=True))
    return may, next((j for j, (kernel, params) in enumerate(selector.configs_) if _held_to(kernel, params)), None)


def _may_predict(kernel: str, prepare_spmvs: float | None, prepare_budget: float) -> bool:
    """Whether :func:`predicted` may pick a config: cuSPARSE (the fallback, whatever its preparation costs), or one
    expected to prepare within ``prepare_budget`` SpMVs (not one never measured: None or NaN)."""
    return kernel == BASELINE or (prepare_spmvs is not None and bool(prepare_spmvs <= prepare_budget))


def _held_to(kernel: str, params: Mapping[str, Any]) -> bool:
    """Whether a config is the one :func:`predicted` holds another family's to (:data:`BASELINE_PARAMS`)."""
    return kernel == BASELINE and dict(params) == BASELINE_PARAMS


@dataclass(frozen=True)
class Prediction:
    """The selector's first config for a matrix."""

    kernel: str
    params: dict[str, Any]
    confidence: float  # the votes of this config
    expected_gflops: float | None
    basis: str = "ranked"


class KernelSelector(BaseEstimator):
    """Ranks the configs of its training portfolio for a matrix, from its features (:meth:`rank_order`).

    Parameters
    ----------
    n_estimators, min_samples_leaf : int
        Of the ExtraTreesRegressor. Leaving each structure family of the H200 corpus out, 50 to 500 trees and
        leaves of 1 to 8 rows all score within 0.003 of each other (about the spread between seeds): 100
        trees of leaves of 2 or more rows are as good as any, and the smallest and fastest of those.
    coverage : float
        A config is a candidate when it was measured on at least this fraction of the training rows.
    cap : float or None
        Each config's target ``log(t / t_best)`` is capped at ``log(cap)``: a config ``cap`` times slower
        than the best or more is learned as ``cap`` times slower, so that the forest's squared error over some
        seventy outputs is not spent on configs 10-100x off the best, which no ranking puts first. None: not
        capped (the selectors shipped before stop 52).
    risk_quantile : float or None
        Configs are ranked by this quantile of their slowdowns on the training matrices the forest draws as
        nearest (:meth:`outcomes`), ties by expected time: on a structure unlike the training ones, a config
        good on most neighbours and far off on a few ranks below one that is never far off. None: by
        expected time alone.
    near_share : float or None
        With ``risk_quantile``, the rank key is ``(1 - near_share)`` x that quantile of the outcomes drawn by
        proximity (:meth:`outcomes`) plus ``near_share`` x the same quantile of outcomes drawn by proximity to the
        power :data:`NEAR_POWER` (the nearest training matrices weigh more). The first draw alone spreads a
        matrix of a structure never seen over neighbours of many kinds; the second keeps the few that share most
        leaves with it from being outvoted. :meth:`outcomes` (races, ``predicted``) stay the first draw's. None
        or 0: the first draw alone (the selectors shipped before stop 61).

        Leaving each structure family out (four corpora, forest seeds 0-9, then 10-19 to check a choice made
        among some sixty rules on the first ten; ``bench/results/2026-11-28_lofo-near-61.txt``), ``risk_quantile``
        0.8 with ``near_share`` 0.7 lifts the first config's worst 5 % on every corpus: H100 float64 0.739 ->
        0.766 (seeds 10-19: 0.721 -> 0.758), H100 float32 0.793 -> 0.809 (0.788 -> 0.803), H200 float64 0.761 ->
        0.771 (0.751 -> 0.761), H200 float32 0.761 -> 0.785 (0.753 -> 0.774), the geomeans within -0.001 and
        +0.010.

        Leaving each structure family out of the four corpora (5 seeds each, on the CPU,
        ``bench/results/2026-11-27_lofo-shipped-52.txt``), cap 4 with the 75th percentile lifts the first
        config's worst 5 % from 0.676-0.757 to 0.745-0.788 and its geomean from 0.915-0.944 to 0.930-0.943.
    gated : str or None
        A family the selector does not rank, whose race config (:meth:`kernels.Family.unranked_config`) a second
        forest weighs against the ranking's first config (:mod:`tuner.select.gate`, ``gate_``), taught by the times
        of :meth:`kernels.Family.judged_config` where the training times hold it on ``coverage`` of the rows:
        :meth:`second_opinion`, what a recommendation answers (:func:`tuner.execute.choice.choose`). Its configs
        are never ranked. None: no second opinion (the selectors shipped before stop 74).
    random_state : int or None
        Seed of the forest.
    """

    def __init__(self, *, n_estimators: int = 100, min_samples_leaf: int = 2, coverage: float = 0.8,
                 cap: float | None = 4.0, risk_quantile: float | None = 0.8, near_share: float | None = 0.7,
                 gated: str | None = "csr5", random_state: int | None = 0) -> None:
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf
        self.coverage = coverage
        self.cap = cap
        self.risk_quantile = risk_quantile
        self.near_share = near_share
        self.gated = gated
        self.random_state = random_state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A selector pickled before ``cap`` and ``risk_quantile`` were parameters was trained uncapped and
        ranks by expected time: it loads with both None, and ranks as it did; one pickled before ``near_share``
        loads with it None (its one draw), one pickled before ``gated`` with no second opinion."""
        super().__setstate__({"cap": None, "risk_quantile": None, "near_share": None, "gated": None, "gate_": None,
                              **state})

    def fit(
        self,
        X: Any,
        times: Sequence[Mapping[str, float]],
        *,
        dtype: str,
        device: DeviceSpec,
        feature_names: Sequence[str] = FEATURE_NAMES,
        prepare_times: Sequence[Mapping[str, float]] | None = None,
        groups: Sequence[str] | None = None,
    ) -> KernelSelector:
        """Learn from rows of features (arrays in ``feature_names`` order, or mappings), each row's measured
        times (config key (:func:`kernels.config_key`) -> fastest verified seconds) and, optionally, its
        prepare times (config key -> seconds), measured on ``device`` in ``dtype``. ``groups``: each row's
        structure family, over which the second opinion (``gated``) takes the ranking's first configs out of
        fold, a family at a time (None: 5 folds of rows).

        A candidate config not measured on a row (it failed there, or was not tried) counts as that row's
        slowest candidate times 2 (:data:`MISSING_PENALTY`); rows where no candidate was measured are left out.
        ``forest_`` learns ``[log(t_best / t_bytes), log(t / t_best) per config]`` (see the module's doc), the
        latter capped at ``log(cap)``.
        """
        if self.cap is not None and not self.cap > 1:
            raise InvalidConfigError(f"cap must be a slowdown above 1 (or None), got {self.cap!r}")
        if self.risk_quantile is not None and not 0 <= self.risk_quantile <= 1:
            raise InvalidConfigError(f"risk_quantile must be within [0, 1] (or None), got {self.risk_quantile!r}")
        if self.near_share is not None and not 0 <= self.near_share <= 1:
            raise InvalidConfigError(f"near_share must be within [0, 1] (or None), got {self.near_share!r}")
        names = [str(n) for n in feature_names]
        X = validate_data(self, _as_rows(X, names), reset=True, dtype=np.float64)
        if X.shape[1] != len(names):
            raise InvalidConfigError(f"X has {X.shape[1]} columns but {len(names)} feature names were given")
        prepare_times = [{}] * len(times) if prepare_times is None else prepare_times
        if not len(times) == len(prepare_times) == len(X):
            raise InvalidConfigError(f"{len(X)} feature rows but {len(times)} time rows and {len(prepare_times)} "
                                     "prepare rows")
        if groups is not None and len(groups) != len(X):
            raise InvalidConfigError(f"{len(X)} feature rows but {len(groups)} groups")
        counts: dict[str, int] = {}
        for row in times:
            for key in row:
                counts[key] = counts.get(key, 0) + 1
        keys = sorted(k for k, c in counts.items()
                      if c >= self.coverage * len(times) and config_of(k)[0] != self.gated)
        T = np.array([[row.get(k, np.nan) for k in keys] for row in times], dtype=np.float64).reshape(len(X), -1)
        used = np.isfinite(T).any(axis=1)
        if used.sum() < 2:
            raise InvalidConfigError(f"too few measurements to rank on: {len(keys)} configs measured on "
                                     f"{self.coverage:.0%} of {len(X)} rows, {used.sum()} rows with one")
        X, T = X[used], T[used]
        self.feature_names_in_ = np.asarray(names, dtype=object)
        self.device_, self.dtype_, self.n_train_ = device, str(np.dtype(dtype)), int(used.sum())
        self.configs_: list[tuple[str, dict[str, Any]]] = [config_of(k) for k in keys]
        design, _ = design_matrix(X, dtype=self.dtype_, device=device, feature_names=names)
        ratio = np.log(T / bytes_time(X, dtype=self.dtype_, device=device, feature_names=names)[:, None])
        ratio = np.where(np.isnan(ratio), np.nanmax(ratio, axis=1, keepdims=True) + MISSING_PENALTY, ratio)
        scale = ratio.min(axis=1, keepdims=True)
        slowdown = ratio - scale if self.cap is None else np.minimum(ratio - scale, math.log(self.cap))
        targets = np.hstack([scale, slowdown])
        forest = ExtraTreesRegressor(n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf,
                                     random_state=self.random_state, n_jobs=-1).fit(design, targets)
        self.forest_ = CompactForest.from_sklearn(forest, design, targets)  # the estimator itself is dropped
        kept = np.flatnonzero(used).tolist()
        self.prepare_spmvs_ = self._prepare_spmvs(X[:, names.index("nnz")], T, [prepare_times[i] for i in kept], keys)
        self.gate_ = self._second_opinion(X, design, [times[i] for i in kept], [prepare_times[i] for i in kept],
                                          None if groups is None else [groups[i] for i in kept])
        return self

    def _second_opinion(self, X: np.ndarray, design: np.ndarray, times: Sequence[Mapping[str, float]],
                        prepare: Sequence[Mapping[str, float]], groups: Sequence[str] | None
                        ) -> SecondOpinion | None:
        """``gated``'s :class:`~tuner.select.gate.SecondOpinion` on these training rows (features ``X``, their
        ``design`` rows), the ranking's first configs out of fold by ``groups`` (a family at a time; None: 5 folds
        of rows); None without ``gated``, where its judged config is measured on fewer than ``coverage`` of the rows,
        or where fewer than two rows have a first config out of fold to weigh it against."""
        if self.gated is None:
            return None
        names = list(self.feature_names_in_)
        judged = get_family(self.gated).judged_config
        itemsize = np.dtype(self.dtype_).itemsize
        gated = [None if (params := judged(dict(zip(names, row, strict=True)), itemsize)) is None
                 else config_key(self.gated, params) for row in X.tolist()]
        measured = sum(k is not None and k in t for k, t in zip(gated, times, strict=True))
        if measured < max(2, self.coverage * len(X)):
            return None
        if groups is not None and len(set(groups)) >= 2:
            splits = LeaveOneGroupOut().split(X, groups=groups)
        else:
            splits = KFold(n_splits=min(5, len(X))).split(X)
        ranker = clone(self).set_params(gated=None)
        ranked = [{k: v for k, v in t.items() if config_of(k)[0] != self.gated} for t in times]

        def firsts(train: np.ndarray, test: np.ndarray) -> list[str | None]:
            try:
                fitted = clone(ranker).fit(X[train], [ranked[i] for i in train], dtype=self.dtype_,
                                           device=self.device_, feature_names=names,
                                           prepare_times=[prepare[i] for i in train])
            except InvalidConfigError:  # too few rows measured outside the fold: no first config out of fold
                return [None] * len(test)
            keys = fitted.config_keys()
            return [keys[j] for j in fitted.rank_order(X[test])[:, 0].tolist()]

        gains = out_of_fold_gains(times, gated, splits, firsts)
        if np.isfinite(gains).sum() < 2:
            return None
        T = np.array([[t.get(k, np.nan) if k else np.nan] for k, t in zip(gated, times, strict=True)])
        P = [{"gated": p[k]} if k in p else {} for k, p in zip(gated, prepare, strict=True)]
        spmvs = float(self._prepare_spmvs(X[:, names.index("nnz")], T, P, ["gated"])[0])
        return SecondOpinion.fit(self.gated, design, gains, cap=self.cap, prepare_spmvs=spmvs,
                                 n_estimators=self.n_estimators, random_state=self.random_state)

    @staticmethod
    def _prepare_spmvs(nnz: np.ndarray, T: np.ndarray, prepare: Sequence[Mapping[str, float]],
                       keys: Sequence[str]) -> np.ndarray:
        """Per config: the median of prepare_s / time_s on the large training rows, else on all rows."""
        P = np.array([[row.get(k, np.nan) for k in keys] for row in prepare], dtype=np.float64).reshape(T.shape)
        ratio = P / T
        out = np.full(len(keys), np.nan)
        for j in range(len(keys)):
            known = np.isfinite(ratio[:, j])
            large = known & (nnz >= LARGE_NNZ)
            pick = large if large.any() else known
            if pick.any():
                out[j] = float(np.median(ratio[pick, j]))
        return out

    def __sklearn_is_fitted__(self) -> bool:
        """Fitted by this version of the class (a pickle of the classifier-based selector before it is not)."""
        return all(hasattr(self, a) for a in ("forest_", "configs_", "device_", "prepare_spmvs_"))

    def _expected(self, X: Any, device: DeviceSpec | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Validated feature rows, the expected seconds of every config (columns) for them on ``device``
        (default: the training one), the votes (the share of the trees whose own prediction puts each
        config first) and each row's nearness to the training rows (:meth:`CompactForest.proximity`)."""
        check_is_fitted(self)
        names = list(self.feature_names_in_)
        rows = np.atleast_2d(_as_rows(X, names))
        # what scikit-learn's validate_data checks, without its third of a millisecond: plan() ranks once a matrix
        if rows.ndim != 2 or rows.shape[1] != len(names):
            raise ValueError(f"X has {rows.shape[-1]} features, but {type(self).__name__} is expecting {len(names)}")
        if not (finite := np.isfinite(rows).all(axis=0)).all():
            bad = [n for n, f in zip(names, finite, strict=True) if not f]
            raise ValueError(f"features hold NaN or infinity: {bad}")
        device = self.device_ if device is None else device
        design, _ = design_matrix(rows, dtype=self.dtype_, device=device, feature_names=names)
        leaves = self.forest_.apply(design)  # (rows, trees)
        weights = self.forest_.proximity(leaves)
        out = self.forest_.mean_under(weights)  # the mean of the trees' predictions
        firsts = self.forest_.leaf_argmin(1)[leaves]  # each tree's first config, (rows, trees)
        configs = len(self.configs_)
        counts = np.bincount((firsts + configs * np.arange(len(rows))[:, None]).ravel(),
                             minlength=len(rows) * configs)
        votes = counts.reshape(len(rows), configs) / leaves.shape[1]
        t_bytes = bytes_time(rows, dtype=self.dtype_, device=device, feature_names=names)
        return rows, t_bytes[:, None] * np.exp(out[:, :1] + out[:, 1:]), votes, weights

    def expected_times(self, X: Any, *, device: DeviceSpec | None = None) -> np.ndarray:
        """Expected seconds of every config in :attr:`configs_` (columns) for each row of X (arrays, or feature
        mappings) on ``device`` (default: the training device)."""
        return self._expected(X, device)[1]

    def rank(self, features: Any, *, device: DeviceSpec | None = None, outcomes: bool = False
             ) -> list[RankedConfig]:
        """Every config for ONE matrix (a mapping, or one row in ``feature_names_in_`` order), first the one
        to run (:meth:`rank_order`), on ``device`` (default: the training device). ``votes``: the share of the
        forest's trees whose own prediction puts the config first; with ``outcomes`` (what a race's shortlist
        draws on; a tenth of a millisecond where the order does not draw them already), each config's
        :meth:`outcomes`."""
        rows, expected, votes, weights = self._expected(features, device)
        if len(rows) != 1:
            raise InvalidConfigError(f"rank() takes one matrix's features, got {len(rows)} rows")
        order, drawn = self._order(expected, weights)
        if outcomes and drawn is None:
            drawn = self._outcomes(weights)
        return self.ranked(order[0], expected[0], votes[0], drawn[0][:, order[0]] if outcomes else None)

    def second_opinion(self, features: Any, first: RankedConfig, *, device: DeviceSpec | None = None
                       ) -> RankedConfig | None:
        """``gated``'s race config for ONE matrix (a mapping, or one row in ``feature_names_in_`` order) where the
        second opinion (``gate_``, :mod:`tuner.select.gate`) expects it faster than ``first``, the ranking's first
        config (:meth:`rank`): its expected time ``first``'s over the expected gain, its votes the share of the
        second opinion's trees that expect it faster. None where it does not, or there is none."""
        check_is_fitted(self)
        if self.gate_ is None:
            return None
        names = list(self.feature_names_in_)
        row = np.atleast_2d(_as_rows(features, names))[0]
        design, _ = design_matrix(row[None], dtype=self.dtype_, device=self.device_ if device is None else device,
                                  feature_names=names)
        gain, votes = self.gate_.gain(design[0])
        params = get_family(self.gate_.family).unranked_config(dict(zip(names, row.tolist(), strict=True)),
                                                               np.dtype(self.dtype_).itemsize)
        if gain <= 0 or params is None:
            return None
        return RankedConfig(self.gate_.family, params, first.expected_s * math.exp(-gain), self.gate_.prepare_spmvs,
                            votes)

    def ranked(self, order: Sequence[int] | np.ndarray, expected: np.ndarray, votes: np.ndarray,
               outcomes: np.ndarray | None = None) -> list[RankedConfig]:
        """One matrix's :meth:`rank` from its parts: the configs' order (columns of :attr:`configs_`), expected
        seconds, votes and, where asked, the outcomes of the configs of ``order`` (samples x len(order),
        :meth:`outcomes_of` with ``columns=order``). :mod:`tuner.select.rank_gpu` computes the parts on the GPU."""
        order = order.tolist() if isinstance(order, np.ndarray) else list(order)
        seconds, prepare, shares = expected.tolist(), self.prepare_spmvs_.tolist(), votes.tolist()
        columns = np.ascontiguousarray(outcomes.T) if outcomes is not None else [()] * len(order)
        return [RankedConfig(self.configs_[j][0], dict(self.configs_[j][1]), seconds[j], prepare[j], shares[j],
                             column)
                for j, column in zip(order, columns, strict=True)]

    def rank_order(self, X: Any, *, device: DeviceSpec | None = None) -> np.ndarray:
        """Each row's configs (columns of :attr:`configs_`) first to last: by expected time, or with
        ``risk_quantile`` by that quantile of their :meth:`outcomes` (with ``near_share``, blended with the
        quantile over a draw weighted to the nearest), ties by expected time."""
        _, expected, _, weights = self._expected(X, device)
        return self._order(expected, weights)[0]

    def _order(self, expected: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`rank_order` from :meth:`_expected`'s times and proximity weights, and the outcomes it drew
        (None when ranked by expected time alone)."""
        if self.risk_quantile is None:
            return np.argsort(expected, axis=1, kind="stable"), None
        drawn = self._outcomes(weights)
        key = _quantile(drawn, self.risk_quantile)
        if self.near_share:
            near = self._outcomes(weights ** NEAR_POWER)
            key = (1 - self.near_share) * key + self.near_share * _quantile(near, self.risk_quantile)
        return np.lexsort((expected, key), axis=-1), drawn

    def outcomes(self, X: Any, *, device: DeviceSpec | None = None) -> np.ndarray:
        """For each row of X, :data:`OUTCOME_SAMPLES` training matrices drawn by their nearness to it in the
        forest (:meth:`CompactForest.proximity`, systematically: a matrix of weight w is drawn about
        w x :data:`OUTCOME_SAMPLES` times) and each config's ``log(t / t_best)`` on them: (rows, samples,
        configs). What each config would have cost on the matrices most like this one, jointly: which
        configs fail together, which cover each other (:func:`tuner.execute.race.shortlist` races a set that
        covers them)."""
        return self._outcomes(self._expected(X, device)[3])

    def _outcomes(self, weights: np.ndarray) -> np.ndarray:
        """:meth:`outcomes` of the rows of these proximity weights."""
        return self.outcomes_of(self._draws(weights))

    def _draws(self, weights: np.ndarray) -> np.ndarray:
        """The training rows drawn for each row of these proximity weights (rows, samples): systematically, a
        row of weight w about w x :data:`OUTCOME_SAMPLES` times."""
        weights = np.cumsum(weights, axis=1)
        at = (np.arange(OUTCOME_SAMPLES) + 0.5) / OUTCOME_SAMPLES
        return np.minimum([np.searchsorted(w, at * w[-1]) for w in weights], len(self.forest_.targets) - 1)

    def outcomes_of(self, drawn: np.ndarray, columns: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Each config's ``log(t / t_best)`` on the training rows ``drawn`` (any shape of row indices): that
        shape plus one axis of configs, every config or, where given, those of ``columns`` in their order (a
        ranking's, as :meth:`ranked` takes them)."""
        on_rows = self.forest_.targets[drawn]
        chosen = on_rows[..., 1:] if columns is None else on_rows[..., np.asarray(columns, dtype=np.intp) + 1]
        return chosen.astype(np.float64)

    def predict_details(self, X: Any, *, device: DeviceSpec | None = None) -> list[Prediction]:
        """The first config of each row's ranking as a :class:`Prediction` (confidence: its votes)."""
        rows, expected, votes, weights = self._expected(X, device)
        nnz = rows[:, list(self.feature_names_in_).index("nnz")]
        out = []
        for i, j in enumerate(self._order(expected, weights)[0][:, 0].tolist()):
            kernel, params = self.configs_[j]
            out.append(Prediction(kernel, dict(params), float(votes[i, j]), float(2 * nnz[i] / expected[i, j] / 1e9)))
        return out

    def predict(self, X: Any, *, device: DeviceSpec | None = None) -> list[tuple[str, dict[str, Any]]]:
        """``(kernel, params)`` of each row's first config (:meth:`rank_order`), per row of X (arrays, or
        feature mappings)."""
        return [(self.configs_[j][0], dict(self.configs_[j][1]))
                for j in self.rank_order(X, device=device)[:, 0].tolist()]

    def config_keys(self) -> list[str]:
        """:func:`kernels.config_key` of each config in :attr:`configs_`, in column order."""
        check_is_fitted(self)
        return [config_key(k, p) for k, p in self.configs_]


# -- storage ---------------------------------------------------------------------------------------


def model_row(model: Any, *, device: str, dtype: str, metrics: Mapping[str, Any] | None = None,
              task: str = "spmv", features: Sequence[str] | None = None) -> dict[str, Any]:
    """A fitted selector as a ``models`` row: what the store keeps and a shipped file holds (the blob pickled).

    ``task`` is 'spmv' for a :class:`KernelSelector` (its ``feature_names_in_`` are the features) or
    'spmspv' for :class:`tuner.select.spmspv_selector.ModeSelector` (pass its ``features``).
    """
    check_is_fitted(model)
    return {
        "task": task,
        "device": device,
        "dtype": dtype,
        "created_at": datetime.now(UTC).isoformat(timespec="microseconds"),
        "n_train": int(model.n_train_),
        "features": json.dumps([str(n) for n in (model.feature_names_in_ if features is None else features)]),
        "metrics": json.dumps({**dict(metrics or {}), "sklearn": sklearn.__version__}, allow_nan=False,
                              default=float),
        "blob": pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL),
    }


def save_model(store: Store, model: Any, *, device: str, dtype: str, metrics: Mapping[str, Any] | None = None,
               task: str = "spmv", features: Sequence[str] | None = None) -> int:
    """Store a fitted selector for (device, dtype) as a new version (see :func:`model_row`); returns its id."""
    row = model_row(model, device=device, dtype=dtype, metrics=metrics, task=task, features=features)
    if store.device(device) is None:
        raise StoreError(f"unknown device {device!r}; known: {[d['id'] for d in store.devices()]}")
    table = store.db["models"]
    table.insert(row)
    return int(table.last_pk)


def ship_model(model: Any, *, device: str, dtype: str, metrics: Mapping[str, Any] | None = None,
               folder: str | Path | None = None, task: str = "spmv", features: Sequence[str] | None = None) -> Path:
    """Write a fitted selector as the one shipped for exactly (device, dtype) (:mod:`tuner.select.shipped`) into
    ``folder`` (default: the package's ``tuner/data``); returns the file's path. A kernel selector's header
    also names its training device's :class:`DeviceSpec` (``device_spec``), so that a GPU of the same
    architecture finds the nearest one without unpickling any."""
    from tuner.select.shipped import DATA_DIR, write_shipped

    row = model_row(model, device=device, dtype=dtype, metrics=metrics, task=task, features=features)
    blob = row.pop("blob")
    if isinstance(getattr(model, "device_", None), DeviceSpec):
        row["device_spec"] = asdict(model.device_)
    return write_shipped(row, blob, Path(folder) if folder is not None else DATA_DIR)


RENAMED_MODULES = {"tuner.model": "tuner.select.model", "tuner.spmspv_selector": "tuner.select.spmspv_selector"}
"""Where the classes and functions a pickled selector names lived before tuner/ was split by stage: the shipped
files and the models in users' stores name those paths, and keep loading."""


class _RenamingUnpickler(pickle.Unpickler):
    """An unpickler that finds what a blob names under its module's new path (:data:`RENAMED_MODULES`)."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(RENAMED_MODULES.get(module, module), name)


def unpickle_blob(blob: bytes) -> Any:
    """A ``models`` blob (or a shipped file's) as an object, pickled before or after the modules moved."""
    return _RenamingUnpickler(io.BytesIO(blob)).load()


def _unpickle(row: Mapping[str, Any], features: Sequence[str]) -> Any:
    """The model of a ``models`` row (or a shipped header with its blob); None when trained on other
    ``features``, or pickled by an older version of its class that this one cannot use (logged: retrain it).
    The blob is a pickle: only load stores and packages you trust."""
    if row.get("blob") is None or json.loads(row["features"]) != list(features):
        return None  # trained on another feature set: unusable until retrained
    try:
        model = unpickle_blob(row["blob"])
        check_is_fitted(model)
    except (AttributeError, ImportError, NotFittedError) as exc:  # a class or function renamed since
        _log.warning("model %s (%s, %s) was saved by an older version and cannot be used (%s); run `tuner "
                     "train` again", row.get("id", "shipped"), row.get("device"), row.get("dtype"), exc)
        return None
    return model


def latest_row(store: Store, *, device: str, dtype: str, task: str = "spmv", select: str = "*"
               ) -> dict[str, Any] | None:
    """The newest ``models`` row of ``task`` for exactly (device, dtype) (its ``select`` columns), or None."""
    rows = store.db["models"].rows_where("task = ? and device = ? and dtype = ?", [task, device, dtype],
                                         select=select, order_by="id desc", limit=1)
    return next(iter(rows), None)


def load_latest(store: Store, *, device: str, dtype: str, task: str = "spmv",
                features: Sequence[str] = FEATURE_NAMES, newest: StoredRow = ASK_STORE) -> Any:
    """The newest ``task`` selector trained for exactly (device, dtype) on ``features``, or None (``newest``:
    its row's id and created_at, where the caller asked the store already). The blob is a pickle: only load
    stores you trust."""
    if newest is ASK_STORE:
        newest = latest_row(store, device=device, dtype=dtype, task=task, select="id, created_at")
    if newest is None:
        return None
    key = (str(store.path), newest["id"], newest["created_at"])
    if key not in _LOADED:  # unpickled once per process: the service asks on every request
        if len(_LOADED) >= _LOADED_MAX:
            del _LOADED[next(iter(_LOADED))]  # the oldest loaded
        _LOADED[key] = _unpickle(store.db["models"].get(newest["id"]), features)
    return _LOADED[key]


_LOADED: dict[tuple[str, int, str], Any] = {}
_LOADED_MAX = 8


def load_shipped(device: str, dtype: str, *, task: str = "spmv", features: Sequence[str] = FEATURE_NAMES,
                 path: Path | None = None) -> Any:
    """The ``task`` selector shipped for exactly (device, dtype) (in ``path``, default the file named for
    them, :func:`~tuner.select.shipped.shipped_file`), or None (also when it cannot be unpickled here, e.g. under an
    incompatible scikit-learn: logged). Each file is unpickled once."""
    from tuner.select.shipped import ShippedFile, shipped_file

    found = shipped_file(device, dtype, task=task) if path is None else ShippedFile.at(path)
    if found is None:
        return None
    return _load_shipped(str(found.path), found.mtime_ns, found.size, device, dtype, task, tuple(features))


@functools.lru_cache(maxsize=8)
def _load_shipped(path: str, mtime_ns: int, size: int, device: str, dtype: str, task: str,
                  features: tuple[str, ...]) -> Any:
    from tuner.select.shipped import read_shipped

    try:
        found = read_shipped(device, dtype, task=task, path=Path(path))
        if found is None:
            return None
        header, blob = found
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # InconsistentVersionWarning: logged once below instead
            model = _unpickle({**header, "blob": blob}, features)
    except Exception as exc:  # a damaged file, a pickle from an incompatible scikit-learn: the default instead
        _log.warning("the selector shipped in %s cannot be loaded (%s: %s); plan() uses the default", path,
                     type(exc).__name__, exc)
        return None
    trained_with = json.loads(header.get("metrics") or "{}").get("sklearn")
    if trained_with and trained_with != sklearn.__version__:
        _log.warning("the selector shipped in %s was pickled with scikit-learn %s, this is %s", path, trained_with,
                     sklearn.__version__)
    return model


# -- which selector answers for a device -----------------------------------------------------------------


def device_spec(store: Store | None, device: str, backend: Backend | None = None) -> DeviceSpec | None:
    """What the selector needs of ``device``: from the store's ``devices`` row when it holds the copy bandwidth
    and SMs, else from ``backend`` when it runs that device (its copy bandwidth measured there), else None."""
    record = store.device(device) if store is not None else None
    info = backend.info if backend is not None and backend.info.id == device else None
    if record and record.get("copy_bandwidth_gbs") and record.get("sms"):
        if not record.get("l2_bytes") and info is not None:
            record = {**record, "l2_bytes": info.l2_bytes}
        return DeviceSpec.from_record(record)
    if info is None or backend is None:
        return None
    return DeviceSpec.from_record({"id": info.id, "name": info.name, "sms": info.sms, "l2_bytes": info.l2_bytes,
                                   "copy_bandwidth_gbs": backend.copy_bandwidth_gbs()})


def find_selector(store: Store | None, *, device: str, dtype: str, backend: Backend | None = None,
                  newest: StoredRow = ASK_STORE) -> tuple[KernelSelector, DeviceSpec | None, str] | None:
    """The selector that ranks configs for ``device`` in ``dtype``, as ``(model, spec, basis)``, or None.

    The store's newest for exactly (device, dtype), else the one shipped for exactly them (``spec`` None:
    the model's own training device), else one shipped for another GPU of the same architecture (the
    ``(sm_XX)`` of the device id) and dtype, the nearest in copy bandwidth when several, with ``spec`` this
    device's (:func:`device_spec`) so that its expectations are carried over; where nothing is known of this
    device, its own training device's. ``basis`` names the selector in a few words. ``newest``: the store's
    newest row for (device, dtype), where the caller asked for it already (:func:`load_latest`).
    """
    if store is not None and (model := load_latest(store, device=device, dtype=dtype, newest=newest)) is not None:
        return model, None, f"the selector trained in the store for {device} on {model.n_train_} matrices"
    if (model := load_shipped(device, dtype)) is not None:
        return model, None, f"the selector shipped for {device}"
    from tuner.select.shipped import architecture, shipped_selectors

    arch = architecture(device)
    others = [h for h in shipped_selectors(task="spmv") if h["dtype"] == dtype and h["device"] != device
              and arch is not None and architecture(h["device"]) == arch]
    if not others:
        return None
    spec = device_spec(store, device, backend)

    def distance(header: Mapping[str, Any]) -> float:
        bandwidth = (header.get("device_spec") or {}).get("bandwidth_gbs")
        return abs(math.log(bandwidth / spec.bandwidth_gbs)) if spec is not None and bandwidth else math.inf

    for header in sorted(others, key=lambda h: (distance(h), h["device"])):
        model = load_shipped(header["device"], dtype, path=header["path"])
        if model is None:
            continue
        if spec is None:
            return model, None, f"the selector shipped for {header['device']}, as on that GPU (this one's copy " \
                                "bandwidth is unknown)"
        return model, spec, f"the selector shipped for {header['device']}, carried over to this GPU by its " \
                            "bandwidth and L2"
    return None


def pick_device(store: Store, device: str | None) -> str:
    """``device`` if the store knows it, else the store's only gpu device; StoreError lists the devices."""
    devices = store.devices()
    if device is not None:
        if store.device(device) is None:
            raise StoreError(f"unknown device {device!r}; devices in the store: {[d['id'] for d in devices]}")
        return device
    gpus = [d["id"] for d in devices if d["kind"] == "gpu"]
    if len(gpus) != 1:
        raise StoreError(f"pass --device: the store holds {len(gpus)} gpu devices; devices: "
                         f"{[d['id'] for d in devices]}")
    return gpus[0]
