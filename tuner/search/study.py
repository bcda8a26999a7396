"""A study's bookkeeping: its name, the attrs its trials carry, and the budget of N finished trials workers share.

One study per (matrix fingerprint, device model, dtype, registry version)
(:func:`study_name`) lives in optuna's storage. The loop (:mod:`tuner.search.loop`)
keeps every trial's record in its user attrs under the names here, and with
``total=N`` asks for trials only while the study's :class:`Budget` is open;
tune-many's workers (:mod:`tuner.search.worker`) and ``tuner sync``
(:mod:`tuner.search.sync`) read the same names and budgets back.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import optuna
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState

from kernels import REGISTRY

if TYPE_CHECKING:
    from tuner.measure.backend import DeviceInfo

RECORD_ATTR = "record"  # a trial's user attr holding its full store row (tune() sets it for every measurement)
UID_ATTR = "uid"  # a trial's user attr: a unique id, set right after ask(); the store's trial_uid
CACHED_ATTR = "cached"  # a trial told the value an earlier trial of the study measured for the same config
SOURCE_ATTR = "source"  # a study's user attr: the key of the generated matrix it tunes (tune-many skips by it)
DEFAULT_ATTR = "default"  # a trial enqueued by tune(total=N): a family's default or a config of its `enqueue`
SURPLUS_ATTR = "surplus"  # a trial asked past the budget and pruned unmeasured
FINISHED = (TrialState.COMPLETE, TrialState.FAIL)


def registry_version() -> str:
    """A short hash of every family's name and space: optuna needs fixed distributions
    within a study, so a change to the registry starts new studies (the store keeps the old trials)."""
    text = json.dumps({n: f.space.to_dict() for n, f in sorted(REGISTRY.items())}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def study_name(fp: str, device: DeviceInfo, dtype: str) -> str:
    return f"{fp}|{device.id}|{dtype}|r{registry_version()}"


# -- the budget: exactly N finished trials per study, however many workers race ------------------------


@dataclass(frozen=True)
class Budget:
    """Where a study stands against a budget of ``total`` finished (COMPLETE or FAIL) trials.

    The budget is the study's first ``total`` trials by number that are not
    PRUNED (its *head*). A worker asks only while the budget is ``open`` (the
    head is short, or holds a WAITING trial that ask() will pop); after asking it
    keeps its trial only if fewer than ``total`` unpruned trials precede it, and
    else tells it PRUNED unmeasured (:data:`SURPLUS_ATTR`). Trial numbers are
    unique and only grow, so a kept trial stays in the head for ever and a
    pruned one gives its place back: the head ends with exactly ``total``
    finished trials however many workers raced for the last places, and no
    trial outside it is ever finished by a worker in this mode.
    """

    total: int
    finished: int  # COMPLETE or FAIL, in the whole study
    failed: int
    running: int
    open: bool  # a worker may ask for a trial now
    done: bool  # the head holds `total` finished trials, and no trial is left running outside it


def study_budget(study: optuna.Study, total: int, trials: Sequence[optuna.trial.FrozenTrial] | None = None) -> Budget:
    """The study's :class:`Budget` for ``total`` finished trials (``trials``: already read, else read now)."""
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    head = sorted((t for t in trials if t.state != TrialState.PRUNED), key=lambda t: t.number)[:total]
    running = sum(t.state == TrialState.RUNNING for t in trials)
    return Budget(
        total=total,
        finished=sum(t.state in FINISHED for t in trials),
        failed=sum(t.state == TrialState.FAIL for t in trials),
        running=running,
        open=len(head) < total or any(t.state == TrialState.WAITING for t in head),
        # A surplus trial whose worker died between ask() and pruning it stays RUNNING until its
        # heartbeat goes stale and settle() prunes it: until then the study is waited for, not done.
        done=len(head) == total and all(t.state in FINISHED for t in head) and running == 0,
    )


def settle(study: optuna.Study, total: int) -> Budget:
    """Fail stale trials, then the study's :class:`Budget`; a done study's leftover WAITING trials are pruned.

    Workers starting on a new study at once may each enqueue the families'
    defaults, so a few WAITING copies can outlive the budget: pruned, they
    never come back as repeats when a later run raises N.
    """
    fail_stale_trials(study, total)
    trials = study.get_trials(deepcopy=False)
    budget = study_budget(study, total, trials)
    if budget.done:
        for t in trials:
            if t.state == TrialState.WAITING:
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    study._storage.set_trial_state_values(t._trial_id, state=TrialState.PRUNED)
    return budget


def fail_stale_trials(study: optuna.Study, total: int | None = None) -> int:
    """Fail the study's RUNNING trials whose heartbeat stopped (their worker died); returns how many.

    optuna's ``fail_stale_trials`` marks them FAIL. With a budget of ``total``
    trials, a stale trial outside the head (a worker died between ask() and
    pruning its surplus trial) is PRUNED instead, so the study still ends with
    exactly ``total`` finished trials. The storage's stale-trial callback is
    called for each failed trial. A storage without heartbeats: nothing to do.
    """
    storage = study._storage
    if not is_heartbeat_enabled(storage):
        return 0
    stale = set(storage._get_stale_trial_ids(study._study_id))
    if not stale:
        return 0
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    live = [t.number for t in trials if t.state != TrialState.PRUNED]
    getter = getattr(storage, "get_heartbeat_stale_trial_callback", None) or storage.get_failed_trial_callback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        callback = getter()
    failed = 0
    for t in trials:
        if t._trial_id not in stale:
            continue
        surplus = total is not None and bisect.bisect_left(live, t.number) >= total
        state = TrialState.PRUNED if surplus else TrialState.FAIL
        try:
            if not storage.set_trial_state_values(t._trial_id, state=state):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # its worker (or another one) finished it meanwhile
        if surplus:
            live.remove(t.number)
            continue
        failed += 1
        if callback is not None:
            callback(study, copy.deepcopy(storage.get_trial(t._trial_id)))
    return failed


def keeps_place(study: optuna.Study, trial: optuna.Trial, total: int) -> bool:
    """Whether fewer than ``total`` unpruned trials precede ``trial`` (see :class:`Budget`)."""
    before = sum(t.number < trial.number and t.state != TrialState.PRUNED for t in study.get_trials(deepcopy=False))
    return before < total


def repeats_queued(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether ``trial`` was enqueued with a default config that a lower-numbered trial runs or ran already.

    Workers that start on a study together may all enqueue the families'
    defaults; the copy with the lowest number is measured, the others are pruned.
    """
    trials = study.get_trials(deepcopy=False)
    mine = next((t for t in trials if t.number == trial.number), None)
    if mine is None or not mine.user_attrs.get(DEFAULT_ATTR):
        return False
    fixed = mine.system_attrs.get("fixed_params")
    return any(
        t.number < trial.number and t.state not in (TrialState.PRUNED, TrialState.WAITING)
        and (t.params or t.system_attrs.get("fixed_params")) == fixed
        for t in trials
    )
