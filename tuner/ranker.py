"""A selector that ranks configs by expected time, for racing a shortlist on a matrix nobody tuned.

:class:`ConfigRanker` follows the scikit-learn estimator API. One multi-output
ExtraTreesRegressor maps a matrix's features to, first, ``log(t_best / t_bytes)``
and then ``log(t / t_best)`` for every config of the training portfolio, where
``t_best`` is the matrix's fastest candidate and ``t_bytes`` the time its
compulsory bytes (:func:`compulsory_bytes`) take at the device's measured copy
bandwidth; a config's expected time is ``t_bytes · exp(sum of the two)``. Both
targets are scale-free, and the inputs (:func:`design_matrix`) add to the stored
features some relative to the device (x and the matrix against the L2 cache,
rows per SM): so a ranker trained on one GPU can answer for another, in that
GPU's seconds. Learning the configs relative to the matrix's best, rather than
each ``log(t / t_bytes)``, keeps the matrix's overall speed (most of the
variance) from steering the trees' splits: on the H200 corpus, leaving whole
structure families out, the first config reaches 0.962 of the tuned best
against 0.954 (geometric means), and the worst 5% 0.84 against 0.81. A random
forest and per-config gradient boosting did worse (:mod:`tuner.ranker_eval`).

``plan()`` races the first few configs of :meth:`ConfigRanker.rank` beside
cuSPARSE; each :class:`RankedConfig` carries its expected time, what preparing
it costs in SpMVs (measured on the training matrices) and the share of the
forest's trees that rank it first (a confidence).

Example (on a synthetic table)::

    rng = np.random.default_rng(0)
    X = rng.random((60, len(FEATURE_NAMES))) * 1e4
    times = [{'csr_scalar{"block_size": 128}': 1e-5, 'csr_vector{"block_size": 256}': 2e-5}] * 60
    device = DeviceSpec("gpu", bandwidth_gbs=4000.0, l2_bytes=60 * 2**20, sms=132)
    ranker = ConfigRanker(n_estimators=20).fit(X, times, dtype="float64", device=device)
    ranker.rank(dict(zip(FEATURE_NAMES, X[0])))[0].kernel  # 'csr_scalar'
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.ensemble import ExtraTreesRegressor
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted, validate_data

from kernels import config_key, config_of
from tuner.errors import InvalidConfigError
from tuner.features import FEATURE_NAMES
from tuner.metrics import effective_bytes

__all__ = [
    "COUNT_FEATURES",
    "DERIVED_FEATURES",
    "LARGE_NNZ",
    "MISSING_PENALTY",
    "ConfigRanker",
    "DeviceSpec",
    "Prediction",
    "RankedConfig",
    "bytes_time",
    "compulsory_bytes",
    "design_matrix",
]

MISSING_PENALTY = math.log(2.0)
"""A config not measured on a training matrix is taken as that matrix's slowest candidate times 2."""

LARGE_NNZ = 1_000_000
"""Preparation costs are estimated on matrices at least this large, where launch overheads do not dominate."""

_L2_BY_NAME = (("H200", 60 * 2**20), ("H100", 50 * 2**20))
"""L2 bytes by device name, for device records that do not carry ``l2_bytes``."""


