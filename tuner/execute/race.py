"""The race at plan time: a shortlist of configs prepared, checked and timed on this GPU, the fastest kept.

A selector's ranking (:meth:`tuner.select.model.KernelSelector.rank`) is a
guess about a matrix it has not seen; the race turns it into a measurement.
:func:`shortlist` takes the first configs of the ranking (a few families,
within a preparation budget) and always adds cuSPARSE's two CSR algorithms,
so the winner is never slower than cuSPARSE as measured in the same race;
:func:`adapted` adds configs as their family fits them to the matrix and the
GPU (what the selector's corpus could not teach it: NuT's slabs to the L2
where x is larger than a corpus matrix's): the first's, the best-ranked
fitted config of a family none of whose entrants fits, and where x fits, NuT's config expected fastest.
:func:`race` prepares each entrant on the matrix, checks one product against
the float64 reference (on the GPU, :class:`~tuner.measure.verify.Reference`),
then times the survivors in rounds, dropping those far behind after each
(successive halving) until one is left, and hands back the winner already prepared: plan()
runs it without preparing it again. A config that fails (wrong y, out of
memory, a launch error) leaves the race with its reason, and the race goes on.

Every lap is a trial (:meth:`Lap.record`): :func:`record_race` writes them
to the store in one transaction, so a later ``plan()`` of the same matrix
answers from the store at once, and every race grows the corpus.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from kernels import BASELINE, BASELINE_CONFIGS, REGISTRY, Family, Prepared, get_family, with_adapted
from tuner.measure.backend import Backend, Timing
from tuner.measure.evaluate import TrialResult, checked_prepares

if TYPE_CHECKING:
    from db.store import Store
    from tuner.measure.verify import Reference
    from tuner.select.model import RankedConfig

__all__ = ["CHEAP_SPMVS", "EARLY_SPMVS", "JOIN_SLACK", "ROOF", "SEED_CONFIGS", "STUDY", "UNSELECTED", "Entrant",
           "Lap", "RaceResult", "adapted", "race", "record_race", "roof", "search_seeds", "shortlist",
           "fitted_entrants", "unranked_entrants", "waits"]

STUDY = "race"
"""The ``study`` of a race's trials in the store (tuning's trials carry their optuna study's name)."""

MARGIN = 0.03
"""How much faster than cuSPARSE an entrant must be to win: a race is a few products each. (When it timed
warm, a config 0.3 % ahead in the race was 6 % behind cold on the H200; it now times cold too.)"""

CHEAP_SPMVS = 5.0
"""A preparation expected within this many SpMVs is cheap: ``plan(effort="predict")`` runs only those, and
a race always has the first of them."""

EARLY_SPMVS = 8.0
"""An entrant expected to prepare within this many SpMVs races from the first round; a costlier one waits for
the roof (:func:`race`, :data:`ROOF`). csr5 (:attr:`kernels.csr5.Csr5.prepare_spmvs`, 0.6-1.0 ms) is one of
the first: on the unseen sawtooth in float32 (H100, 5c8b474) csr_vector at 80 % of the copy bandwidth put the
race at the roof and left csr5 waiting, which in the race before had won at 1.33x cuSPARSE against 1.12x."""

ROOF = 0.75
"""An entrant that moves a product's compulsory bytes (:func:`tuner.measure.metrics.effective_bytes`, 4-byte
columns) at this fraction of the copy bandwidth or more is at the roof: the race then leaves out the entrants
still waiting that are expected to be costly to prepare (:func:`race`). Every family that is (NuT, IPCSR, SURAA,
specsum, rcm) reads at least those bytes but for its narrow columns, so none could win by much more than
1 / ROOF, and their preparations cost more SpMVs than the products they might save (NuT's 5-9 ms on matrices
of 24-40 M nonzeros, where a product takes 70-190 us). In the 519 races of the unseen benchmark's runs of
2026-11-26 (both GPUs), a costly entrant won by 3 % or more only where the cheap leader was at 72.5 % of the copy
bandwidth or less, or at 87 % and over (2 races). In the races run since (the GPU leave-one-family-out runs at
6aa22a4 and 1568315 on the H100 and at b9f63cd on the H200, the unseen benchmark at 1568315 and b9f63cd), 40
races whose leader was at 70-80 % prepared costly entrants and none won by 3 %; on the H200's unseen run, csr5 at
75-76 % left NuT and rcm to be prepared in 8-19 ms (70-150 SpMVs) on diagonals and sawtooth in float32, for
nothing. Replayed on the corpora (``bench/race_lofo.py``), 0.75 against 0.80 moves the pick from 0.963 to 0.962
(H100, float64; float32 0.970 and the H200's 0.971 / 0.979 as they were) and cuts the median preparation on the
H100's matrices of 1 M nonzeros and more from 226 / 203 SpMVs to 211 / 151. That is for 8-byte values:
:func:`roof` for others."""


