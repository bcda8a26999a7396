"""The race's pick out of distribution, raced on the GPU: each structure family of a corpus left out (issue #18).

``bench/race_lofo.py`` replays the race on a corpus's times, where an entrant the corpus never measured
cannot win: NuT fitted to the L2 of a matrix whose x outgrows it (:func:`tuner.execute.race.adapted`) is one,
and on the corpus's matrices of 1 M nonzeros and more it is the race's pick as often as not. Its figures
are a lower bound. Here the race runs. For each structure family of the corpus (its generator kind, or
"real"), a selector is fitted on the other families' matrices (as ``race_lofo.py`` fits it) and saved into
a fresh store as this GPU's selector; each of the family's matrices of ``--min-nnz`` nonzeros or more is
built again by its suite's generator (or read from ``--mtx-dir``), checked to be the corpus's matrix (its
fingerprint), and ``plan()`` runs on it as a user's would, at ``effort="predict"`` and then ``"race"``.
Then, checked against the float64 reference and timed cold (L2 flushed before every product, the configs
round-robin): the race's pick, predict's, the selector's recommendation (``first``: what ``tuner recommend``
answers, :func:`~tuner.execute.choice.choose`, its second opinion's csr5 where it expects csr5 faster), its
ranking's first config (``ranked``: the recommendation before stop 74), cuSPARSE's two algorithms and the
corpus's ``--best`` fastest configs of the matrix (its tuned best, timed again by this commit's kernels). The
score of a pick is the fastest of them all over the pick's time: 1.0 where nothing known is faster. The corpus
must be of this GPU's model (its times pick the configs timed again, and its device is the selector's); one with
csr5's race survey merged in (``tuner corpus replace ... --family csr5``) teaches the selectors their second
opinion.

    python bench/race_lofo_gpu.py \\
        --corpus bench/results/corpus/2026-11-24_NVIDIA-H100-80GB-HBM3-sm-90_corpus.jsonl.gz \\
        --out bench/results --label <commit> [--dtype float64] [--family lp kronecker] [--min-nnz 1e6]

Fitting a selector each family out takes minutes of CPU a family (its second opinion fits one a family again);
``--fit-only --fits DIR`` fits them (the families whose matrices it finds) on any machine and writes them to DIR,
and ``--fits DIR`` then reads them there, so that a GPU's time goes to racing. ``--grown`` adds the matrices
``bench/grow_corpus.py`` grew the corpus by (its generators rebuild them).
"""

from __future__ import annotations

import argparse
import lzma
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.jsonfile import write_json  # noqa: E402
from db.store import Store  # noqa: E402
from kernels import BASELINE, BASELINE_CONFIGS, canonical, config_key, config_of, get_family  # noqa: E402
from tuner.benchmark.bench import environment  # noqa: E402
from tuner.execute.choice import choose, rank_configs  # noqa: E402
from tuner.execute.plan import plan  # noqa: E402
from tuner.matrix.features import FEATURE_NAMES, extract_features  # noqa: E402
from tuner.matrix.fingerprint import fingerprint  # noqa: E402
from tuner.matrix.io import as_device_csr  # noqa: E402
from tuner.matrix.sources import Source, sources  # noqa: E402
from tuner.measure.backend import GpuBackend  # noqa: E402
from tuner.measure.evaluate import checked_prepare, round_robin  # noqa: E402
from tuner.measure.verify import Reference  # noqa: E402
from tuner.search.survey import load_ahead  # noqa: E402
from tuner.select.evaluation import RankingTable, corpus_table, fitted_on  # noqa: E402
from tuner.select.model import KernelSelector, save_model  # noqa: E402
from tuner.select.shipped import slug  # noqa: E402


def cold_checked(backend: GpuBackend, A: Any, configs: Sequence[tuple[str, dict[str, Any]]], reference: Reference,
                 *, rounds: int = 3, repeats: int = 10) -> list[float | str]:
    """Each config prepared and checked against ``reference``, then timed cold, round-robin: the median of
    its rounds' medians in seconds, or why it failed."""
    ready: list[tuple[Any, Any, Any] | str] = []
    for kernel, params in configs:
        family = get_family(kernel)
        result, prepared, out = checked_prepare(backend, family, A, params, reference, reference.x)
        ready.append((family, prepared, out) if prepared is not None else f"{result.error_kind}: {result.error}")
    runs = [lambda f=r[0], p=r[1], o=r[2]: backend.run(f, p, reference.x, o) for r in ready if not isinstance(r, str)]
    timed = iter(round_robin(backend, runs, rounds=rounds, repeats=repeats, flush_l2=True))
    return [r if isinstance(r, str) else next(timed).median_s for r in ready]


