"""plan() on matrices no corpus, test or selector has seen, against cuSPARSE's best algorithm (issue #18).

The matrices, set by set, and why each was added, are in :mod:`unseen_matrices` (``bench/unseen_matrices.py``).

For each matrix and dtype, in one process on one GPU: cuSPARSE's CSR_ALG1 and
CSR_ALG2 with descriptors built once, then ``plan()`` at each effort on the
matrix already on the GPU (``PLANS`` times, each on a fresh store made before
the clock starts and holding only the warm-up matrix: nothing of this one tuned
or raced before, the selector as shipped; and each on a new CuPy matrix of the
same arrays, as a user's is), the median run's whole wall time (fingerprint,
features, ranking, race, preparation of the winner; the store's writes) and
steps; then that run's planned kernel and both cuSPARSE algorithms timed interleaved with L2 flushed
before every product (cold). The ratio is cuSPARSE's best / plan's kernel, and
the cost in SpMV-equivalents is plan's wall time / cuSPARSE's best time. The
features are also timed alone (``features_s``: :func:`~tuner.matrix.features.extract_features`
on a new CuPy matrix of the same arrays flagged canonical, the fastest of three: a slow run, such as the first
allocations for a matrix's columns, would understate what is beyond them), and ``beyond_features_spmvs``
is the plan's wall time less that, in SpMVs: what issue #18 bounds for ``predict``. Those features run back to back;
a plan starts after its store was made, and there the same features take longer (0.95-1.0 ms against 0.48-0.62 on
three unseen matrices in float32, an H200, stop 61: a CuPy call on a host whose caches other work emptied costs
30-130 us, not 5-15). So they are also timed alike (``features_alike_s``, the fastest of three, each
after the same preamble as a plan: a new store made and opened, the warm-up matrix added), and
``beyond_alike_spmvs`` is the plan's wall time less those: what the plan spends beyond features costing what they
cost there. Both are reported (``plan()``
reads the features back with the matrix's checks where the store holds no matrix of its
shape, so its own steps do not time them apart). Kernel
compilation (of every config the shipped selector ranks, on each matrix before
its first plan(): CuPy keeps compiled kernels on disk, so a machine pays it
once) and the copy-bandwidth probe (once a process) come first, and are
reported apart (``compile_s``).

    python bench/unseen.py --out bench/results            # sets g on (no selector learned them), both dtypes
    python bench/unseen.py --set b --effort predict race   # the set added at stop 37
    python bench/unseen.py --dtype float32 --effort race --only rgg,perm27 --scale 0.25
    python bench/unseen.py --suite issue18 --effort predict race   # the six structures issue #18 names

``--renumbered`` plans each (square) matrix with :func:`tuner.execute.renumbered.plan_renumbered` instead: the
ratio is then cuSPARSE's best on A over the planned kernel on B (A renumbered with its hubs first), x and y in B's
numbering, as a caller that keeps them there runs; ``moves_s`` is what moving x into that numbering and y out of
it take (once an iteration, not once a product), and the renumbering's seconds are in the plan's cost
(``renumber``). A matrix that is not square is left out.

    python bench/unseen.py --renumbered --only hubcols,communities,bursts --effort race --label renumbered

``--permute-columns`` measures each matrix with its columns alone under a random permutation (named ``NAME-colperm``):
the rows keep their order and their lengths, each row's columns scattered over x (as set n's colperm27 is the
27-point stencil's), what firsttouch is for.

    python bench/unseen.py --permute-columns --only rgg,sawtooth,prolong3d --effort race --label colperm

``--recommend`` also times, for each matrix and dtype, what ``tuner recommend`` answers measuring nothing
(:func:`~tuner.execute.choice.choose` with the shipped selector: its ranking's first config, or csr5 where its second
opinion expects csr5 faster; effort ``recommend``) and the ranking's first config alone (``ranked``: the answer
before stop 74), each prepared, checked against cuSPARSE's y and timed cold beside cuSPARSE as a plan's pick is
(no plan cost: they are answers, not plans). With ``--effort`` given no value, those alone:

    python bench/unseen.py --effort --recommend --label recommend

``--suite NAME`` measures a named suite of :mod:`tuner.matrix.suites` instead, the same way: ``issue18`` is the
six structures issue #18 names, at its sizes. Those are kinds the selector's corpus has (at smaller sizes, most
of them), so they are not unseen structures: they say how ``plan()`` does on what the issue measured.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
PLANS = 3
"""plan() runs this many times a matrix, dtype and effort (``tune`` once): its cost is the median run's. The
GPU machines' hosts vary by 20-50 % from one minute to the next (the same code's ranking took 0.9 ms in one
run and 1.3 ms in the next); one plan() a cell left the cost medians to that."""
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from unseen_matrices import GROWN, MATRICES, Unseen, columns_permuted, from_suite, rgg  # noqa: E402

from common.errors import InvalidConfigError  # noqa: E402
from common.jsonfile import write_json  # noqa: E402
from db.shared import shared_store  # noqa: E402
from db.store import Store  # noqa: E402
from kernels import BASELINE, BASELINE_CONFIGS, canonical, get_family  # noqa: E402
from tuner.benchmark.bench import environment  # noqa: E402
from tuner.execute.choice import choose, rank_configs  # noqa: E402
from tuner.execute.plan import EFFORTS, plan  # noqa: E402
from tuner.execute.race import unranked_entrants  # noqa: E402
from tuner.execute.renumbered import plan_renumbered  # noqa: E402
from tuner.matrix.features import extract_features  # noqa: E402
from tuner.matrix.io import as_csr  # noqa: E402
from tuner.measure.backend import GpuBackend  # noqa: E402
from tuner.measure.evaluate import round_robin  # noqa: E402
from tuner.measure.metrics import gbps  # noqa: E402
from tuner.select.model import find_selector  # noqa: E402
from tuner.select.shipped import slug  # noqa: E402

# --------------------------------------------------------------------------- measuring

def compile_configs(backend: GpuBackend, A_host: sp.csr_matrix) -> None:
    """Run every config of the selector for this GPU and dtype once on ``A_host``, and the config a race
    enters of each family it does not rank (:meth:`kernels.Family.unranked_config`): each kernel compiled
    before the clock starts, as CuPy's kernel cache on disk holds them after a machine's first use. Run on
    each matrix before its plan(): the preparations' CuPy kernels are compiled per index width, which the
    matrix's shape picks (NuT's first preparation of communities in float64 on a fresh H100 took 173 ms,
    12 ms once compiled; rcm's first on perm27 on a fresh H200 1.36 s, 22 ms once compiled)."""
    import cupyx.scipy.sparse as cusp

    found = find_selector(None, device=backend.info.id, dtype=str(A_host.dtype), backend=backend)
    A = cusp.csr_matrix(A_host)
    x = backend.cp.ones(A.shape[1], dtype=A.dtype)
    out = backend.cp.empty(A.shape[0], dtype=A.dtype)
    features = extract_features(A)
    ranking = found[0].rank(features, device=found[1]) if found else []
    configs = [*ranking, *unranked_entrants(ranking, features, A.dtype.itemsize)]
    for kernel, params in ((c.kernel, c.params) for c in configs):
        family = get_family(kernel)
        try:
            family.run(family.prepare(A, params), x, out)
        except InvalidConfigError:  # rcm on a graph with no narrow order: it fails as fast in the race
            pass
    backend.synchronize()