def roof(itemsize: int) -> float:
    """The roof (:data:`ROOF`) for values of ``itemsize`` bytes. An entry's compulsory bytes are its value and its
    4-byte column; what a kernel moves beyond them for each entry (x's sector gathered, its share of the row
    pointers and sums) stays about the same as the values shrink, so it weighs more where they are small. The roof
    is an entry's compulsory bytes over those plus the bytes beyond that put float64's 12 at :data:`ROOF` (4 at
    0.75): 0.75 for float64, 0.667 for float32. In the unseen benchmark's float32 races at 2d471d5 and adb6e43
    (H200, 174 races), the 32 whose cheap leader was at 60-75 % of the copy bandwidth prepared costly entrants
    (30-150 SpMVs each) and none of them won; under 55 %, colperm27's firsttouch won by 1.37-1.43x."""
    entry = itemsize + 4
    return entry / (entry + 12 * (1 / ROOF - 1))


JOIN_SLACK = 1.2
"""NuT (the family that fits first, :func:`adapted`) joins a race that has none of its configs where the selector
expects one of them (the fastest it expects; the best-ranked until stop 67) within this factor of the fastest
entrant. NuT is the one family that keeps the gathers of x near the SMs, and a selector that never saw a structure
often ranks it just behind the rest: on the GPU, leaving each family of the H100's corpus out
(``bench/race_lofo_gpu.py``, 37d8275, 121 matrices of 1 M nonzeros and more), a NuT config was the fastest known on
11 float32 matrices whose race had none (the race's pick at 0.66-0.95 of it, on the kronecker graphs). With NuT in
every such race (ea2146b, where a NuT config of slabs enough also kept its own panels): of the 138 races it joined,
it won 21; each win by more than 3 % had NuT expected within 1.17 of the fastest entrant; in the 45 where it was
expected beyond 1.2 it was prepared every time and won once, by 1.5 %."""

SEED_CONFIGS = 8
"""How many of the selector's first configs a search measures first (:func:`search_seeds`: ``plan(effort=
"tune")``, ``tuner tune``). Replayed on the corpora with selectors that never saw the matrix's family
(``bench/race_lofo.py --seed-configs``, strategy 'seeds'), these configs hold one within 3 % of the corpus's
best on 66-75 % of the matrices with 4 and on 82-87 % with 8."""

UNSELECTED: tuple[str, ...] = ("csr_scalar", "csr_vector", "csr5", "nut", "rcm", "rowsort", "firsttouch")
"""The families a race enters without a selector for this GPU (no selector trained or shipped for its
architecture), each with the configs it races where no selector ranks it (:meth:`kernels.Family.unranked_configs`:
csr_vector's threads a row and csr5's sigma from the mean row length, NuT's tiles and slabs fitted to the shared
memory and the L2, the renumbering families only where they can pay). The four first won 221 of the unseen
benchmark's 240 races on the H200 (stops 75-76, the shipped selector ranking: csr5 103, csr_vector 49, NuT 44,
csr_scalar 25), the three others 13 (cuSPARSE 6); until stop 76 such a race had csr_vector, csr_scalar and specsum
alone (specsum won none of those races)."""


@dataclass(frozen=True)
class Entrant:
    """A config in the race, with what the selector expected of it (None: raced without a selector)."""

    kernel: str
    params: dict[str, Any]
    expected_s: float | None = None
    prepare_spmvs: float | None = None


