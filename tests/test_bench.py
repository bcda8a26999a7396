"""The benchmark harness and its report, end to end on the CPU references (the plumbing, not the numbers)."""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pytest
from typer.testing import CliRunner

from common.errors import TunerError
from common.jsonfile import write_json
from kernels import BASELINE, REGISTRY, config_key
from tuner.benchmark.bench import COLUMNS, PLAN_LABEL
from tuner.benchmark.report import render
from tuner.cli import app
from tuner.matrix.generate import KINDS, generate
from tuner.matrix.suites import SUITES, approx_nnz

runner = CliRunner()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    bad = out / "broken.mtx"
    bad.write_text("%%MatrixMarket matrix coordinate real general\n2 2 1\n1 9 1.0\n")
    result = runner.invoke(app, ["bench", str(bad), "--suite", "small", "--device", "cpu-reference",
                                 "--out", str(out), "--db", str(out / "s.db"), "--trials", "4"],
                           env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    (json_path,) = out.glob("*.json")
    (csv_path,) = out.glob("*.csv")
    return out, json_path, csv_path


def test_bench_writes_one_row_per_kernel_and_matrix_and_records_failures(results):
    out, json_path, csv_path = results
    assert "cpu-reference" in json_path.name and "small" in json_path.name
    data = json.loads(json_path.read_text())
    env = data["environment"]
    assert env["device_kind"] == "cpu-reference" and env["copy_bandwidth_gbs"] > 0 and env["git_commit"]
    rows = data["rows"]
    failed = [r for r in rows if r["error"]]
    assert [r["matrix"] for r in failed] == ["broken"] and "line 3" in failed[0]["error"]
    names = {m.name for m in SUITES["small"]}
    ok = [r for r in rows if not r["error"]]
    assert {r["matrix"] for r in ok} == names
    for name in names:
        kernels = {r["kernel"] for r in ok if r["matrix"] == name}
        assert kernels == set(REGISTRY) | {PLAN_LABEL}
        base = next(r for r in ok if r["matrix"] == name and r["kernel"] == BASELINE)
        assert base["ratio_to_cusparse"] == pytest.approx(1.0)
    for r in ok:
        assert r["time_s"] > 0 and r["gflops"] == pytest.approx(2 * r["nnz"] / r["time_s"] / 1e9)
        assert 0 < r["bandwidth_fraction"] and r["prepare_spmvs"] >= 0
        assert r["time_p10_s"] <= r["time_s"] <= r["time_p90_s"]
    with csv_path.open() as f:
        table = list(csv.DictReader(f))
    assert tuple(table[0]) == COLUMNS and len(table) == len(rows)


def test_report_renders_plots_with_one_series_per_kernel(results, tmp_path):
    out, json_path, _ = results
    report = render([json_path], tmp_path / "report")
    assert set(report.figures) == {"throughput", "ratio_vs_cv", "ratio_vs_nnz", "roofline"}
    n_kernels = len(REGISTRY) + 1
    for name, path in report.figures.items():
        img = mpimg.imread(path)
        assert img.shape[0] > 300 and img.shape[1] > 500, name
        assert np.std(img[..., :3]) > 0.05, f"{name} looks blank"
        assert report.series[name] == n_kernels, name
    md = report.markdown.read_text()
    assert "geometric mean" in md and "CPU reference" in md and "broken" in md
    assert all(f"({p.name})" in md for p in report.figures.values())
    assert "<table" in report.html.read_text()
    assert report.summary["matrices"] == len(SUITES["small"]) + 1
    rows = [r for r in json.loads(json_path.read_text())["rows"] if not r["error"] and r["kernel"] != PLAN_LABEL]
    best = {}
    for r in rows:
        if r["matrix"] not in best or r["time_s"] < best[r["matrix"]]["time_s"]:
            best[r["matrix"]] = r
    expected = np.exp(np.mean([np.log(r["ratio_to_cusparse"]) for r in best.values()]))
    assert report.summary["geomean_ratio_best"] == pytest.approx(expected)


def test_report_cli_and_bad_input(results, tmp_path):
    out, json_path, _ = results
    result = runner.invoke(app, ["report", str(json_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0 and (tmp_path / "r" / "throughput.png").exists()
    gzipped = tmp_path / "gz"  # as bench/results commits its larger files: a folder of .json.gz reads the same
    gzipped.mkdir()
    write_json(gzipped / f"{json_path.name}.gz", json.loads(json_path.read_text()))
    assert render([gzipped], tmp_path / "rg").summary == render([json_path], tmp_path / "rp").summary
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    with pytest.raises(TunerError, match="not a benchmark result file"):
        render([junk], tmp_path / "x")
    result = runner.invoke(app, ["report", str(junk)])
    assert result.exit_code == 1 and "junk.json" in result.output
    result = runner.invoke(app, ["bench", "--device", "cpu-reference"])
    assert result.exit_code == 1 and "nothing to benchmark" in result.output
    result = runner.invoke(app, ["bench", "--suite", "huge", "--device", "cpu-reference"])
    assert result.exit_code == 1 and "known suites" in result.output


def test_family_trials_tune_every_family_and_enqueued_configs_are_measured(tmp_path):
    """--family-trials N: each family gets its own N-trial search after the joint one; --enqueue
    configs are measured as given (a portfolio's ipcsr config fills the newer params' defaults). 8 trials:
    within 4, optuna now and then suggested cuSPARSE's default again and again (3 configs in all), and a
    config suggested again is not measured twice."""
    import optuna

    from db.store import Store
    from kernels import config_key, config_of, get_family
    from tuner.benchmark.bench import bench_matrix
    from tuner.matrix.fingerprint import fingerprint
    from tuner.matrix.sources import sources
    from tuner.measure.backend import get_backend
    from tuner.search.storage import default_storage, open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    (src,) = [s for s in sources([], "small") if s.name.startswith("powerlaw")]
    store = Store(tmp_path / "b.db")
    backend = get_backend("cpu-reference")
    portfolio = [("ipcsr", get_family("ipcsr").space.validate({"shared_size": 512, "nt": 64}))]
    rows = bench_matrix(src, backend=backend, store=store, storage=open_storage(default_storage(store.path)),
                        dtype="float64", trials=1, family_trials=8, enqueue=portfolio)
    assert {r["kernel"] for r in rows} == set(REGISTRY) | {PLAN_LABEL}
    trials = store.trials(fingerprint(src.load("float64")), device=backend.info.id, dtype="float64")
    measured = {config_key(t["kernel"], t["params"]) for t in trials if t["state"] == "ok"}
    for name in REGISTRY:  # the default and at least one config of the family's own search
        assert len({k for k in measured if config_of(k)[0] == name}) >= 2, name
    assert config_key(*portfolio[0]) in measured


def test_a_family_the_seeds_crowd_out_of_the_search_is_still_timed(tmp_path, monkeypatch):
    """The store's seeds run before the defaults; three csr_vector seeds fill three of the search's
    len(REGISTRY) places, so two defaults fall outside it (a CI run lost csr5 so). The bench measures
    each family the search missed once more, alone, and so still has a row for every family."""
    import optuna

    import tuner.search.loop as loop
    from db.store import Store
    from kernels import get_family
    from tuner.benchmark.bench import bench_matrix
    from tuner.matrix.sources import sources
    from tuner.measure.backend import get_backend
    from tuner.search.storage import default_storage, open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = get_family("csr_vector").space
    seeds = [("csr_vector", space.validate({"threads_per_row": t})) for t in (2, 4, 8)]
    monkeypatch.setattr(loop, "seed_configs", lambda *a, **k: list(seeds))
    (src,) = [s for s in sources([], "small") if s.name.startswith("powerlaw")]
    store = Store(tmp_path / "s.db")
    rows = bench_matrix(src, backend=get_backend("cpu-reference"), store=store,
                        storage=open_storage(default_storage(store.path)), dtype="float64", trials=1)
    assert {r["kernel"] for r in rows} == set(REGISTRY) | {PLAN_LABEL}


def test_kernels_limit_the_families_tuned_and_timed(tmp_path):
    """--kernels a,b: only those families (and cuSPARSE, the baseline) are tuned, stored and timed;
    an unknown name fails before anything is measured, naming the known ones."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["bench", "--suite", "small", "--device", "cpu-reference", "--out", str(out),
                                 "--db", str(tmp_path / "k.db"), "--trials", "2", "--kernels", "specsum,nut"],
                           env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    (json_path,) = out.glob("*.json")
    data = json.loads(json_path.read_text())
    assert data["environment"]["kernels"] == [BASELINE, "specsum", "nut"]
    rows = [r for r in data["rows"] if not r["error"]]
    assert {r["matrix"] for r in rows} == {m.name for m in SUITES["small"]}
    for name in {r["matrix"] for r in rows}:
        assert {r["kernel"] for r in rows if r["matrix"] == name} == {BASELINE, "specsum", "nut", PLAN_LABEL}
    from db.store import Store

    assert {t["kernel"] for t in Store(tmp_path / "k.db").db["trials"].rows} == {BASELINE, "specsum", "nut"}
    result = runner.invoke(app, ["bench", "--suite", "small", "--device", "cpu-reference", "--out", str(out),
                                 "--db", str(tmp_path / "k2.db"), "--kernels", "specsum,nutt"])
    assert result.exit_code == 1 and "known kernels" in result.output and not (tmp_path / "k2.db").exists()


def test_git_commit_prefers_the_variable_over_a_stale_checkout(monkeypatch):
    from tuner.benchmark.bench import _git_commit

    monkeypatch.setenv("SPMV_GIT_COMMIT", "f" * 40)
    assert _git_commit() == "f" * 40
    monkeypatch.delenv("SPMV_GIT_COMMIT")
    assert _git_commit() != "f" * 40


@pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")
def test_git_commit_says_where_the_tree_is_not_the_commit(monkeypatch, tmp_path):
    """A checkout's commit, "+modified" once a tracked file changes (a stale .git under newer files), and
    "unknown" for a folder inside a checkout (a tree copied there) or outside any."""
    import subprocess

    from tuner.benchmark.bench import _git_commit

    monkeypatch.delenv("SPMV_GIT_COMMIT", raising=False)
    repo = tmp_path / "repo"
    (repo / "code").mkdir(parents=True)
    (repo / "code" / "a.py").write_text("x = 1\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "code/a.py")
    git("commit", "-qm", "a")
    head = git("rev-parse", "HEAD")
    assert _git_commit(repo) == head
    (repo / "untracked.txt").write_text("new")
    assert _git_commit(repo) == head
    (repo / "code" / "a.py").write_text("x = 2\n")
    assert _git_commit(repo) == head + "+modified"
    assert _git_commit(repo / "code") == "unknown"
    (tmp_path / "plain").mkdir()
    assert _git_commit(tmp_path / "plain") == "unknown"


def _bench_module(script: str):
    """``bench/<script>.py``, a script, loaded as a module (registered, as its dataclasses need)."""
    import importlib.util
    from pathlib import Path

    name = f"bench_{script}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "bench" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_convergence_counts_the_trials_until_the_running_best_is_within_3_percent() -> None:
    module = _bench_module("convergence")
    found = module.convergence([5.0, float("inf"), 4.0, 3.05, 3.2, 3.0], early=4)
    assert found["best_s"] == 3.0 and found["trials_to_within"] == 4  # 3.05 <= 1.03 * 3.0; a failure is inf
    assert found["best_after_4_over_best"] == pytest.approx(3.0 / 3.05)
    assert found["improved"] == [1, 3, 4, 6]  # the trials that set a new running best, a tie or a failure not
    assert module.convergence([2.0], early=30) == {"best_s": 2.0, "trials_to_within": 1, "best_after_30_over_best": 1.0,
                                                   "improved": [1]}
    assert module.convergence([float("inf"), 2.0, 2.0], early=30)["improved"] == [2]
    # against a longer search's best: the better of the two is the mark
    assert module.convergence([5.0, 3.2, 3.05, 3.0], reference_s=2.97)["trials_to_within_reference"] == 3
    assert module.convergence([5.0, 3.2, 3.0], reference_s=3.5)["trials_to_within_reference"] == 3
    assert module.convergence([5.0, 3.2], reference_s=2.0)["trials_to_within_reference"] is None


def test_convergence_reads_the_best_of_each_matrix_and_dtype_from_reference_files(tmp_path) -> None:
    module = _bench_module("convergence")
    rows = [{"matrix": "a", "dtype": "float64", "best_s": 2.0}, {"matrix": "a", "dtype": "float32", "best_s": 1.0}]
    for i, factor in enumerate((1.0, 0.9)):
        (tmp_path / f"{i}.json").write_text(json.dumps({"rows": [r | {"best_s": r["best_s"] * factor} for r in rows]}))
    assert module.reference_bests([tmp_path / "0.json", tmp_path / "1.json"]) == \
        {("a", "float64"): pytest.approx(1.8), ("a", "float32"): pytest.approx(0.9)}


def test_ncu_summary_adds_up_each_products_kernels_and_names_its_config(tmp_path) -> None:
    """bench/ncu_spmv.py: a range per product (the best, then cuSPARSE's two); ncu's CSV rows joined to them,
    counts summed over a product's kernels, shares weighted by each kernel's time; lines before the header
    and kernels outside the ranges ignored."""
    from tuner.measure.metrics import effective_bytes

    module = _bench_module("ncu_spmv")
    result = tmp_path / "conv.json"
    result.write_text(json.dumps({"suite": "large", "scale": 1.0, "rows": [
        {"matrix": "m", "dtype": "float32", "rows": 100, "cols": 80, "nnz": 1000, "best_kernel": "csr5",
         "best_params": {"sigma": 16}}]}))
    products = module.labels([result])
    assert [(p["range"], p["kernel"]) for p in products] == [("spmv-0", "csr5"), ("spmv-1", BASELINE),
                                                             ("spmv-2", BASELINE)]
    assert products[0]["compulsory_bytes"] == effective_bytes(100, 80, 1000, "float32")
    assert products[0]["params"] == {"sigma": 16, "block_size": 128, "indices": "narrow"}  # as it runs
    assert module.labels([result], only=["another"]) == [] and module.labels([result], only=["m"]) == products
    header = ["ID", "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg", "Kernel Name",
              "Metric Name", "Metric Value"]
    counters = {"spmv-0": [(2000, 300, 40, 1.0), (1000, 60, 70, 2.0)], "spmv-12": [(9, 9, 9, 9.0)]}
    lines = ["==PROF== Connected to process", ",".join(f'"{h}"' for h in header)]
    kid = 0
    for name, kernels in counters.items():
        for time_ns, sectors, l2_pct, warps in kernels:
            for metric in module.METRICS:
                value = {"gpu__time_duration.sum": time_ns, "lts__t_sectors_srcunit_tex_op_read.sum": sectors,
                         "lts__throughput.avg.pct_of_peak_sustained_elapsed": l2_pct,
                         "sm__warps_active.avg.pct_of_peak_sustained_active": warps}.get(metric, 1)
                lines.append(f'"{kid}","1  ""<default domain>:{name}:none:none:none:none:none:none"" ","k",'
                             f'"{metric}","{value:,}"')
            kid += 1
    (tmp_path / "ncu.csv").write_text("\n".join(lines) + "\n")
    (row,) = module.summary(tmp_path / "ncu.csv", products)
    assert row["kernel"] == "csr5" and row["kernels"] == 2 and row["time_s"] == pytest.approx(3e-6)
    assert row["l2_sectors_per_nonzero"] == pytest.approx(0.36)
    assert row["l2_read_over_compulsory"] == pytest.approx(32 * 360 / products[0]["compulsory_bytes"])
    assert row["l2_throughput_pct"] == pytest.approx(50.0) and row["warps_active_pct"] == pytest.approx(4 / 3)


def test_convergence_times_the_best_cold_beside_both_cusparse_algorithms() -> None:
    """``cold`` on the CPU reference backend: the three configs timed, the ratio and bandwidth from them."""
    import scipy.sparse as sp

    from tuner.measure.backend import CpuReferenceBackend

    module = _bench_module("convergence")
    A = sp.random(300, 200, density=0.05, format="csr", random_state=3)
    found = module.cold(CpuReferenceBackend(), A, {"kernel": "csr_scalar", "params": {"block_size": 128}})
    assert found["best_s"] > 0 and found["cusparse_best_s"] > 0
    assert found["ratio_to_cusparse"] == pytest.approx(found["cusparse_best_s"] / found["best_s"])
    assert 0 < found["bandwidth_fraction"] < float("inf")


def test_probe_g_tries_nut_past_its_fitted_slabs_with_configs_its_space_takes() -> None:
    """bench/probe_unseen_configs.py G, where x is several times the L2: cuSPARSE's two algorithms, then NuT as
    ``Nut.adapt`` fits it at 4 and 8 slabs, 1, 2 and 4 bands, 512 and 1024 threads, each a config NuT's space
    takes as it is (one it refused would only show on the GPU)."""
    import itertools

    import scipy.sparse as sp

    from kernels import get_family

    module = _bench_module("probe_unseen_configs")
    A = sp.csr_matrix((1000, 8_000_000), dtype=np.float64)  # x of 64 MB against an L2 of 50 MiB: 4 slabs fitted
    configs = module.slab_configs(A, 50 << 20)
    nut = [params for kernel, params in configs if kernel == "nut"]
    assert configs[:2] == module.BASE and len(configs) == 2 + len(nut)
    assert sorted((p["slabs"], p["bands"], p["threads"]) for p in nut) == \
        sorted(itertools.product((4, 8), (1, 2, 4), (512, 1024)))
    assert all(get_family("nut").space.validate(p, family="nut") == p for p in nut)
    assert {(p["rows_per_panel"], p["cols_per_tile"]) for p in nut} == {(4096, 8192)}  # 32 KB of y, 96 KB in all


def test_probe_h_times_configs_their_spaces_take() -> None:
    """bench/probe_unseen_configs.py H: cuSPARSE's two algorithms, NuT at one slab and at the race's former 4, and
    csr5, each a config its family's space takes as it is (one it refused would only show on the GPU)."""
    from kernels import get_family

    configs = _bench_module("probe_unseen_configs").CONFIGS["H"]
    assert configs[:2] == _bench_module("probe_unseen_configs").BASE and len(configs) == 11
    assert all(get_family(k).space.validate(p, family=k) == p for k, p in configs[2:])
    assert sorted({p["slabs"] for k, p in configs if k == "nut"}) == [1, 4]


def test_the_sigma_probe_reads_the_race_survey_as_the_float64_cap_says() -> None:
    """bench/probe_csr5_sigma.py survey on the H200's race survey: in float64 setSigma's sigma capped at
    FLOAT64_SIGMA runs closer to the best sigma than setSigma's own on the large matrices (what the cap rests on),
    and the race's pair (the faster of its two configs) closer than either."""
    from kernels.csr5 import FLOAT64_SIGMA

    corpus = Path(__file__).resolve().parents[1] / "bench/results/corpus"
    survey = corpus / "2026-11-26_NVIDIA-H200-sm-90_survey-race.jsonl.gz"
    lines = [line for line in _bench_module("probe_csr5_sigma").survey(survey) if "float64 >= 1e+06" in line]
    assert len(lines) == 1
    scores = dict(re.findall(r"(\d+) (0\.\d+)", lines[0].split("at most ")[1].split(";")[0]))
    pair = float(lines[0].rsplit(" ", 1)[1])
    assert float(scores[str(FLOAT64_SIGMA)]) > float(scores["32"]) + 0.03 and pair > float(scores[str(FLOAT64_SIGMA)])


def test_the_grown_corpus_names_one_family_a_generator_and_keys_legacy_configs_as_the_corpus_does(tmp_path) -> None:
    """bench/grow_corpus.py: every generator of its sets once a scale, each a structure family of its own by its
    name (none taken for a real matrix, none for a family the corpus has); and its export keys the csr_vector and
    csr_scalar trials that ran with the int32 columns and the plain loop as the corpus keys those configs (as they
    ran before the parameters existed), leaving others alone."""
    from db.store import Store
    from tuner.select.evaluation import structure_family
    from tuner.select.portfolio import read_portfolio

    grow = _bench_module("grow_corpus")
    grown = grow.grown()
    families = [structure_family(name) for _, _, name in grown]
    assert len(grown) == len(set(n for _, _, n in grown)) == 3 * len(set(families)) == 87
    assert families == [m.name for m, _, _ in grown] and not set(families) & set(KINDS)
    portfolio = read_portfolio(grow.PORTFOLIO)
    assert {k for k, p in portfolio if p.get("indices") == "int32"} == {"csr_vector", "csr_scalar"}
    with Store(tmp_path / "s.db") as store:
        store.add_device({"id": "d", "name": "d", "kind": "gpu"})
        store.add_matrix("fp", name=grown[0][2], rows=2, cols=2, nnz=2, features={})
        base = {"fingerprint": "fp", "device": "d", "dtype": "float64", "state": "ok", "time_s": 1.0}
        store.add_trials([{**base, "kernel": "csr_scalar", "params": {"block_size": 64, "indices": "int32",
                                                                          "unroll": 1}},
                          {**base, "kernel": "csr_scalar", "params": {"block_size": 64, "indices": "int32",
                                                                          "unroll": 4}},
                          {**base, "kernel": "csr_vector", "params": {"block_size": 64, "threads_per_row": 2,
                                                                          "indices": "int32"}},
                          {**base, "kernel": "csr5", "params": {"sigma": 8, "indices": "int32"}}])
        assert grow.legacy_keys(store) == 2
        assert sorted(config_key(r["kernel"], r["params"]) for r in store.trials("fp", device="d")) == sorted([
            'csr_scalar{"block_size": 64}', 'csr_scalar{"block_size": 64, "indices": "int32", "unroll": 4}',
            'csr_vector{"block_size": 64, "threads_per_row": 2}', 'csr5{"indices": "int32", "sigma": 8}'])


@pytest.mark.parametrize("script", ["ab_unseen", "convergence", "grow_corpus", "loadtest", "ncu_spmv",
                                    "probe_csr_scalar_unroll", "plan_timeline", "probe_firsttouch", "probe_gather",
                                    "probe_listed",
                                    "probe_csr5_sigma", "probe_lofo_size", "probe_reference", "probe_rowsort",
                                    "probe_tune_scale", "probe_unseen_configs",
                                    "profile_plan", "race_lofo", "race_lofo_gpu", "spmspv", "unseen"])
def test_bench_scripts_import_and_describe_themselves_without_a_gpu(script: str) -> None:
    """Each command-line script of bench/ imports on any machine (a broken import shows here, not on a GPU)."""
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / f"{script}.py"
    done = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:") and path.read_text().split('"""')[1].splitlines()[0][:40] in \
        " ".join(done.stdout.split())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_probe_gather_kernels_compile_with_nvcc(tmp_path: Path) -> None:
    """bench/probe_gather.py's kernels, kernels/csr_vector.cu with its loads or its rows' order rewritten, each with
    a float64 and a float32 instantiation: the lines they rewrite are still in csr_vector.cu, and the PTX of the cache
    hints assembles."""
    import subprocess

    sources = _bench_module("probe_gather").sources()
    assert len(sources) == 10
    uses = "void instantiate_all() { (void)&csr_vector<double, 4, true>; (void)&csr_vector<float, 8, false>; }\n"
    for name, source in sources.items():
        path = tmp_path / f"{name.replace(' ', '_')}.cu"
        path.write_text(source + uses)
        done = subprocess.run([shutil.which("nvcc"), "-std=c++17", "-arch=sm_90", "-c", str(path), "-o",
                               str(tmp_path / "k.o")], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{name}: {done.stderr}"


def test_the_plan_timeline_marks_steps_the_code_still_has_and_each_mark_once_a_call() -> None:
    """bench/plan_timeline.py: every step it marks names a function plan() still calls through (a renamed one would
    drop out of the timeline unseen), and a wrapped function marks its step when it returns, its result's call
    another, only while the probe is on."""
    module = _bench_module("plan_timeline")
    for where, attribute, _ in module.STEPS:
        owner, name = module.resolve(where, attribute)
        assert callable(getattr(owner, name))

    class Clock:
        cuda = type("cuda", (), {"Event": type("Event", (), {"record": lambda self: None})})

    class Owner:
        @staticmethod
        def launch(n: int):
            return lambda: n + 1

    timeline = module.Timeline(Clock, events=4)
    timeline.wrap(Owner, "launch", "launched", result_too=True)
    assert Owner.launch(1)() == 2 and timeline.marks == []  # off: nothing marked
    timeline.start(False)
    assert Owner.launch(1)() == 2 and timeline.marks == []  # a plan not probed: nothing marked
    timeline.start(True)
    read = Owner.launch(2)
    assert [label for label, *_ in timeline.marks] == ["launched"] and read() == 3
    assert [label for label, *_ in timeline.marks] == ["launched", "launched read"]


def test_the_gpu_race_replay_scores_each_pick_against_every_config_it_checked_and_timed() -> None:
    """bench/race_lofo_gpu.py: a config that fails its check is timed as its reason, not as a time; the summary
    scores each effort's picks by the fastest known, and leaves out matrices that failed."""
    import scipy.sparse as sp

    from kernels import config_key, config_of
    from tuner.measure.backend import CpuReferenceBackend
    from tuner.measure.verify import Reference

    module = _bench_module("race_lofo_gpu")
    assert config_of(config_key("nut", {"slabs": 2, "threads": 512})) == ("nut", {"slabs": 2, "threads": 512})
    A = sp.random(300, 200, density=0.05, format="csr", random_state=3)
    timed = module.cold_checked(CpuReferenceBackend(), A, [("csr_scalar", {"block_size": 128}),
                                                           ("csr_vector", {"threads_per_row": 3})],
                                Reference.build(A, "float64"), rounds=2, repeats=2)
    assert timed[0] > 0 and isinstance(timed[1], str) and "threads_per_row" in timed[1]
    rows = [{"dtype": "float64", "race_score": 1.0, "race_ratio_to_cusparse": 1.5, "predict_score": 0.81,
             "predict_ratio_to_cusparse": 0.9},
            {"dtype": "float64", "race_score": 0.64, "race_ratio_to_cusparse": 1.0, "predict_score": 0.64,
             "predict_ratio_to_cusparse": 1.0},
            {"matrix": "lp-1", "error": "ValueError: a generator failed"}]
    race, predict = module.summary(rows)
    assert race.startswith("float64 race   : pick / fastest known 0.800") and "lowest 0.640" in race
    assert "50% within 3 %" in race and "1.225x cuSPARSE, 2 matrices" in race
    assert predict.startswith("float64 predict: pick / fastest known 0.720")


def test_the_gpu_race_replay_reads_the_selectors_fitted_elsewhere(tmp_path: Path) -> None:
    """bench/race_lofo_gpu.py ``--fits``: a family's selector written by ``--fit-only`` is read back, not fitted
    again, where it was fitted on as many rows as the table has outside the family; one of another corpus stops the
    run; a family the folder lacks is fitted from the table."""
    import lzma
    import pickle
    import types

    module = _bench_module("race_lofo_gpu")
    table = types.SimpleNamespace(families=["lp", "lp", "kronecker", "banded", "banded"])
    written = types.SimpleNamespace(n_train_=3)
    with lzma.open(module.fitted_path(tmp_path, "float64", "lp"), "wb") as fh:
        pickle.dump(written, fh)
    read = module.left_out_selectors({"float64": table}, ["lp"], tmp_path)
    assert list(read) == [("float64", "lp")] and read["float64", "lp"].n_train_ == 3
    with pytest.raises(SystemExit, match="not fitted on this corpus's 4 float64 rows outside lp"):
        module.left_out_selectors({"float64": types.SimpleNamespace(families=["kronecker", *table.families])}, ["lp"],
                                  tmp_path)
    with pytest.raises(AttributeError):  # not in the folder: fitted from the table (this one has no times)
        module.left_out_selectors({"float64": table}, ["kronecker"], tmp_path)


def test_the_race_replay_prepares_costly_entrants_only_while_the_leader_is_under_the_roof() -> None:
    """bench/race_lofo.py's ``roof``: the entrants that wait join cheapest first, each as the leader allows;
    csr5 (its family's 8 SpMVs, EARLY_SPMVS) does not wait."""
    from kernels import BASELINE, config_key
    from tuner.execute.race import ROOF, Entrant

    module = _bench_module("race_lofo")
    cheap = Entrant("csr_scalar", {"block_size": 128}, prepare_spmvs=0.5)
    nut = Entrant("nut", {"slabs": 1}, prepare_spmvs=40.0)
    specsum = Entrant("specsum", {}, prepare_spmvs=12.0)
    csr5 = Entrant("csr5", {"sigma": 16}, prepare_spmvs=8.0)
    cusparse = Entrant(BASELINE, {"algorithm": "csr_alg1"})
    entrants = [cheap, nut, specsum, csr5, cusparse]
    key = {e.kernel: config_key(e.kernel, e.params) for e in entrants}
    prepare_s = {key["nut"]: 3e-3}  # the others' preparations unmeasured: their expected SpMVs count
    base, roof_s = 1e-4, 5e-5 / ROOF  # the compulsory bytes at the copy bandwidth, over the roof
    # the first round (csr_scalar, csr5, cuSPARSE) far from the roof: specsum joins first, reaches it, and NuT
    # is never prepared
    times = {key["csr_scalar"]: 9e-5, key["csr5"]: 9.5e-5, key["specsum"]: roof_s, key["nut"]: 4e-5,
             key[BASELINE]: base}
    ran, spent = module._roofed(entrants, times, prepare_s, base=base, roof_s=roof_s)
    assert [e.kernel for e in ran] == ["csr_scalar", "csr5", BASELINE, "specsum"]
    assert spent == pytest.approx(0.5 + 8.0 + 12.0)
    # specsum under the roof too: NuT joins, its measured preparation counted (3 ms / 0.1 ms), not its expected 40
    times[key["specsum"]] = 8e-5
    ran, spent = module._roofed(entrants, times, prepare_s, base=base, roof_s=roof_s)
    assert [e.kernel for e in ran] == ["csr_scalar", "csr5", BASELINE, "specsum", "nut"]
    assert spent == pytest.approx(0.5 + 8.0 + 12.0 + 30.0)
    # csr5 at the roof already: no waiting entrant's preparation is spent
    times[key["csr5"]] = 5e-5  # under the roof: at it
    assert [e.kernel for e in module._roofed(entrants, times, prepare_s, base=base, roof_s=roof_s)[0]] == \
        ["csr_scalar", "csr5", BASELINE]


def test_the_race_replay_says_when_the_times_given_hold_no_cusparse_time(monkeypatch, tmp_path) -> None:
    """bench/race_lofo.py --times with a survey alone (no cuSPARSE lap, so no matrix can be scored): a clear
    message naming the files, not an IndexError from an empty table."""
    module = _bench_module("race_lofo")
    monkeypatch.setattr(module, "picks", lambda *a, **k: {"shortlist": [], "race": [], "roof": [], "seeds": []})
    monkeypatch.setattr("sys.argv", ["race_lofo.py", "--corpus", "c.jsonl.gz", "--times", "survey.jsonl.gz",
                                     "--l2-mb", "50", "--dtype", "float64", "--out", str(tmp_path / "o.json")])
    with pytest.raises(SystemExit, match=r"survey.jsonl.gz holds no cuSPARSE time .* in float64 for any matrix of "
                                         r"c.jsonl.gz: --times takes a whole corpus"):
        module.main()
    assert not (tmp_path / "o.json").exists()


def _unseen_set(group: str, names: set[str]) -> dict[str, Any]:
    """bench/unseen_matrices.py's set ``group`` built at 1 % of its size, checked to be the matrices ``names``, each
    canonical and not empty."""
    module = _bench_module("unseen_matrices")
    built = {m.name: m.make(0.01) for m in module.MATRICES if m.group == group}
    assert set(built) == names
    for A in built.values():
        assert A.has_canonical_format and A.nnz > 0
    return built


def test_the_unseen_benchmarks_third_set_is_a_randomly_numbered_mesh() -> None:
    """bench/unseen_matrices.py set c: mesh2d, the 9-point pattern of a grid (9 entries a row inside, 4 at a corner)
    under a random numbering: its columns far from the diagonal."""
    module = _bench_module("unseen_matrices")
    (mesh,) = [m for m in module.MATRICES if m.group == "c"]
    A = mesh.make(0.01)  # 120 x 120 nodes
    lengths = np.diff(A.indptr)
    assert A.has_canonical_format and A.shape == (120 * 120, 120 * 120)
    assert lengths.max() == 9 and lengths.min() == 4 and (lengths == 9).sum() == 118 * 118
    pattern = A.copy()
    pattern.data[:] = 1.0
    assert (pattern != pattern.T).nnz == 0  # one numbering for rows and columns
    assert np.abs(A.tocoo().row - A.tocoo().col).mean() > 0.2 * A.shape[0]


def test_the_unseen_benchmarks_fourth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set d at a small scale: each generator's defining trait, and every matrix canonical."""
    built = _unseen_set("d", {"fem3x3", "scatterwide", "densepanel", "mixedrows"})
    fem = built["fem3x3"]  # 17^3 nodes
    lengths = np.diff(fem.indptr)
    assert fem.shape == (3 * 17**3, 3 * 17**3) and lengths.max() == 21 and (lengths == 21).sum() == 3 * 15**3
    assert (fem.indices.reshape(-1, 3) % 3 == [0, 1, 2]).all()  # a node's 3 unknowns together, in every block
    assert np.abs(fem.tocoo().row - fem.tocoo().col).mean() > 0.2 * fem.shape[0]  # nodes numbered at random
    wide = built["scatterwide"]
    assert wide.shape == (10_000, 32_000_000) and np.diff(wide.indptr).max() == 12
    panel = built["densepanel"]
    assert panel.shape == (10_000, 32) and panel.nnz == 32 * 10_000
    mixed = built["mixedrows"]
    lengths = np.diff(mixed.indptr)
    assert lengths.max() <= 300 and 0.03 < (lengths > 3).mean() < 0.07 and (lengths <= 3).mean() > 0.9


def test_the_unseen_benchmarks_fifth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set e at a small scale: each generator's defining trait, and every matrix canonical."""
    built = _unseen_set("e", {"road", "restrict3d", "prolong3d", "lowertri", "bandnoise", "tensorprod"})
    road = built["road"].copy()  # 180 x 180 crossings
    road.data[:] = 1.0
    assert road.shape == (180**2, 180**2) and (road != road.T).nnz == 0 and road.diagonal().all()  # symmetric
    assert 2 < np.diff(road.indptr).mean() < 5  # 70 % of the 4 segments, both ways, and the diagonal
    restrict, prolong = built["restrict3d"], built["prolong3d"]  # coarse 22^3, fine 44^3
    assert restrict.shape == (22**3, 44**3) and np.diff(restrict.indptr).max() == 27
    assert np.diff(restrict.indptr).min() == 8  # the corner (0, 0, 0): a, b, c in {0, 1}
    # prolong3d: the pattern of restrict3d's transpose
    assert prolong.shape == (44**3, 22**3) and (abs(abs(prolong).sign() - abs(restrict.T).sign()) > 0).nnz == 0
    assert np.diff(prolong.indptr).max() == 8 and np.diff(prolong.indptr).min() >= 1
    tri = built["lowertri"]
    coo = tri.tocoo()
    assert (coo.col <= coo.row).all() and tri.diagonal().all()  # lower triangular, with the diagonal
    lengths = np.diff(tri.indptr)
    assert lengths[-len(lengths) // 10:].mean() > 5 * lengths[: len(lengths) // 10].mean()  # rows grow downwards
    band = built["bandnoise"]
    far = np.abs(band.tocoo().row - band.tocoo().col) > 40
    assert np.diff(band.indptr).max() <= 81 + 3 and 2 <= far.sum() / band.shape[0] <= 3
    kron = built["tensorprod"]  # A 20 x 20, T 800 x 800
    assert kron.shape == (20 * 800, 20 * 800) and np.diff(kron.indptr).max() <= 15


def test_the_unseen_benchmarks_seventh_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set g at a small scale: each generator's defining trait, and every matrix canonical."""
    built = _unseen_set("g", {"debruijn", "blocksparse8", "smallworld", "rowperm7", "colruns", "staircase"})
    shift = built["debruijn"]  # 30,000 nodes
    assert shift.shape == (30_000, 30_000) and np.diff(shift.indptr).max() == 8
    assert set(shift[5].indices) == {20, 21, 22, 23, 1, 7_501, 15_001, 22_501}
    blocks = built["blocksparse8"]  # 750 block rows of 8
    lengths = np.diff(blocks.indptr)
    assert blocks.shape == (6_000, 6_000) and lengths.max() == 40 and (lengths % 8 == 0).all()
    assert (blocks.indices.reshape(-1, 8) % 8 == np.arange(8)).all()  # whole blocks of 8 columns
    assert all(blocks[8 * b:8 * b + 8, 8 * b:8 * b + 8].nnz == 64 for b in (0, 377, 749))  # the diagonal block
    ring = built["smallworld"]  # 6,000 nodes, 12 scales
    coo = ring.tocoo()
    distance = np.minimum(np.abs(coo.row - coo.col), 6_000 - np.abs(coo.row - coo.col))
    assert ring.diagonal().all() and np.diff(ring.indptr).max() <= 2 * 12 + 1 and distance.max() > 1_000
    rows = built["rowperm7"]  # 32^3 grid points
    laplacian = generate("poisson3d", n=32)
    assert rows.shape == laplacian.shape and rows.nnz == laplacian.nnz
    assert (np.bincount(rows.indices, minlength=32**3) == np.bincount(laplacian.indices, minlength=32**3)).all()
    assert not (np.sort(np.diff(rows.indptr)) == np.diff(rows.indptr)).all()  # rows moved, columns kept
    runs = built["colruns"]  # 2,000 x 2,000
    breaks = [1 + int((np.diff(runs[i].indices) > 1).sum()) for i in range(0, 2_000, 97)]
    assert np.diff(runs.indptr).max() == 144 and max(breaks) <= 3
    stairs = built["staircase"]  # 22,000 rows
    assert stairs.shape == (22_000, 26_400) and np.diff(stairs.indptr).max() == 9
    spans = [np.ptp(stairs[i].indices) for i in range(0, 22_000, 101)]
    assert np.median(spans) < 0.05 * 26_400  # a row's columns within its period and the one before


def test_the_unseen_benchmarks_eighth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set h at a small scale: rows out of order in six ways, each generator's defining
    trait."""
    import scipy.sparse as sp

    built = _unseen_set("h", {"lengthsorted", "twofield", "tallshuffled", "multicolor", "blockshuffled", "rowhash9"})
    band = built["lengthsorted"]  # 12,000 rows
    lengths = np.diff(band.indptr)
    assert (np.diff(lengths) <= 0).all() and lengths.max() >= 50 and lengths.min() <= 4  # longest first
    assert all(np.diff(band[i].indices).max() == 1 for i in range(0, 12_000, 499))  # each row one run
    coupled = built["twofield"]  # 2 x 25^3 unknowns
    half = 25**3
    assert coupled.shape == (2 * half, 2 * half) and coupled.nnz == 2 * (generate("poisson3d", n=25).nnz + half)
    assert (coupled[0].indices >= half).sum() == 1 and (coupled[1].indices < half).sum() == 1  # node by node
    tall = built["tallshuffled"]  # 99^2 cells of 8 points, from a 100 x 100 grid
    assert tall.shape == (99 * 99 * 8, 100 * 100) and (np.diff(tall.indptr) == 4).all()
    assert all(list(np.diff(tall[i].indices)) == [1, 99, 1] for i in range(0, tall.shape[0], 997))
    assert np.abs(np.diff(tall.indices[tall.indptr[:-1]])).mean() > 1_000  # neighbouring rows far apart
    colours = built["multicolor"]  # 22^3 nodes
    assert colours.shape == (22**3, 22**3) and np.diff(colours.indptr).max() == 27
    pattern = (colours != 0).astype(np.int8)
    assert colours.diagonal().all() and (pattern != pattern.T).nnz == 0  # one order for rows and columns
    blocks, hashed = built["blockshuffled"], built["rowhash9"]  # 140^2 nodes each
    path = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(140, 140))
    in_order = sp.kron(path, path, format="csr")
    for A in (blocks, hashed):  # the 9-point stencil's rows, columns kept
        assert A.shape == in_order.shape and A.nnz == in_order.nnz
        assert (np.bincount(A.indices, minlength=140**2) == np.bincount(in_order.indices, minlength=140**2)).all()
    moved = np.abs(np.diff(blocks.indices[blocks.indptr[:-1]])) > 2 * 140
    assert 0 < moved.sum() <= 140 * 140 // 512 + 1  # rows in order within a block of 512
    assert np.abs(np.diff(hashed.indices[hashed.indptr[:-1]])).mean() > 1_000


def test_the_unseen_benchmarks_ninth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set i at a small scale: each generator's defining trait."""
    built = _unseen_set("i", {"groupedrows", "denseblock", "wideclustered", "hypersparse", "globalcols", "tallwide"})
    groups = built["groupedrows"]  # 10,000 rows
    assert groups.shape == (10_000, 10_000) and np.diff(groups.indptr).max() == 24
    assert all(np.array_equal(groups[32 * g].indices, groups[32 * g + 31].indices) for g in (0, 7, 300))
    assert not np.array_equal(groups[0].indices, groups[32].indices)
    corner = built["denseblock"]  # a 200 x 200 grid, a dense block of 400
    lengths = np.diff(corner.indptr)
    assert corner.shape == (40_000, 40_000) and corner[:400, :400].nnz == 400 * 400 and lengths[400:].max() == 5
    wide = built["wideclustered"]  # 400 rows of 16 M columns
    assert wide.shape == (400, 16_000_000) and np.diff(wide.indptr).max() == 400
    assert max(1 + int((np.diff(wide[i].indices) > 1).sum()) for i in range(0, 400, 37)) <= 4
    sparse = built["hypersparse"]  # 300,000 x 300,000
    assert sparse.shape == (300_000, 300_000) and 0.55 < float(np.mean(np.diff(sparse.indptr) == 0)) < 0.65
    assert 0.4 < sparse.nnz / 300_000 < 0.6
    hot = built["globalcols"]  # 20,000 rows
    counts = np.bincount(hot.indices, minlength=20_000)
    assert (counts == 20_000).sum() == 16 and np.diff(hot.indptr).max() <= 21
    tall = built["tallwide"]  # 10,000 x 500,000
    assert tall.shape == (10_000, 500_000) and np.diff(tall.indptr).max() <= 20
    near = np.abs(tall[5_000].indices - 5_000 * 50) <= 1_000
    assert 5 <= near.sum() <= 12


def test_the_unseen_benchmarks_tenth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set j at a small scale: each generator's defining trait."""
    built = _unseen_set("j", {"zipfrows", "stencil125", "vbr3d", "onehot", "antiband", "subsetcols"})
    zipf = np.diff(built["zipfrows"].indptr)  # 20,000 rows: the longest 20,000 draws, 63 % of them distinct
    assert zipf.min() >= 1 and 10_000 < zipf.max() < 15_000 and np.median(zipf) <= 2
    box = built["stencil125"]  # a 13^3 grid
    assert box.shape == (13**3,) * 2 and np.diff(box.indptr).max() == 125
    centre = box[6 * 169 + 6 * 13 + 6].indices
    assert int((np.diff(centre) > 1).sum()) == 24  # 25 runs of 5
    vbr = built["vbr3d"]  # a 15^3 grid of nodes
    lengths = np.diff(vbr.indptr)
    assert set(np.unique(lengths)) <= set(range(4, 43)) and {7, 42} <= set(np.unique(lengths).tolist())
    picks = built["onehot"]  # 240,000 x 30,000
    assert picks.shape == (240_000, 30_000) and np.all(np.diff(picks.indptr) == 1)
    anti = built["antiband"]  # 15,000 rows
    assert np.array_equal(anti[100].indices, np.r_[96:105, 14_895:14_904])
    subset = built["subsetcols"]  # 20,000 rows, 625 columns read
    assert np.unique(subset.indices).size <= 625 and np.diff(subset.indptr).max() == 12


def test_the_unseen_benchmarks_eleventh_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set k at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("k", {"fewlongrows", "degreesorted", "ndgrid", "diagonal", "bitrev5", "log2rows"})
    few = built["fewlongrows"]  # the 64 rows are not scaled below 8: 8 rows of 250,000 draws
    assert few.shape == (8, 30_000_000) and np.diff(few.indptr).min() > 240_000
    graph = built["degreesorted"]  # 20,000 vertices
    lengths, reads = np.diff(graph.indptr), np.bincount(graph.indices, minlength=20_000)
    assert lengths[:100].mean() > 5 * lengths[-10_000:].mean() and reads[:100].mean() > 5 * reads[-10_000:].mean()
    order = module._nested_dissection(40, leaf=8)
    assert np.array_equal(np.sort(order), np.arange(1_600)) and set(order[-40:]) == set(range(20 * 40, 21 * 40))
    nd = built["ndgrid"]  # a 160 x 160 grid, one permutation of rows and columns: the 9-point pattern, symmetric
    pattern = nd.copy()
    pattern.data[:] = 1.0
    assert nd.shape == (25_600, 25_600) and nd.nnz == (3 * 160 - 2) ** 2 and (pattern - pattern.T).nnz == 0
    spans = [int(np.ptp(nd[i].indices)) for i in range(1_024)]  # the first 32 x 32 box: its own rows, mostly
    assert np.median(spans) <= 2 * 32 + 2
    assert built["diagonal"].nnz == 240_000 and np.array_equal(built["diagonal"].indices, np.arange(240_000))
    rev = built["bitrev5"]  # a 200 x 200 grid
    assert rev.shape == (40_000, 40_000) and np.diff(rev.indptr).max() == 5
    assert abs(int(rev[0].indices.max()) - int(rev[1].indices.max())) > 10_000  # neighbouring rows far apart
    runs = built["log2rows"]  # 1,500 rows
    run_lengths = np.diff(runs.indptr)
    assert set(np.unique(run_lengths).tolist()) <= {1 << k for k in range(11)}
    assert all(np.all(np.diff(runs[i].indices) == 1) for i in range(0, 1_500, 97))


def test_the_unseen_benchmarks_twelfth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set l at a small scale: each generator's defining trait."""
    built = _unseen_set("l", {"onedenserow", "topheavy", "lattice4d", "termdoc", "everyother", "cliques"})
    dense = built["onedenserow"]  # a 200 x 200 grid
    lengths = np.diff(dense.indptr)
    assert dense.shape == (40_000, 40_000) and lengths[20_000] == 40_000 and np.delete(lengths, 20_000).max() == 5
    top = np.diff(built["topheavy"].indptr)  # 50,000 rows, the first 1,000 filled
    assert top[1_000:].max() == 0 and top[:900].min() >= 90 and top[:1_000].max() <= 300  # the last clipped to n
    lattice = built["lattice4d"]  # 8^4 sites of 12 unknowns
    assert lattice.shape == (12 * 8**4,) * 2 and np.all(np.diff(lattice.indptr) == 108)
    site = lattice[0].indices // 12  # site 0 and its 8 neighbours, the wrap-around ones at each dimension's far end
    assert set(site.tolist()) == {0, 1, 7, 8, 56, 64, 448, 512, 3584}
    terms = built["termdoc"]  # 10,000 documents x 80,000 terms
    reads = np.bincount(terms.indices, minlength=80_000)
    assert terms.shape == (10_000, 80_000) and reads[:100].sum() > 0.25 * terms.nnz and reads[0] > 50 * reads.mean()
    other = built["everyother"]  # 12,000 rows
    assert np.all(np.diff(other.indptr)[0::2] == 0) and np.all(np.diff(other.indptr)[1::2] == 40)
    assert np.array_equal(other[101].indices, np.arange(81, 121))
    hyper = built["cliques"]  # 4,000 vertices: each row its hyperedges' 30 members each
    assert np.diff(hyper.indptr).max() <= 60 and np.diff(hyper.indptr).min() >= 30
    members = hyper[17].indices  # its two hyperedges: every pair of one of them an entry
    assert hyper[members][:, members].nnz >= 2 * 30 * 30 - members.size

def test_the_unseen_benchmarks_thirteenth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set m at a small scale: each generator's defining trait."""
    built = _unseen_set("m", {"blocktri", "randperm", "window", "useritem", "mediumwide", "upper27"})
    chain = built["blocktri"]  # 35 blocks of 48
    lengths = np.diff(chain.indptr)
    assert chain.shape == (35 * 48,) * 2 and lengths[0] == lengths[-1] == 96 and set(lengths[48:-48]) == {144}
    assert np.array_equal(chain[100].indices, np.arange(48, 192))  # block 2: blocks 1 to 3
    perm = built["randperm"]  # 240,000 rows
    assert np.all(np.diff(perm.indptr) == 1) and np.array_equal(np.sort(perm.indices), np.arange(240_000))
    narrow = built["window"]  # 8,000 rows
    spans = np.array([np.ptp(narrow[i].indices) for i in range(0, 8_000, 7)])
    assert spans.max() < 4_096 and np.diff(narrow.indptr).max() <= 30
    assert np.std([narrow[i].indices.min() for i in range(100)]) > 1_000  # windows anywhere in 0 .. 3,904
    likes = built["useritem"]  # 30,000 x 7,500
    degrees, reads = np.diff(likes.indptr), np.bincount(likes.indices, minlength=7_500)
    assert likes.shape == (30_000, 7_500) and np.median(degrees) >= 3 and degrees.max() > 20 * np.median(degrees)
    assert reads.max() > 50 * np.median(reads) and np.argmax(reads) != 0  # popular items scattered
    wide = built["mediumwide"]  # 240 rows of 1,000 draws from 20 M
    assert wide.shape == (240, 20_000_000) and np.diff(wide.indptr).min() >= 990
    upper = built["upper27"]  # a 26^3 grid
    coo = upper.tocoo()
    assert upper.shape == (26**3,) * 2 and np.all(coo.col >= coo.row) and np.diff(upper.indptr).max() == 14


def test_the_unseen_benchmarks_fourteenth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set n at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("n", {"widestencil", "morton27", "colperm27", "invertedindex", "cutoff3d", "groupby"})
    wide = built["widestencil"]  # an 8^3 grid: the middle node's row its whole 9^3 box, in 81 runs of 9
    middle = wide[4 * 64 + 4 * 8 + 4].indices
    assert wide.shape == (512, 512) and middle.size == 8**3 and np.diff(wide.indptr).max() == 8**3
    assert module._box_stencil(12, 3, 4)[6 * 144 + 6 * 12 + 6].indices.size == 729
    assert np.array_equal(module._morton(4, 2), [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15])
    z, perm = built["morton27"], built["colperm27"]  # a 22^3 grid each
    pattern = z.copy()
    pattern.data[:] = 1.0
    assert z.nnz == perm.nnz == (3 * 22 - 2) ** 3 and (pattern - pattern.T).nnz == 0
    assert np.median([np.ptp(z[i].indices) for i in range(0, 10_648, 11)]) < 22**2  # near, mostly
    spans = [np.ptp(perm[i].indices) for i in range(0, 10_648, 11)]
    shared = np.intersect1d(perm[5_000].indices, perm[5_001].indices).size
    assert np.median(spans) > 5_000 and shared == 18  # scattered columns, neighbouring rows sharing 18
    index = built["invertedindex"]  # 48,000 terms x 12,000 documents
    lengths = np.diff(index.indptr)
    assert index.shape == (48_000, 12_000) and lengths[0] > 0.3 * 12_000 and np.mean(lengths == 0) > 0.3
    near = built["cutoff3d"]  # 800 points: each row itself and the points within its radius
    assert near.shape == (800, 800) and near.diagonal().all() and np.diff(near.indptr).mean() > 100
    group = built["groupby"]  # 3,600 groups: each column read once, each row one run
    assert np.array_equal(group.indices, np.arange(group.shape[1])) and np.all(np.diff(group.indptr) >= 1)


def test_the_unseen_benchmarks_fifteenth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set o at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("o", {"prunedlayer", "twofour", "spectralz", "erdos", "wideband", "randblocks"})
    pruned = built["prunedlayer"]  # 1,638^2 at 10 %
    assert pruned.shape == (1_638, 1_638) and 0.08 < pruned.nnz / 1_638**2 < 0.1
    quads = built["twofour"]  # 717^2: 179 quads a row, 2 kept of each
    assert np.all(np.diff(quads.indptr) == 358) and np.all(np.bincount(quads[5].indices // 4) == 2)
    spectral = built["spectralz"]  # an 8 x 8 x 64 grid: row (1, 1, 0) its z line and its 4 neighbours' points
    row = spectral[(1 * 8 + 1) * 64].indices
    assert spectral.shape == (4_096, 4_096) and np.diff(spectral.indptr).max() == 68
    assert set(row.tolist()) == set(range(9 * 64, 10 * 64)) | {64, 17 * 64, 8 * 64, 10 * 64}
    graph = built["erdos"]  # 1,000 vertices, 250 draws a row
    assert np.diff(graph.indptr).min() > 200 and np.median([np.ptp(graph[i].indices) for i in range(50)]) > 900
    band = built["wideband"]  # 300 rows: the band is wider than the matrix
    assert band.nnz == 300 * 300
    assert np.array_equal(module.wideband(1_000, np.random.default_rng(0))[500].indices, np.arange(100, 901))
    assert np.array_equal(module._runs(np.array([5, 0]), np.array([2, 3])), [5, 6, 0, 1, 2])
    blocky = built["randblocks"]  # 72 block rows: each row runs of whole blocks, equal within a block row
    lengths = np.diff(blocky.indptr)
    assert lengths.min() >= 4 and len(set(lengths[:4].tolist())) == 1 and blocky.shape[0] >= 72 * 4


def test_the_unseen_benchmarks_sixteenth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set p at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("p", {"hmatrix", "circuit", "tridiag", "dgblocks", "transposed5", "bigbird"})
    far = module.hmatrix(1_000, np.random.default_rng(0))[500].indices  # a run of 32, then 2^5 .. 2^8 either side
    assert np.array_equal(far, [244, 372, 436, 468, *range(484, 516), 532, 564, 628, 756])
    assert np.diff(built["hmatrix"].indptr).min() >= 32
    wired = built["circuit"]  # 35,000 nodes: 20 nets of about 1,750 nodes each, rows and columns
    lengths, heights = np.diff(wired.indptr), np.diff(wired.tocsc().indptr)
    assert np.sum(lengths > 1_000) == 20 and np.sum(heights > 1_000) == 20 and np.median(lengths) <= 7
    line = built["tridiag"]  # 80,000 rows of three
    assert line.nnz == 3 * 80_000 - 2 and np.array_equal(line[7].indices, [6, 7, 8])
    dg = module.dgblocks(3, np.random.default_rng(0))  # the middle element (13) of 27: its block, 6 faces of 16
    row = dg[13 * 64].indices
    assert row.size == 64 + 6 * 16 and np.array_equal(row[:16], 4 * 64 + np.arange(48, 64))  # below in z: its top
    assert set(range(13 * 64, 14 * 64)) <= set(row.tolist()) and 12 * 64 + 3 in row and 12 * 64 + 2 not in row
    assert np.diff(built["dgblocks"].indptr).max() == 160
    cross = built["transposed5"]  # a 220^2 grid: row (i, j) holds columns j * 220 + i and its 4 neighbours
    assert np.array_equal(module.transposed5(4, np.random.default_rng(0))[5].indices, [1, 4, 5, 6, 9])
    assert np.diff(cross.indptr).max() == 5 and cross[1_000].indices.min() - cross[999].indices.min() == 220
    attention = built["bigbird"]  # 1,900 tokens: 8 whole rows, 8 dense columns, a window of 64 about the diagonal
    lengths = np.diff(attention.indptr)
    assert np.all(lengths[:8] == 1_900) and np.all(attention.tocsc()[:, :8].getnnz(axis=0) == 1_900)
    assert set(range(968, 1_032)) <= set(attention[1_000].indices.tolist()) and lengths[8:].max() < 64 + 8 + 48 + 1

def test_the_unseen_benchmarks_seventeenth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set q at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("q", {"spinchain", "dilated", "sellslices", "interleaved", "citations", "torus3d"})
    ring = module.spinchain(16, np.random.default_rng(0))  # 4 spins: 0101 swaps each of its 4 antiparallel pairs
    assert np.array_equal(ring[5].indices, [3, 5, 6, 9, 12]) and np.array_equal(ring[0].indices, [0])
    assert (ring.astype(bool) != ring.T.astype(bool)).nnz == 0  # a symmetric pattern: a swap undoes itself
    assert np.diff(built["spinchain"].indptr).max() <= 16  # 15 spins (20,972 states): at most 15 swaps and itself
    image = module.dilated(40, np.random.default_rng(0))[20 * 40 + 20].indices - (20 * 40 + 20)
    assert np.array_equal(image, [d * (40 * dy + dx) for dy, dx, d in sorted(
        {(dy * d, dx * d, 1) for d in (1, 4, 16) for dy in (-1, 0, 1) for dx in (-1, 0, 1)},
        key=lambda t: 40 * t[0] + t[1])])
    slices = np.diff(built["sellslices"].indptr)[:2_976].reshape(-1, 32)  # 93 whole slices of 32 rows
    assert built["sellslices"].shape == (3_000, 30_000) and np.ptp(slices.max(axis=1)) > 100
    assert np.all(slices.min(axis=1) >= 0.97 * slices.max(axis=1) - 1)  # one length a slice, less duplicates
    mixed = built["interleaved"]
    assert np.array_equal(mixed[10].indices, np.arange(6, 15)) and 30 < mixed[11].nnz <= 40
    cited = built["citations"].tocoo()
    assert np.all(cited.col < cited.row) and built["citations"][0].nnz == 0
    assert np.median(cited.col) < np.median(cited.row) / 2  # the oldest papers are cited most
    torus = module.torus3d(5, np.random.default_rng(0))
    assert np.array_equal(torus[0].indices, [0, 1, 4, 5, 20, 25, 100]) and np.all(np.diff(torus.indptr) == 7)
    assert built["torus3d"].nnz == 7 * 32 ** 3


def test_the_unseen_benchmarks_eighteenth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set r at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("r", {"reactdiff", "patree", "kronrandom", "sparseblocks", "tandemqueue", "levy"})
    grid = module.reactdiff(4, np.random.default_rng(0), species=3)  # node 5 (1, 1), its species 1: row 16
    assert np.array_equal(grid[16].indices, [4, 13, 15, 16, 17, 19, 28])
    assert np.diff(built["reactdiff"].indptr).max() == 24  # 20 species and 4 neighbours inside
    tree = built["patree"]
    assert (tree.astype(bool) != tree.T.astype(bool)).nnz == 0 and tree.nnz == 3 * tree.shape[0] - 2
    edges = tree.tocoo()
    older = np.bincount(edges.row[edges.col < edges.row], minlength=tree.shape[0])
    assert older[0] == 0 and np.all(older[1:] == 1)  # every node but the first one parent, an older node
    assert np.argmax(np.diff(tree.indptr)) < 10 and np.diff(tree.indptr).max() > 100  # the oldest collect children
    kron = built["kronrandom"].tocoo()
    n = 100  # its factors' order at this scale
    assert built["kronrandom"].shape == (n * n, n * n) and np.diff(built["kronrandom"].indptr).max() <= 25
    assert max(np.unique(kron.col[kron.row == r] // n).size for r in range(0, n * n, 997)) <= 5
    blocks = built["sparseblocks"].tocoo()
    assert np.all(blocks.col // 64 == blocks.row // 64) and built["sparseblocks"].diagonal().all()
    queue = module.tandemqueue(2, np.random.default_rng(0), queues=3)  # 27 states, the first queue's length fastest
    assert np.array_equal(queue[0].indices, [0, 1]) and np.array_equal(queue[1].indices, [1, 2, 3])
    assert np.array_equal(queue[26].indices, [17, 26])  # all full: only a departure, 2 * 9 states back
    assert np.diff(built["tandemqueue"].indptr).max() == 7  # 5 queues: itself, an arrival, 4 moves, a departure
    flight = built["levy"].tocoo()
    gap = np.abs(flight.col - flight.row)
    gap = np.minimum(gap, flight.shape[0] - gap)  # on the ring
    assert np.mean(gap <= 4) > 0.4 and np.mean(gap > 1_000) > 0.01


def test_the_unseen_benchmarks_nineteenth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set s at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("s", {"matricized", "maxwell", "haar", "conv3dch", "driftband", "supernodal"})
    tensor = built["matricized"]
    assert tensor.shape[1] == 2_000 * 10_000 and np.diff(tensor.indptr).max() <= 24
    assert max(np.unique(tensor[r].indices // 10_000).size for r in range(0, tensor.shape[0], 499)) <= 4
    yee = module.maxwell(4, np.random.default_rng(0))  # 64 edges a field: x-edges, then y, then z
    assert np.array_equal(yee[0].indices, [0, 4, 12, 16, 48, 64, 65, 76, 77, 128, 129, 176, 177])
    curl = built["maxwell"].astype(bool)
    assert np.all(np.diff(curl.indptr) == 13) and (curl != curl.T).nnz == 0  # C^T C + I: a symmetric pattern
    wavelet = module.haar(8, np.random.default_rng(0))  # sections of 8, 4, 2 and 1 coefficients
    assert wavelet.shape == (8, 15) and np.array_equal(wavelet[5].indices, [5, 10, 13, 14])
    conv = module.conv3dch(3, np.random.default_rng(0), channels=2)  # the middle voxel's rows: 27 runs of 2
    assert np.array_equal(conv[26].indices, np.arange(54)) and np.diff(conv.indptr).min() == 8 * 2
    drift = built["driftband"].tocoo()
    assert np.abs(drift.col - drift.row).max() > 1_000 and np.diff(built["driftband"].indptr).max() <= 20
    factor = built["supernodal"]
    assert module.sp.triu(factor, 1).nnz == 0 and factor.diagonal().all()
    lengths = np.diff(factor.indptr)
    assert np.mean(np.diff(lengths) == 1) > 0.8  # rising by one through each supernode


def test_the_unseen_benchmarks_twentieth_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set t at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("t", {"exactcover", "resample", "subdomains", "tomography", "gnnsample", "dangling"})
    sudoku = module.exactcover(4, np.random.default_rng(0))  # boxes of 2 x 2: row (r, c, v) = (1, 2, 3) is 27, box 1
    assert sudoku.shape == (64, 64) and np.array_equal(sudoku[27].indices, [6, 23, 43, 55])
    cover = built["exactcover"]
    n = round(cover.shape[1] ** 0.5 / 2)
    assert np.all(np.diff(cover.indptr) == 4) and np.all(cover.indices.reshape(-1, 4) // (n * n) == np.arange(4))
    assert np.all(np.bincount(cover.indices) == n)  # every constraint met by n candidates
    filt = module.resample(5, np.random.default_rng(0), factor=2, taps=4)
    assert filt.shape == (5, 10) and np.array_equal(filt[2].indices, [3, 4, 5, 6])
    assert np.array_equal(filt[0].indices, [0, 1, 2])  # cut at the start
    parts = module.subdomains(4, np.random.default_rng(0), parts=2)  # 8 subdomains of 2^3
    parts.sort_indices()
    assert np.array_equal(parts[0].indices, [0, 1, 2, 4])  # a corner: its own subdomain alone
    assert np.array_equal(parts[1].indices, [0, 1, 3, 5, 8])  # x + 1 crosses into the next subdomain
    assert np.diff(built["subdomains"].indptr).max() == 7
    rays = built["tomography"]
    assert rays.shape[1] == 1_000_000 and np.diff(rays.indptr).min() > 100
    flat = module.tomography(1, np.random.default_rng(0), side=50, angles=1)  # angle 0: one image row
    assert np.all(np.diff(flat.indices) == 1) and flat.nnz == 50 and len(set(flat.indices // 50)) == 1
    sampled = built["gnnsample"]
    assert sampled.shape[1] == 8_000_000 and np.diff(sampled.indptr).max() == 25
    assert np.bincount(sampled.indices).max() > 20  # popular nodes, drawn by many rows
    crawl = built["dangling"]
    assert 0.75 < np.mean(np.diff(crawl.indptr) == 0) < 0.85
    coo = crawl.tocoo()
    assert np.mean(np.abs(coo.col - coo.row) <= 5_000) > 0.45  # half the links within the host



def test_the_unseen_benchmarks_twenty_first_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set u at a small scale: each generator's defining trait."""
    module = _bench_module("unseen_matrices")
    built = _unseen_set("u", {"ghostcols", "amr3d", "specelem", "molecules", "coupled", "stochgalerkin"})
    ghosts = module.ghostcols(3, np.random.default_rng(0))  # 27 rows, 6 faces of 9 ghosts after them
    assert ghosts.shape == (27, 81) and np.all(np.diff(ghosts.indptr) == 7)
    assert np.array_equal(ghosts[0].indices, [0, 1, 3, 9, 27, 45, 63])  # a corner: 3 neighbours, 3 ghosts
    assert np.array_equal(ghosts[13].indices, [4, 10, 12, 13, 14, 16, 22])  # the centre: no ghost
    assert np.all(np.diff(built["ghostcols"].indptr) == 7)
    mesh = module.amr3d(4, np.random.default_rng(0), shell=0.2)
    pattern = abs(mesh).astype(bool)
    assert (pattern != pattern.T).nnz == 0 and mesh.shape[0] > 4**3  # split cells: more than the coarse grid
    assert np.diff(mesh.indptr).max() == 13  # a whole cell beside a split one: 4 finer across that face
    assert np.diff(built["amr3d"].indptr).max() >= 10
    spectral = module.specelem(2, np.random.default_rng(0), order=2)  # 2 x 2 elements of 3 x 3 nodes
    assert spectral.shape == (25, 25) and np.array_equal(spectral[0].indices, np.arange(9))  # element 0 first
    assert sorted(set(np.diff(spectral.indptr))) == [9, 15, 25]  # inside, on an edge, at the corner of four
    assert sorted(set(np.diff(built["specelem"].indptr))) == [64, 120, 225]
    batch = module.molecules(1_000, np.random.default_rng(0))
    pattern = abs(batch).astype(bool)
    coo = batch.tocoo()
    assert (pattern != pattern.T).nnz == 0 and np.abs(coo.row - coo.col).max() < 60 and batch.diagonal().all()
    assert 2.5 < batch.nnz / batch.shape[0] < 4
    physics = module.coupled(4, np.random.default_rng(0))  # 64 stencil rows over 64 network rows
    assert np.array_equal(np.diff(physics.indptr)[:64], np.diff(module._box_stencil(4, 3).indptr))
    assert physics[:64, 64:].nnz == 0 and physics[64:, 64:].nnz > 0
    chaos = module.stochgalerkin(3, np.random.default_rng(0), variables=2, degree=1)  # 3 polynomials: 1, x, y
    assert chaos.shape == (27, 27) and chaos[9:18, 18:].nnz == 0  # x and y differ in two inputs: no block
    assert chaos[:9, 9:18].nnz == chaos[:9, :9].nnz == 33  # the mean couples to x: the 5-point pattern of 3^2
    lengths = np.diff(built["stochgalerkin"].indptr)  # 84 polynomials of 6 inputs: 2 to 9 stencils of 3 to 5
    assert built["stochgalerkin"].shape[0] % 84 == 0 and lengths.min() == 2 * 3 and lengths.max() == 9 * 5

def test_the_unseen_benchmark_permutes_a_matrixs_columns_alone_where_asked() -> None:
    """--permute-columns: the same rows, of the same lengths, each column's entries moved to another column."""
    module = _bench_module("unseen_matrices")
    sawtooth = next(m for m in module.MATRICES if m.name == "sawtooth")
    A, P = sawtooth.make(0.01), module.columns_permuted(sawtooth).make(0.01)
    assert module.columns_permuted(sawtooth).name == "sawtooth-colperm" and P.has_canonical_format
    assert P.shape == A.shape and np.array_equal(P.indptr, A.indptr)
    reads = np.bincount(A.indices, minlength=A.shape[1])
    moved = np.bincount(P.indices, minlength=A.shape[1])
    assert np.array_equal(np.sort(reads), np.sort(moved)) and not np.array_equal(reads, moved)


def test_the_unseen_benchmark_measures_a_named_suite_as_its_own_matrices() -> None:
    """--suite issue18: the six structures issue #18 names, each built by its suite entry (at the size asked)."""
    module = _bench_module("unseen_matrices")
    matrices = module.from_suite("issue18")
    assert [m.name for m in matrices] == [m.name for m in SUITES["issue18"]]
    assert {m.group for m in matrices} == {"issue18"}
    lp = next(m for m in matrices if m.name.startswith("lp-"))
    A = lp.make(0.05)  # 1,000 rows x 200 times as many columns
    assert A.shape == (1_000, 200_000) and A.has_canonical_format and np.diff(A.indptr).mean() > 300


def test_the_issue18_suite_is_the_six_structures_the_issue_names_at_its_sizes() -> None:
    kinds = {m.kind: m for m in SUITES["issue18"]}
    assert set(kinds) == {"blockfem", "kronecker", "arrowband", "bipartite", "emptyrows", "lp"}
    assert all(approx_nnz(m.kind, m.size, dict(m.options)) > 1.3e7 for m in kinds.values())
    assert kinds["bipartite"].size == 8_000_000 and dict(kinds["emptyrows"].options)["empty"] == 0.4
    assert kinds["lp"].size == 20_000 and kinds["lp"].size * dict(kinds["lp"].options)["width"] == 4_000_000


def test_the_unseen_benchmarks_second_set_builds_the_structures_it_names() -> None:
    """bench/unseen_matrices.py set b at a small scale: each generator's defining trait, and every matrix canonical."""
    built = _unseen_set("b", {"incidence", "hubcols", "diagonals", "denserows", "sawtooth", "kkt"})
    lengths = {name: np.diff(A.indptr) for name, A in built.items()}
    incidence = built["incidence"]
    assert incidence.shape[0] == 10 * incidence.shape[1] and (lengths["incidence"] == 2).all()
    columns = np.bincount(built["hubcols"].indices, minlength=built["hubcols"].shape[1])
    assert lengths["hubcols"].max() <= 8 and columns.max() > 50 * columns.mean()  # a few columns read by many rows
    assert (lengths["diagonals"] == 11).all()
    assert built["denserows"].shape[0] == 40 and lengths["denserows"].min() > 3900
    sawtooth = np.arange(lengths["sawtooth"].size) % 64 + 1  # at most: columns drawn twice are one entry
    assert (lengths["sawtooth"] <= sawtooth).all() and lengths["sawtooth"][2000:].sum() > 0.9 * sawtooth[2000:].sum()
    kkt = built["kkt"]
    constraints = kkt.shape[0] - round(kkt.shape[0] / 1.25)  # the last fifth of the rows: B, beside a zero block
    B = kkt[-constraints:]
    assert (B.indices < kkt.shape[0] - constraints).all()  # the zero block: B's rows read K's columns only
    assert np.diff(B.indptr).max() == 24 and np.diff(B.indptr).mean() > 20  # 24 drawn, a repeat counted once


def test_an_ab_archives_both_trees_alike_without_the_shipped_selectors(tmp_path) -> None:
    """A commit's tree and the working tree hold the packages and bench/unseen.py, not tuner/data (the working
    tree every file of the commit it still has); an existing folder is refused."""
    module = _bench_module("ab_unseen")
    module.archive("HEAD", tmp_path / "base")
    module.archive(module.WORKTREE, tmp_path / "new")
    trees = [{p.relative_to(tmp_path / t).as_posix() for p in (tmp_path / t).rglob("*") if p.is_file()}
             for t in ("base", "new")]
    assert {"bench/unseen.py", "tuner/execute/plan.py", "kernels/csr_vector.cu", "db/store.py"} <= trees[0]
    assert "bench/unseen_matrices.py" in trees[1]  # the benchmark's matrices beside it
    assert not any(f.startswith(("tuner/data/", "tests/")) for f in trees[0] | trees[1])
    assert {f for f in trees[0] if (module.REPO / f).is_file()} <= trees[1]  # the commit's files still there
    with pytest.raises(SystemExit, match="exists"):
        module.archive("HEAD", tmp_path / "base")
    with pytest.raises(SystemExit, match="git archive no-such-rev"):
        module.archive("no-such-rev", tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # nothing half-written left behind


def test_an_ab_runs_each_tree_from_its_own_folder_in_turn_with_the_same_environment(tmp_path, monkeypatch) -> None:
    """Each tree's bench/unseen.py runs from that tree, first on the path, labelled by tree and run, in the order
    new, base, base, new; the arguments after -- are passed on."""
    module = _bench_module("ab_unseen")
    log = tmp_path / "log.jsonl"
    fake = ("import json, os, sys\n"
            f"with open({str(log)!r}, 'a') as f: f.write(json.dumps({{'cwd': os.getcwd(), 'argv': sys.argv[1:], "
            "'commit': os.environ['SPMV_GIT_COMMIT'], 'path': os.environ['PYTHONPATH'].split(os.pathsep)[0], "
            "'models': os.environ['SPMV_TUNER_MODELS']}) + '\\n')\n")
    for name in ("new", "base"):
        (tmp_path / name / "bench").mkdir(parents=True)
        (tmp_path / name / "bench" / "unseen.py").write_text(fake)
    monkeypatch.delenv("SPMV_TUNER_MODELS", raising=False)
    module.run([tmp_path / "new", tmp_path / "base"], tmp_path / "out", ["--only", "rgg", "--effort", "predict"])
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["commit"] for r in runs] == ["new", "base", "base", "new"]
    assert all(r["cwd"] == r["path"] == str(tmp_path / r["commit"]) for r in runs)
    assert [r["argv"][-3] for r in runs] == ["ab-new-1", "ab-base-1", "ab-base-2", "ab-new-2"]
    assert all(r["argv"][:4] == ["--only", "rgg", "--effort", "predict"] for r in runs)
    assert {r["models"] for r in runs} == {str(module.REPO / "tuner" / "data")}
    (tmp_path / "base" / "bench" / "unseen.py").write_text(fake + "sys.exit(3)\n")
    log.unlink()
    with pytest.raises(SystemExit, match=r"failed in .*base \(run 1\)"):
        module.run([tmp_path / "new", tmp_path / "base"], tmp_path / "out", [])
    assert [json.loads(line)["commit"] for line in log.read_text().splitlines()] == ["new", "base"]


def test_an_abs_command_line_passes_what_follows_two_dashes_to_the_benchmark(monkeypatch, tmp_path) -> None:
    """``run NEW BASE --out O --cpu N -- ARGS``, as the module's doc writes it: the trees, the folder and the core
    to run, and bench/unseen.py's arguments (those after --, options included) apart."""
    module = _bench_module("ab_unseen")
    calls = []
    monkeypatch.setattr(module, "run", lambda *args: calls.append(args))
    module.main(["run", "n", "b", "--out", str(tmp_path), "--cpu", "3", "--", "--only", "rgg", "--effort", "predict"])
    module.main(["run", "--out", str(tmp_path), "n", "b"])
    assert calls == [([Path("n"), Path("b")], tmp_path, ["--only", "rgg", "--effort", "predict"], 3),
                     ([Path("n"), Path("b")], tmp_path, [], None)]


def test_an_ab_compares_each_matrix_over_its_runs_and_names_what_it_cannot_read(tmp_path) -> None:
    """Per matrix, each tree's median over its runs of the plan's seconds beyond its features; the geomean of
    their ratios; runs of other files or of one tree only are refused."""
    module = _bench_module("ab_unseen")

    def row(matrix: str, plan_s: float) -> dict[str, Any]:
        return {"matrix": matrix, "effort": "predict", "dtype": "float32", "plan_s": plan_s, "features_s": 0.5e-3,
                "plan_steps_s": {"rank": 1e-4, "total": plan_s}}

    beyond = {"new": {"a": [1.0, 1.2, 1.1], "b": [2.0, 2.0, 2.4]}, "base": {"a": [2.0, 2.2, 2.1], "b": [2.0, 2.0, 2.0]}}
    files = []
    for tree, matrices in beyond.items():
        for n in range(3):
            path = tmp_path / f"2026-11-28_gpu_unseen-ab-{tree}-{n + 1}.json"
            path.write_text(json.dumps({"rows": [row(m, 0.5e-3 + ms[n] * 1e-3) for m, ms in matrices.items()]}))
            files.append(path)
    for base, want in (("base", np.sqrt((1.1 / 2.1) * (2.0 / 2.0))), ("new", np.sqrt((2.1 / 1.1) * (2.0 / 2.0)))):
        lines = module.compare(files, base=base)
        assert any(line.startswith("predict float32 base run 1: rank 100, total") for line in lines)
        assert float(lines[-1].split()[-1]) == pytest.approx(want, rel=1e-3)
        assert lines[-1].startswith(f"predict float32: {'new / base' if base == 'base' else 'base / new'}")
        assert "geomean over 2 matrices" in lines[-1]
    with pytest.raises(SystemExit, match="no runs of 'old'"):
        module.compare(files, base="old")
    with pytest.raises(SystemExit, match="two trees"):
        module.compare(files[:3])
    with pytest.raises(SystemExit, match="not a run"):
        module.compare([tmp_path / "2026-11-28_gpu_unseen-x.json"])


def test_the_unseen_benchmarks_answers_are_summarized_by_ratio_alone_and_a_failed_one_left_out() -> None:
    """--recommend's rows (what `tuner recommend` answers, the ranking's first config) have no plan cost: their
    summary lines give the ratios and the share below 0.97x; a row whose answer failed is not among them."""
    module = _bench_module("unseen")

    def row(effort: str, ratio: float) -> dict[str, Any]:
        return {"matrix": "m", "dtype": "float64", "effort": effort, "ratio_to_cusparse": ratio}

    lines = module.summary([row("recommend", 2.0), row("recommend", 0.5), row("ranked", 0.9),
                            {**row("ranked", 1.0), "error": "OutOfMemoryError: out of memory"}])
    assert lines == ["set a   float64 recommend: geomean 1.000x, lowest 0.500x (2 matrices); 50% below 0.97x",
                     "set a   float64 ranked  : geomean 0.900x, lowest 0.900x (1 matrices); 100% below 0.97x"]


def test_the_unseen_benchmark_reports_predicts_cost_beyond_both_timings_of_the_features(tmp_path) -> None:
    """A predict row's cost beyond its features, both ways (features back to back, and each after a fresh store
    as a plan starts), in the summary; the fresh store holds the warm-up matrix only, and is gone after."""
    module = _bench_module("unseen")

    def row(matrix: str, beyond: float, alike: float) -> dict[str, Any]:
        return {"matrix": matrix, "dtype": "float32", "effort": "predict", "ratio_to_cusparse": 1.0, "plan_spmvs": 9.0,
                "beyond_features_spmvs": beyond, "beyond_alike_spmvs": alike}

    line = module.summary([row("a", 6.0, 3.0), row("b", 8.0, 5.0), row("c", 7.0, 4.0)])[0]
    assert "beyond the features median 7.0, highest 8.0 (features timed alike: 4.0, 5.0)" in line
    warm = module.rgg(2_000, np.random.default_rng(0))
    warm_up = {"rows": warm.shape[0], "cols": warm.shape[1], "nnz": warm.nnz,
               "features": module.extract_features(warm)}
    with module.fresh_store(warm_up) as store:
        folder = store.path.parent
        assert [m["name"] for m in store.db["matrices"].rows] == ["warm-up"]
    assert not folder.exists()