def bench_one(backend: GpuBackend, matrix: Unseen, A_host: sp.csr_matrix, dtype: str, efforts: list[str],
              trials: int, warm_up: dict[str, Any], renumber: bool = False, recommend: bool = False
              ) -> list[dict[str, Any]]:
    import cupyx.scipy.sparse as cusp

    A = A_host.astype(dtype)
    start = time.perf_counter()
    compile_configs(backend, A)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    A_dev = cusp.csr_matrix(A)
    backend.synchronize()
    upload_s = time.perf_counter() - start
    x = backend.cp.random.RandomState(0).random_sample(A.shape[1]).astype(dtype)
    cus = get_family(BASELINE)
    base = [cus.prepare(A_dev, params) for _, params in BASELINE_CONFIGS]
    outs = [backend.cp.empty(A.shape[0], dtype=dtype) for _ in base]
    fns = [lambda p=p, o=o: cus.run(p, x, o) for p, o in zip(base, outs, strict=True)]
    y_ref = cus.run(base[0], x).copy()
    info = {"matrix": matrix.name, "set": matrix.group, "rows": A.shape[0], "cols": A.shape[1], "nnz": A.nnz,
            "dtype": dtype, "compile_s": compile_s, "upload_s": upload_s, "features_s": features_alone(backend, A_dev),
            "features_alike_s": features_alone(backend, A_dev, warm_up=warm_up)}
    rows = [planned(backend, A_dev, x, fns, y_ref, effort, trials, info, warm_up, renumber) for effort in efforts]
    return rows + (recommended(backend, A_dev, x, fns, y_ref, info) if recommend else [])


