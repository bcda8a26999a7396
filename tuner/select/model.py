"""The learned selector: matrix features -> the best kernel family and its config, trained from the store.

:class:`KernelSelector` follows the scikit-learn estimator API. The family is
a classifier's answer (a Pipeline: log1p of the count-like features, a
StandardScaler, then gradient boosting, a random forest or an SVM, picked by
cross-validation grouped by matrix fingerprint, see :func:`select_model`); the
family's parameters are chosen on the ``n_neighbors`` most similar training
matrices (in the scaled feature space): among the family's configs measured on
most training matrices (the corpus measures a :mod:`tuner.select.portfolio` on every
one), the config with the best mean log of t_best / t there. Where none was
measured on enough of them, the params of the nearest matrix that the family
won. Each prediction carries the classifier's probability of the family
(``confidence``) and the GFLOP/s the neighbours measured for the config
(:meth:`KernelSelector.predict_details`).

Models are stored in the ``models`` table (:func:`save_model`,
:func:`load_latest`), one versioned row per (device, dtype) training run;
:func:`tuner.execute.choice.choose` uses the latest one for a matrix without a tuned
best (source ``'predicted'``), else the one shipped inside the package for
exactly that device and dtype (:func:`ship_model`, :func:`load_shipped`,
:mod:`tuner.select.shipped`). Both hold the same row and the same pickled blob
(:func:`model_row`): one way of serializing.

Example (on a synthetic table)::

    import numpy as np
    rng = np.random.default_rng(0)
    X = rng.random((40, len(FEATURE_NAMES)))
    y = np.where(X[:, 0] > 0.5, "csr_vector", "csr_scalar")
    params = [{"block_size": 128}] * 40
    sel = KernelSelector(classifier="random_forest").fit(X, y, params)
    sel.predict(X[:2])  # [('csr_vector', {'block_size': 128}), ...]
"""

from __future__ import annotations

import functools
import io
import json
import logging
import pickle
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import sklearn
from sklearn.base import BaseEstimator
from sklearn.compose import ColumnTransformer
from sklearn.dummy import DummyClassifier
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GroupKFold, GroupShuffleSplit, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler
from sklearn.svm import SVC
from sklearn.utils.validation import check_is_fitted, validate_data

from common.errors import InvalidConfigError, StoreError
from kernels import config_key, config_of
from tuner.matrix.features import FEATURE_NAMES

if TYPE_CHECKING:
    from db.store import Store

__all__ = [
    "CLASSIFIERS",
    "COUNT_FEATURES",
    "KernelSelector",
    "Prediction",
    "TrainingTable",
    "find_model",
    "grouped_split",
    "latest_row",
    "load_latest",
    "load_shipped",
    "measured_times",
    "model_row",
    "save_model",
    "select_model",
    "ship_model",
    "pick_device",
    "training_table",
    "unpickle_blob",
]
_log = logging.getLogger(__name__)

COUNT_FEATURES: frozenset[str] = frozenset(
    {"rows", "cols", "nnz", "npr_min", "npr_max", "npr_mean", "npr_std", "fd_seg_count", "fd_seg_size",
     "bandwidth", "col_std"}
)
"""Features that span orders of magnitude: log1p before scaling."""

CLASSIFIERS = ("gradient_boosting", "random_forest", "svm")
"""The classifiers :func:`select_model` compares; ``KernelSelector(classifier="auto")`` picks among them."""


def _classifier(name: str, random_state: int | None) -> Any:
    if name == "gradient_boosting":
        return GradientBoostingClassifier(random_state=random_state)
    if name == "random_forest":
        return RandomForestClassifier(n_estimators=200, random_state=random_state)
    if name == "svm":
        return SVC(C=10.0, gamma="scale", probability=True, random_state=random_state)
    raise InvalidConfigError(f"unknown classifier {name!r}; choose one of {['auto', *CLASSIFIERS]}")


