"""The ``tuner`` command line (typer + rich).

Every command turns the project's own errors (:class:`~common.errors.TunerError`)
and the system's (``OSError``: a missing file, a full disk) into one red line and
exit code 1; anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from common.errors import TunerError
from tuner.matrix.io import check_dtype

app = typer.Typer(
    help="Auto-tuned SpMV on NVIDIA GPUs: generate or read a matrix, tune kernels on it, look up results.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # --help joins a docstring's wrapped lines ("rich" broke them where the source did)
)
console = Console()
err_console = Console(stderr=True)

DbOption = Annotated[Path | None, typer.Option("--db", help="SQLite store (default: $SPMV_TUNER_DB or per-user)")]
DtypeOption = Annotated[str, typer.Option("--dtype", help="value type: float64 or float32")]


def _clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (TunerError, OSError) as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(1) from None

    return wrapper


_PROGRESS_BYTES = 64 << 20  # files from this size are read with a progress bar


def counting_bar(console: Console | None = None) -> Progress:
    """The bar a long command counts its steps with (trials, matrices): what it is at, the bar, done of total and the
    time so far; ``with counting_bar() as bar: task = bar.add_task("matrices", total=n)``."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console)


def _read_matrix(path: str | Path, *, dtype: str | None = None) -> Any:
    """The matrix at ``path``; a large file (whose size nothing caps here) with a progress bar on stderr."""
    from rich.progress import DownloadColumn

    from tuner.matrix.io import read_mtx, read_mtx_watched

    path = Path(path)
    if not path.is_file() or path.stat().st_size < _PROGRESS_BYTES:
        return read_mtx(path, dtype=dtype)
    with Progress(TextColumn("reading {task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:
        task = progress.add_task(escape(path.name), total=path.stat().st_size)
        return read_mtx_watched(path, dtype=dtype,
                                on_progress=lambda done, total: progress.update(task, completed=done, total=total))


@app.command()
@_clean_errors
def generate(
    kind: Annotated[str, typer.Argument(help="matrix kind (see `tuner generate --help` for the list)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="where to write the .mtx (or .mtx.gz)")],
    n: Annotated[int | None, typer.Option("--n", help="grid side, for the stencil kinds")] = None,
    rows: Annotated[int | None, typer.Option("--rows", help="number of rows, for the other kinds")] = None,
    seed: Annotated[int, typer.Option("--seed", help="random seed (same seed, same matrix)")] = 0,
) -> None:
    """Write a synthetic matrix: stencils, banded, uniform, power-law, few huge rows, LP-like, empty rows."""
    from tuner.matrix.generate import generate as make
    from tuner.matrix.io import write_mtx

    A = make(kind, n=n, rows=rows, seed=seed)
    write_mtx(output, A, comment=f"tuner generate {kind} n={n} rows={rows} seed={seed}")
    console.print(f"wrote {output}: {A.shape[0]} x {A.shape[1]}, {A.nnz} nonzeros")


@app.command()
@_clean_errors
def tune(
    matrix: Annotated[Path, typer.Argument(help="Matrix Market file (.mtx or .mtx.gz)")],
    trials: Annotated[int, typer.Option(min=1, help="trials to run now (the study keeps earlier ones)")] = 40,
    timeout: Annotated[float | None, typer.Option(
        min=0, help="stop starting new trials after this many seconds")] = None,
    kernels: Annotated[str | None, typer.Option(help="comma-separated families (default: all)")] = None,
    dtype: DtypeOption = "float64",
    db: DbOption = None,
    storage: Annotated[
        str | None, typer.Option(help="optuna storage: URL, journal:PATH or PATH.log (default: journal beside --db)")
    ] = None,
    device: Annotated[str, typer.Option(help="gpu, or cpu-reference (CPU references; not GPU figures)")] = "gpu",
    seed: Annotated[int, typer.Option(help="seed of the sampler and of the test vector")] = 0,
) -> None:
    """Tune SpMV kernels for MATRIX on this device; results go to the store (run again to continue). The
    search starts with what the store knows of this matrix and of the nearest tuned ones, then the
    selector's first configs with those it fits to the matrix (as plan(effort="tune") does)."""
    import optuna

    from db.store import Store
    from tuner.execute.choice import rank_configs
    from tuner.execute.race import SEED_CONFIGS, search_seeds
    from tuner.matrix.features import extract_features
    from tuner.matrix.io import matrix_name
    from tuner.measure.backend import GpuBackend, get_backend
    from tuner.search.loop import tune as run_tune
    from tuner.search.storage import default_storage, open_storage

    check_dtype(dtype)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = get_backend(device)
    A = _read_matrix(matrix, dtype=dtype)
    store = Store(db)
    study_storage = open_storage(storage or default_storage(store.path))
    label = "" if backend.info.kind == "gpu" else " [yellow](CPU references: not GPU figures)[/]"
    console.print(f"tuning {matrix_name(matrix)} ({A.shape[0]} x {A.shape[1]}, {A.nnz} nnz, {dtype}) "
                  f"on {backend.info.id}{label}")
    gpu = backend if isinstance(backend, GpuBackend) else None
    features = extract_features(backend.matrix(A))
    ranking, basis = rank_configs(store, device=backend.info.id, dtype=dtype, features=features, backend=gpu)
    seeds = search_seeds(ranking, size=SEED_CONFIGS, cols=A.shape[1], itemsize=A.dtype.itemsize,
                         l2_bytes=backend.info.l2_bytes, features=features)
    if seeds:
        console.print(f"the search starts with {len(seeds)} configs: the first of {basis}, then those a race "
                      "fits to the matrix or enters unranked")
    failures = 0
    with counting_bar(console) as progress:
        task = progress.add_task("trials", total=trials)

        def on_trial(outcome: Any) -> None:
            nonlocal failures
            failures += outcome is not None and not outcome.ok
            what = "cached" if outcome is None else f"{outcome.kernel}: {_outcome_text(outcome)}"
            progress.update(task, advance=1, description=f"trials ({failures} failed) {what}")

        result = run_tune(A, backend=backend, store=store, storage=study_storage, name=matrix_name(matrix),
                          dtype=dtype, trials=trials, timeout=timeout,
                          kernels=kernels.split(",") if kernels else None, seed=seed, on_trial=on_trial,
                          enqueue=seeds)
    _print_summary(result)


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "-"


def _outcome_text(outcome: Any) -> str:
    if outcome.ok:
        return f"{outcome.timing.median_s * 1e6:.1f} µs"
    return f"[red]{outcome.error_kind}[/]"


def _print_summary(result: Any) -> None:
    table = Table(title=f"best per family on {result.device.id} ({result.dtype}), re-timed in one run")
    for col in ("kernel", "params", "time (µs)", "GFLOP/s", "GB/s", "of copy BW", "vs cuSPARSE"):
        table.add_column(col, justify="left" if col in ("kernel", "params") else "right")
    for s in result.summary:
        ratio = f"{s.ratio_to_cusparse:.2f}x" if s.ratio_to_cusparse else "-"
        table.add_row(s.kernel, _params(s.params), f"{s.timing.median_s * 1e6:.1f}", f"{s.gflops:.1f}",
                      f"{s.gbps:.1f}", f"{s.bandwidth_fraction:.0%}", ratio)
    console.print(table)
    console.print(f"copy bandwidth measured in this run: {result.copy_bandwidth_gbs:.0f} GB/s; "
                  f"fingerprint {result.fingerprint}; study {result.study}")
    if result.device.kind != "gpu":
        console.print("[yellow]these are CPU reference timings: they say nothing about any GPU[/]")


@app.command()
@_clean_errors
def bench(
    matrices: Annotated[list[Path] | None, typer.Argument(help=".mtx files or folders of them")] = None,
    suite: Annotated[str | None, typer.Option(
        help="a named generated suite: small, large, graphs, corpus or corpus-smoke")] = None,
    trials: Annotated[int, typer.Option(min=0, help="trials per matrix (0: reuse what the store holds)")] = 40,
    family_trials: Annotated[int, typer.Option(
        min=0, help="then this many trials for each family alone, so every family is tuned")] = 0,
    enqueue: Annotated[Path | None, typer.Option(
        help="portfolio file (`tuner corpus portfolio`): configs measured on every matrix")] = None,
    kernels: Annotated[str | None, typer.Option(
        help="comma-separated families to tune and time (default: all; cusparse, the baseline, always)")] = None,
    dtype: DtypeOption = "float64",
    out: Annotated[Path, typer.Option(help="folder for the result CSV and JSON")] = Path("bench/results"),
    db: DbOption = None,
    storage: Annotated[str | None, typer.Option(help="optuna storage (default: journal beside --db)")] = None,
    device: Annotated[str, typer.Option(help="gpu, or cpu-reference (CPU references; not GPU figures)")] = "gpu",
) -> None:
    """Tune, then time cuSPARSE, each family's best and plan()'s untuned pick, in one run, per matrix."""
    import optuna

    from common.errors import InvalidConfigError
    from db.store import Store
    from tuner.benchmark.bench import families_of, run_bench
    from tuner.matrix.sources import sources
    from tuner.measure.backend import get_backend
    from tuner.search.storage import default_storage, open_storage
    from tuner.select.portfolio import read_portfolio

    check_dtype(dtype)
    families = families_of(kernels.split(",")) if kernels else None  # unknown names fail before the store opens
    configs = read_portfolio(enqueue) if enqueue else []
    srcs = sources(matrices or [], suite)
    if not srcs:
        raise InvalidConfigError("nothing to benchmark: give .mtx files, folders, or --suite NAME "
                                 "(small, large, graphs, corpus, corpus-smoke)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = get_backend(device)
    store = Store(db)
    study_storage = open_storage(storage or default_storage(store.path))
    with counting_bar(console) as progress:
        task = progress.add_task("matrices", total=len(srcs))

        def on_matrix(src: Any, status: str) -> None:
            if status != "ok":
                progress.console.print(f"[red]{escape(src.name)} failed:[/] {escape(status)}")
            progress.update(task, advance=1, description=f"matrices (last: {src.name})")

        csv_path, json_path = run_bench(srcs, backend=backend, store=store, storage=study_storage, dtype=dtype,
                                        trials=trials, family_trials=family_trials, enqueue=configs,
                                        kernels=families,
                                        out_dir=out, label=suite or "matrices",
                                        on_matrix=on_matrix)
    console.print(f"wrote {csv_path} and {json_path}; `tuner report {json_path}` draws the plots")


@app.command()
@_clean_errors
def report(
    results: Annotated[list[Path], typer.Argument(help="result JSON files (or folders) from `tuner bench`")],
    out: Annotated[Path | None, typer.Option(help="folder for the PNGs and pages (default: beside the results)")]
    = None,
) -> None:
    """Draw the benchmark plots and write report.md / report.html."""
    from tuner.benchmark.report import render

    target = out or (results[0] if results[0].is_dir() else results[0].parent) / "report"
    made = render(results, target)
    s = made.summary
    ratio = f"{s['geomean_ratio_best']:.2f}x" if s["geomean_ratio_best"] else "-"
    console.print(f"wrote {made.markdown}, {made.html} and {len(made.figures)} plots; tuned best vs cuSPARSE "
                  f"(geometric mean): {ratio}, {s['wins']} faster, {s['losses']} slower")


@app.command()
@_clean_errors
def recommend(
    matrix: Annotated[Path, typer.Argument(help="a Matrix Market file (.mtx, .mtx.gz)")],
    db: DbOption = None,
    dtype: Annotated[str, typer.Option(help="value type: float64 or float32")] = "float64",
    device: Annotated[str | None, typer.Option(
        help="device id, e.g. 'NVIDIA H200 (sm_90)', or cpu-reference: this CPU's references, as `tuner tune "
        "--device cpu-reference` stores them (default: this machine's GPU)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
    race: Annotated[bool, typer.Option(
        "--race", help="race the selector's shortlist and cuSPARSE on this GPU (or, with --device "
        "cpu-reference, the CPU references) and store every lap, as plan() does")] = False,
) -> None:
    """Say which kernel and config plan() would run for MATRIX: measured before (tuned or raced), predicted by
    the selector, or the default; with --race, race the shortlist now."""
    from db.store import Store
    from tuner.execute.choice import choose, stored_choice
    from tuner.matrix.features import extract_features
    from tuner.matrix.fingerprint import fingerprint
    from tuner.measure.backend import get_backend

    check_dtype(dtype)
    A = _read_matrix(matrix, dtype=dtype)
    laps = None
    cpu = device == "cpu-reference"  # the device kind, as `tuner tune --device` takes it
    if race:
        from tuner.execute.plan import race_matrix

        backend = get_backend("cpu-reference" if cpu else "gpu")
        device = backend.info.id
        A_dev, fp = backend.matrix(A), fingerprint(A)
        with Store(db) as store:
            choice = stored_choice(store, fp, device=device, dtype=dtype)
            if choice is None:
                choice, result = race_matrix(A_dev, backend=backend, store=store, fp=fp)
                laps = result.table()
    else:
        if cpu or device is None:  # this CPU's references' id, or this machine's GPU's (NoDeviceError without one)
            device = get_backend("cpu-reference" if cpu else "gpu").info.id
        with Store(db) as store:
            choice = choose(fingerprint(A), store=store, device=device, dtype=dtype, features=extract_features(A))
    rate = choice.expected_gflops
    answer = {"matrix": str(matrix), "rows": A.shape[0], "cols": A.shape[1], "nnz": int(A.nnz), "device": device,
              "dtype": dtype, "kernel": choice.kernel, "params": choice.params, "source": choice.source,
              "expected_gflops": rate, "expected_time_s": choice.time_s or (2 * A.nnz / (rate * 1e9) if rate else None),
              "confidence": choice.confidence,
              "ratio_to_cusparse": choice.cusparse_time_s / choice.time_s if choice.cusparse_time_s and choice.time_s
              else None, "race": laps}
    if as_json:
        console.print_json(json.dumps(answer))
        return
    console.print(f"[bold]{choice.kernel}[/] {_params(choice.params)} ({choice.source}) for {matrix.name}: "
                  f"{A.shape[0]} x {A.shape[1]}, {A.nnz} nnz, {dtype} on {device}")
    if answer["expected_time_s"]:
        console.print(f"expected {answer['expected_time_s'] * 1e6:.1f} µs a product ({rate:.1f} GFLOP/s)")
    if choice.confidence is not None:
        console.print(f"ranked by {choice.basis}: {choice.confidence:.0%} of its trees put this config first")
    if answer["ratio_to_cusparse"]:
        console.print(f"{answer['ratio_to_cusparse']:.2f}x cuSPARSE, as {choice.source}")
    for line in laps or ():
        console.print(f"  {escape(line)}")
    if choice.source == "default":
        console.print("nothing tuned and no selector for this device and dtype: cuSPARSE (run `tuner tune`)")


@app.command()
@_clean_errors
def show(
    matrix: Annotated[str, typer.Argument(help="a .mtx path, a fingerprint (or prefix) or a stored name")],
    db: DbOption = None,
    trials: Annotated[bool, typer.Option("--trials", help="list every trial too")] = False,
) -> None:
    """Print what the store knows about a matrix: best configs per device and dtype, trial counts."""
    from common.errors import TunerError as _TunerError
    from db.store import Store
    from tuner.matrix.fingerprint import fingerprint

    path = Path(matrix)
    is_path = path.exists() or len(path.parts) > 1 or matrix.endswith((".mtx", ".mtx.gz"))
    key = fingerprint(_read_matrix(path)) if is_path else matrix  # a missing file: an error naming it
    store = Store(db, create=False)
    row = store.find_matrix(key)
    if row is None:
        raise _TunerError(f"nothing stored for {matrix!r} in {store.path}; run `tuner tune` on it first")
    fp = row["fingerprint"]
    console.print(f"[bold]{row['name'] or '(unnamed)'}[/] {row['rows']} x {row['cols']}, {row['nnz']} nnz, "
                  f"fingerprint {fp}")
    table = Table(title="best configs")
    for col in ("device", "dtype", "kernel", "params", "time (µs)", "GFLOP/s", "vs cuSPARSE"):
        table.add_column(col)
    for b in store.bests(fp):
        ratio = f"{b['cusparse_time_s'] / b['time_s']:.2f}x" if b.get("cusparse_time_s") else "-"
        table.add_row(b["device"], b["dtype"], b["kernel"], _params(b["params"]),
                      f"{b['time_s'] * 1e6:.1f}", f"{b['gflops']:.1f}", ratio)
    console.print(table)
    rows = store.trials(fp)
    failed = sum(r["state"] != "ok" for r in rows)
    console.print(f"{len(rows)} trials stored, {failed} failed")
    if trials:
        t = Table()
        for col in ("id", "device", "dtype", "kernel", "params", "state", "time (µs)", "error"):
            t.add_column(col)
        for r in rows:
            time_us = f"{r['time_s'] * 1e6:.1f}" if r["time_s"] else "-"
            t.add_row(str(r["id"]), r["device"], r["dtype"], r["kernel"], _params(r["params"]), r["state"],
                      time_us, (r["error_kind"] or "") + (f": {r['error'][:60]}" if r["error"] else ""))
        console.print(t)


@app.command()
@_clean_errors
def train(
    db: DbOption = None,
    device: Annotated[str | None, typer.Option(help="device id in the store (default: its only gpu device)")] = None,
    dtype: DtypeOption = "float64",
    cv: Annotated[int, typer.Option(min=2, help="folds of the cross-validation grouped by matrix")] = 5,
    seed: Annotated[int, typer.Option(help="random seed of the forest")] = 0,
    corpus: Annotated[list[Path] | None, typer.Option(
        help="corpus file(s) (`tuner corpus export`) to import into the store first; again: adds nothing")] = None,
    evaluate: Annotated[bool, typer.Option(
        help="print the out-of-fold evaluation (k folds by matrix, and leaving each structure family out) "
             "against the tuned best and cuSPARSE")] = True,
    ship: Annotated[bool, typer.Option(
        help="also write the model as the selector shipped in the package for this device and dtype")] = False,
    ship_dir: Annotated[Path | None, typer.Option(
        help="folder for --ship (default: $SPMV_TUNER_MODELS, else the package's tuner/data)")] = None,
    task: Annotated[str, typer.Option(
        help="spmv: the kernel selector, from the measured matrices; spmspv: the SpMSpV mode selector, from the "
             "store's SpMSpV measurements (bench/spmspv.py writes them)")] = "spmv",
) -> None:
    """Train the kernel selector (or the SpMSpV mode selector) from the store on a device; save it as a new model."""
    from db.store import Store
    from tuner.execute.race import CHEAP_SPMVS
    from tuner.select.evaluation import evaluate_selector, ranking_table
    from tuner.select.model import KernelSelector, pick_device, save_model, ship_model

    check_dtype(dtype)
    if task not in ("spmv", "spmspv"):
        raise TunerError(f"unknown task {task!r}: spmv (the kernel selector) or spmspv (the SpMSpV mode selector)")
    with Store(db, create=bool(corpus)) as store:
        if corpus:
            from tuner.select.corpus import import_corpus

            for path in corpus:
                _print_import(import_corpus(store, path))
        device = pick_device(store, device)
        if task == "spmspv":
            _train_spmspv(store, device=device, dtype=dtype, cv=cv, ship=ship, ship_dir=ship_dir)
            return
        table = ranking_table(store, device=device, dtype=dtype)
        if len(table) < 2:
            raise TunerError(f"only {len(table)} measured matrices with features on {device} in {dtype}; "
                             "tune more before training")
        metrics: dict[str, Any] = {"matrices": len(table), "evaluation": {}}
        for kind in ("kfold", "lofo") if evaluate else ():
            if kind == "lofo" and len(set(table.families)) < 2:
                console.print(f"no structure family to leave out: every matrix is {table.families[0]!r}")
                continue
            result = evaluate_selector(table, cv=kind, folds=cv, make=lambda: KernelSelector(random_state=seed),
                                       cheap=CHEAP_SPMVS)
            _print_evaluation(result)
            metrics["evaluation"][kind] = result.as_metrics()
        if metrics["evaluation"]:
            console.print("first: the selector's first config, or its second opinion's csr5 (what tuner recommend "
                          "answers); predict: what plan(effort='predict') runs, its "
                          f"first config that is cuSPARSE or expected to prepare within {CHEAP_SPMVS:g} SpMVs, held "
                          "to cuSPARSE on the nearest training matrices; race<k>: the best of its first k configs "
                          "and cuSPARSE's two algorithms; cusparse: its best algorithm (tuner.select.evaluation)")
        model = KernelSelector(random_state=seed).fit(table.X, table.times, dtype=dtype, device=table.device,
                                                      prepare_times=table.prepare, groups=table.families)
        model_id = save_model(store, model, device=device, dtype=dtype, metrics=metrics)
        second = f", a second opinion on {model.gate_.family}" if model.gate_ is not None else ""
        console.print(f"saved model {model_id}: {len(model.configs_)} configs ranked{second}, trained on "
                      f"{model.n_train_} matrices ({model.forest_!r})")
        if ship:
            from tuner.select.shipped import shipped_dir

            path = ship_model(model, device=device, dtype=dtype, metrics=metrics, folder=ship_dir or shipped_dir())
            console.print(f"shipped as {path} ({path.stat().st_size / 1024:.0f} KiB): plan() predicts with it "
                          f"on {device} in {dtype} wherever the store has no model of its own, and on other GPUs "
                          "of its architecture that have none")


def _train_spmspv(store: Any, *, device: str, dtype: str, cv: int, ship: bool, ship_dir: Path | None) -> None:
    from tuner.select import spmspv_selector

    model, report = spmspv_selector.train(store, device=device, dtype=dtype, cv=cv)
    out = Table(title=f"SpMSpV mode, out of fold by matrix: {report['rows']} measurements of {report['matrices']} "
                      f"matrices ({device}, {dtype})")
    for col in ("strategy", "right mode", "time vs per-call oracle", "worst matrix"):
        out.add_column(col, justify="left" if col == "strategy" else "right")
    for name, r in report["table"].items():
        out.add_row(escape(name), f"{r['accuracy']:.1%}", f"{r['time_vs_oracle']:.3f}x",
                    f"{r['worst_matrix_vs_oracle']:.3f}x")
    console.print(out)
    if model is None:
        raise TunerError(f"SpMSpV selector not trained: {report['not_trained']}")
    console.print(f"saved the SpMSpV selector (SVM {report['svm_params']}) for {device} in {dtype}")
    if ship:
        from tuner.select.shipped import shipped_dir

        path = spmspv_selector.ship(model, device=device, dtype=dtype, metrics=report, folder=ship_dir or shipped_dir())
        console.print(f"shipped as {path}: plan(A, op='spmspv') uses it on {device} in {dtype}")


def _print_evaluation(result: Any) -> None:
    how = (f"{result.folds} folds by matrix" if result.cv == "kfold"
           else f"leaving each of {result.folds} structure families out")
    console.print(f"[bold]out of fold, {how}[/], on {result.matrices} matrices ({result.device}, {result.dtype}): "
                  "t_best / t, 1 = the tuned best")
    table = Table()
    for col in ("strategy", "geomean", "worst 5%", "matrices", "prepare (SpMVs)", "< 0.97x cuSPARSE",
                "geomean, >= 1 M nonzeros (matrices)"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for r in result.rows:
        prepare = "" if r.prepare_spmvs is None else f"{r.prepare_spmvs:.0f}"
        large = f"{r.large_geomean:.3f} ({r.large_matrices})" if r.large_matrices else "-"
        table.add_row(escape(r.strategy), f"{r.geomean:.3f}", f"{r.worst5:.3f}", str(r.matrices), prepare,
                      str(r.below_cusparse), large)
    console.print(table)
    if unmeasured := sum(r.unmeasured for r in result.rows):
        console.print(f"the first config was never measured on {unmeasured} matrices: counted as their slowest "
                      "time times 2")
    if result.cv == "lofo":
        names = [r.strategy for r in result.rows]
        families = Table(title="geomean per family, left out of training")
        for col in ("family", "matrices", *names):
            families.add_column(col, justify="left" if col == "family" else "right")
        for f in result.families:
            families.add_row(f.family, str(f.matrices), *(f"{f.geomean[n]:.3f}" for n in names))
        console.print(families)


def _per_dtype(report: Any) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(report.per_dtype.items())) or "none"


def _print_import(report: Any) -> None:
    console.print(f"imported {report.path}: {report.trials_added} of {report.trials} trials added "
                  f"({_per_dtype(report)}), "
                  f"{report.matrices} matrices, {report.devices} devices; {report.best} best configs in the store")


corpus_app = typer.Typer(help="The training corpus as one compact file: export a store's trials, import them.",
                         no_args_is_help=True, rich_markup_mode="markdown")
app.add_typer(corpus_app, name="corpus")


@corpus_app.command("export")
@_clean_errors
def corpus_export(
    output: Annotated[Path, typer.Argument(help="the corpus file to write (gzipped JSON lines, .jsonl.gz)")],
    db: DbOption = None,
    device: Annotated[str | None, typer.Option(help="only this device's trials (default: every device)")] = None,
    dtype: Annotated[str | None, typer.Option(help="only this dtype's trials (default: both)")] = None,
) -> None:
    """Write the store's trials, with their matrices, features and devices, to one compact file."""
    from db.store import Store
    from tuner.select.corpus import export_corpus

    if dtype is not None:
        check_dtype(dtype)
    with Store(db, create=False) as store:
        report = export_corpus(store, output, device=device, dtype=dtype)
    size = output.stat().st_size
    console.print(f"wrote {output} ({size / 1e6:.2f} MB): {report.trials} trials ({_per_dtype(report)}) of "
                  f"{report.matrices} matrices on {report.devices} devices")


@corpus_app.command("import")
@_clean_errors
def corpus_import(
    files: Annotated[list[Path], typer.Argument(help="corpus files from `tuner corpus export`")],
    db: DbOption = None,
) -> None:
    """Add corpus files' trials to the store (each trial once: importing again adds nothing)."""
    from db.store import Store
    from tuner.select.corpus import import_corpus

    with Store(db) as store:
        for path in files:
            _print_import(import_corpus(store, path))


@corpus_app.command("replace")
@_clean_errors
def corpus_replace(
    base: Annotated[Path, typer.Argument(help="the corpus file (`tuner corpus export`)")],
    survey: Annotated[Path, typer.Argument(help="a survey of some families on its matrices (`tuner corpus measure`, "
                                                "then `tuner corpus export`)")],
    output: Annotated[Path, typer.Argument(help="the corpus file to write")],
    family: Annotated[list[str], typer.Option(help="a family whose trials the survey replaces (repeat)")],
) -> None:
    """Write a corpus with some families' trials replaced by a survey's (a kernel changed since it was tuned)."""
    from kernels import get_family
    from tuner.select.corpus import replace_families

    for name in family:
        get_family(name)  # an unknown name lists the known ones
    report = replace_families(base, survey, family, output)
    console.print(f"wrote {output}: {report.trials} trials ({_per_dtype(report)}) of {report.matrices} matrices, "
                  f"{', '.join(family)} from {survey}")


@corpus_app.command("measure")
@_clean_errors
def corpus_measure(
    matrices: Annotated[list[Path] | None, typer.Argument(help=".mtx files, folders of them, manifests")] = None,
    portfolio: Annotated[Path, typer.Option(help="the configs to measure on every matrix (a portfolio file)")]
    = Path("bench/results/corpus/portfolio.json"),
    suite: Annotated[list[str] | None, typer.Option(help="a generated suite (repeat for several)")] = None,
    dtype: Annotated[list[str] | None, typer.Option(help="float64 and/or float32 (repeat; default both)")] = None,
    db: DbOption = None,
    device: Annotated[str, typer.Option(help="gpu, or cpu-reference (CPU references; not GPU figures)")] = "gpu",
    workers: Annotated[int, typer.Option(min=0, help="processes building generated matrices ahead")] = 4,
    repeats: Annotated[int, typer.Option(min=1, help="timed products per config (median)")] = 20,
) -> None:
    """Measure every config of a portfolio on every matrix, into the store: the selector's corpus."""
    from db.store import Store
    from tuner.matrix.sources import read_sources, sources
    from tuner.measure.backend import get_backend
    from tuner.search.survey import survey
    from tuner.select.portfolio import read_portfolio

    dtypes = dtype or ["float64", "float32"]
    for d in dtypes:
        check_dtype(d)
    configs = read_portfolio(portfolio)
    srcs = read_sources(matrices or [])
    for name in suite or []:
        srcs += sources([], name)
    if not srcs:
        raise typer.BadParameter("give matrices or --suite")
    backend = get_backend(device)
    with Store(db) as store, counting_bar(console) as progress:
        task = progress.add_task("matrices", total=len(srcs))
        report = survey(srcs, configs, backend=backend, store=store, dtypes=dtypes, repeats=repeats,
                        workers=workers, on_matrix=lambda src, n: progress.update(
                            task, advance=1, description=f"matrices (last: {src.name}, {n} trials)"))
    for name, why in report.unreadable.items():
        err_console.print(f"[yellow]{escape(name)} left out:[/] {escape(why)}")
    console.print(f"{report.matrices} matrices measured ({report.passed_by} done before, passed by), "
                  f"{report.trials} trials ({report.failed} failed) of {len(configs)} configs in "
                  f"{report.seconds:.0f} s on {backend.info.id}")


@corpus_app.command("portfolio")
@_clean_errors
def corpus_portfolio(
    output: Annotated[Path, typer.Argument(help="the portfolio file to write (JSON)")],
    db: DbOption = None,
    device: Annotated[str | None, typer.Option(help="device id in the store (default: its only gpu device)")]
    = None,
    per_family: Annotated[int, typer.Option(min=1, help="configs of each family with a large space")] = 6,
) -> None:
    """Write the configs that `tune-many --enqueue` measures on every matrix (see tuner.select.portfolio)."""
    from db.store import Store
    from tuner.select.model import pick_device
    from tuner.select.portfolio import build_portfolio, write_portfolio

    with Store(db) as store:
        configs = build_portfolio(store, device=pick_device(store, device), per_family=per_family)
    write_portfolio(output, configs)
    counts = ", ".join(f"{k} {n}" for k, n in sorted(Counter(k for k, _ in configs).items()))
    console.print(f"wrote {output}: {len(configs)} configs ({counts})")


@app.command("kernels")
def list_kernels(as_json: Annotated[bool, typer.Option("--json", help="print the registry as JSON")] = False) -> None:
    """List the kernel families and their parameter spaces (from the registry)."""
    from kernels import REGISTRY

    described = [f.describe() for f in REGISTRY.values()]
    if as_json:
        console.print_json(json.dumps(described))
        return
    for d in described:
        console.print(f"[bold]{d['name']}[/]: {d['summary']} ({d['source']})")
        for p in d["params"]:
            console.print(f"  {p['name']} in {p['values']} (default {p['default']}): {p['doc']}")


def _register_commands_of_other_modules() -> None:
    """Commands written beside the code they drive; they print their own errors."""
    from service.cli import serve
    from tuner.search.pool import tune_many
    from tuner.search.sync import sync

    app.command("tune-many")(tune_many)
    app.command("sync")(sync)
    app.command("serve")(serve)


_register_commands_of_other_modules()

if __name__ == "__main__":
    app()
