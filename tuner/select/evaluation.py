"""How well :class:`tuner.select.model.KernelSelector` ranks on matrices, and kinds of structure, it has not seen.

Every matrix gets an out-of-fold ranking, from a selector fitted without it:
either GroupKFold by matrix (5 folds), or leaving out its whole structure family
(the generator kind of a synthetic matrix, "real" for the others: does the
selector generalize to structures outside its corpus?). Each strategy's time on a
matrix is compared with its tuned best (the fastest verified trial of any
config), as ``t_best / t_strategy`` (1 is the tuned best), summarized by the
geometric mean and the 5th percentile over the matrices.

Strategies:

- ``first``: the selector's first config, or its second opinion's where it has one (what a recommendation
  answers, :attr:`Ranking.first`). When the store holds no time for it on the matrix
  (it failed there), it counts as the matrix's slowest measured time times 2,
  as in training; ``unmeasured`` counts those;
- ``predict`` (where a bound ``cheap`` is given): what ``plan(effort="predict")`` runs
  (:func:`~tuner.select.model.predicted`): the first config that is cuSPARSE or expected to prepare within
  ``cheap`` SpMVs, held to cuSPARSE's csr_alg1 on the nearest training matrices (counted as ``first`` is where
  unmeasured), else cuSPARSE (its best algorithm);
- ``race<k>``: the race of its first k configs beside cuSPARSE csr_alg1 and csr_alg2 (always
  raced): the best time measured among them. ``prepare_spmvs`` is the race's
  expected preparation cost, the sum of the raced configs' ``prepare_spmvs``
  (the mean over the matrices);
- ``cusparse``: cuSPARSE, the best of its algorithms.

Times are single measurements taken while tuning.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from sklearn.model_selection import GroupKFold

from common.errors import InvalidConfigError, StoreError
from kernels import BASELINE_CONFIGS, config_key
from tuner.matrix.features import FEATURE_NAMES
from tuner.select.corpus import read_corpus
from tuner.select.model import LARGE_NNZ, DeviceSpec, KernelSelector, predicted

if TYPE_CHECKING:
    from db.store import Store

__all__ = [
    "BELOW_CUSPARSE",
    "CV_KINDS",
    "RACED_ALWAYS",
    "Evaluation",
    "FamilyScore",
    "RankingTable",
    "StrategyScore",
    "corpus_table",
    "cv_folds",
    "evaluate_selector",
    "out_of_fold",
    "picked_speed",
    "ranking_table",
    "structure_family",
]

BELOW_CUSPARSE = 0.97
"""A strategy is counted below cuSPARSE on a matrix where it runs at less than this times cuSPARSE's speed: the
bound issue #18 sets ``plan()``."""

RACED_ALWAYS: tuple[str, ...] = tuple(config_key(kernel, params) for kernel, params in BASELINE_CONFIGS)
"""The configs every race runs beside the selector's shortlist (their keys)."""

CV_KINDS = ("kfold", "lofo")
"""GroupKFold by matrix (5 folds unless told), and leave-one-structure-family-out."""


def structure_family(name: str, kinds: Sequence[str] | None = None) -> str:
    """The generator kind of a synthetic matrix: its name starts with ``<kind>-``, ``kind`` one of ``kinds``
    (default: :data:`tuner.matrix.generate.KINDS` as it is when called), or is named as generated matrices are,
    ``<kind>-<size>[-<option>...]-s<seed>`` (``bench/grow_corpus.py``'s, of generators outside the package);
    else "real"."""
    if kinds is None:
        from tuner.matrix.generate import KINDS

        kinds = list(KINDS)
    prefix, dash, _ = name.partition("-")
    return prefix if dash and prefix in kinds or _GENERATED.fullmatch(name) else "real"


_GENERATED = re.compile(r"[a-z][a-z0-9]*-\d+(?:-[^-]+)*-s\d+")
"""A generated matrix's name (:func:`structure_family`): no real matrix's in the shared set has this form."""


@dataclass(frozen=True)
class RankingTable:
    """One row per matrix measured on (device, dtype): its features, times and prepare times per config key."""

    fingerprints: list[str]
    names: list[str]
    families: list[str]
    X: np.ndarray  # features in FEATURE_NAMES order
    times: list[dict[str, float]]  # config key -> fastest verified seconds
    prepare: list[dict[str, float]]  # config key -> prepare seconds of that fastest trial
    device: DeviceSpec
    dtype: str

    def __len__(self) -> int:
        return len(self.fingerprints)


