"""How good the selector is on matrices it has not seen, against what the store measured.

Every matrix gets an out-of-fold prediction: cross-validation grouped by
fingerprint (GroupKFold), each fold's selector fitted on the other folds with
the classifier that ``tuner train`` kept. Each strategy's time on a matrix is
compared with the matrix's tuned best (its fastest verified trial), as the
fraction ``t_best / t_strategy`` (1 is the tuned best), summarized over the
matrices by its geometric mean and its 5th percentile (the worst 5%).

What the store knows of a predicted config: its time when that exact config
was measured on the matrix; otherwise the time of the predicted family's
default config, which tuning measures on every matrix (a stand-in). ``exact``
counts the matrices where the predicted config itself was measured: all of
them when the corpus measured a :mod:`tuner.select.portfolio` everywhere (the
selector scores only configs measured on most training matrices). The row
"predicted family, best params" is the upper bound of choosing the family
right. Times are single measurements taken while tuning (two independent
corpus runs on an H200 agreed within 1.4% on 90% of the configs both measured).

Baselines: cuSPARSE at its default (what ``plan()`` runs without a model); the
single family that, at its default config, does best over all matrices (chosen
on every matrix, so slightly optimistic); the same family tuned per matrix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from sklearn.model_selection import GroupKFold

from kernels import BASELINE, REGISTRY, config_key, get_family
from tuner.select.model import KernelSelector, TrainingTable

__all__ = ["Evaluation", "StrategyScore", "evaluate_selector"]


@dataclass(frozen=True)
class StrategyScore:
    """One strategy over the matrices whose time for it is known."""

    strategy: str
    accuracy: float | None  # the family it runs is the tuned best's family, as a fraction of matrices
    geomean: float  # geometric mean of t_best / t_strategy
    worst5: float  # 5th percentile of t_best / t_strategy
    matrices: int  # with a known time


@dataclass
class Evaluation:
    device: str
    dtype: str
    matrices: int
    folds: int
    classifier: str
    exact: int  # matrices where the predicted config itself was measured
    rows: list[StrategyScore] = field(default_factory=list)

    def as_metrics(self) -> dict[str, Any]:
        """Plain numbers for the model's ``metrics`` (and the shipped file's header)."""
        def plain(row: StrategyScore) -> dict[str, Any]:  # NaN (no known time) as null: metrics are strict JSON
            return {k: None if isinstance(v, float) and not np.isfinite(v) else v for k, v in asdict(row).items()}

        return {"matrices": self.matrices, "folds": self.folds, "classifier": self.classifier, "exact": self.exact,
                "strategies": [plain(r) for r in self.rows]}


def _score(name: str, best: np.ndarray, times: np.ndarray, right: np.ndarray | None) -> StrategyScore:
    known = np.isfinite(times)
    fraction = best[known] / times[known]
    return StrategyScore(
        strategy=name,
        accuracy=None if right is None else float(np.mean(right)),
        geomean=float(np.exp(np.mean(np.log(fraction)))) if fraction.size else float("nan"),
        worst5=float(np.percentile(fraction, 5)) if fraction.size else float("nan"),
        matrices=int(known.sum()),
    )


def out_of_fold(table: TrainingTable, *, classifier: str, cv: int = 5,
                random_state: int | None = 0) -> list[tuple[str, dict[str, Any]]]:
    """A prediction for every row of ``table`` by a selector that did not see its matrix."""
    groups = np.asarray(table.fingerprints, dtype=object)
    predicted: list[tuple[str, dict[str, Any]] | None] = [None] * len(table)
    for train, test in GroupKFold(n_splits=min(cv, len(set(table.fingerprints)))).split(table.X, groups=groups):
        sel = KernelSelector(classifier=classifier, random_state=random_state).fit(
            table.X[train], table.kernels[train], [table.params[i] for i in train], groups=groups[train],
            measured=[table.measured[i] for i in train])
        for i, p in zip(test, sel.predict(table.X[test]), strict=True):
            predicted[i] = p
    return predicted  # type: ignore[return-value]


def evaluate_selector(table: TrainingTable, *, device: str, dtype: str, classifier: str,
                      cv: int = 5, random_state: int | None = 0) -> Evaluation:
    """Out-of-fold accuracy and time fractions of the selector and the baselines (see the module's doc)."""
    if classifier not in ("gradient_boosting", "random_forest", "svm"):
        classifier = "random_forest"  # 'constant' (one family everywhere): each fold is constant too
    measured = dict(zip(table.fingerprints, table.measured, strict=True))
    predicted = out_of_fold(table, classifier=classifier, cv=cv, random_state=random_state)
    best = np.asarray(table.times, dtype=float)
    families = sorted(REGISTRY)
    defaults = {f: config_key(f, get_family(f).space.defaults()) for f in families}
    nan = float("nan")

    def family_best(fp: str, family: str) -> float:
        return min((t for k, t in measured[fp].items() if k.startswith(family + "{")), default=nan)

    default_time = {f: np.array([measured[fp].get(defaults[f], nan) for fp in table.fingerprints]) for f in families}
    tuned_time = {f: np.array([family_best(fp, f) for fp in table.fingerprints]) for f in families}
    exact = 0
    chosen, chosen_family_best = [], []
    for fp, (kernel, params) in zip(table.fingerprints, predicted, strict=True):
        t = measured[fp].get(config_key(kernel, params))
        exact += t is not None
        chosen.append(t if t is not None else measured[fp].get(defaults.get(kernel, ""), nan))
        chosen_family_best.append(family_best(fp, kernel))
    right = np.array([k for k, _ in predicted], dtype=object) == table.kernels

    def rank(times: np.ndarray) -> tuple[float, float]:
        """Matrices it runs on (its default may fail on some), then its geometric mean there."""
        known = np.isfinite(times)
        return float(known.mean()), float(np.mean(np.log(best[known] / times[known]))) if known.any() else -np.inf

    fixed = max(families, key=lambda f: rank(default_time[f]))
    rows = [
        _score("selector: predicted config", best, np.asarray(chosen, dtype=float), right),
        _score("selector: predicted family, best params", best, np.asarray(chosen_family_best, dtype=float), right),
        _score(f"{BASELINE} default (no model)", best, default_time[BASELINE], table.kernels == BASELINE),
        _score(f"best fixed family at default: {fixed}", best, default_time[fixed], table.kernels == fixed),
        _score(f"{fixed}, best params per matrix", best, tuned_time[fixed], table.kernels == fixed),
    ]
    return Evaluation(device, dtype, len(table), min(cv, len(set(table.fingerprints))), classifier, exact, rows)