ANSWERS = ("recommend", "ranked")
"""``--recommend``'s rows: what ``tuner recommend`` answers, and the selector's ranking's first config."""


def recommended(backend: GpuBackend, A_dev: Any, x: Any, baseline: list[Callable[[], object]], y_ref: Any,
                info: dict[str, Any]) -> list[dict[str, Any]]:
    """What :func:`~tuner.execute.choice.choose` answers for ``A_dev`` with the shipped selector (no store: nothing
    of it measured) and its ranking's first config, each prepared, its y checked against cuSPARSE's ``y_ref`` and
    timed cold beside cuSPARSE (as :func:`planned` times a plan's pick): one row each (:data:`ANSWERS`)."""
    dtype, device = str(A_dev.dtype), backend.info.id
    features = extract_features(A_dev)
    choice = choose("", store=None, device=device, dtype=dtype, use_tuned=False, features=features)
    ranking, _ = rank_configs(None, device=device, dtype=dtype, features=features)
    first = (ranking[0].kernel, canonical(ranking[0].kernel, ranking[0].params)) if ranking else \
        (choice.kernel, choice.params)
    rows = []
    for answer, (kernel, params), source in (("recommend", (choice.kernel, choice.params), choice.source),
                                              ("ranked", first, "predicted" if ranking else choice.source)):
        row = {**info, "effort": answer, "source": source, "kernel": kernel,
               "params": json.dumps(params, sort_keys=True)}
        try:
            row |= answered(backend, A_dev, x, baseline, y_ref, get_family(kernel), params)
        except Exception as exc:  # noqa: BLE001  (an answer that fails is recorded, and the run goes on)
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        print(f"{info['matrix']:18s} {dtype} {answer:9s} " + (
            f"{row['ratio_to_cusparse']:.3f}x {row['bandwidth_fraction']:4.0%} of copy  {kernel} {params}  error "
            f"{row['rel_error']:.1e}" if "error" not in row else f"failed: {row['error']}"), flush=True)
    return rows


def answered(backend: GpuBackend, A_dev: Any, x: Any, baseline: list[Callable[[], object]], y_ref: Any, family: Any,
             params: dict[str, Any]) -> dict[str, Any]:
    """One config prepared on ``A_dev``, timed cold beside cuSPARSE's ``baseline`` and its y checked against
    ``y_ref``: the row's measured part (as :func:`planned`'s)."""
    prepared = family.prepare(A_dev, params)
    out = backend.cp.empty(A_dev.shape[0], dtype=A_dev.dtype)
    times = [r.median_s for r in round_robin(backend, [*baseline, lambda: family.run(prepared, x, out)], repeats=10,
                                             max_duration=0.5, flush_l2=True)]
    return beside_cusparse(backend, A_dev, times, family.run(prepared, x), y_ref)


