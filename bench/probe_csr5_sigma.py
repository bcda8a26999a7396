"""Which single sigma csr5's own config should take, per value size, and what the recommendation gains by it.

Three views, each printed as lines of ``bench/results/2026-11-29_second-opinion-sigma-77.txt``:

- ``survey``: on a race survey (every sigma of csr5's race configs measured on each corpus matrix,
  ``bench/results/corpus/..._survey-race.jsonl.gz``), each rule's sigma (setSigma's, capped at C) as the
  fastest sigma's time over its time, geomean per dtype and size class; and the same for the race's pair of
  configs (the faster of the two);
- ``unseen``: on the unseen benchmark's result files (``--unseen``), where a race timed setSigma's sigma over 8
  beside 8, setSigma's time over 8's (geomean, and on how many 8 was the faster);
- ``replay``: the recommendation (the selector's first config, or csr5's own config where the second opinion
  expects it faster) replayed on a corpus's times with each structure family left out (``--cv lofo``) or five
  folds by matrix (``kfold``), per family: ``--variant shipped`` as the code is (the second opinion taught by
  setSigma's config, :meth:`kernels.Family.judged_config`, and answering with csr5's own, its sigma at most 8 in
  float64), ``race`` taught by the config it answers with, ``before`` answering with setSigma's (stops 74-76).

    python bench/probe_csr5_sigma.py survey \
        --corpus bench/results/corpus/2026-11-26_NVIDIA-H200-sm-90_survey-race.jsonl.gz
    python bench/probe_csr5_sigma.py unseen --unseen bench/results/*H200*_unseen-*.json.gz
    python bench/probe_csr5_sigma.py replay --corpus merged.jsonl.gz --cv lofo [--variant race|before]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.jsonfile import read_json  # noqa: E402
from kernels import config_key, get_family  # noqa: E402
from kernels.csr5 import SIGMAS, Csr5, set_sigma  # noqa: E402
from tuner.matrix.features import FEATURE_NAMES  # noqa: E402
from tuner.select.evaluation import corpus_table, out_of_fold, picked_speed  # noqa: E402

CAPS = (4, 6, 8, 12, 16, 24, 32)


def geomean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def survey(corpus: Path) -> list[str]:
    """Each capped rule's single sigma and the race's pair, as the fastest sigma's time over theirs."""
    table = {dtype: corpus_table(corpus, dtype=dtype) for dtype in ("float64", "float32")}
    lines = []
    for least in (1e5, 1e6, 8e6):
        for dtype, t in table.items():
            single, pair = defaultdict(list), []
            for x, times in zip(t.X.tolist(), t.times, strict=True):
                features = dict(zip(FEATURE_NAMES, x, strict=True))
                sigmas = {s: times.get(_key({"sigma": s})) for s in SIGMAS}
                if features["nnz"] < least or None in sigmas.values():
                    continue
                best, own = min(sigmas.values()), set_sigma(features["npr_mean"])
                for cap in CAPS:
                    single[cap].append(best / sigmas[min(own, cap)])
                raced = get_family("csr5").unranked_configs(features, np.dtype(dtype).itemsize)
                pair.append(best / min(sigmas[c["sigma"]] for c in raced))
            lines.append(f"survey {dtype} >= {least:.0e} nonzeros ({len(pair)} matrices): setSigma's sigma at most "
                         + ", ".join(f"{c} {geomean(v):.3f}" for c, v in single.items())
                         + f"; the race's pair {geomean(pair):.3f}")
    return lines


def _key(params: dict[str, int]) -> str:
    """csr5's config key with ``params`` over its defaults (the survey's block size and indices)."""
    return config_key("csr5", {**Csr5.space.defaults(), **params})


RACE_LINE = re.compile(r"csr5 \{'sigma': (\d+)[^}]*\}: ([\d.]+) (us|ms)")


def unseen(files: Sequence[Path]) -> list[str]:
    """setSigma's time over 8's where a race timed both (setSigma's over 8), each matrix and dtype once."""
    ratios, seen = defaultdict(list), set()
    for path in files:
        for row in read_json(path)["rows"]:
            key = (row["matrix"], row["dtype"], row["nnz"])
            if row["effort"] != "race" or not isinstance(row.get("race"), list) or key in seen:
                continue
            timed = {int(m[1]): float(m[2]) * (1e3 if m[3] == "ms" else 1) for line in row["race"]
                     if (m := RACE_LINE.search(line))}
            if len(timed) == 2 and 8 in timed and max(timed) > 8:
                seen.add(key)
                ratios[row["dtype"]].append(timed[max(timed)] / timed[8])
    return [f"unseen {dtype}: setSigma's sigma over 8 raced beside 8 on {len(r)} matrices: its time / 8's "
            f"{geomean(r):.3f}, 8 the faster on {sum(x > 1 for x in r)}" for dtype, r in sorted(ratios.items())]


def replay(corpus: Path, cv: str, variant: str) -> list[str]:
    """The recommendation out of fold, overall and per structure family, against the ranking's first config."""
    if variant == "race":
        Csr5.judged_config = Csr5.unranked_config  # type: ignore[method-assign]
    elif variant == "before":
        Csr5.unranked_config = Csr5.judged_config  # type: ignore[method-assign]
    lines = []
    for dtype in ("float64", "float32"):
        t = corpus_table(corpus, dtype=dtype)
        rankings = out_of_fold(t, cv=cv)
        ranked = picked_speed(t.times, [r.keys[0] for r in rankings])
        first = picked_speed(t.times, [r.first for r in rankings])
        large = t.X[:, FEATURE_NAMES.index("nnz")] >= 1e6
        families = np.array(t.families)
        w5 = lambda a: float(np.percentile(a, 5))  # noqa: E731
        lines.append(f"replay {cv} {dtype}, {variant}: the ranking's first {geomean(ranked):.3f} (worst 5 % "
                     f"{w5(ranked):.3f}), the recommendation {geomean(first):.3f} ({w5(first):.3f}) on {len(t)} "
                     f"matrices; of 1 M nonzeros and more {geomean(ranked[large]):.3f} ({w5(ranked[large]):.3f}) -> "
                     f"{geomean(first[large]):.3f} ({w5(first[large]):.3f}) on {large.sum()}; second opinion on "
                     f"{sum(r.second is not None for r in rankings)}")
        for family in sorted(set(t.families)):
            mine, big = families == family, (families == family) & large
            lines.append(f"  {family:11s} {mine.sum():3d} {geomean(ranked[mine]):.3f} -> {geomean(first[mine]):.3f}"
                         + (f"   large {big.sum():2d} {geomean(ranked[big]):.3f} -> {geomean(first[big]):.3f}"
                            if big.any() else ""))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("view", choices=("survey", "unseen", "replay"))
    ap.add_argument("--corpus", type=Path, help="survey: a race survey; replay: a corpus with csr5's survey merged in")
    ap.add_argument("--unseen", type=Path, nargs="*", default=[], help="unseen: the benchmark's result files")
    ap.add_argument("--cv", choices=("lofo", "kfold"), default="lofo")
    ap.add_argument("--variant", choices=("shipped", "race", "before"), default="shipped")
    args = ap.parse_args()
    if args.view == "unseen":
        lines = unseen(args.unseen)
    elif args.corpus is None:
        raise SystemExit(f"{args.view} needs --corpus")
    else:
        lines = survey(args.corpus) if args.view == "survey" else replay(args.corpus, args.cv, args.variant)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