def _table(times: dict[str, dict[str, float]], prepare: dict[str, dict[str, float]],
           matrices: Callable[[str], dict[str, Any] | None], record: dict[str, Any], dtype: str,
           kinds: Sequence[str] | None) -> RankingTable:
    """The table of the measured matrices whose record (name, features) lists every feature."""
    fps, names, X = [], [], []
    for fp in sorted(times):
        matrix = matrices(fp)
        values = [matrix["features"].get(n) for n in FEATURE_NAMES] if matrix else [None]
        if any(v is None for v in values):
            continue
        fps.append(fp)
        names.append(matrix["name"])
        X.append(values)
    return RankingTable(fps, names, [structure_family(n, kinds) for n in names],
                        np.asarray(X, dtype=np.float64).reshape(len(fps), len(FEATURE_NAMES)),
                        [times[fp] for fp in fps], [prepare.get(fp, {}) for fp in fps],
                        DeviceSpec.from_record(record), dtype)


def _keep_fastest(times: dict[str, dict[str, float]], prepare: dict[str, dict[str, float]], trial: dict[str, Any]
                  ) -> None:
    """Record a verified ok trial when it is its config's fastest on its matrix so far."""
    fp, key, t = trial["fingerprint"], config_key(trial["kernel"], trial["params"]), trial["time_s"]
    if t < times.setdefault(fp, {}).get(key, np.inf):
        times[fp][key] = t
        if trial.get("prepare_s") is not None:
            prepare.setdefault(fp, {})[key] = trial["prepare_s"]
        else:
            prepare.get(fp, {}).pop(key, None)


def ranking_table(store: Store, *, device: str, dtype: str, kinds: Sequence[str] | None = None) -> RankingTable:
    """The matrices the store measured on ``device`` in ``dtype`` with their features (those lacking one are
    left out), the fastest verified time of each config and that trial's prepare time."""
    record = store.device(device)
    if record is None:
        raise StoreError(f"unknown device {device!r}; known: {[d['id'] for d in store.devices()]}")
    times: dict[str, dict[str, float]] = {}
    prepare: dict[str, dict[str, float]] = {}
    rows = store.db.execute(
        "select fingerprint, kernel, params, time_s, prepare_s from trials where device = ? and dtype = ? "
        "and state = 'ok' and verified = 1 and time_s > 0", [device, dtype])
    for fp, kernel, params, time_s, prepare_s in rows:
        _keep_fastest(times, prepare, {"fingerprint": fp, "kernel": kernel, "params": json.loads(params),
                                       "time_s": time_s, "prepare_s": prepare_s})
    return _table(times, prepare, store.matrix, record, dtype, kinds)


def corpus_table(path: str | os.PathLike[str], *, dtype: str, device: str | None = None,
                 kinds: Sequence[str] | None = None) -> RankingTable:
    """:func:`ranking_table` straight from a corpus file (:mod:`tuner.select.corpus`), without a store; ``device``
    may be left out when the file holds one."""
    devices: dict[str, dict[str, Any]] = {}
    matrices: dict[str, dict[str, Any]] = {}
    trials: list[dict[str, Any]] = []
    for kind, record in read_corpus(path):
        if kind == "device":
            devices[record["id"]] = record
        elif kind == "matrix":
            matrices[record["fingerprint"]] = record
        elif kind == "trial" and record.get("state") == "ok" and record.get("verified") and record["dtype"] == dtype:
            trials.append(record)
    if device is None and len(devices) != 1:
        raise InvalidConfigError(f"{path} holds the devices {sorted(devices)}: name one")
    device = next(iter(devices)) if device is None else device
    if device not in devices:
        raise InvalidConfigError(f"{path} holds no device {device!r}; it holds {sorted(devices)}")
    times: dict[str, dict[str, float]] = {}
    prepare: dict[str, dict[str, float]] = {}
    for trial in trials:
        if trial["device"] == device and trial.get("time_s", 0) > 0:
            _keep_fastest(times, prepare, trial)
    return _table(times, prepare, matrices.get, devices[device], dtype, kinds)


@dataclass(frozen=True)
class Ranking:
    """A matrix's out-of-fold ranking: config keys in the selector's order (first the one to run), each one's
    prepare_spmvs, where asked for with a preparation budget the key ``plan(effort="predict")`` runs
    (:func:`~tuner.select.model.predicted`; None: cuSPARSE's default), and the key of the race config its second
    opinion puts before the ranking's first (:meth:`~tuner.select.model.KernelSelector.second_opinion`; None: it
    does not)."""

    keys: list[str]
    prepare_spmvs: dict[str, float]
    predicted: str | None = None
    second: str | None = None

    @property
    def first(self) -> str:
        """What a recommendation answers (:func:`tuner.execute.choice.choose`): the second opinion's config where
        it has one, else the ranking's first."""
        return self.second or self.keys[0]