def beside_cusparse(backend: GpuBackend, A_dev: Any, times: Sequence[float], y: Any, y_ref: Any) -> dict[str, Any]:
    """A pick's row fields from ``times`` (cuSPARSE's CSR_ALG1, CSR_ALG2 and the pick's, timed round-robin) and its
    ``y`` against cuSPARSE's ``y_ref``: the times, the ratio to cuSPARSE's best, ``rel_error`` (the norm of the
    difference over y_ref's) and both kernels' fractions of the copy bandwidth."""
    t1, t2, t = times
    cp, best, bandwidth = backend.cp, min(t1, t2), backend.copy_bandwidth_gbs()
    rate = functools.partial(gbps, A_dev.shape[0], A_dev.shape[1], A_dev.nnz, A_dev.dtype)
    return {"time_s": t, "cusparse_alg1_s": t1, "cusparse_alg2_s": t2, "cusparse_best_s": best,
            "ratio_to_cusparse": best / t,
            "rel_error": float(cp.linalg.norm(y - y_ref) / max(float(cp.linalg.norm(y_ref)), 1e-300)),
            "bandwidth_fraction": rate(t) / bandwidth, "cusparse_bandwidth_fraction": rate(best) / bandwidth}


def features_alone(backend: GpuBackend, A_dev: Any, runs: int = 3, warm_up: dict[str, Any] | None = None) -> float:
    """Fewest wall seconds of :func:`extract_features` on a new CuPy matrix of ``A_dev``'s arrays, flagged
    canonical (synchronized): the features alone, without CuPy's own canonical check (a kernel and a wait,
    0.2-1.5 ms), which ``plan()`` does not run. Back to back, or with ``warm_up`` each after the preamble of
    :func:`one_plan` (a fresh store holding ``warm_up``): in the state a plan starts in."""
    import cupyx.scipy.sparse as cusp

    seconds = []
    for _ in range(runs):
        A = cusp.csr_matrix((A_dev.data, A_dev.indices, A_dev.indptr), shape=A_dev.shape)
        A.has_canonical_format = True
        with fresh_store(warm_up) if warm_up is not None else contextlib.nullcontext():
            backend.synchronize()
            start = time.perf_counter()
            extract_features(A)
            backend.synchronize()
            seconds.append(time.perf_counter() - start)
    return float(np.min(seconds))


@contextlib.contextmanager
def fresh_store(warm_up: dict[str, Any]) -> Iterator[Store]:
    """A new store, made and opened as a user's is after the process's first plan(), holding the warm-up
    matrix (its tables shaped): where each benchmarked plan() starts."""
    with tempfile.TemporaryDirectory() as tmp:
        store = shared_store(Path(tmp) / "store.db")
        store.add_matrix("warm-up", name="warm-up", **warm_up)
        yield store


def planned(backend: GpuBackend, A_dev: Any, x: Any, baseline: list[Callable[[], object]], y_ref: Any, effort: str,
            trials: int, info: dict[str, Any], warm_up: dict[str, Any], renumber: bool = False) -> dict[str, Any]:
    """plan() at one effort, :data:`PLANS` times, each on a fresh store and a matrix new to it: the median
    plan's wall time and pick, that pick timed cold beside cuSPARSE, its y checked against cuSPARSE's ``y_ref``
    (``rel_error``: the norm of the difference over y_ref's). The store holds ``warm_up`` (the warm-up
    matrix's shape and features) before the clock starts. With ``renumber``, plan_renumbered() instead, its
    product timed in B's numbering, and the moves into it and out of it (``moves_s``) timed beside."""
    runs = []
    for _ in range(PLANS if effort != "tune" else 1):
        runs.append(one_plan(backend, A_dev, effort, trials, warm_up, renumber))
    plan_s, ex, record_s = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    cp = backend.cp
    out = cp.empty(A_dev.shape[0], dtype=A_dev.dtype)
    x_in, moves = x, []
    if renumber:  # x moved in once, and the moves in and out timed beside (y out into a buffer of its own)
        x_in, back = ex.to_internal(x), cp.empty_like(out)
        moves = [lambda: ex.to_internal(x), lambda: ex.from_internal(out, out=back)]
    times = [t.median_s for t in round_robin(backend, [*baseline, lambda: ex(x_in, out=out), *moves], repeats=10,
                                             max_duration=0.5, flush_l2=True)]
    y = ex.from_internal(ex(x_in)) if renumber else ex(x)
    measured = beside_cusparse(backend, A_dev, times[:3], y, y_ref)
    inner = ex.inner if renumber else ex
    best, rel_error = measured["cusparse_best_s"], measured["rel_error"]
    steps = {**inner.cost, "renumber": ex.renumber_s} if renumber else inner.cost
    row = {**info, "effort": effort, "source": inner.source, "kernel": inner.kernel,
           "params": json.dumps(inner.params, sort_keys=True), **measured, "plan_s": plan_s,
           "plan_spmvs": plan_s / best, "beyond_features_spmvs": (plan_s - info["features_s"]) / best,
           "beyond_alike_spmvs": (plan_s - info["features_alike_s"]) / best,
           "plan_steps_s": steps, "record_behind_s": record_s,
           "race": inner.race.table() if inner.race is not None else None,
           "race_steps_s": inner.race.seconds if inner.race is not None else None}
    if renumber:
        row |= {"renumbered": True, "order": ex.order_name, "others_s": ex.others, "moves_s": sum(times[3:]),
                "moves_spmvs": sum(times[3:]) / best}
    print(f"{info['matrix']:18s} {info['dtype']} {effort:8s} {row['ratio_to_cusparse']:.3f}x "
          f"{row['bandwidth_fraction']:4.0%} of copy  plan "
          f"{plan_s * 1e3:8.1f} ms = {plan_s / best:7.1f} SpMVs  {inner.source:9s} {inner.kernel} {inner.params}  "
          f"error {rel_error:.1e}" + (f"  {ex.order_name}, moves {row['moves_spmvs']:.2f} SpMVs" if renumber else ""),
          flush=True)
    return row