@dataclass(frozen=True)
class DeviceSpec:
    """What the ranker knows of a GPU: its measured copy bandwidth (GB/s, read + write), L2 size (bytes, 0 when
    unknown) and number of SMs."""

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
    (:func:`tuner.metrics.effective_bytes`, which takes arrays of counts as well)."""
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
        raise InvalidConfigError(f"the ranker needs the features {missing}")
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
    X = np.column_stack([np.log1p(np.maximum(f[n], 0)) if n in COUNT_FEATURES else f[n] for n in out])
    return X, out


def bytes_time(features: Any, *, dtype: np.dtype | str, device: DeviceSpec,
               feature_names: Sequence[str] = FEATURE_NAMES) -> np.ndarray:
    """Seconds the compulsory bytes of each row take at ``device``'s copy bandwidth (the target's unit)."""
    F = np.atleast_2d(_as_rows(features, feature_names))
    names = list(feature_names)
    rows, cols, nnz = (F[:, names.index(n)] for n in ("rows", "cols", "nnz"))
    return compulsory_bytes(rows, cols, nnz, dtype) / (device.bandwidth_gbs * 1e9)


@dataclass(frozen=True)
class RankedConfig:
    """One config of a matrix's ranking."""

    kernel: str
    params: dict[str, Any]
    expected_s: float  # expected time of one SpMV on the device asked for
    prepare_spmvs: float  # median prepare time / SpMV time on the training matrices (NaN: never measured)
    votes: float  # share of the forest's trees that rank this config first


@dataclass(frozen=True)
class Prediction:
    """The ranker's first config for a matrix: the fields of :class:`tuner.model.Prediction`."""

    kernel: str
    params: dict[str, Any]
    confidence: float  # the votes of this config
    expected_gflops: float | None
    basis: str = "ranked"


