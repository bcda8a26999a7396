"""Grow the H200's corpus with structures it lacks: some of the unseen benchmark's generators, smaller, surveyed.

Leaving 3 of the corpus's 13 other structure families out of training, on top of the held-out one, costs the
recommendation 0.014-0.024 of the tuned best on the held-out large matrices (float32, the CPU's replay): the
selector generalizes by the variety it has seen. So this adds families: the generators of the unseen benchmark's
sets a to f (:mod:`unseen_matrices`, the 29 of the 30 oldest structures that are not one of the others at another
size), each at a quarter and at a sixteenth of its benchmark size, surveyed with the portfolio the corpus was
measured with (:data:`PORTFOLIO`: its 69 configs, csr_vector and csr_scalar with the int32 columns and plain loop
their corpus times were measured with, and csr5's seven sigmas, as its race survey). Those sets then train the
selector and are no longer unseen; the benchmark's figures from then on are over the other sets.

    python bench/grow_corpus.py survey --db grow.db        # on the GPU: every matrix, both dtypes, into the store
    python bench/grow_corpus.py export --db grow.db out.jsonl.gz   # keyed as the corpus keys those configs

``survey`` can be stopped and run again: each matrix is stored whole, and one stored is passed by. ``export``
writes csr_vector's and csr_scalar's configs by the keys the corpus gives them (without ``indices`` and
``unroll``, which they predate), so that a selector trained on both sees one config, not two.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from unseen_matrices import MATRICES, Unseen  # noqa: E402

from db.store import Store  # noqa: E402
from tuner.matrix.sources import Source  # noqa: E402
from tuner.measure.backend import get_backend  # noqa: E402
from tuner.search.survey import survey  # noqa: E402
from tuner.select.corpus import export_corpus  # noqa: E402
from tuner.select.portfolio import read_portfolio  # noqa: E402

PORTFOLIO = REPO / "bench/results/corpus/portfolio-grow.json"
SETS = ("a", "b", "c", "d", "e", "f")
SCALES = (0.25, 1 / 16)
LEGACY = {"csr_vector": {"indices": "int32"}, "csr_scalar": {"indices": "int32", "unroll": 1}}
"""The params a family's corpus configs ran with before the family had them: dropped from the keys on export."""


def grown(sets: tuple[str, ...] = SETS, scales: tuple[float, ...] = SCALES) -> list[tuple[Unseen, float, str]]:
    """Each generator of ``sets`` (one per structure: a name with a dash is another's at another size) at each
    scale, all of the first scale first, with its corpus name ``<generator>-<size>-s<seed>``."""
    chosen = [m for m in MATRICES if m.group in sets and "-" not in m.name]
    return [(m, scale, f"{m.name}-{max(8, round(m.size * scale ** (1 / m.dims)))}-s{m.seed}")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("survey", "export"))
    ap.add_argument("out", nargs="?", help="export: the corpus file to write")
    ap.add_argument("--db", required=True, help="the survey's SQLite store")
    ap.add_argument("--scale", type=float, nargs="+", default=SCALES, help="sizes, as fractions of the benchmark's")
    ap.add_argument("--workers", type=int, default=8, help="processes building the matrices ahead of the GPU")
    args = ap.parse_intermixed_args()
    with Store(args.db) as store:
        if args.step == "export":
            if not args.out:
                raise SystemExit("export needs the corpus file to write")
            print(f"{legacy_keys(store)} trials keyed as the corpus keys them")
            print(export_corpus(store, args.out))
            return
        srcs, backend = grown_sources(tuple(args.scale)), get_backend("gpu")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
            task = bar.add_task("matrices", total=len(srcs))
            report = survey(srcs, read_portfolio(PORTFOLIO), backend=backend, store=store, workers=args.workers,
                            on_matrix=lambda src, n: (bar.update(task, advance=1, description=f"{src.name}: {n}"),
                                                       bar.console.print(f"{src.name}: {n} trials")))
    print(report)


if __name__ == "__main__":
    main()