def one_plan(backend: GpuBackend, A_dev: Any, effort: str, trials: int, warm_up: dict[str, Any],
             renumber: bool = False, at_start: Callable[[], object] | None = None) -> tuple[float, Any, float | None]:
    """One plan() of ``A_dev`` (as a CuPy matrix new to plan(): its arrays in a new matrix object) on a fresh
    store: (wall seconds, the executor, the seconds the race's laps took to land behind it). ``at_start``: called
    just before the clock starts (``bench/plan_timeline.py`` starts its timeline there)."""
    import cupyx.scipy.sparse as cusp

    A = cusp.csr_matrix((A_dev.data, A_dev.indices, A_dev.indptr), shape=A_dev.shape)
    with fresh_store(warm_up) as store:  # made before the clock starts
        backend.synchronize()
        if at_start is not None:
            at_start()
        start = time.perf_counter()
        ex = (plan_renumbered if renumber else plan)(A, effort=effort, db=store.path,
                                                     trials=trials if effort == "tune" else None)  # as users do
        backend.synchronize()
        plan_s = time.perf_counter() - start
        # the race's laps are written behind plan()'s back, while the caller's products run: waited for here
        race = (ex.inner if renumber else ex).race
        record_s = race.recorded.result() if race is not None and race.recorded is not None else None
    return plan_s, ex, record_s


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per dtype and effort: the ratios' geomean and lowest, the cost's median and highest; over every matrix
    run, then over each set where more than one was run."""
    sets = sorted({r.get("set", "a") for r in rows})
    out = []
    for group in ["all", *sets] if len(sets) > 1 else sets:
        for dtype in sorted({r["dtype"] for r in rows}):
            for effort in (*EFFORTS, *ANSWERS):
                mine = [r for r in rows if r["dtype"] == dtype and r["effort"] == effort
                        and group in ("all", r.get("set", "a")) and "error" not in r]
                if mine:
                    out.append(f"set {group:3s} {_line(dtype, effort, mine)}")
    return out


def _line(dtype: str, effort: str, mine: list[dict[str, Any]]) -> str:
    ratios = np.array([r["ratio_to_cusparse"] for r in mine])
    head = (f"{dtype} {effort:8s}: geomean {np.exp(np.log(ratios).mean()):.3f}x, lowest {ratios.min():.3f}x "
            f"({len(mine)} matrices)")
    if effort in ANSWERS:
        return f"{head}; {np.mean(ratios < 0.97):.0%} below 0.97x"
    spmvs = np.array([r["plan_spmvs"] for r in mine])
    beyond = np.array([r.get("beyond_features_spmvs", np.nan) for r in mine])
    alike = np.array([r.get("beyond_alike_spmvs", np.nan) for r in mine])
    return (f"{head}; cost median {np.median(spmvs):.0f} SpMVs, highest {spmvs.max():.0f}"
            + (f"; beyond the features median {np.median(beyond):.1f}, highest {beyond.max():.1f} (features timed "
               f"alike: {np.median(alike):.1f}, {alike.max():.1f})" if effort == "predict" else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    ap.add_argument("--effort", nargs="*", default=list(EFFORTS), choices=EFFORTS,
                    help="plan()'s efforts to run (none: only --recommend's answers)")
    ap.add_argument("--recommend", action="store_true", help="also time what `tuner recommend` answers and the "
                    "selector's ranking's first config (efforts 'recommend' and 'ranked')")
    ap.add_argument("--trials", type=int, default=12, help="trials of effort='tune'")
    ap.add_argument("--only", default="", help="comma-separated matrix names")
    sets = sorted({m.group for m in MATRICES})
    ap.add_argument("--set", nargs="+", default=[s for s in sets if s not in GROWN], choices=sets,
                    help="which sets of matrices (default: those no shipped selector learned from, g on)")
    ap.add_argument("--suite", default="", help="a named suite of tuner.matrix.suites instead (issue18: the six "
                    "structures issue #18 names); --set and --only are then not used")
    ap.add_argument("--scale", type=float, default=1.0, help="size factor (nonzeros scale about linearly)")
    ap.add_argument("--renumbered", action="store_true", help="plan_renumbered() instead of plan(): products in "
                    "the degree numbering (square matrices only)")
    ap.add_argument("--permute-columns", action="store_true", help="each matrix with its columns alone randomly "
                    "permuted (named NAME-colperm)")
    ap.add_argument("--label", default="", help="added to the result file's name (runs of a day kept apart)")
    ap.add_argument("--workers", type=int, default=4, help="processes generating the matrices (before any is measured)")
    args = ap.parse_args()
    chosen = from_suite(args.suite) if args.suite else \
        [m for m in MATRICES if m.group in args.set and (not args.only or m.name in args.only.split(","))]
    if args.permute_columns:
        chosen = [columns_permuted(m) for m in chosen]
    import cupyx.scipy.sparse as cusp

    backend = GpuBackend()
    env = environment(backend)
    start = time.perf_counter()
    for dtype in args.dtype:  # compile every config the selector ranks: once a machine (CuPy's cache), apart
        warm = as_csr(rgg(20_000, np.random.default_rng(0)), dtype=dtype)
        plan(cusp.csr_matrix(warm), effort="race", db=Store(memory=True))  # on the GPU, as the matrices are
        compile_configs(backend, warm)
    warm_up = {"rows": warm.shape[0], "cols": warm.shape[1], "nnz": warm.nnz, "features": extract_features(warm)}
    compile_s = time.perf_counter() - start
    print(f"{env['device']}: compile and first plan() {compile_s:.1f} s", flush=True)
    rows: list[dict[str, Any]] = []
    stem = f"{env['date'][:10]}_{slug(env['device'])}_unseen{'-' + args.label if args.label else ''}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # every matrix generated before the first is measured: generators running beside plan() took CPU from
    # it (its steps on the host ran up to twice as long)
    with cf.ProcessPoolExecutor(args.workers) as pool:
        matrices = [(m, A) for m, A in zip(chosen, pool.map(functools.partial(Unseen.make, scale=args.scale),
                                                                  chosen), strict=True)]
    for matrix, A in matrices:
        if args.renumbered and A.shape[0] != A.shape[1]:
            print(f"{matrix.name}: not square, left out (--renumbered)", flush=True)
            continue
        for dtype in args.dtype:
            rows += bench_one(backend, matrix, A, dtype, args.effort, args.trials, warm_up, args.renumbered,
                              args.recommend)
        write_json(out / f"{stem}.json.gz",
                   {"env": env, "compile_s": compile_s, "rows": rows, "summary": summary(rows)})
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