@dataclass
class Lap:
    """One entrant's outcome: its trial result (failed with a reason, or timed)."""

    entrant: Entrant
    result: TrialResult
    samples: list[float] = field(default_factory=list)

    @property
    def time_s(self) -> float:
        return self.result.timing.median_s if self.result.ok and self.result.timing else float("inf")


@dataclass
class RaceResult:
    """The laps in the order raced, the winner (None when every entrant failed), its prepared matrix, the
    wall seconds of each step (``prepare``, ``verify``, ``time``; :func:`tuner.execute.plan.race_matrix` adds
    ``reference`` and ``record``), and, where the laps are written to the store behind the caller's back,
    the future of that write (:mod:`db.write_behind`: its seconds, or its error)."""

    laps: list[Lap]
    winner: Lap | None
    prepared: Prepared | None
    seconds: dict[str, float]
    recorded: Future[float] | None = None
    skipped: list[Entrant] = field(default_factory=list)
    """Entrants left out unprepared: a cheap one was at the roof already (``roof_share``)."""
    roof_share: float = ROOF
    """The share of the copy bandwidth the race took for the roof (:func:`roof` of the matrix's values)."""

    @property
    def baseline_s(self) -> float | None:
        """cuSPARSE's best time in this race (None when both its algorithms failed)."""
        times = [lap.time_s for lap in self.laps if lap.entrant.kernel == BASELINE and lap.result.ok]
        return min(times) if times else None

    def table(self) -> list[str]:
        """One line per lap, fastest first, for ``explain()`` and the CLI: its time (the median of its products,
        and their range where it timed several: one slow product shows there), what the selector expected and
        how long its preparation took."""
        lines = []
        for lap in sorted(self.laps, key=lambda lap: lap.time_s):
            e = lap.entrant
            expected = f", expected {e.expected_s * 1e6:.1f} us" if e.expected_s else ""
            if lap.result.ok:
                mark = "*" if lap is self.winner else " "
                low, high = min(lap.samples, default=0.0) * 1e6, max(lap.samples, default=0.0) * 1e6
                spread = f" ({low:.1f}-{high:.1f} us, {len(lap.samples)} products)" if len(lap.samples) > 1 else \
                    " (1 product)"
                prepared = f", prepared in {lap.result.prepare_s * 1e3:.1f} ms" if lap.result.prepare_s else ""
                lines.append(f"{mark} {e.kernel} {e.params}: {lap.time_s * 1e6:.1f} us{spread}{expected}{prepared}")
            else:
                lines.append(f"  {e.kernel} {e.params}: out ({lap.result.error_kind}: {lap.result.error}){expected}")
        lines += [f"  {e.kernel} {e.params}: not prepared (a cheaper entrant was at {self.roof_share:.0%} of the copy "
                  "bandwidth or more)" for e in self.skipped]
        return lines