def one_matrix(backend: GpuBackend, A_host: Any, i: int, table: RankingTable, selector: KernelSelector,
               best: int) -> dict[str, Any]:
    """predict and race on one matrix of ``table`` (row ``i``) with ``selector`` as this GPU's, then the picks,
    cuSPARSE and the corpus's ``best`` fastest configs timed cold: the row of the result file."""
    dtype = table.dtype
    A = as_device_csr(A_host, dtype=dtype)
    row: dict[str, Any] = {"matrix": table.names[i], "family": table.families[i], "dtype": dtype,
                           "rows": A.shape[0], "cols": A.shape[1], "nnz": A.nnz}
    if fingerprint(A) != table.fingerprints[i]:
        return {**row, "error": "not the corpus's matrix (its generator changed since)"}
    picks = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store.db")
        store.add_device(backend.info.record(backend.copy_bandwidth_gbs()))
        save_model(store, selector, device=backend.info.id, dtype=dtype)
        features = extract_features(A)
        first = choose(table.fingerprints[i], store=store, device=backend.info.id, dtype=dtype, use_tuned=False,
                       features=features)
        picks["first"] = (first.kernel, first.params)
        ranking, _ = rank_configs(store, device=backend.info.id, dtype=dtype, features=features)
        picks["ranked"] = (ranking[0].kernel, ranking[0].params)
        for effort in ("predict", "race"):
            start = time.perf_counter()
            ex = plan(A, effort=effort, db=store)
            backend.synchronize()
            picks[effort] = (ex.kernel, ex.params)
            row[f"{effort}_source"], row[f"{effort}_plan_s"] = ex.source, time.perf_counter() - start
            if ex.race is not None:
                row["race_table"] = ex.race.table()
                if ex.race.recorded is not None:
                    ex.race.recorded.result()
            del ex
    corpus_best = sorted(table.times[i], key=table.times[i].get)[:best]
    configs = [*picks.values(), *BASELINE_CONFIGS, *map(config_of, corpus_best)]
    keys = list(dict.fromkeys(config_key(k, canonical(k, p)) for k, p in configs))
    reference = Reference.build(A, dtype)
    timed = dict(zip(keys, cold_checked(backend, A, [config_of(k) for k in keys], reference), strict=True))
    times = [t for t in timed.values() if not isinstance(t, str)]
    fastest = min(times)
    base = min(t for k, t in timed.items() if k.startswith(BASELINE) and not isinstance(t, str))

    def score(kernel: str, params: dict[str, Any]) -> tuple[float, float]:
        t = timed[config_key(kernel, canonical(kernel, params))]
        return (0.0, 0.0) if isinstance(t, str) else (fastest / t, base / t)

    for effort, (kernel, params) in picks.items():
        row[effort] = config_key(kernel, params)
        row[f"{effort}_score"], row[f"{effort}_ratio_to_cusparse"] = score(kernel, params)
    row["corpus_best"] = corpus_best
    row["timed_s"] = timed
    print(f"{row['matrix']:45s} {dtype} race {row['race_score']:.3f} ({row['race_ratio_to_cusparse']:.2f}x) "
          f"first {row['first_score']:.3f} ranked {row['ranked_score']:.3f} predict {row['predict_score']:.3f}  "
          f"{row['race'][:60]}", flush=True)
    return row


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per dtype and pick (the race's, the selector's recommendation, its ranking's first config, predict's): the
    score's geomean, 5th percentile and lowest, and the ratio to cuSPARSE."""
    out = []
    for dtype in sorted({r["dtype"] for r in rows if "dtype" in r}):
        mine = [r for r in rows if r.get("dtype") == dtype and "error" not in r]
        for effort in ("race", "first", "ranked", "predict"):
            if not all(f"{effort}_score" in r for r in mine):
                continue
            s = np.array([r[f"{effort}_score"] for r in mine])
            c = np.array([r[f"{effort}_ratio_to_cusparse"] for r in mine])
            if len(s) and s.min() > 0:
                out.append(f"{dtype} {effort:7s}: pick / fastest known {np.exp(np.log(s).mean()):.3f} (worst 5 % "
                           f"{np.percentile(s, 5):.3f}, lowest {s.min():.3f}, {np.mean(s >= 1 / 1.03):.0%} within "
                           f"3 %), {np.exp(np.log(c).mean()):.3f}x cuSPARSE, {len(s)} matrices")
            elif len(s):
                out.append(f"{dtype} {effort:7s}: {int(np.sum(s == 0))} of {len(s)} picks failed their check")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, help="a corpus file of this GPU's model (bench/results/corpus/)")
    ap.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    ap.add_argument("--family", nargs="+", help="only these structure families (default: every one)")
    ap.add_argument("--min-nnz", type=float, default=1e6, help="only the matrices of this many nonzeros or more")
    ap.add_argument("--max-nnz", type=float, default=float("inf"), help="only the matrices of fewer nonzeros")
    ap.add_argument("--best", type=int, default=3, help="the corpus's fastest configs of a matrix timed again")
    ap.add_argument("--mtx-dir", default=os.environ.get("SPMV_SHARED_MATRICES"),
                    help="where the corpus's real matrices are (.mtx / .mtx.gz)")
    ap.add_argument("--workers", type=int, default=6, help="processes building the matrices ahead of the GPU")
    ap.add_argument("--label", default="", help="added to the result file's name")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--fits", type=Path, help="a folder of selectors fitted each family out: read from it (those "
                                              "it lacks are fitted here), or written by --fit-only")
    ap.add_argument("--fit-only", action="store_true", help="fit the selectors into --fits and stop (no GPU needed); "
                                                             "those --fits holds already are kept")
    ap.add_argument("--grown", action="store_true", help="also the matrices bench/grow_corpus.py grew the corpus by "
                                                         "(rebuilt by their generators)")
    args = ap.parse_args()
    if args.fit_only and args.fits is None:
        ap.error("--fit-only needs --fits, the folder to write the selectors to")
    tables = {dtype: corpus_table(args.corpus, dtype=dtype) for dtype in args.dtype}
    first = next(iter(tables.values()))
    known = {s.name: s for s in sources([args.mtx_dir] if args.mtx_dir else [], None)}
    for suite in ("corpus", "corpus-more"):
        known.update({s.name: s for s in sources([], suite)})
    if args.grown:
        from grow_corpus import grown_sources

        known.update({s.name: s for s in grown_sources()})
    families = sorted(set(first.families)) if not args.family else args.family
    nnz = FEATURE_NAMES.index("nnz")
    chosen = [i for i, f in enumerate(first.families)
              if f in families and args.min_nnz <= first.X[i, nnz] < args.max_nnz]
    missing = [first.names[i] for i in chosen if first.names[i] not in known]
    srcs: list[Source] = [known[first.names[i]] for i in chosen if first.names[i] in known]
    raced = sorted({first.families[i] for i in chosen if first.names[i] in known})
    if args.fit_only:
        args.fits.mkdir(parents=True, exist_ok=True)
        todo = [f for f in raced if not all(fitted_path(args.fits, d, f).exists() for d in tables)]
        for (dtype, f), selector in left_out_selectors(tables, todo, None).items():
            with lzma.open(fitted_path(args.fits, dtype, f), "wb", preset=9 | lzma.PRESET_EXTREME) as fh:
                pickle.dump(selector, fh)
        print(f"{len(todo)} families' selectors in {args.dtype} written to {args.fits} "
              f"({len(raced) - len(todo)} were there)")
        return
    backend = GpuBackend()
    env = environment(backend)
    if first.device.id != backend.info.id:
        raise SystemExit(f"{args.corpus} was measured on {first.device.id}, this GPU is {backend.info.id}")
    selectors = left_out_selectors(tables, raced, args.fits)
    index = {dtype: dict(zip(t.names, range(len(t)), strict=True)) for dtype, t in tables.items()}
    print(f"{env['device']}: {len(srcs)} matrices of {len(raced)} families ({len(missing)} not found: "
          f"{missing[:5]})", flush=True)
    stem = f"{env['date'][:10]}_{slug(env['device'])}_race_lofo_gpu{'-' + args.label if args.label else ''}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for src, A in load_ahead(srcs, args.workers):
        if isinstance(A, Exception):
            rows.append({"matrix": src.name, "error": f"{type(A).__name__}: {A}"})
            continue
        for dtype, table in tables.items():
            if (i := index[dtype].get(src.name)) is None:
                continue
            try:
                rows.append(one_matrix(backend, A, i, table, selectors[dtype, table.families[i]], args.best))
            except Exception as exc:  # noqa: BLE001  (a matrix that fails is recorded, and the run goes on)
                rows.append({"matrix": src.name, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"})
                print(f"{src.name} {dtype}: {rows[-1]['error']}", flush=True)
        write_json(out / f"{stem}.json.gz", {"env": env, "corpus": args.corpus, "missing": missing, "rows": rows,
                                             "summary": summary(rows)})  # a run's rows: about a megabyte of JSON
    print("\n".join(summary(rows)))


def fitted_path(folder: Path, dtype: str, family: str) -> Path:
    """Where ``--fit-only`` writes the selector fitted without ``family``'s matrices, in ``dtype``."""
    return folder / f"{dtype}_{family}.pkl.xz"  # xz: a fifth smaller than gzip, for a GPU call's 64 MiB


def left_out_selectors(tables: dict[str, RankingTable], families: Sequence[str], folder: Path | None
                       ) -> dict[tuple[str, str], KernelSelector]:
    """For each dtype's table and each of ``families``: a selector fitted on the other families' rows, read from
    ``folder`` where it holds one (:func:`fitted_path`), else fitted here. One read that was not fitted on as many
    rows as the table has outside the family (another corpus's) stops the run."""
    out = {}
    for dtype, t in tables.items():
        for f in families:
            path = fitted_path(folder, dtype, f) if folder is not None else None
            rows = np.flatnonzero(np.asarray(t.families) != f)
            if path is None or not path.exists():
                out[dtype, f] = fitted_on(t, rows)
                continue
            with lzma.open(path, "rb") as fh:
                out[dtype, f] = pickle.load(fh)
            if getattr(out[dtype, f], "n_train_", None) != rows.size:
                raise SystemExit(f"{path} was not fitted on this corpus's {rows.size} {dtype} rows outside {f}")
    return out


if __name__ == "__main__":
    main()
