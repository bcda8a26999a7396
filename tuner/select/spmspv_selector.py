"""Which SpMSpV mode for this call: an SVM on matrix features and x's fill (Hong et al., 2018, Sec. V).

:class:`ModeSelector` follows the scikit-learn estimator API: a Pipeline of a
log transform of the counts, a StandardScaler and an RBF SVC, fitted on one row
per measured (matrix, fill fraction) with the faster mode as the label and
``|log(t_sparse / t_dense)|`` as the sample weight (a wrong call costs what the
two times differ by, so near-ties matter little). ``C`` and ``gamma`` are
picked by cross-validation grouped by matrix (:func:`evaluate` reports the
paper's Table VII figures: accuracy and the time lost against the per-call
oracle).

Per call only the fill changes, so :meth:`ModeSelector.crossover_table`
evaluates the SVM once per matrix on a grid of fills, and the executor looks
a call's fill up in that table (no scikit-learn on the per-call path).

Without a trained selector for the device and dtype, :data:`DEFAULT_CROSSOVER`
decides: sparse mode below that fill, dense above.

The measurements live in the store's ``spmspv_trials`` table
(:meth:`db.store.Store.add_spmspv_trials`), a trained selector in ``models``
with ``task = 'spmspv'``; a selector for the GPU measured here ships in
``tuner/data/`` (:func:`ship`, :mod:`tuner.select.shipped`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.compose import ColumnTransformer
from sklearn.model_selection import GridSearchCV, GroupKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler
from sklearn.svm import SVC
from sklearn.utils.validation import check_is_fitted, validate_data

from common.errors import InvalidConfigError, StoreError
from tuner.matrix.features import CF_WIDTHS

if TYPE_CHECKING:
    from db.store import Store

MATRIX_FEATURES: tuple[str, ...] = ("nnz", "rows", "cols", "col_std", *(f"cf_{w}" for w in CF_WIDTHS))
"""The paper's matrix features: sizes, the spread of nonzeros over columns, the clustering factors."""

SELECTOR_FEATURES: tuple[str, ...] = (*MATRIX_FEATURES, "fill")
"""A row of the selector: the matrix features and x's nonzero fraction (nnz(x) / cols)."""

_COUNTS = ("nnz", "rows", "cols", "col_std")
"""Columns that span orders of magnitude from 0 on: log10(1 + x) before scaling (col_std is 0 for a matrix
whose columns all hold as many entries, e.g. the transpose of a uniform graph)."""

DEFAULT_CROSSOVER = 0.05
"""Fill below which the sparse mode runs when no selector is trained for this GPU and dtype."""

FILL_GRID = np.logspace(-6, 0, 121)
"""Fills at which :meth:`ModeSelector.crossover_table` evaluates the SVM (20 per decade)."""

MODES = ("dense", "sparse")

TASK = "spmspv"
"""The selector's ``task`` in the ``models`` table and in shipped file names."""


def _log10_1p(X: np.ndarray) -> np.ndarray:
    return np.log10(1 + np.maximum(X, 0))


def _log10_fill(X: np.ndarray) -> np.ndarray:
    return np.log10(np.clip(X, 1e-9, 1))


def _pipeline(C: float = 10.0, gamma: float | str = "scale") -> Pipeline:
    counts = [SELECTOR_FEATURES.index(name) for name in _COUNTS]
    fill = [SELECTOR_FEATURES.index("fill")]
    log = ColumnTransformer([("counts", FunctionTransformer(_log10_1p), counts),
                             ("fill", FunctionTransformer(_log10_fill), fill)], remainder="passthrough")
    return Pipeline([("log", log), ("scale", StandardScaler()), ("svm", SVC(C=C, gamma=gamma))])