def shortlist(ranking: Sequence[RankedConfig] | None, *, features: Mapping[str, float] | None = None,
              itemsize: int = 8, size: int = 4, per_family: int = 2, prepare_budget: float = 60.0, slack: float = 1.5,
              cheap: float = CHEAP_SPMVS, margin: float = MARGIN) -> list[Entrant]:
    """The entrants of a race: up to ``size`` configs from the selector's ``ranking`` (the one to run
    first), then cuSPARSE's two algorithms.

    From the ranking: the first (the selector's answer) and the first that prepares within ``cheap`` SpMVs (what
    ``plan(effort="predict")`` runs, so a race never does worse than a prediction; where that is cuSPARSE, raced
    anyway, the first of ours that prepares within ``cheap`` and is expected within ``slack`` times it, for on a
    structure it never saw the selector can be off severalfold: on the unseen benchmark's blockdiag a selector
    trained on capped slowdowns (stop 51's trial; shipped since) expected cuSPARSE at 399 us and csr_vector at 453, and
    they ran in 154 and 114 on the H200), then others, each the one
    that covers most of what those chosen miss on the training matrices nearest this one where the ranking
    carries their outcomes (:func:`_next_entrant`), else in rank order: at most ``per_family`` of one family (a
    second family often wins where the selector is wrong), none expected slower than ``slack`` times the first
    or expected to miss beating cuSPARSE's faster ranked algorithm by ``margin`` (it could not win), and their
    preparation within ``prepare_budget`` SpMVs in all (the first's is not counted: it is raced whatever it
    costs); then, beyond ``size``, the default of every family the selector ranks no config of (one added to the
    registry after it was trained: it cannot be ranked, so it is measured), or the configs its family races on a
    matrix of these ``features`` with values of ``itemsize`` bytes (:meth:`kernels.Family.unranked_configs`: rcm
    only where renumbering can pay, csr5 at two sigmas), with what its family says a preparation costs
    (:attr:`kernels.Family.prepare_spmvs`: rcm's waits for the roof in :func:`race`, csr5's does not); and the
    configs each family the ranking holds fits to a matrix of these ``features`` beyond it (:func:`fitted_entrants`:
    csr_vector's threads a row for the nonempty rows where most are empty). cuSPARSE's
    configs in the ranking are left for the two always raced. Without a ranking (no selector for this GPU): the
    configs the families of :data:`UNSELECTED` race unranked on a matrix of these ``features``, whatever ``size``.
    """
    if size < 1:
        raise ValueError(f"a race needs at least one entrant besides cuSPARSE, got size={size}")
    if ranking is None:
        picked = [e for e in unranked_entrants((), features, itemsize) if e.kernel in UNSELECTED]
        families: Iterable[str] = UNSELECTED
    else:
        ranked = [r for r in ranking if r.kernel != BASELINE]
        anchor = next((r for r in ranking if _cost(r) <= cheap), None)
        if anchor is not None and anchor.kernel == BASELINE:  # raced anyway: the first cheap of ours near it
            anchor = next((r for r in ranked if _cost(r) <= cheap and r.expected_s <= slack * anchor.expected_s),
                          None)
        chosen = ranked[:1] + ([anchor] if anchor is not None and anchor is not ranked[0] and size > 1 else [])
        spent = sum(_cost(r) for r in chosen[1:])
        bar = (1 - margin) * min((r.expected_s for r in ranking if r.kernel == BASELINE), default=float("inf"))

        # those that could ever join: not expected too slow to win (the few dozen others are never looked at)
        pool = [r for r in ranked[1:] if r.expected_s <= slack * chosen[0].expected_s and r.expected_s < bar]

        def admits(r: RankedConfig) -> bool:
            return (not any(r is c for c in chosen) and sum(c.kernel == r.kernel for c in chosen) < per_family
                    and spent + _cost(r) <= prepare_budget)

        outcomes = np.array([r.outcomes for r in pool]) if pool and all(len(r.outcomes) for r in ranking) else None
        covered = None if outcomes is None else \
            np.min([r.outcomes for r in (*chosen, *(r for r in ranking if r.kernel == BASELINE))], axis=0)
        while len(chosen) < size and (j := _next_entrant(pool, outcomes, covered, admits)) is not None:
            chosen.append(pool[j])
            spent += _cost(pool[j])
            if outcomes is not None:
                covered = np.minimum(covered, outcomes[j])
        order = {id(r): i for i, r in enumerate(ranked)}
        picked = [Entrant(r.kernel, dict(r.params), r.expected_s, r.prepare_spmvs)
                  for r in sorted(chosen, key=lambda r: order[id(r)])]
        picked += unranked_entrants(ranking, features, itemsize)
        families = [r.kernel for r in ranking]
    picked += [e for e in fitted_entrants(families, features, itemsize)
               if not any(p.kernel == e.kernel and p.params == e.params for p in picked)]
    expected = {(r.kernel, _key(r.params)): r for r in ranking or () if r.kernel == BASELINE}
    for kernel, params in BASELINE_CONFIGS:
        r = expected.get((kernel, _key(params)))
        picked.append(Entrant(kernel, dict(params), r.expected_s if r else None, r.prepare_spmvs if r else None))
    return picked


def _next_entrant(ranked: Sequence[RankedConfig], outcomes: np.ndarray | None, covered: np.ndarray | None,
                  admits: Callable[[RankedConfig], bool]) -> int | None:
    """The index in ``ranked`` of the config ``admits`` lets join that covers most of what those chosen miss:
    with ``outcomes`` (each ranked config's :meth:`~tuner.select.model.KernelSelector.outcomes`, a row each)
    and ``covered`` (the best outcome among the chosen and cuSPARSE, raced always, on each training matrix
    drawn), the one that lowers most their mean; where none does (or without outcomes), the first in
    ``ranked`` order."""
    if outcomes is not None:
        gains = np.maximum(covered - outcomes, 0.0).mean(axis=1)
        for j in np.argsort(-gains, kind="stable"):
            if gains[j] <= 0:
                break
            if admits(ranked[j]):
                return int(j)
    return next((j for j, r in enumerate(ranked) if admits(r)), None)


