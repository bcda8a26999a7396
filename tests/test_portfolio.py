"""The portfolio: built from a store's trials, written and read back, measured in every study by tune-many."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

from common.errors import InvalidConfigError
from db.store import Store
from kernels import REGISTRY, get_family
from tests.conftest import REPO
from tuner.cli import app
from tuner.matrix.io import as_csr, write_mtx
from tuner.measure.backend import CpuReferenceBackend
from tuner.search.loop import tune
from tuner.search.storage import open_storage
from tuner.select.portfolio import build_portfolio, read_portfolio, write_portfolio

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used:UserWarning")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Store:
    """A store with a few matrices tuned on the CPU references."""
    folder = tmp_path_factory.mktemp("tuned")
    store = Store(folder / "t.db")
    storage = open_storage(str(folder / "j.log"))
    for seed in range(3):
        A = as_csr(sp.random(200 + 50 * seed, 180, density=0.05, format="csr", random_state=seed))
        tune(A, backend=CpuReferenceBackend(), store=store, storage=storage, name=f"m{seed}", trials=20, seed=seed,
             summary=False)
    return store


def test_small_spaces_whole_large_ones_their_default_first_and_few(tuned: Store) -> None:
    device = tuned.devices()[0]["id"]
    configs = build_portfolio(tuned, device=device, per_family=2)
    by_family: dict[str, list[dict]] = {}
    for kernel, params in configs:
        by_family.setdefault(kernel, []).append(params)
    assert set(by_family) == set(REGISTRY)
    for name, got in by_family.items():
        space = get_family(name).space
        if len(space.configs()) <= 32:
            assert got == space.configs()
        else:
            assert got[0] == space.defaults() and 1 <= len(got) <= 2
        assert len({json.dumps(p, sort_keys=True) for p in got}) == len(got)
    assert build_portfolio(tuned, device="no such device", per_family=2) == [
        (name, c) for name in sorted(REGISTRY) for c in (get_family(name).space.configs()
                                                         if len(get_family(name).space.configs()) <= 32
                                                         else [get_family(name).space.defaults()])]


def test_a_portfolio_file_round_trips_and_a_bad_one_names_the_fault(tmp_path: Path) -> None:
    configs = [("csr_vector", {"threads_per_row": 4, "block_size": 128, "indices": "int32"}),
               ("cusparse", {"algorithm": "csr_alg2"})]
    assert read_portfolio(write_portfolio(tmp_path / "p.json", configs)) == configs
    bad = tmp_path / "bad.json"
    for text, message in (("{", "cannot read"), ('{"configs": []}', "not a portfolio file"),
                          ('{"format": "spmv-tuner-portfolio", "configs": [{"kernel": "nope"}]}', "unknown kernel"),
                          ('{"format": "spmv-tuner-portfolio", "configs": [{"kernel": "csr_scalar", '
                           '"params": {"block_size": 3}}]}', "block_size=3 is not allowed")):
        bad.write_text(text)
        with pytest.raises(InvalidConfigError, match=message):
            read_portfolio(bad)
    with pytest.raises(InvalidConfigError, match="cannot read"):
        read_portfolio(tmp_path / "missing.json")


def test_cli_writes_it_and_tune_many_measures_it_in_every_study(tuned: Store, tmp_path: Path) -> None:
    out = tmp_path / "portfolio.json"
    device = tuned.devices()[0]["id"]
    result = CliRunner().invoke(app, ["corpus", "portfolio", str(out), "--db", str(tuned.path), "--device", device,
                                      "--per-family", "1"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    configs = read_portfolio(out)
    assert f"{len(configs)} configs" in result.output
    few = [c for c in configs if c[0] in ("csr_scalar", "cusparse")]  # 8 configs: quick on the references
    write_portfolio(out, few)
    folder = tmp_path / "mtx"
    folder.mkdir()
    for seed in range(2):
        write_mtx(folder / f"m{seed}.mtx", as_csr(sp.random(120, 100, density=0.05, format="csr", random_state=seed)))
    journal = tmp_path / "j.log"
    total = len(REGISTRY) + len(few)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"}
    proc = subprocess.run([sys.executable, "-m", "tuner", "tune-many", str(folder), "--storage",
                           str(journal), "--trials-per-matrix", str(total), "--device", "cpu-reference",
                           "--workers", "2", "--enqueue", str(out)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    storage = open_storage(str(journal))
    names = [s.study_name for s in storage.get_all_studies()]
    assert len(names) == 2
    want = {(k, json.dumps(p, sort_keys=True)) for k, p in few}
    for name in names:
        done = [t for t in optuna.load_study(study_name=name, storage=storage).trials
                if t.state == optuna.trial.TrialState.COMPLETE]
        assert len(done) == total
        seen = {(t.params["kernel"], json.dumps({k.split(".", 1)[1]: v for k, v in t.params.items() if "." in k},
                                                sort_keys=True)) for t in done}
        assert want <= seen
    bad = subprocess.run([sys.executable, "-m", "tuner", "tune-many", str(folder), "--storage",
                          str(journal), "--trials-per-matrix", "2", "--device", "cpu-reference", "--enqueue",
                          str(tmp_path / "missing.json")], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "cannot read the portfolio" in bad.stdout + bad.stderr


def test_the_benchmark_options_file_is_a_valid_portfolio() -> None:
    """bench/options.json (the README's `tuner bench --enqueue`): every config valid, none a family default."""
    configs = read_portfolio(REPO / "bench" / "options.json")
    assert configs and len({(k, json.dumps(p, sort_keys=True)) for k, p in configs}) == len(configs)
    assert all(p != get_family(k).space.defaults() for k, p in configs)