class ModeSelector(ClassifierMixin, BaseEstimator):
    """Predicts 'sparse' or 'dense' from rows of :data:`SELECTOR_FEATURES`.

    Parameters
    ----------
    Cs, gammas : candidate SVM parameters, picked by GroupKFold cross-validation in ``fit``
        (when ``groups`` name at least ``cv`` matrices; else the first of each).
    cv : folds of that cross-validation.
    """

    def __init__(self, *, Cs: Sequence[float] = (0.1, 1.0, 10.0),
                 gammas: Sequence[float | str] = ("scale", 0.01, 0.1), cv: int = 5) -> None:
        self.Cs = Cs
        self.gammas = gammas
        self.cv = cv

    def fit(self, X: Any, y: Sequence[str], *, sample_weight: Any = None,
            groups: Sequence[Any] | None = None) -> ModeSelector:
        """Learn from rows of features and each row's faster mode; ``groups`` (matrix fingerprints)
        keep one matrix's rows in one fold."""
        X, y = validate_data(self, X, np.asarray(y, dtype=object), reset=True, dtype=np.float64)
        if X.shape[1] != len(SELECTOR_FEATURES):
            raise InvalidConfigError(f"X needs the {len(SELECTOR_FEATURES)} columns {SELECTOR_FEATURES}")
        if unknown := set(y) - set(MODES):
            raise InvalidConfigError(f"unknown modes {sorted(unknown)}; modes are {MODES}")
        self.classes_ = np.unique(y)
        if len(self.classes_) == 1:
            raise InvalidConfigError(f"every row is {self.classes_[0]!r}: measure fills where the other mode wins")
        fit_params = {} if sample_weight is None else {"svm__sample_weight": np.asarray(sample_weight, float)}
        n_groups = len(set(groups)) if groups is not None else 0
        if n_groups >= max(2, self.cv):
            grid = GridSearchCV(_pipeline(), {"svm__C": list(self.Cs), "svm__gamma": list(self.gammas)},
                                cv=GroupKFold(n_splits=self.cv))
            grid.fit(X, y, groups=groups, **fit_params)
            self.pipeline_, self.best_params_ = grid.best_estimator_, grid.best_params_
        else:
            self.best_params_ = {"svm__C": self.Cs[0], "svm__gamma": self.gammas[0]}
            self.pipeline_ = _pipeline(self.Cs[0], self.gammas[0]).fit(X, y, **fit_params)
        self.n_train_ = len(y)
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "pipeline_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return self.pipeline_.predict(X)

    def crossover_table(self, features: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """(fills, modes) for one matrix: the predicted mode at each fill of :data:`FILL_GRID`."""
        row = [float(features[name]) for name in MATRIX_FEATURES]
        X = np.array([[*row, fill] for fill in FILL_GRID])
        return FILL_GRID, self.predict(X)


def default_table() -> tuple[np.ndarray, np.ndarray]:
    """The rule without a selector: sparse below :data:`DEFAULT_CROSSOVER`, dense from it on."""
    return FILL_GRID, np.where(FILL_GRID < DEFAULT_CROSSOVER, "sparse", "dense")


def mode_lookup(table: tuple[np.ndarray, np.ndarray]) -> Callable[[float], str]:
    """fill -> the mode of the table's grid point nearest to the fill on a log scale (a tie: the lower point).

    A bisection over the geometric midpoints of the grid, precomputed: a microsecond a call (BFS asks once a
    step, thousands of times on a large-diameter graph).
    """
    fills, modes = table
    cuts = np.sqrt(fills[1:] * fills[:-1]).tolist()
    names = [str(m) for m in modes]
    return lambda fill: names[bisect.bisect_left(cuts, fill)]



# -- training data, evaluation -----------------------------------------------------------------------


def training_rows(store: Store, *, device: str, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str],
                                                                   np.ndarray]:
    """(X, y, weight, groups, times) from the store's SpMSpV measurements for (device, dtype).

    One row per (matrix, x) measured in both modes; ``times`` holds (t_dense, t_sparse) per row.
    """
    rows = store.spmspv_trials(device=device, dtype=dtype)
    pairs: dict[tuple[str, int, int], dict[str, float]] = {}
    for r in rows:
        pairs.setdefault((r["fingerprint"], r["x_nnz"], r["x_seed"]), {})[r["mode"]] = r["time_s"]
    keys = [k for k, t in pairs.items() if set(t) == set(MODES)]
    if not keys:
        raise StoreError(f"the store has no SpMSpV measurements of both modes on {device!r} in {dtype}")
    feats = {fp: (store.matrix(fp) or {}).get("features") for fp in {k[0] for k in keys}}
    if missing := sorted(fp for fp, f in feats.items() if not f):
        raise StoreError(f"no features stored for {len(missing)} measured matrices, e.g. {missing[0]}")
    X = np.array([[feats[fp][n] for n in MATRIX_FEATURES] + [k / feats[fp]["cols"]] for fp, k, _ in keys])
    times = np.array([[pairs[k]["dense"], pairs[k]["sparse"]] for k in keys])
    y = np.where(times[:, 1] < times[:, 0], "sparse", "dense")
    weight = np.abs(np.log(times[:, 1] / times[:, 0]))
    return X, y, weight, [k[0] for k in keys], times