def adapted(entrants: Sequence[Entrant], ranking: Sequence[RankedConfig] | None = None, *, cols: int,
            itemsize: int, l2_bytes: int) -> list[Entrant]:
    """``entrants`` with configs fitted to this matrix and GPU (:meth:`kernels.Family.adapt`: NuT's slabs to
    the L2, and its panels to the slabs), what the selector's corpus could not teach it:

    - second, the first's config as its family fits it (:func:`kernels.with_adapted`), where that is another
      config not raced already. The first's only: such a variant costs what the first costs to prepare. A first
      the selector expects to prepare in more than :data:`CHEAP_SPMVS` is raced fitted only, in its place:
      a NuT preparation costs 30-40 SpMVs on the 8 M-column graph of the unseen benchmark, and in every race
      recorded there (both GPUs, both dtypes) the fitted config beat the one it was fitted from (by 2-30 %).
      Not everywhere: timed beside it on the GPU's held-out corpus matrices (stop 77, the recommendation's first
      config fitted, ``bench/results/2026-11-29_race-lofo-gpu-fit77-not-kept.txt``), it lost on 11 of 15, by up to
      13 % (lp's x of 64-600 MB, and arrowband's where fewer slabs were fitted).
      (:func:`search_seeds` gives no preparation costs: a search measures both.)
    - before cuSPARSE, for each family of ``ranking`` that names what it fits first
      (:attr:`kernels.Family.adapt_first`: NuT's slabs) and has no entrant yet, the config of it the selector
      expects fastest, where that is within :data:`JOIN_SLACK` of the fastest entrant (expected fastest, not
      best-ranked: the ranking's order weighs the risk of a first config, and a config that joins the race is
      judged by its time. Stop 67: the race's pick replayed on the four corpora, each family left out, 0.0000-0.0008
      closer to the tuned best (0.0001-0.0030 on the matrices of 1 M nonzeros and more), worst 5 % 0.866 -> 0.884
      on the H200's in float64, none lower; on the H200, the
      unseen subsetcols in float64 1.16x cuSPARSE (NuT of 8192-row panels; the best-ranked, of 4 slabs on an x
      that fits the L2, ran 0.94x) against 1.09x, lowertri in float64 1.07x against 1.09x, 12 of the A/B's 13
      other races within 1 %, mesh2d's rcm 4 % apart, ``..._joinv*.json.gz``), as its family enters it
      (:meth:`kernels.Family.joined`: NuT's tiles as wide as its threads' share of the shared memory takes; stop
      68: set l's cliques in float64, a NuT join of 4096 columns a tile ran 0.99x cuSPARSE, of 8192 1.24x); where
      its default does not
      fit this matrix (NuT where x outgrows its share of the L2), whatever it expects, the best-ranked that
      has that right, fitted further (NuT's panels), and also where no entrant of the family fits it: on a
      matrix like that, the one family that keeps the gathers of x out of DRAM races even where the
      selector, never having seen such an x, ranks it behind cuSPARSE. The first's fitted config does not count
      as one that fits: it keeps the tiles and threads the selector chose for another count of slabs, so the
      best-ranked config that has the slabs right as ranked races beside it (on the unseen benchmark's bursts
      in float32 a first of one slab, fitted to 4 with tiles of 16384 columns and 1024 threads, ran at 381 us
      on the H200 beside the ranked 4-slab config of 4096 columns and 512 threads at 286, alone before). Its
      preparation waits for the roof (:func:`race`). (csr_scalar's variant, int32 columns in float64, races
      only beside a csr_scalar first.)
    - an entrant raced unranked (no expectation: no selector for this GPU, or a family the selector does not rank)
      of a family that fits first (:attr:`kernels.Family.adapt_first`) as its family fits it, in its place:
      nothing ranked of its family to race beside (NuT in a race without a selector, :data:`UNSELECTED`).
    """

    def fitted(kernel: str, params: dict[str, Any]) -> dict[str, Any] | None:
        return get_family(kernel).adapt(params, cols=cols, itemsize=itemsize, l2_bytes=l2_bytes)

    entrants = [replace(e, params=own) if e.expected_s is None and get_family(e.kernel).adapt_first is not None
                and (own := fitted(e.kernel, e.params)) is not None else e for e in entrants]
    configs = with_adapted([(e.kernel, e.params) for e in entrants], cols=cols, itemsize=itemsize,
                           l2_bytes=l2_bytes)
    out, fit = list(entrants), None
    if len(configs) > len(entrants):
        first = entrants[0]
        fit = Entrant(first.kernel, configs[1][1], prepare_spmvs=first.prepare_spmvs)
        if _cost(first) > CHEAP_SPMVS:
            out[0] = fit
        else:
            out.insert(1, fit)

    def leads(kernel: str, params: dict[str, Any]) -> bool:
        """Whether ``params`` have right what their family fits first."""
        family, fit = get_family(kernel), fitted(kernel, params)
        first = family.adapt_first
        return fit is None or fit[first] == family.space.validate(params, family=kernel)[first]

    lead = min((e.expected_s for e in entrants if e.kernel != BASELINE and e.expected_s), default=float("inf"))
    for kernel in dict.fromkeys(r.kernel for r in ranking or ()):
        family = get_family(kernel)
        if family.adapt_first is None:
            continue
        outgrown = fitted(kernel, family.space.defaults()) is not None
        entered = [e for e in out if e.kernel == kernel]
        as_ranked = [e for e in entered if e is not fit]
        if entered and (not outgrown or any(fitted(kernel, e.params) is None for e in as_ranked)):
            continue
        if outgrown:
            best = next((r for r in ranking or () if r.kernel == kernel and leads(kernel, r.params)), None)
        else:
            best = min((r for r in ranking or () if r.kernel == kernel), key=lambda r: r.expected_s, default=None)
        if best is not None and (outgrown or best.expected_s <= JOIN_SLACK * lead):
            at = next((i for i, e in enumerate(out) if e.kernel == BASELINE), len(out))
            params = (fitted(kernel, best.params) or dict(best.params)) if outgrown else \
                family.joined(best.params, itemsize=itemsize)
            if not any(e.params == params for e in entered):
                out.insert(at, Entrant(best.kernel, params, best.expected_s, best.prepare_spmvs))
    return out


