"""Which config ``plan(A)`` runs, and where it comes from: tuned, raced, predicted or the default.

Where the config comes from is part of the answer (``ex.source``):
``'tuned'`` when the store's best config for this matrix's fingerprint on this
device model and dtype was found by tuning (or a survey), ``'raced'`` when a
race at plan time found it (:mod:`tuner.execute.race`), ``'predicted'`` when
nothing is measured and a selector ranked the configs
(:mod:`tuner.select.model`), ``'default'`` otherwise (cuSPARSE, the safe
choice), and ``'cpu'`` on a machine without a GPU, where SciPy computes y. The
service's ``/recommend`` asks :func:`choose`, which measures nothing.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.errors import InvalidConfigError
from db.store import Store
from kernels import BASELINE, canonical, get_family
from tuner.execute.race import MARGIN
from tuner.execute.race import STUDY as RACE_STUDY
from tuner.matrix.features import FEATURE_NAMES
from tuner.select.shipped import ASK_STORE, StoredRow, may_predict

if TYPE_CHECKING:
    from kernels._narrow import PickGate
    from tuner.matrix.features import QueuedFeatures
    from tuner.measure.backend import GpuBackend
    from tuner.select.model import DeviceSpec, KernelSelector, RankedConfig
    from tuner.select.rank_gpu import QueuedRank


@dataclass(frozen=True)
class Choice:
    """A kernel config and where it came from ('tuned', 'raced', 'predicted', 'default' or 'cpu'); for a
    measured one, its time and cuSPARSE's (may be unknown); for a predicted one, the GFLOP/s the selector
    expects and its confidence (the share of its trees that rank this config first); ``basis`` names the
    selector that ranked the configs (a predicted or raced choice)."""

    kernel: str
    params: dict[str, Any]
    source: str
    expected_gflops: float | None = None
    time_s: float | None = None
    cusparse_time_s: float | None = None
    confidence: float | None = None
    basis: str | None = None


def stored_choice(store: Store | None, fp: str, *, device: str, dtype: str) -> Choice | None:
    """The store's best for (fingerprint, device, dtype), 'raced' when a race measured it, else 'tuned'.
    A raced best that is not :data:`~tuner.execute.race.MARGIN` faster than cuSPARSE's best lap gives
    cuSPARSE, as the race itself did: the same matrix gets the same answer from the race and from the store."""
    best = store.best(fp, device=device, dtype=dtype) if store is not None else None
    if best is None:
        return None
    if store.db["trials"].get(best["trial_id"])["study"] != RACE_STUDY:
        return Choice(best["kernel"], best["params"], "tuned", best["gflops"], best["time_s"],
                      best["cusparse_time_s"])
    base = best["cusparse_time_s"]
    if best["kernel"] != BASELINE and base and best["time_s"] > (1 - MARGIN) * base:
        laps = [t for t in store.trials(fp, device=device, dtype=dtype, kernel=BASELINE) if t["state"] == "ok"]
        if laps:
            best = min(laps, key=lambda t: t["time_s"])
    return Choice(best["kernel"], best["params"], "raced", best["gflops"], best["time_s"], base)


def default_choice() -> Choice:
    """cuSPARSE at its default: what runs when nothing is measured or predicted."""
    return Choice(BASELINE, get_family(BASELINE).space.defaults(), "default")


NO_SELECTOR = "no selector for this GPU's architecture and dtype"


def selector_for(store: Store | None, *, device: str, dtype: str, backend: GpuBackend | None = None,
                 newest: StoredRow = ASK_STORE) -> tuple[KernelSelector | None, DeviceSpec | None, str]:
    """The selector that ranks configs for ``device`` in ``dtype`` as ``(model, spec, basis)``
    (:func:`tuner.select.model.find_selector`), or ``(None, None, why not)``: what :func:`rank_configs` ranks
    with, found apart so that ``plan()`` can find it while the GPU describes the matrix. ``newest``: the store's
    newest selector row for them, where the caller asked for it already."""
    if not may_predict(store, device, dtype, newest):
        return None, None, NO_SELECTOR
    from tuner.select.model import find_selector  # scikit-learn only when a selector is stored or shipped

    found = find_selector(store, device=device, dtype=dtype, backend=backend, newest=newest)
    return found if found is not None else (None, None, NO_SELECTOR)


def rank_configs(store: Store | None, *, device: str, dtype: str, features: Mapping[str, float],
                 backend: GpuBackend | None = None, outcomes: bool = False,
                 selector: tuple[KernelSelector | None, DeviceSpec | None, str] | None = None
                 ) -> tuple[list[RankedConfig] | None, str]:
    """The configs in the selector's order on ``device`` (first the one to run,
    :meth:`tuner.select.model.KernelSelector.rank`), and which selector ranked them; ``(None, reason)`` without
    one for this device's architecture and dtype. ``outcomes``: with each config's outcomes on the nearest
    training matrices (what a race's shortlist draws on). ``selector``: :func:`selector_for`'s answer for this
    device and dtype, where the caller found it already.

    The selector is the store's newest for exactly this device and dtype, else the one shipped for it,
    else one shipped for another GPU of the same architecture, whose expectations are then carried over
    by this device's copy bandwidth, L2 size and SMs (:class:`tuner.select.model.DeviceSpec`; measured on
    ``backend`` when the store has no record of the device).
    """
    if not set(FEATURE_NAMES) <= set(features):
        return None, NO_SELECTOR
    model, spec, basis = selector or selector_for(store, device=device, dtype=dtype, backend=backend)
    if model is None:
        return None, basis
    try:
        ranking = model.rank(features, device=spec, outcomes=outcomes)
    except InvalidConfigError:  # a selector trained on other features: unusable until retrained
        return None, f"{basis} cannot rank this matrix"
    return _registered(model, ranking), basis


class QueuedRanking:
    """:func:`queue_ranking`'s answer: called with the features read back, :func:`rank_configs`' answer, or None
    where the kernel's features differ from them (then :func:`rank_configs` ranks). ``rows_gate``: the kernel's
    pick on the GPU where it picks for a prediction and may pick a config that takes the rows' 16-bit columns
    (:attr:`tuner.select.rank_gpu.QueuedRank.rows_gate`), else None."""

    def __init__(self, model: KernelSelector, basis: str, pending: QueuedRank, *, pick: bool, outcomes: bool) -> None:
        self._model, self._basis, self._pending, self._pick, self._outcomes = model, basis, pending, pick, outcomes
        self.rows_gate: PickGate | None = pending.rows_gate

    def __call__(self, features: Mapping[str, float]) -> tuple[list[RankedConfig] | None, str] | None:
        model, basis, parts = self._model, self._basis, self._pending()
        if parts.features.tolist() != [features[name] for name in FEATURE_NAMES]:
            return None
        if self._pick:
            chosen = parts.pick
            return (model.ranked([chosen], parts.expected, parts.votes) if chosen is not None else None), basis
        order = parts.order
        ranking = model.ranked(order, parts.expected, parts.votes,
                               model.outcomes_of(parts.drawn, order) if self._outcomes else None)
        return _registered(model, ranking), basis


def queue_ranking(selector: tuple[KernelSelector | None, DeviceSpec | None, str], queued: QueuedFeatures, *,
                  outcomes: bool = False, prepare_budget: float | None = None) -> QueuedRanking | None:
    """:func:`rank_configs` with ``selector`` (:func:`selector_for`'s answer) queued on the GPU behind the
    features' kernels (:mod:`tuner.select.rank_gpu`), or None where it cannot be (no selector, features not
    computed on the GPU, a selector the kernel does not take). With ``prepare_budget`` (``plan(effort="predict")``),
    the kernel also picks what :func:`ranked_choice` picks with that budget, and the ranking is that config alone
    (none where none qualifies): the some seventy configs, and the outcomes predict holds its pick to, are neither
    read back nor built (0.1-0.2 ms of a plan on the GPU machines' hosts)."""
    model, spec, basis = selector
    if model is None or queued.on_device is None:
        return None
    from tuner.select.rank_gpu import queue_rank, takes  # CuPy: the features are on the GPU

    if not takes(model):
        return None
    pick = prepare_budget is not None and _ranks_valid_configs_only(model)  # else the pick could be unregistered
    pending = queue_rank(model, queued.on_device, device=spec, prepare_budget=prepare_budget if pick else None)
    return QueuedRanking(model, basis, pending, pick=pick, outcomes=outcomes)


def _registered(model: Any, ranking: list[RankedConfig]) -> list[RankedConfig] | None:
    """``ranking`` without the configs the registry no longer holds; None where none is left."""
    if not _ranks_valid_configs_only(model):
        ranking = [r for r in ranking if _valid(r.kernel, r.params)]
    return ranking or None


_ALL_VALID: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _ranks_valid_configs_only(model: Any) -> bool:
    """Whether every config ``model`` ranks is in the registry still (once a model and process: the usual case,
    where no config of a ranking needs checking)."""
    if (known := _ALL_VALID.get(model)) is None:
        known = _ALL_VALID[model] = all(_valid(kernel, params) for kernel, params in model.configs_)
    return known


def _valid(kernel: str, params: Mapping[str, Any]) -> bool:
    """Whether a config the selector learned is still in the registry (it may predate a change of it)."""
    return _valid_key(kernel, tuple(sorted(params.items())))


@functools.lru_cache(maxsize=4096)
def _valid_key(kernel: str, params: tuple[tuple[str, Any], ...]) -> bool:
    """:func:`_valid`, once a process per config (every plan() ranks the same few dozen)."""
    try:
        get_family(kernel).space.validate(dict(params), family=kernel)
    except InvalidConfigError:
        return False
    return True


def ranked_choice(ranking: Sequence[RankedConfig], basis: str, *, nnz: float,
                  prepare_budget: float | None = None) -> Choice:
    """The selector's first config, as a prediction (for a matrix of ``nnz`` nonzeros), with the family's
    defaults filled in where the selector learned it before a parameter was added (what runs); with
    ``prepare_budget`` (``plan(effort="predict")``), :func:`~tuner.select.model.predicted`'s: the first that is
    cuSPARSE or expected to prepare within that many SpMVs, held to cuSPARSE on the nearest training matrices
    where the ranking carries their outcomes (cuSPARSE's default when no config qualifies)."""
    first = ranking[0]
    if prepare_budget is not None:
        from tuner.select.model import predicted

        first = predicted(ranking, prepare_budget)
        if first is None:
            return default_choice()
    gflops = 2 * nnz / first.expected_s / 1e9 if first.expected_s else None
    return Choice(first.kernel, canonical(first.kernel, first.params), "predicted", expected_gflops=gflops,
                  confidence=first.votes, basis=basis)


def choose(fp: str, *, store: Store | None, device: str, dtype: str, use_tuned: bool = True,
           features: Mapping[str, float] | None = None) -> Choice:
    """The config recommended without measuring anything: the stored best for (fingerprint, device,
    dtype), else the selector's first config for ``features`` or, where its second opinion expects the race
    config of a family it does not rank (csr5) to be faster, that config
    (:meth:`~tuner.select.model.KernelSelector.second_opinion`), else the default.

    ``use_tuned=False`` gives what plan() would predict for a matrix it has never
    tuned (the benchmark compares that with the tuned best).
    """
    stored = stored_choice(store, fp, device=device, dtype=dtype) if use_tuned else None
    if stored is not None:
        return stored
    if features is not None:
        selector = selector_for(store, device=device, dtype=dtype)
        ranking, basis = rank_configs(store, device=device, dtype=dtype, features=features, selector=selector)
        if ranking:
            model, spec, _ = selector
            second = model.second_opinion(features, ranking[0], device=spec) if model is not None else None
            if second is None:
                return ranked_choice(ranking, basis, nnz=features["nnz"])
            return ranked_choice([second, *ranking], f"{basis}, whose second opinion expects {second.kernel} faster "
                                 f"than its first config ({ranking[0].kernel})", nnz=features["nnz"])
    return default_choice()


__all__ = ["NO_SELECTOR", "Choice", "QueuedRanking", "choose", "default_choice", "queue_ranking", "rank_configs",
           "ranked_choice", "selector_for", "stored_choice"]
