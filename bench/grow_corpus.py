"""Grow the H200's corpus with structures it lacks: some of the unseen benchmark's generators, smaller, surveyed.

Leaving 3 of the corpus's 13 other structure families out of training, on top of the held-out one, costs the
recommendation 0.014-0.024 of the tuned best on the held-out large matrices (float32, a scratch replay): the
selector generalizes by the variety it has seen. So this adds families: the generators of the unseen benchmark's
sets a to f (:mod:`unseen_matrices`, the 29 of the 30 oldest structures that are not one of the others at another
size), each at a quarter, a sixteenth and half its benchmark size, surveyed with the portfolio the corpus was
measured with (:data:`PORTFOLIO`: its 69 configs, csr_vector and csr_scalar with the int32 columns and plain loop
their corpus times were measured with, and csr5's seven sigmas, as its race survey). Those sets then train the
selector and are no longer unseen; the benchmark's figures from then on are over the other sets.

    python bench/grow_corpus.py survey --db grow.db        # on the GPU: every matrix, both dtypes, into the store
    python bench/grow_corpus.py export --db grow.db out.jsonl.gz   # keyed as the corpus keys those configs
    python bench/grow_corpus.py replay --base merged.jsonl.gz --grown out.jsonl.gz   # what the selector gains

``survey`` can be stopped and run again: each matrix is stored whole, and one stored is passed by. ``export``
writes csr_vector's and csr_scalar's configs by the keys the corpus gives them (without ``indices`` and
``unroll``, which they predate), so that a selector trained on both sees one config, not two. ``replay`` scores the
recommendation (the ranking's first config, or csr5's where the second opinion expects it faster) on the corpus's
times, each structure family left out: on the base corpus's families trained on the base alone and on base and
grown, on the grown families by the base's selector and each left out of base and grown (about 15 minutes a dtype).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402
from unseen_matrices import GROWN, MATRICES, Unseen  # noqa: E402

from db.store import Store  # noqa: E402
from kernels import config_key  # noqa: E402
from tuner.cli import counting_bar  # noqa: E402
from tuner.matrix.features import FEATURE_NAMES  # noqa: E402
from tuner.matrix.sources import Source  # noqa: E402
from tuner.measure.backend import get_backend  # noqa: E402
from tuner.search.survey import survey  # noqa: E402
from tuner.select.corpus import export_corpus, import_corpus  # noqa: E402
from tuner.select.evaluation import (  # noqa: E402
    RankingTable,
    corpus_table,
    fitted_on,
    out_of_fold,
    picked_speed,
    ranking_table,
)
from tuner.select.model import KernelSelector  # noqa: E402
from tuner.select.portfolio import read_portfolio  # noqa: E402

PORTFOLIO = REPO / "bench/results/corpus/portfolio-grow.json"
SCALES = (0.25, 1 / 16, 0.5)
LEGACY = {"csr_vector": {"indices": "int32"}, "csr_scalar": {"indices": "int32", "unroll": 1}}
"""The params a family's corpus configs ran with before the family had them: dropped from the keys on export."""


def grown(sets: tuple[str, ...] = GROWN, scales: tuple[float, ...] = SCALES) -> list[tuple[Unseen, float, str]]:
    """Each generator of ``sets`` (one per structure: a name with a dash is another's at another size) at each
    scale, all of the first scale first, with its corpus name ``<generator>-<size>-s<seed>``."""
    chosen = [m for m in MATRICES if m.group in sets and "-" not in m.name]
    return [(m, scale, f"{m.name}-{m.size_at(scale)}-s{m.seed}")
            for scale in scales for m in chosen]


def _build(name: str, scale: float, dtype: str) -> object:
    """The generator ``name``'s matrix at ``scale`` (a module function: sources are built in spawned workers)."""
    matrix = next(m for m in MATRICES if m.name == name)
    return matrix.make(scale).astype(dtype)


def grown_sources(scales: tuple[float, ...] = SCALES) -> list[Source]:
    """The grown matrices as survey sources, each built when loaded."""
    return [Source(name, "grown", functools.partial(_build, m.name, scale), key=name)
            for m, scale, name in grown(scales=scales)]


def legacy_keys(store: Store) -> int:
    """Rewrite the store's csr_vector and csr_scalar trials that ran with :data:`LEGACY`'s params to the keys the
    corpus gives them; returns how many."""
    changed = 0
    for kernel, legacy in LEGACY.items():
        for row in list(store.db["trials"].rows_where("kernel = ?", [kernel])):
            params = json.loads(row["params"])
            if all(params.get(k) == v for k, v in legacy.items()):
                kept = {k: v for k, v in params.items() if k not in legacy}
                store.db["trials"].update(row["id"], {"params": json.dumps(kept, sort_keys=True)})
                changed += 1
    return changed