def evaluate(X: np.ndarray, y: np.ndarray, weight: np.ndarray, groups: Sequence[str], times: np.ndarray,
             *, cv: int = 5) -> dict[str, Any]:
    """Out-of-fold figures by GroupKFold over matrices, as in the paper's Table VII.

    For the SVM and three baselines (always sparse, always dense, the default
    crossover rule): accuracy, and total time over all rows relative to the
    per-row oracle (1.0 = never lost time), plus the worst matrix's ratio.
    """
    n_groups = len(set(groups))
    if n_groups < 2:
        raise InvalidConfigError(f"cross-validation needs at least 2 matrices, got {n_groups}")
    predicted = np.empty(len(y), dtype=object)
    for train, test in GroupKFold(n_splits=min(cv, n_groups)).split(X, y, groups):
        if len(set(y[train])) < 2:
            predicted[test] = y[train][0]
            continue
        model = ModeSelector(cv=cv).fit(X[train], y[train], sample_weight=weight[train],
                                        groups=[groups[i] for i in train])
        predicted[test] = model.predict(X[test])
    fill = X[:, SELECTOR_FEATURES.index("fill")]
    choices = {
        "svm": predicted,
        "always sparse": np.full(len(y), "sparse", dtype=object),
        "always dense": np.full(len(y), "dense", dtype=object),
        f"fill < {DEFAULT_CROSSOVER:g} rule": np.where(fill < DEFAULT_CROSSOVER, "sparse", "dense"),
    }
    oracle = times.min(axis=1)
    group_arr = np.asarray(groups, dtype=object)
    table = {}
    for name, choice in choices.items():
        t = np.where(choice == "sparse", times[:, 1], times[:, 0])
        per_matrix = [t[group_arr == g].sum() / oracle[group_arr == g].sum() for g in set(groups)]
        table[name] = {"accuracy": float(np.mean(choice == y)), "time_vs_oracle": float(t.sum() / oracle.sum()),
                       "worst_matrix_vs_oracle": float(max(per_matrix))}
    return {"rows": len(y), "matrices": n_groups, "table": table}


def train(store: Store, *, device: str, dtype: str, cv: int = 5) -> tuple[ModeSelector | None, dict[str, Any]]:
    """Evaluate (:func:`evaluate`), fit on every row and save to ``models`` the selector for (device, dtype)
    from the store's ``spmspv_trials``. Returns ``(model, report)``; the model is None (nothing saved) when
    one mode won every measurement (nothing to learn). StoreError when nothing is measured."""
    X, y, weight, groups, times = training_rows(store, device=device, dtype=dtype)
    report = evaluate(X, y, weight, groups, times, cv=cv)
    try:
        model = ModeSelector(cv=cv).fit(X, y, sample_weight=weight, groups=groups)
    except InvalidConfigError as exc:
        report["not_trained"] = str(exc)
        return None, report
    report["svm_params"] = {k: (v if isinstance(v, str) else float(v)) for k, v in model.best_params_.items()}
    save(store, model, device=device, dtype=dtype, metrics=report)
    return model, report


# -- storage: the models table and the shipped files of the SpMV selector (tuner.select.model), task 'spmspv' ---------


def save(store: Store, model: ModeSelector, *, device: str, dtype: str, metrics: Mapping[str, Any]) -> int:
    """Store a fitted selector for (device, dtype) as a new ``models`` row (task 'spmspv'); its id."""
    from tuner.select.model import save_model

    return save_model(store, model, device=device, dtype=dtype, metrics=metrics, task=TASK,
                      features=SELECTOR_FEATURES)


def ship(model: ModeSelector, *, device: str, dtype: str, metrics: Mapping[str, Any],
         folder: str | Path | None = None) -> Path:
    """Write a fitted selector as the one shipped for (device, dtype) (default folder: ``tuner/data``)."""
    from tuner.select.model import ship_model

    return ship_model(model, device=device, dtype=dtype, metrics=metrics, folder=folder, task=TASK,
                      features=SELECTOR_FEATURES)


def load(store: Store | None, *, device: str, dtype: str) -> tuple[ModeSelector | None, str]:
    """The newest selector for exactly (device, dtype): from the store, else shipped, else None.

    Returns ``(selector, source)`` with source 'trained', 'shipped' or 'default'.
    Selectors are pickles: only load stores and packages you trust.
    """
    from tuner.select.model import load_latest, load_shipped

    found = {"device": device, "dtype": dtype, "task": TASK, "features": SELECTOR_FEATURES}
    if store is not None and (model := load_latest(store, **found)) is not None:
        return model, "trained"
    if (model := load_shipped(**found)) is not None:
        return model, "shipped"
    return None, "default"