def cv_folds(table: RankingTable, cv: str, n_splits: int = 5) -> list[np.ndarray]:
    """Test rows of each fold (``n_splits`` folds for kfold; one family each for lofo)."""
    if cv == "lofo":
        if len(set(table.families)) < 2:
            raise InvalidConfigError(f"leaving a family out needs 2 families or more; all are {table.families[0]!r}")
        families = np.asarray(table.families, dtype=object)
        return [np.flatnonzero(families == f) for f in sorted(set(table.families))]
    if cv == "kfold":
        splitter = GroupKFold(n_splits=min(n_splits, len(table)))
        return [test for _, test in splitter.split(table.X, groups=table.fingerprints)]
    raise InvalidConfigError(f"unknown cross-validation {cv!r}; choose one of {list(CV_KINDS)}")


def fitted_on(table: RankingTable, rows: np.ndarray, make: Callable[[], KernelSelector] = KernelSelector
              ) -> KernelSelector:
    """A selector (``make()``) fitted on these ``rows`` of ``table``: their features, times, prepare times and
    structure families."""
    return make().fit(table.X[rows], [table.times[i] for i in rows], dtype=table.dtype, device=table.device,
                      prepare_times=[table.prepare[i] for i in rows], groups=[table.families[i] for i in rows])


def out_of_fold(table: RankingTable, *, cv: str, make: Callable[[], KernelSelector] = KernelSelector,
                folds: int = 5, cheap: float | None = None) -> list[Ranking]:
    """Each row's ranking by a selector (``make()``) fitted on the other folds of ``cv`` (:data:`CV_KINDS`);
    with ``cheap``, also what ``plan(effort="predict")`` runs with that preparation budget."""
    out: list[Ranking | None] = [None] * len(table)
    for test in cv_folds(table, cv, folds):
        selector = fitted_on(table, np.setdiff1d(np.arange(len(table)), test), make)
        keys = selector.config_keys()
        spmvs = dict(zip(keys, selector.prepare_spmvs_.tolist(), strict=True))
        for i, order in zip(test, selector.rank_order(table.X[test]).tolist(), strict=True):
            ranking = selector.rank(table.X[i], outcomes=cheap is not None)
            pick = predicted(ranking, cheap) if cheap is not None else None
            second = selector.second_opinion(table.X[i], ranking[0])
            out[i] = Ranking([keys[j] for j in order], spmvs,
                             None if pick is None else config_key(pick.kernel, pick.params),
                             None if second is None else config_key(second.kernel, second.params))
    return out  # type: ignore[return-value]


@dataclass(frozen=True)
class StrategyScore:
    """One strategy over the matrices where it has a time."""

    strategy: str
    geomean: float  # of t_best / t_strategy
    worst5: float  # its 5th percentile
    matrices: int
    unmeasured: int = 0  # first configs with no time on the matrix (counted as its slowest times 2)
    prepare_spmvs: float | None = None  # a race's expected preparation cost, mean over the matrices
    below_cusparse: int = 0  # matrices where it runs below 0.97x cuSPARSE's best (BELOW_CUSPARSE)
    # over the matrices of LARGE_NNZ nonzeros or more alone (NaN: none), where users' matrices are and the held-out
    # first config misses most (0.857 of the tuned best on the H100's corpus in float64 against 0.967 on the
    # smaller ones, bench/results/2026-11-28_lofo-large-57.txt)
    large_geomean: float = float("nan")
    large_matrices: int = 0


@dataclass(frozen=True)
class FamilyScore:
    """The geometric mean of t_best / t_strategy of each strategy over one structure family."""

    family: str
    matrices: int
    geomean: dict[str, float]


@dataclass
class Evaluation:
    """Out-of-fold scores of the selector's strategies and cuSPARSE, overall and per structure family."""

    device: str
    dtype: str
    cv: str
    matrices: int
    folds: int
    rows: list[StrategyScore] = field(default_factory=list)
    families: list[FamilyScore] = field(default_factory=list)

    def as_metrics(self) -> dict[str, Any]:
        """Plain JSON numbers (NaN as null)."""
        def plain(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, list):
                return [plain(v) for v in value]
            return None if isinstance(value, float) and not np.isfinite(value) else value

        return plain({"device": self.device, "dtype": self.dtype, "cv": self.cv, "matrices": self.matrices,
                      "folds": self.folds, "strategies": [asdict(r) for r in self.rows],
                      "families": [asdict(f) for f in self.families]})

    def format_table(self) -> str:
        """The scores as two text tables: the strategies, then the geometric means per family."""
        head = f"{self.device}, {self.dtype}, {self.cv} ({self.folds} folds, {self.matrices} matrices)"
        lines = [head, f"{'strategy':<28}{'geomean':>9}{'worst5%':>9}{'n':>6}{'unmeas.':>9}{'prep.spmvs':>12}"
                       f"{'<0.97x cus.':>13}{'large':>9}{'n':>6}"]
        for r in self.rows:
            prep = "" if r.prepare_spmvs is None else f"{r.prepare_spmvs:.0f}"
            lines.append(f"{r.strategy:<28}{r.geomean:>9.3f}{r.worst5:>9.3f}{r.matrices:>6}{r.unmeasured:>9}"
                         f"{prep:>12}{r.below_cusparse:>13}{r.large_geomean:>9.3f}{r.large_matrices:>6}")
        names = [r.strategy for r in self.rows]
        lines += ["", f"{'family':<12}{'n':>5}" + "".join(f"{n:>10}" for n in names)]
        for f in self.families:
            lines.append(f"{f.family:<12}{f.matrices:>5}" + "".join(f"{f.geomean[n]:>10.3f}" for n in names))
        return "\n".join(lines)