def replay(base: Path, grown_corpus: Path, dtype: str) -> list[str]:
    """The recommendation's scores (fastest time / its config's, geomean and worst 5 %) before and after growing."""
    before = corpus_table(base, dtype=dtype)
    after = _merged_table(base, grown_corpus, dtype, before.device.id)
    old = dict(zip(before.names, picked_speed(before.times, [r.first for r in out_of_fold(before, cv="lofo")]),
                   strict=True))
    new = dict(zip(after.names, picked_speed(after.times, [r.first for r in out_of_fold(after, cv="lofo")]),
                   strict=True))
    selector = fitted_on(before, np.arange(len(before)))
    added = [i for i, name in enumerate(after.names) if name not in old]
    by_base = picked_speed([after.times[i] for i in added], [_recommended(selector, after.X[i]) for i in added])
    nnz = FEATURE_NAMES.index("nnz")
    large = {name for name, x in zip(after.names, after.X[:, nnz], strict=True) if x >= 1e6}
    lines = []
    for label, names in (("all", list(old)), ("1 M nonzeros and more", [n for n in old if n in large])):
        lines.append(f"{dtype}, the base's families, {label} ({len(names)}): left out of the base "
                     f"{_summary([old[n] for n in names])}, of base and grown {_summary([new[n] for n in names])}")
    mine = [after.names[i] in large for i in added]
    lines.append(f"{dtype}, the grown families ({len(added)}; {sum(mine)} of 1 M nonzeros and more): the base's "
                 f"selector {_summary(by_base)} ({_summary(by_base[mine])}), each left out of base and grown "
                 f"{_summary([new[after.names[i]] for i in added])} "
                 f"({_summary([new[after.names[i]] for i, m in zip(added, mine, strict=True) if m])})")
    return lines


def _merged_table(base: Path, grown_corpus: Path, dtype: str, device: str) -> RankingTable:
    """The ranking table of both corpora's trials on ``device`` (the base's device record kept)."""
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "m.db") as store:
        for path in (base, grown_corpus):
            import_corpus(store, path)
        return ranking_table(store, device=device, dtype=dtype)


def _recommended(selector: KernelSelector, x: np.ndarray) -> str:
    """What the recommendation answers for one feature row: csr5's where the second opinion says, else the first."""
    ranking = selector.rank(x)
    second = selector.second_opinion(x, ranking[0])
    chosen = second if second is not None else ranking[0]
    return config_key(chosen.kernel, chosen.params)


def _summary(scores: Sequence[float] | np.ndarray) -> str:
    """Geometric mean and worst 5 % of picked speeds (:func:`~tuner.select.evaluation.picked_speed`)."""
    values = np.asarray(scores, dtype=float)
    return f"{np.exp(np.mean(np.log(values))):.3f} (worst 5 % {np.percentile(values, 5):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("survey", "export", "replay"))
    ap.add_argument("out", nargs="?", help="export: the corpus file to write")
    ap.add_argument("--db", help="survey, export: the survey's SQLite store")
    ap.add_argument("--scale", type=float, nargs="+", default=SCALES, help="sizes, as fractions of the benchmark's")
    ap.add_argument("--workers", type=int, default=8, help="processes building the matrices ahead of the GPU")
    ap.add_argument("--base", type=Path, help="replay: the corpus grown (csr5's survey merged in)")
    ap.add_argument("--grown", type=Path, help="replay: what export wrote")
    ap.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    args = ap.parse_intermixed_args()
    if args.step == "replay":
        if not (args.base and args.grown):
            raise SystemExit("replay needs --base and --grown")
        for dtype in args.dtype:
            print("\n".join(replay(args.base, args.grown, dtype)), flush=True)
        return
    if not args.db:
        raise SystemExit(f"{args.step} needs --db")
    with Store(args.db) as store:
        if args.step == "export":
            if not args.out:
                raise SystemExit("export needs the corpus file to write")
            print(f"{legacy_keys(store)} trials keyed as the corpus keys them")
            print(export_corpus(store, args.out))
            return
        srcs, backend = grown_sources(tuple(args.scale)), get_backend("gpu")
        with counting_bar() as bar:
            task = bar.add_task("matrices", total=len(srcs))
            report = survey(srcs, read_portfolio(PORTFOLIO), backend=backend, store=store, workers=args.workers,
                            on_matrix=lambda src, n: (bar.update(task, advance=1, description=f"{src.name}: {n}"),
                                                       bar.console.print(f"{src.name}: {n} trials")))
    print(report)


if __name__ == "__main__":
    main()