def _pipeline(classifier: Any, feature_names: Sequence[str]) -> Pipeline:
    counts = [i for i, name in enumerate(feature_names) if name in COUNT_FEATURES]
    log = ColumnTransformer([("log1p", FunctionTransformer(np.log1p), counts)], remainder="passthrough")
    return Pipeline([("log", log), ("scale", StandardScaler()), ("classify", classifier)])


def select_model(
    X: np.ndarray,
    y: np.ndarray,
    groups: Sequence[Any],
    *,
    feature_names: Sequence[str] = FEATURE_NAMES,
    candidates: Sequence[str] = CLASSIFIERS,
    n_splits: int = 5,
    random_state: int | None = 0,
) -> tuple[str, dict[str, dict[str, float]]]:
    """The candidate with the best mean accuracy under GroupKFold by ``groups`` (no matrix in two folds).

    Returns ``(name, scores)`` with ``scores[name] = {"mean": ..., "std": ..., "folds": k}``; a fold
    that fails (e.g. one class only in its training part) scores NaN and is left out of the mean.
    """
    n_groups = len(set(groups))
    if n_groups < 2:
        raise InvalidConfigError(f"cross-validation needs at least 2 matrices, got {n_groups}")
    cv = GroupKFold(n_splits=min(n_splits, n_groups))
    scores: dict[str, dict[str, float]] = {}
    for name in candidates:
        pipe = _pipeline(_classifier(name, random_state), feature_names)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # failed folds (error_score=nan) warn; they show as NaN
            try:
                fold = cross_val_score(pipe, X, y, groups=groups, cv=cv, error_score=np.nan)
            except ValueError:  # every fold failed (scikit-learn raises then, error_score or not)
                fold = np.full(cv.get_n_splits(), np.nan)
        ok = fold[np.isfinite(fold)]
        scores[name] = {
            "mean": float(ok.mean()) if ok.size else float("nan"),
            "std": float(ok.std()) if ok.size else float("nan"),
            "folds": int(ok.size),
        }
    ranked = [n for n in candidates if np.isfinite(scores[n]["mean"])]
    if not ranked:
        raise InvalidConfigError("every candidate classifier failed in cross-validation")
    return max(ranked, key=lambda n: scores[n]["mean"]), scores


@dataclass(frozen=True)
class Prediction:
    """What the selector says of one matrix."""

    kernel: str
    params: dict[str, Any]
    confidence: float  # the classifier's probability of this family
    expected_gflops: float | None  # what the neighbours measured for this config (None: not measured on them)
    basis: str  # 'neighbours' (the config scored best on the nearest matrices) or 'nearest winner'