class ConfigRanker(BaseEstimator):
    """Ranks the configs of its training portfolio by expected time on a matrix, from its features.

    Parameters
    ----------
    n_estimators, min_samples_leaf : int
        Of the ExtraTreesRegressor.
    coverage : float
        A config is a candidate when it was measured on at least this fraction of the training rows.
    random_state : int or None
        Seed of the forest.
    """

    def __init__(self, *, n_estimators: int = 300, min_samples_leaf: int = 2, coverage: float = 0.8,
                 random_state: int | None = 0) -> None:
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf
        self.coverage = coverage
        self.random_state = random_state

    def fit(
        self,
        X: Any,
        times: Sequence[Mapping[str, float]],
        *,
        dtype: str,
        device: DeviceSpec,
        feature_names: Sequence[str] = FEATURE_NAMES,
        prepare_times: Sequence[Mapping[str, float]] | None = None,
    ) -> ConfigRanker:
        """Learn from rows of features (arrays in ``feature_names`` order, or mappings), each row's measured
        times (config key (:func:`kernels.config_key`) -> fastest verified seconds) and, optionally, its
        prepare times (config key -> seconds), measured on ``device`` in ``dtype``.

        A candidate config not measured on a row (it failed there, or was not tried) counts as that row's
        slowest candidate times 2 (:data:`MISSING_PENALTY`); rows where no candidate was measured are left out.
        ``model_`` learns ``[log(t_best / t_bytes), log(t / t_best) per config]`` (see the module's doc).
        """
        names = [str(n) for n in feature_names]
        X = validate_data(self, _as_rows(X, names), reset=True, dtype=np.float64)
        if X.shape[1] != len(names):
            raise InvalidConfigError(f"X has {X.shape[1]} columns but {len(names)} feature names were given")
        prepare_times = [{}] * len(times) if prepare_times is None else prepare_times
        if not len(times) == len(prepare_times) == len(X):
            raise InvalidConfigError(f"{len(X)} feature rows but {len(times)} time rows and {len(prepare_times)} "
                                     "prepare rows")
        counts: dict[str, int] = {}
        for row in times:
            for key in row:
                counts[key] = counts.get(key, 0) + 1
        keys = sorted(k for k, c in counts.items() if c >= self.coverage * len(times))
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
        self.model_ = Pipeline([("regress", ExtraTreesRegressor(
            n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf, random_state=self.random_state,
            n_jobs=-1))]).fit(design, np.hstack([scale, ratio - scale]))
        self.model_[-1].set_params(n_jobs=None)  # plan() asks about one matrix, where threads cost more than they save
        self.prepare_spmvs_ = self._prepare_spmvs(X[:, names.index("nnz")], T,
                                                  [p for p, u in zip(prepare_times, used, strict=True) if u], keys)
        return self

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

    def _expected(self, X: Any, device: DeviceSpec | None, *, votes: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Validated feature rows, the expected seconds of every config (columns) for them on ``device``
        (default: the training one) and, when asked, the votes (:meth:`_tree_outputs`)."""
        check_is_fitted(self)
        names = list(self.feature_names_in_)
        with warnings.catch_warnings():  # fitted on arrays in feature_names_in_ order: plain arrays are expected
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
            rows = validate_data(self, np.atleast_2d(_as_rows(X, names)), reset=False, dtype=np.float64)
        device = self.device_ if device is None else device
        design, _ = design_matrix(rows, dtype=self.dtype_, device=device, feature_names=names)
        share = None
        if votes:
            trees = self._tree_outputs(design)
            out = trees.mean(axis=0)  # what the forest predicts
            firsts = trees[:, :, 1:].argmin(axis=2)  # (trees, rows)
            share = np.stack([np.bincount(col, minlength=len(self.configs_)) for col in firsts.T]) / len(trees)
        else:
            out = self.model_.predict(design)
        t_bytes = bytes_time(rows, dtype=self.dtype_, device=device, feature_names=names)
        return rows, t_bytes[:, None] * np.exp(out[:, :1] + out[:, 1:]), share

    def _tree_outputs(self, design: np.ndarray) -> np.ndarray:
        """Each tree's own prediction, (trees, rows, outputs): the value of the leaf each row falls in."""
        Z = design
        for _, step in self.model_.steps[:-1]:
            Z = step.transform(Z)
        forest = self.model_[-1]
        leaves = forest.apply(Z)  # (rows, trees)
        return np.stack([tree.tree_.value[leaves[:, t], :, 0] for t, tree in enumerate(forest.estimators_)])

    def expected_times(self, X: Any, *, device: DeviceSpec | None = None) -> np.ndarray:
        """Expected seconds of every config in :attr:`configs_` (columns) for each row of X (arrays, or feature
        mappings) on ``device`` (default: the training device)."""
        return self._expected(X, device)[1]

    def rank(self, features: Any, *, device: DeviceSpec | None = None) -> list[RankedConfig]:
        """Every config for ONE matrix (a mapping, or one row in ``feature_names_in_`` order), fastest expected
        first, on ``device`` (default: the training device). ``votes``: the share of the forest's trees whose
        own prediction puts the config first."""
        rows, expected, votes = self._expected(features, device, votes=True)
        if len(rows) != 1:
            raise InvalidConfigError(f"rank() takes one matrix's features, got {len(rows)} rows")
        assert votes is not None
        return [RankedConfig(self.configs_[j][0], dict(self.configs_[j][1]), float(expected[0, j]),
                             float(self.prepare_spmvs_[j]), float(votes[0, j]))
                for j in np.argsort(expected[0], kind="stable")]

    def predict_details(self, X: Any, *, device: DeviceSpec | None = None) -> list[Prediction]:
        """The first config of each row's ranking as a :class:`Prediction` (confidence: its votes)."""
        rows, expected, votes = self._expected(X, device, votes=True)
        assert votes is not None
        nnz = rows[:, list(self.feature_names_in_).index("nnz")]
        out = []
        for i, j in enumerate(np.argmin(expected, axis=1)):
            kernel, params = self.configs_[j]
            out.append(Prediction(kernel, dict(params), float(votes[i, j]), float(2 * nnz[i] / expected[i, j] / 1e9)))
        return out

    def predict(self, X: Any, *, device: DeviceSpec | None = None) -> list[tuple[str, dict[str, Any]]]:
        """``(kernel, params)`` expected fastest, per row of X (arrays, or feature mappings)."""
        return [(self.configs_[j][0], dict(self.configs_[j][1]))
                for j in np.argmin(self.expected_times(X, device=device), axis=1)]

    def config_keys(self) -> list[str]:
        """:func:`kernels.config_key` of each config in :attr:`configs_`, in column order."""
        check_is_fitted(self)
        return [config_key(k, p) for k, p in self.configs_]
