"""The race's pick out of distribution: leaving each structure family of a corpus out (issue #18).

For each family of a committed corpus (`bench/results/corpus/`), a selector is fitted on the others; on each
left-out matrix the race's entrants are built exactly as ``plan()`` builds them (:func:`shortlist`, then
:func:`adapted` with the ranking: the first's config fitted to the L2, and the fitted NuT config where x
outgrows it), and the race's pick is the fastest entrant the corpus measured on that matrix, cuSPARSE unless
it is 3 % faster (as the race's margin). Score: tuned best / pick, geometric mean and 5th percentile, over
all matrices and over those of 1 M nonzeros and more. Entrants the corpus never measured on the matrix (the
merge_path default, which the corpus's portfolio predates, and fitted configs outside it) cannot win here:
the figures are a lower bound of what the race picks. ``--times`` judges the picks by another corpus file of
the same matrices: the corpus with the narrow-columns survey (``tuner corpus replace``) times csr_vector as
it runs now (narrow columns) and measured merge_path's default, so that only csr5 and fitted configs outside
the portfolios stay out of reach. ``--prepare-budget`` and ``--per-family`` build the shortlists with other
bounds than :func:`shortlist`'s (what a looser race would pick, and what its preparation costs: each row's
``prepare_spmvs_median``, expected by the selector for 'shortlist' and 'race', measured by the corpus for
'roof', the race with its roof rule; the corpus's times are a search's, warm, where the race's are cold).
CPU only.

    python bench/race_lofo.py --corpus bench/results/corpus/2026-11-24_NVIDIA-H100-80GB-HBM3-sm-90_corpus.jsonl.gz \\
        --l2-mb 50 --out bench/results/2026-11-26_race_lofo_H100.json [--times H100_corpus-narrow.jsonl.gz] \\
        [--prepare-budget 1e9]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernels import BASELINE, BASELINE_CONFIGS, canonical, config_key  # noqa: E402
from tuner.execute.race import (  # noqa: E402
    MARGIN,
    SEED_CONFIGS,
    Entrant,
    adapted,
    roof,
    search_seeds,
    shortlist,
    waits,
)
from tuner.matrix.features import FEATURE_NAMES  # noqa: E402
from tuner.measure.metrics import effective_bytes  # noqa: E402
from tuner.select.evaluation import corpus_table, cv_folds, fitted_on  # noqa: E402

ALGORITHMS = [config_key(kernel, params) for kernel, params in BASELINE_CONFIGS]


def picks(corpus: str, dtype: str, l2_bytes: int, times: str | None = None,
          shortlist_args: Mapping[str, Any] | None = None,
          seed_configs: int = SEED_CONFIGS, rank_order: bool = False) -> dict[str, list[tuple[float, float, float]]]:
    """Per strategy: (tuned best / pick, nnz, preparation in SpMVs) per matrix. 'shortlist' (alone) and 'race'
    (as plan() builds it) prepare every entrant, and their preparation is what the selector expects of the
    entrants; 'roof' is the race as :func:`~tuner.execute.race.race` runs it: the entrants that wait
    (:func:`~tuner.execute.race.waits`) join one at a time, cheapest first, while the fastest so far moves
    the compulsory bytes under the roof (:func:`~tuner.execute.race.roof`) of the corpus device's copy
    bandwidth; its preparation is what the corpus measured of the entrants prepared (the expected where it
    measured none). cuSPARSE's
    preparation is left out, and the SpMV is cuSPARSE's best time. With ``times`` (a corpus file of the same
    matrices), the selectors learn from ``corpus`` and the picks are timed by ``times``, each entrant by the
    config that runs (:func:`kernels.canonical`: defaults filled in). ``shortlist_args``: given to
    :func:`shortlist` (its size, per_family, prepare_budget, ...) in place of its defaults. 'seeds': the
    configs a search measures first (:func:`~tuner.execute.race.search_seeds` of ``seed_configs``), the best
    of them (no cuSPARSE margin; preparation 0; matrices where ``times`` measured none of them left out): how
    near a search starts to the best. ``rank_order``: the shortlist fills its places in the ranking's order, as
    before it drew them by the outcomes of the nearest training matrices
    (:meth:`~tuner.select.model.KernelSelector.outcomes`)."""
    table = corpus_table(corpus, dtype=dtype)
    measured = table if times is None else corpus_table(times, dtype=dtype)
    timed = dict(zip(measured.fingerprints, measured.times, strict=True))
    prepared = dict(zip(measured.fingerprints, measured.prepare, strict=True))
    nnz, rows, cols = (FEATURE_NAMES.index(n) for n in ("nnz", "rows", "cols"))
    out: dict[str, list[tuple[float, float, float]]] = {"shortlist": [], "race": [], "roof": [], "seeds": []}
    for test in cv_folds(table, "lofo"):
        selector = fitted_on(table, np.setdiff1d(np.arange(len(table)), test))
        for i in test:
            times, prepare_s = timed.get(table.fingerprints[i], {}), prepared.get(table.fingerprints[i], {})
            if not any(a in times for a in ALGORITHMS):
                continue
            base = min(times[a] for a in ALGORITHMS if a in times)
            ranking = selector.rank(table.X[i], outcomes=not rank_order)
            features = dict(zip(FEATURE_NAMES, table.X[i].tolist(), strict=True))
            short = shortlist(ranking, features=features, itemsize=np.dtype(dtype).itemsize,
                              **(shortlist_args or {}))
            raced = adapted(short, ranking, cols=int(table.X[i, cols]), itemsize=np.dtype(dtype).itemsize,
                            l2_bytes=l2_bytes)
            floor_s = effective_bytes(int(table.X[i, rows]), int(table.X[i, cols]), int(table.X[i, nnz]),
                                      dtype) / (table.device.bandwidth_gbs * 1e9)
            roofed, spent = _roofed(raced, times, prepare_s, base=base,
                                    roof_s=floor_s / roof(np.dtype(dtype).itemsize))
            for name, entrants, cost in (("shortlist", short, _expected_spmvs(short)),
                                         ("race", raced, _expected_spmvs(raced)), ("roof", roofed, spent)):
                laps = [t for e in entrants if (t := _lap(e, times)[1]) is not None]
                pick = min(laps, default=base)
                out[name].append((min(times.values()) / (pick if pick < (1 - MARGIN) * base else base),
                                  float(table.X[i, nnz]), cost))
            seeds = search_seeds(ranking, size=seed_configs, cols=int(table.X[i, cols]),
                                 itemsize=np.dtype(dtype).itemsize, l2_bytes=l2_bytes, features=features)
            if laps := [t for k, p in seeds if (t := _lap(Entrant(k, p), times)[1]) is not None]:
                out["seeds"].append((min(times.values()) / min(laps), float(table.X[i, nnz]), 0.0))
    return out


def _lap(entrant: Entrant, times: Mapping[str, float]) -> tuple[str | None, float | None]:
    """The entrant's config key the corpus measured (its params, else the config that runs) and its time."""
    for params in (entrant.params, canonical(entrant.kernel, entrant.params)):
        if (key := config_key(entrant.kernel, params)) in times:
            return key, times[key]
    return None, None