class KernelSelector(BaseEstimator):
    """Predicts ``(kernel, params)`` for a matrix from its feature vector (columns as in FEATURE_NAMES).

    Parameters
    ----------
    classifier : "auto", "gradient_boosting", "random_forest" or "svm"
        ``"auto"`` compares them by grouped cross-validation in ``fit`` and keeps the best.
    cv : int
        Folds of that cross-validation.
    n_neighbors : int
        Training matrices on which a family's candidate configs are scored.
    coverage : float
        A config is a candidate when it was measured on at least this fraction of the training matrices.
    random_state : int or None
        Seed of the classifiers.
    """

    def __init__(self, *, classifier: str = "auto", cv: int = 5, n_neighbors: int = 5, coverage: float = 0.5,
                 random_state: int | None = 0) -> None:
        self.classifier = classifier
        self.cv = cv
        self.n_neighbors = n_neighbors
        self.coverage = coverage
        self.random_state = random_state

    def fit(
        self,
        X: Any,
        y_kernel: Sequence[str],
        params_per_row: Sequence[Mapping[str, Any]],
        *,
        groups: Sequence[Any] | None = None,
        feature_names: Sequence[str] | None = None,
        measured: Sequence[Mapping[str, float]] | None = None,
    ) -> KernelSelector:
        """Learn from rows of features, each row's best kernel and its params; ``groups`` (default: one per
        row) are the matrix fingerprints that cross-validation keeps together; ``measured`` (per row: config
        key (:func:`kernels.config_key`) to seconds) are the times the params are scored by."""
        X, y = validate_data(self, X, np.asarray(y_kernel, dtype=object), reset=True, dtype=np.float64)
        names = list(FEATURE_NAMES if feature_names is None else feature_names)
        if len(names) != X.shape[1]:
            raise InvalidConfigError(f"X has {X.shape[1]} columns but {len(names)} feature names were given")
        if len(params_per_row) != len(y) or (measured is not None and len(measured) != len(y)):
            raise InvalidConfigError(f"{len(y)} kernels but {len(params_per_row)} params and "
                                     f"{'no' if measured is None else len(measured)} measured rows")
        groups = list(range(len(y))) if groups is None else list(groups)
        self.classes_ = np.unique(y)
        self.feature_names_in_ = np.asarray(names, dtype=object)
        self.cv_scores_: dict[str, dict[str, float]] = {}
        if len(self.classes_) == 1:
            self.classifier_name_ = "constant"
            estimator: Any = DummyClassifier(strategy="most_frequent")
        elif self.classifier == "auto":
            self.classifier_name_, self.cv_scores_ = select_model(
                X, y, groups, feature_names=names, n_splits=self.cv, random_state=self.random_state
            )
            estimator = _classifier(self.classifier_name_, self.random_state)
        else:
            self.classifier_name_ = self.classifier
            estimator = _classifier(self.classifier, self.random_state)
        with warnings.catch_warnings():  # SVC(probability=True): deprecated in 1.9, gone in 1.11 (pinned)
            warnings.filterwarnings("ignore", message="The `probability` parameter", category=FutureWarning)
            self.pipeline_ = _pipeline(estimator, names).fit(X, y)
        self.train_scaled_ = self.pipeline_[:-1].transform(X)  # where the neighbours are looked for
        self.winners_: dict[str, tuple[np.ndarray, list[dict[str, Any]]]] = {}  # family -> rows it won, params
        for kernel in self.classes_:
            rows = np.flatnonzero(y == kernel)
            self.winners_[str(kernel)] = (rows, [dict(params_per_row[i]) for i in rows])
        self._fit_candidates(X[:, names.index("nnz")] if "nnz" in names else None,
                             [{}] * len(y) if measured is None else measured)
        self.n_train_ = len(y)
        return self

    def _fit_candidates(self, nnz: np.ndarray | None, measured: Sequence[Mapping[str, float]]) -> None:
        """The configs measured on ``coverage`` of the rows, and each row's log(t_best / t) and log(nnz / t)."""
        counts: dict[str, int] = {}
        for row in measured:
            for key in row:
                counts[key] = counts.get(key, 0) + 1
        keys = sorted(k for k, c in counts.items() if c >= self.coverage * len(measured))
        self.candidates_: list[tuple[str, dict[str, Any]]] = [config_of(key) for key in keys]
        times = np.array([[row.get(k, np.nan) for k in keys] for row in measured], dtype=float).reshape(
            len(measured), len(keys))
        best = np.array([min(row.values()) if row else np.nan for row in measured], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.log_fraction_ = np.log(best[:, None] / times)
            self.log_rate_ = np.log(nnz[:, None] / times) if nnz is not None else np.full_like(times, np.nan)

    def __sklearn_is_fitted__(self) -> bool:
        """Fitted by this version of the class (a pickle of an older one lacks the candidates)."""
        return all(hasattr(self, a) for a in ("pipeline_", "train_scaled_", "winners_", "candidates_",
                                              "log_fraction_"))

    def _as_array(self, X: Any) -> Any:
        """Mappings (one matrix's features, or a list of them) become rows in ``feature_names_in_`` order."""
        if isinstance(X, Mapping):
            X = [X]
        if isinstance(X, list) and X and isinstance(X[0], Mapping):
            try:
                return np.array([[float(row[n]) for n in self.feature_names_in_] for row in X])
            except KeyError as exc:
                raise InvalidConfigError(f"features lack {exc.args[0]!r}") from None
        return X

    def predict_details(self, X: Any) -> list[Prediction]:
        """A :class:`Prediction` per row of X (an array, or feature mappings)."""
        check_is_fitted(self)
        X = self._as_array(X)
        with warnings.catch_warnings():
            # Fitted on a plain array with FEATURE_NAMES order: a plain array is the expected input.
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
            X = validate_data(self, X, reset=False, dtype=np.float64)
        scaled = self.pipeline_[:-1].transform(X)
        classifier = self.pipeline_[-1]
        kernels, proba = classifier.predict(scaled), classifier.predict_proba(scaled)
        classes = list(classifier.classes_)
        # Squared distances to every training matrix (a few hundred): plain NumPy, microseconds a row.
        dist = ((scaled[:, None, :] - self.train_scaled_[None, :, :]) ** 2).sum(axis=2)
        near = np.argsort(dist, axis=1, kind="stable")[:, : self.n_neighbors]
        out = []
        for kernel, d, p, nb in zip(kernels, dist, proba, near, strict=True):
            confidence = float(p[classes.index(kernel)])
            mine = [j for j, (k, _) in enumerate(self.candidates_) if k == kernel]
            scores = self.log_fraction_[np.ix_(nb, mine)]
            enough = np.isfinite(scores).sum(axis=0) * 2 >= len(nb)
            if mine and enough.any():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # columns of NaN only: not enough anyway
                    mean = np.where(enough, np.nanmean(scores, axis=0), -np.inf)
                j = mine[int(np.argmax(mean))]
                rate = self.log_rate_[nb, j]
                rate = rate[np.isfinite(rate)]
                gflops = float(2 * np.exp(rate.mean()) / 1e9) if rate.size else None
                out.append(Prediction(str(kernel), dict(self.candidates_[j][1]), confidence, gflops, "neighbours"))
                continue
            rows, params = self.winners_[str(kernel)]
            out.append(Prediction(str(kernel), dict(params[int(np.argmin(d[rows]))]), confidence, None,
                                  "nearest winner"))
        return out

    def predict(self, X: Any) -> list[tuple[str, dict[str, Any]]]:
        """``(kernel, params)`` per row of X (an array, or feature mappings)."""
        return [(p.kernel, p.params) for p in self.predict_details(X)]

    def score(self, X: Any, y_kernel: Sequence[str]) -> float:
        """Accuracy of the predicted family."""
        predicted = [k for k, _ in self.predict(X)]
        return float(np.mean(np.asarray(predicted, dtype=object) == np.asarray(y_kernel, dtype=object)))


# -- training data -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingTable:
    """One row per matrix tuned on a (device, dtype): its features and its best kernel and params."""

    fingerprints: list[str]
    X: np.ndarray
    kernels: np.ndarray
    params: list[dict[str, Any]]
    times: np.ndarray
    skipped: list[str]  # tuned matrices left out because features are missing
    measured: list[dict[str, float]]  # per row: config key -> fastest verified time (measured_times)

    def __len__(self) -> int:
        return len(self.fingerprints)


def measured_times(store: Store, *, device: str, dtype: str) -> dict[str, dict[str, float]]:
    """Fingerprint → config key (:func:`kernels.config_key`) → fastest verified time on (device, dtype)."""
    out: dict[str, dict[str, float]] = {}
    rows = store.db.execute(
        "select fingerprint, kernel, params, min(time_s) from trials where device = ? and dtype = ? "
        "and state = 'ok' and verified = 1 group by fingerprint, kernel, params", [device, dtype])
    for fp, kernel, params, time_s in rows:
        out.setdefault(fp, {})[config_key(kernel, json.loads(params))] = time_s
    return out


def training_table(store: Store, *, device: str, dtype: str) -> TrainingTable:
    """The store's best configs on ``device`` in ``dtype`` joined with the matrices' features and times."""
    measured = measured_times(store, device=device, dtype=dtype)
    fps, rows, kernels, params, times, skipped = [], [], [], [], [], []
    for best in store.db["best"].rows_where("device = ? and dtype = ?", [device, dtype], order_by="fingerprint"):
        feats = next(iter(store.db["features"].rows_where("fingerprint = ?", [best["fingerprint"]])), None)
        values = [None if feats is None else feats.get(name) for name in FEATURE_NAMES]
        if any(v is None for v in values):
            skipped.append(best["fingerprint"])
            continue
        fps.append(best["fingerprint"])
        rows.append(values)
        kernels.append(best["kernel"])
        params.append(json.loads(best["params"]))
        times.append(best["time_s"])
    X = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURE_NAMES))
    return TrainingTable(fps, X, np.asarray(kernels, dtype=object), params, np.asarray(times, dtype=float), skipped,
                         [measured.get(fp, {}) for fp in fps])