def unranked_entrants(ranking: Sequence[RankedConfig], features: Mapping[str, float] | None,
                      itemsize: int) -> list[Entrant]:
    """The configs each family the ranking has none of races on a matrix of these ``features`` with values of
    ``itemsize`` bytes (:meth:`kernels.Family.unranked_configs`), with what its family says a preparation costs."""
    return [Entrant(k, params, prepare_spmvs=family.prepare_spmvs) for k, family in _unranked(ranking)
            for params in family.unranked_configs(features, itemsize)]


def fitted_entrants(families: Iterable[str], features: Mapping[str, float] | None, itemsize: int) -> list[Entrant]:
    """The configs each of these families (those a ranking holds; without a selector, :data:`UNSELECTED`) fits to
    a matrix of these ``features`` with values of ``itemsize`` bytes beyond what a selector learned
    (:meth:`kernels.Family.fitted_configs`), with what its family says a preparation costs."""
    return [Entrant(k, params, prepare_spmvs=REGISTRY[k].prepare_spmvs)
            for k in dict.fromkeys(families) if k != BASELINE
            for params in REGISTRY[k].fitted_configs(features, itemsize)]


def _unranked(ranking: Sequence[RankedConfig]) -> list[tuple[str, Family]]:
    """The families of the registry (cuSPARSE aside) of which ``ranking`` holds no config."""
    known = {r.kernel for r in ranking}
    return [(k, family) for k, family in REGISTRY.items() if k != BASELINE and k not in known]