def picked_speed(times: Sequence[Mapping[str, float]], keys: Sequence[str]) -> np.ndarray:
    """Each row's fastest time over the time of its ``keys`` config (1: the tuned best); a config never measured
    on the row counts as the row's slowest times 2, as the selector learns it."""
    return np.array([min(t.values()) / t.get(k, 2 * max(t.values())) for t, k in zip(times, keys, strict=True)])


def _geomean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.exp(np.mean(np.log(x)))) if x.size else float("nan")


def _fraction(best: np.ndarray, t: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return best / t


def evaluate_selector(table: RankingTable, *, cv: str, ks: Sequence[int] = (2, 3, 4, 5),
                      make: Callable[[], KernelSelector] = KernelSelector, folds: int = 5,
                      cheap: float | None = None) -> Evaluation:
    """Out-of-fold scores of the selector's first config, its first config cheap to prepare (with ``cheap``,
    the SpMVs of ``plan(effort="predict")``'s bound), races of its first ``ks`` configs and cuSPARSE on
    ``table`` under ``cv`` (:data:`CV_KINDS`; ``folds`` for kfold); see the module's doc."""
    if len(table) < 2:
        raise InvalidConfigError(f"evaluation needs at least 2 matrices, got {len(table)}")
    rankings = out_of_fold(table, cv=cv, make=make, folds=folds, cheap=cheap)
    nan = float("nan")
    best = np.array([min(t.values()) for t in table.times])
    first_t = np.array([times.get(r.first, nan) for times, r in zip(table.times, rankings, strict=True)])
    unmeasured = ~np.isfinite(first_t)
    first_t = np.where(unmeasured, [2 * max(t.values()) for t in table.times], first_t)
    fractions: dict[str, np.ndarray] = {"first": _fraction(best, first_t)}
    cusparse = np.array([min((s for c, s in times.items() if c.startswith("cusparse{")), default=nan)
                         for times in table.times])
    if cheap is not None:
        fractions["predict"] = _fraction(best, np.array([
            base if r.predicted is None else times.get(r.predicted, 2 * max(times.values()))
            for r, times, base in zip(rankings, table.times, cusparse, strict=True)]))
    prepare: dict[str, float] = {}
    for k in ks:
        raced = [[*r.keys[:k], *(c for c in RACED_ALWAYS if c not in r.keys[:k])] for r in rankings]
        t = np.array([min((times[c] for c in keys if c in times), default=nan)
                      for times, keys in zip(table.times, raced, strict=True)])
        fractions[f"race{k}"] = _fraction(best, t)
        cost = [np.nansum([r.prepare_spmvs.get(c, nan) for c in keys]) for r, keys in zip(rankings, raced,
                                                                                         strict=True)]
        prepare[f"race{k}"] = float(np.mean(cost))
    fractions["cusparse"] = _fraction(best, cusparse)
    large = table.X[:, FEATURE_NAMES.index("nnz")] >= LARGE_NNZ

    def score(name: str, f: np.ndarray) -> StrategyScore:
        ok = f[np.isfinite(f)]
        with np.errstate(invalid="ignore"):
            below = int(np.sum(f / fractions["cusparse"] < BELOW_CUSPARSE))
        return StrategyScore(name, _geomean(ok), float(np.percentile(ok, 5)) if ok.size else nan, int(ok.size),
                             int(unmeasured.sum()) if name == "first" else 0, prepare.get(name), below,
                             _geomean(f[large]), int(np.isfinite(f[large]).sum()))

    families = np.asarray(table.families, dtype=object)
    per_family = [FamilyScore(fam, int((families == fam).sum()),
                              {name: _geomean(f[families == fam]) for name, f in fractions.items()})
                  for fam in sorted(set(table.families))]
    return Evaluation(table.device.id, table.dtype, cv, len(table), len(cv_folds(table, cv, folds)),
                            [score(n, f) for n, f in fractions.items()], per_family)