def grouped_split(
    groups: Sequence[Any], *, test_size: float = 0.25, random_state: int | None = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Train and test row indices such that no group (matrix fingerprint) is on both sides."""
    groups = np.asarray(groups, dtype=object)
    splitter = GroupShuffleSplit(n_splits=1, test_size=test_size, random_state=random_state)
    return next(splitter.split(np.zeros((len(groups), 1)), groups=groups))


# -- storage ---------------------------------------------------------------------------------------


def model_row(model: Any, *, device: str, dtype: str, metrics: Mapping[str, Any] | None = None,
              task: str = "spmv", features: Sequence[str] | None = None) -> dict[str, Any]:
    """A fitted selector as a ``models`` row: what the store keeps and a shipped file holds (the blob pickled).

    ``task`` is 'spmv' for a :class:`KernelSelector` (its ``feature_names_in_`` are the features) or
    'spmspv' for :class:`tuner.select.spmspv_selector.ModeSelector` (pass its ``features``).
    """
    check_is_fitted(model, "pipeline_")
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
    ``folder`` (default: the package's ``tuner/data``); returns the file's path."""
    from tuner.select.shipped import DATA_DIR, write_shipped

    row = model_row(model, device=device, dtype=dtype, metrics=metrics, task=task, features=features)
    blob = row.pop("blob")
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
                features: Sequence[str] = FEATURE_NAMES) -> Any:
    """The newest ``task`` selector trained for exactly (device, dtype) on ``features``, or None. The blob
    is a pickle: only load stores you trust."""
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


def load_shipped(device: str, dtype: str, *, task: str = "spmv", features: Sequence[str] = FEATURE_NAMES) -> Any:
    """The ``task`` selector shipped for exactly (device, dtype), or None (also when it cannot be unpickled
    here, e.g. under an incompatible scikit-learn: logged). Each file is unpickled once."""
    from tuner.select.shipped import shipped_path

    path = shipped_path(device, dtype, task=task)
    if path is None or not path.is_file():
        return None
    stat = path.stat()
    return _load_shipped(str(path), stat.st_mtime_ns, stat.st_size, device, dtype, task, tuple(features))


@functools.lru_cache(maxsize=8)
def _load_shipped(path: str, mtime_ns: int, size: int, device: str, dtype: str, task: str,
                  features: tuple[str, ...]) -> Any:
    from tuner.select.shipped import read_shipped

    try:
        found = read_shipped(device, dtype, task=task)
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


def find_model(store: Store | None, *, device: str, dtype: str) -> KernelSelector | None:
    """The selector ``plan()`` predicts with for exactly (device, dtype): the store's newest, else the shipped one."""
    model = load_latest(store, device=device, dtype=dtype) if store is not None else None
    return model if model is not None else load_shipped(device, dtype)


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