def search_seeds(ranking: Sequence[RankedConfig] | None, *, size: int, cols: int, itemsize: int,
                 l2_bytes: int, features: Mapping[str, float] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """What a search on an unmeasured matrix measures first (``plan(effort="tune")``, ``tuner tune``): the
    selector's first ``size`` configs with the configs fitted to the matrix that a race adds (:func:`adapted`),
    then, of each family the selector does not rank, what it names for a matrix of ``features``
    (:meth:`kernels.Family.unranked_seeds`: the config a race enters, csr5 with its neighbouring sigmas too; rcm
    only where it can pay), and the configs a race fits beyond the ranking (:func:`fitted_entrants`); nothing
    without a selector. (Without the unranked seeds, a search of 30 trials on the unseen
    incidence matrix in float64 ended on csr_scalar at 1.24x cuSPARSE, where the race had csr5 at 1.42x.)"""
    if not ranking:
        return []
    first = [Entrant(r.kernel, dict(r.params), r.expected_s) for r in ranking[:size]]
    seeds = [(e.kernel, e.params) for e in adapted(first, ranking, cols=cols, itemsize=itemsize, l2_bytes=l2_bytes)]
    seeds += [(k, params) for k, family in _unranked(ranking) for params in family.unranked_seeds(features, itemsize)]
    return seeds + [(e.kernel, e.params) for e in fitted_entrants((r.kernel for r in ranking), features, itemsize)
                    if (e.kernel, e.params) not in seeds]


def _cost(r: RankedConfig | Entrant) -> float:
    """A ranked config's (or an entrant's) expected preparation in SpMVs (0 where the selector gives none)."""
    return r.prepare_spmvs if r.prepare_spmvs is not None and np.isfinite(r.prepare_spmvs) else 0.0


def _key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def race(backend: Backend, A: Any, entrants: Sequence[Entrant], reference: Reference, x: Any, *,
         repeats: int = 2, rounds: int = 2, screen: int = 1, drop: float = 1.05, margin: float = MARGIN,
         floor_s: float | None = None, early: float = EARLY_SPMVS,
         on_lap: Callable[[Lap], None] | None = None) -> RaceResult:
    """Prepare, check and time every entrant on ``A`` (on ``backend``'s device; ``x`` is ``reference.x``
    there); the winner stays prepared, the others are released.

    Timing: up to ``rounds`` rounds, the first of ``screen`` products of each entrant, the others of
    ``repeats`` products of each survivor, interleaved, each product after an L2 flush and between two CUDA
    events (:meth:`~tuner.measure.backend.Backend.time_queued`, whose gates keep the host's time out of
    them): cold, as the benchmarks time (warm, x stays in L2 and the order of configs can differ). After a
    round an entrant slower than ``drop`` times the leader leaves, and the race ends when one is left: cold
    products vary by about 1 % (a race's laps at 5c8b474 on the H100), so one 5 % behind after its first
    does not catch up, and the products of the race are most of its cost. A lap's time is the median of its
    products. The winner must beat cuSPARSE's best lap by ``margin``, else cuSPARSE wins.

    ``floor_s``: the product's compulsory bytes at the copy bandwidth. Where given, the entrants expected to
    prepare in more than ``early`` SpMVs wait: the others (cuSPARSE's always, and those with no expectation)
    are prepared and timed in a first round; then the waiting ones join one at a time, the cheapest to
    prepare first, each timed as it joins, until the fastest so far takes at most ``floor_s`` over the roof
    (:func:`roof` of ``A``'s values): those still waiting are left out unprepared (``skipped``): specsum (about
    10 SpMVs) goes before NuT (8 ms), and where csr5, raced from the first round, is at the roof neither is
    prepared.
    """
    seconds = {"prepare": 0.0, "verify": 0.0, "time": 0.0}
    laps: list[Lap] = []
    ready: dict[int, tuple[Prepared, Any]] = {}  # lap index -> prepared, out

    def enter(group: Sequence[Entrant]) -> None:
        start = time.perf_counter()
        checked = checked_prepares(backend, [(get_family(e.kernel), e.params) for e in group], A, reference, x)
        prepare_s = sum(result.prepare_s or 0.0 for result, _, _ in checked)
        seconds["prepare"] += prepare_s
        seconds["verify"] += time.perf_counter() - start - prepare_s
        for entrant, (result, prepared, out) in zip(group, checked, strict=True):
            laps.append(Lap(entrant, result))
            if prepared is not None:
                ready[len(laps) - 1] = (prepared, out)
            elif on_lap:
                on_lap(laps[-1])

    def lap_round(only: Sequence[int] | None = None, products: int = repeats) -> float:
        """One round of ``products`` cold products of every entrant ready (or of ``only`` those), then those
        ``drop`` times the leader or more behind dropped; the leader's median so far."""
        start = time.perf_counter()
        order = list(ready) if only is None else list(only)
        fns = [_runner(backend, laps[i].entrant.kernel, *ready[i], x) for i in order]
        timed = backend.time_queued(fns, repeats=products, flush_l2=True)
        for i, samples in zip(order, timed, strict=True):
            laps[i].samples += samples
        medians = {i: statistics.median(laps[i].samples) for i in ready if laps[i].samples}
        leader = min(medians.values())
        for i, median in medians.items():
            if median > drop * leader:
                del ready[i]  # far behind: its memory goes back now
        seconds["time"] += time.perf_counter() - start
        return leader

    costly = sorted((e for e in entrants if floor_s is not None and waits(e, early)), key=lambda e: e.prepare_spmvs)
    at_roof = roof(np.dtype(A.dtype).itemsize)
    enter([e for e in entrants if not any(e is c for c in costly)])
    skipped: list[Entrant] = []
    screened = bool(costly and ready)  # the screening round counts as the first
    if screened:
        leader = lap_round(products=screen)
        for k, entrant in enumerate(costly):  # the cheapest to prepare first, each timed as it joins
            if leader <= floor_s / at_roof:
                skipped = costly[k:]
                break
            enter([entrant])
            if len(laps) - 1 in ready:
                leader = lap_round([len(laps) - 1], products=screen)
    else:
        enter(costly)
    for round_ in range(int(screened), rounds):
        if len(ready) <= (1 if round_ else 0):
            break  # nothing to time, or one left after a round: it has won
        lap_round(products=repeats if round_ else screen)
    for lap in laps:
        if lap.samples:
            lap.result.timing = Timing.from_samples(lap.samples)
            lap.result.state = "ok"
            if on_lap:
                on_lap(lap)
    win = min(ready, key=lambda i: laps[i].time_s, default=None)  # among those that ran every round
    baseline = min((i for i in ready if laps[i].entrant.kernel == BASELINE), key=lambda i: laps[i].time_s,
                   default=None)
    if win is not None and baseline is not None and laps[win].time_s > (1 - margin) * laps[baseline].time_s:
        win = baseline  # not clearly faster than cuSPARSE: a tie goes to cuSPARSE
    prepared = ready.pop(win)[0] if win is not None else None
    ready.clear()
    return RaceResult(laps, laps[win] if win is not None else None, prepared, seconds, skipped=skipped,
                      roof_share=at_roof)


def waits(entrant: Entrant, early: float = EARLY_SPMVS) -> bool:
    """Whether :func:`race` holds ``entrant`` back until the others are timed: it is expected to prepare in more
    than ``early`` SpMVs (never cuSPARSE)."""
    return entrant.kernel != BASELINE and entrant.prepare_spmvs is not None and entrant.prepare_spmvs > early


def _runner(backend: Backend, kernel: str, prepared: Prepared, out: Any, x: Any) -> Callable[[], object]:
    family = get_family(kernel)
    return lambda: backend.run(family, prepared, x, out)


def record_race(store: Store, result: RaceResult, *, fingerprint: str, device: str, dtype: str,
                shape: tuple[int, int], nnz: int) -> None:
    """Write every lap as a trial of the matrix (study :data:`STUDY`), in one transaction: all or none.

    The matrix and the device must be in the store already. cuSPARSE's time in the race goes on the best
    row, so ``explain()`` can give the ratio later.
    """
    records = []
    for lap in result.laps:
        row = lap.result.record(shape=shape, nnz=nnz, dtype=dtype)
        records.append({**row, "fingerprint": fingerprint, "device": device, "dtype": dtype, "study": STUDY,
                        "trial_uid": uuid.uuid4().hex})
    with store.transaction():
        store.add_trials(records)
        if (base := result.baseline_s) is not None:
            store.set_cusparse_time(fingerprint, device=device, dtype=dtype, time_s=base)