def _expected_spmvs(entrants: Sequence[Entrant]) -> float:
    """The preparation the selector expects of the entrants, in SpMVs (cuSPARSE's left out)."""
    return sum(e.prepare_spmvs for e in entrants if e.kernel != BASELINE and e.prepare_spmvs is not None
               and np.isfinite(e.prepare_spmvs))


def _roofed(entrants: Sequence[Entrant], times: Mapping[str, float], prepare_s: Mapping[str, float], *,
            base: float, roof_s: float) -> tuple[list[Entrant], float]:
    """The entrants :func:`~tuner.execute.race.race` prepares, by the corpus's times, and their preparation in
    SpMVs (what the corpus measured of each, else what the selector expects)."""
    ran = [e for e in entrants if not waits(e)]
    leader = min((t for e in ran if (t := _lap(e, times)[1]) is not None), default=base)
    for e in sorted(filter(waits, entrants), key=lambda e: e.prepare_spmvs):
        if leader <= roof_s:
            break
        ran.append(e)
        leader = min(leader, _lap(e, times)[1] or np.inf)

    def spmvs(e: Entrant) -> float:
        key = _lap(e, times)[0]
        if key is not None and key in prepare_s:
            return prepare_s[key] / base
        return _expected_spmvs([e])

    return ran, sum(spmvs(e) for e in ran if e.kernel != BASELINE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--l2-mb", type=int, required=True, help="the L2 of the corpus's GPU, MiB (H100 50, H200 60)")
    ap.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    ap.add_argument("--times", help="a corpus file of the same matrices whose times judge the picks (default: "
                    "--corpus's), e.g. the corpus with the narrow-columns survey (tuner corpus replace)")
    ap.add_argument("--prepare-budget", type=float, help="the shortlist's preparation budget in SpMVs (default: "
                    "shortlist()'s)")
    ap.add_argument("--per-family", type=int, help="the shortlist's configs of one family at most (default: "
                    "shortlist()'s)")
    ap.add_argument("--seed-configs", type=int, default=SEED_CONFIGS, help="the selector's first configs a search "
                    "measures first (strategy 'seeds')")
    ap.add_argument("--rank-order", action="store_true", help="fill the shortlist in the ranking's order, not by "
                    "the outcomes of the nearest training matrices (the shortlist before they were used)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    given = {"prepare_budget": args.prepare_budget, "per_family": args.per_family}
    shortlist_args = {k: v for k, v in given.items() if v is not None}
    rows = []
    for dtype in args.dtype:
        found = picks(args.corpus, dtype, args.l2_mb << 20, args.times, shortlist_args, args.seed_configs,
                      args.rank_order)
        if not found["race"]:
            raise SystemExit(f"{args.times or args.corpus} holds no cuSPARSE time ({', '.join(ALGORITHMS)}) in {dtype} "
                             f"for any matrix of {args.corpus}: --times takes a whole corpus of the same matrices (a "
                             "survey merged into the corpus by `tuner corpus replace`), not a survey alone")
        for name, scores in found.items():
            a = np.array(scores)
            large = a[a[:, 1] >= 1e6]
            row = {"dtype": dtype, "strategy": name, "matrices": len(a),
                   "geomean": float(np.exp(np.log(a[:, 0]).mean())), "worst5": float(np.percentile(a[:, 0], 5)),
                   "large_matrices": len(large), "large_geomean": float(np.exp(np.log(large[:, 0]).mean())),
                   "prepare_spmvs_median": float(np.median(a[:, 2])),
                   "large_prepare_spmvs_median": float(np.median(large[:, 2])),
                   "within_3pc": float(np.mean(a[:, 0] >= 1 / 1.03)),
                   "large_within_3pc": float(np.mean(large[:, 0] >= 1 / 1.03))}
            rows.append(row)
            print(f"{dtype} {name:9s}: pick / tuned best {row['geomean']:.3f} (worst 5 % {row['worst5']:.3f}), "
                  f"{row['within_3pc']:.0%} within 3 %, preparation {row['prepare_spmvs_median']:.0f} SpMVs "
                  f"(median); on the {len(large)} of 1 M nonzeros and more {row['large_geomean']:.3f}, "
                  f"{row['large_within_3pc']:.0%}, {row['large_prepare_spmvs_median']:.0f} SpMVs", flush=True)
    Path(args.out).write_text(json.dumps({"corpus": args.corpus, "times": args.times, "l2_mb": args.l2_mb,
                                          "shortlist": shortlist_args, "seed_configs": args.seed_configs,
                                          "rank_order": args.rank_order,
                                          "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
