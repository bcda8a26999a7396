"""Tuning past one GPU: workers sharing studies through optuna's storage, on the CPU references.

Every scenario runs on a journal file and on a real PostgreSQL server started
here on 127.0.0.1 (a throwaway cluster: initdb into a temporary folder, a free
port, stopped at the end). Without PostgreSQL's binaries those runs skip, except
under CI (``CI`` set), where ``.ci/run`` installs them and a skip would hide a gap.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import typer
from typer.testing import CliRunner

from common.errors import InvalidConfigError
from db.store import Store
from tests.conftest import REPO
from tuner.matrix.generate import KINDS, generate
from tuner.matrix.io import write_mtx
from tuner.matrix.sources import read_sources
from tuner.measure.backend import CpuReferenceBackend
from tuner.search.loop import tune
from tuner.search.pool import tune_many
from tuner.search.storage import HeartbeatJournalStorage, HeartbeatRDBStorage, open_storage
from tuner.search.study import CACHED_ATTR, RECORD_ATTR, fail_stale_trials, keeps_place, settle, study_budget
from tuner.search.sync import sync, sync_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used:UserWarning")

N = 6  # finished trials per study
HEARTBEAT, GRACE = 1, 2
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"}

cli = typer.Typer()
cli.command("tune-many")(tune_many)
cli.command("sync")(sync)
runner = CliRunner()


# -- a throwaway PostgreSQL server -------------------------------------------------------------------


def _pg_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    for folder in [*([str(Path(found).parent)] if found else []), *sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                                                          reverse=True)]:
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; .ci/run installs it, so CI must have it")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server on 127.0.0.1:<free port>; yields a function making a new, empty database URL."""
    pg = _pg_bin()
    if pg is None:
        _missing("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
    try:
        import psycopg
    except ImportError:
        _missing("the PostgreSQL driver psycopg is not installed: pip install -e '.[dev]'")
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="spmv-pg-"))
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    data = folder / "data"
    subprocess.run([*as_user, pg / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync",
                    "--locale=C", "-E", "UTF8"], check=True, capture_output=True, timeout=120)
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    subprocess.run([*as_user, pg / "pg_ctl", "-D", data, "-l", folder / "server.log", "-o", options, "-w", "-t", "60",
                    "start"], check=True, capture_output=True, timeout=120)
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    made = []

    def database() -> str:
        name = f"spmv{len(made)}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"create database {name}")
        made.append(name)
        return f"postgresql://postgres@127.0.0.1:{port}/{name}"

    try:
        yield database
    finally:
        subprocess.run([*as_user, pg / "pg_ctl", "-D", data, "-m", "fast", "-w", "-t", "60", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["journal", "postgresql"])
def shared(request, tmp_path) -> str:
    """The storage spec every worker of a test shares."""
    if request.param == "journal":
        return str(tmp_path / "studies.log")
    return request.getfixturevalue("postgres")()


@pytest.fixture(scope="module")
def matrices(tmp_path_factory) -> Path:
    """A dozen small generated matrices of every kind, in one folder."""
    folder = tmp_path_factory.mktemp("matrices")
    kinds = list(KINDS)
    for i in range(12):
        kind = kinds[i % len(kinds)]
        size = {KINDS[kind].size_arg: (5 + i) if KINDS[kind].size_arg == "n" else 30 + 6 * i}
        write_mtx(folder / f"{i:02d}_{kind}.mtx", generate(kind, seed=i, **size))
    return folder


# -- helpers -------------------------------------------------------------------------------------------


def studies(spec: str) -> dict[str, list[optuna.trial.FrozenTrial]]:
    storage = open_storage(spec)
    return {s.study_name: storage.get_all_trials(s._study_id, deepcopy=False) for s in storage.get_all_studies()}


def finished_count(spec: str) -> int:
    try:
        return sum(t.state in FINISHED for trials in studies(spec).values() for t in trials)
    except Exception:  # the first worker may still be creating the schema
        return 0


def children(pid: int) -> list[int]:
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(Path(stat).parent.name))
    return out


def tune_many_cmd(spec: str, folder: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "tuner", "tune-many", str(folder), "--storage", spec,
            "--trials-per-matrix", str(N), "--device", "cpu-reference", "--workers", str(workers),
            "--heartbeat", str(HEARTBEAT), "--grace", str(GRACE)]


DIE = textwrap.dedent(
    """
    import os, signal, sys
    import optuna
    from tuner.search import loop as search, worker
    from tuner.measure.backend import CpuReferenceBackend
    from tuner.matrix.fingerprint import fingerprint
    from tuner.matrix.io import read_mtx
    from tuner.search.study import study_name
    spec, folder, how = sys.argv[1:]
    if how == "before-first-beat":  # asks a trial of the first matrix's study and dies at once
        storage = worker.open_shared_storage(spec, heartbeat=1, grace=2)
        first = sorted(p for p in os.listdir(folder))[0]
        name = study_name(fingerprint(read_mtx(os.path.join(folder, first))), CpuReferenceBackend().info, "float64")
        study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True)
        study.ask()
        os.kill(os.getpid(), signal.SIGKILL)
    calls = []
    real = search.evaluate
    def evaluate(*args, **kwargs):  # dies in the middle of its 4th measurement, heartbeat running
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    search.evaluate = evaluate
    worker.app([folder, "--storage", spec, "--trials-per-matrix", "6", "--device", "cpu-reference",
                "--heartbeat", "1", "--grace", "2"])
    """
)


def die(spec: str, folder: Path, how: str) -> None:
    proc = subprocess.run([sys.executable, "-c", DIE, spec, str(folder), how], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def dump(db: Path) -> dict[str, list[dict]]:
    with Store(db) as store:
        return {t: list(store.db[t].rows_where(order_by="rowid")) for t in
                ("matrices", "features", "devices", "trials", "best")}


# -- the scenario CI must show -------------------------------------------------------------------------


def test_three_workers_a_killed_one_and_a_rerun_finish_every_study_exactly_then_sync_twice(
    shared: str, matrices: Path, tmp_path: Path
) -> None:
    # Workers that died mid-trial before: one between ask() and its first heartbeat, one while measuring.
    die(shared, matrices, "before-first-beat")
    die(shared, matrices, "mid-trial")
    running = [t for trials in studies(shared).values() for t in trials if t.state.name == "RUNNING"]
    assert len(running) == 2

    # Three workers; one of them SIGKILLed once some trials are told.
    proc = subprocess.Popen(tune_many_cmd(shared, matrices, 3), cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while (len(children(proc.pid)) < 3 or finished_count(shared) < 20) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    victim = children(proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 1, out  # a worker died: said so, and not an error of its own
    assert "-9" in out

    again = subprocess.run(tune_many_cmd(shared, matrices, 3), cwd=REPO, env=ENV, capture_output=True, text=True,
                           timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "studies complete: 12 of 12" in again.stdout

    by_study = studies(shared)
    assert len(by_study) == 12
    for name, trials in by_study.items():
        states = Counter(t.state.name for t in trials)
        assert states["COMPLETE"] + states["FAIL"] == N, (name, states)  # exactly N, none lost or extra
        assert states["RUNNING"] == states["WAITING"] == 0, (name, states)
        assert len({t.number for t in trials}) == len(trials)
    lost = [t for trials in by_study.values() for t in trials if t.state.name == "FAIL" and RECORD_ATTR not in
            t.user_attrs]
    assert len(lost) >= 2  # the two dead workers' trials (and the SIGKILLed one's, if it was mid-trial)

    # What sync must copy: every finished trial with a measurement, and the lost ones whose config was chosen.
    expected = set()
    for trials in by_study.values():
        for t in trials:
            if t.state in FINISHED and not t.user_attrs.get(CACHED_ATTR):
                if RECORD_ATTR in t.user_attrs:
                    expected.add(t.user_attrs[RECORD_ATTR]["trial_uid"])
                elif t.params.get("kernel"):
                    expected.add(t.user_attrs.get("uid") or f"derived-{t.number}")
    db = tmp_path / "local.db"
    first = runner.invoke(cli, ["sync", "--storage", shared, "--db", str(db)], env={"COLUMNS": "160"})
    assert first.exit_code == 0, first.output
    assert "synced 12 studies" in first.output
    with Store(db) as store:
        rows = list(store.db["trials"].rows)
        uids = [r["trial_uid"] for r in rows]
        assert len(uids) == len(set(uids)) == len(expected)  # no duplicates, nothing missing
        assert {u for u in uids if not u.startswith("derived-")} == {u for u in expected
                                                                     if not u.startswith("derived-")}
        assert sum(r["error_kind"] == "worker_lost" for r in rows) >= 1
        assert store.count_matrices() == 12 and len(store.devices()) == 1
        assert all(store.best(m["fingerprint"], device=store.devices()[0]["id"], dtype="float64")
                   for m in store.matrices())
    before = dump(db)
    second = runner.invoke(cli, ["sync", "--storage", shared, "--db", str(db)], env={"COLUMNS": "160"})
    assert second.exit_code == 0 and "0 trials added" in second.output, second.output
    assert dump(db) == before


# -- exactly N, in one process ----------------------------------------------------------------------------


def test_many_threads_racing_on_one_study_end_with_exactly_n(shared: str) -> None:
    storage = open_storage(shared, heartbeat_interval=HEARTBEAT, grace_period=GRACE)
    totals = {}
    for total, kind in ((1, "uniform"), (3, "banded"), (7, "powerlaw")):
        A = generate(kind, rows=40, seed=total)
        errors, names = [], set()

        def work(k: int, A=A, total=total, errors=errors, names=names) -> None:
            try:
                names.add(tune(A, backend=CpuReferenceBackend(), store=None, storage=storage, trials=total,
                               total=total, seed=k, summary=False).study)
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        (name,) = names
        totals[name] = total
    for name, total in totals.items():  # tune() alone does not wait for the others' last trials: settle
        assert settle(optuna.load_study(study_name=name, storage=storage), total).done
    by_study = studies(shared)
    assert set(by_study) == set(totals)
    for name, trials in by_study.items():
        states = Counter(t.state.name for t in trials)
        assert states["COMPLETE"] + states["FAIL"] == totals[name], (name, states)
        assert set(states) <= {"COMPLETE", "FAIL", "PRUNED"}, (name, states)


def test_a_trial_asked_past_the_budget_is_pruned_and_gives_no_finished_trial(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "b.log"), heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage)
    for _ in range(2):
        study.tell(study.ask(), 1.0)
    a, b = study.ask(), study.ask()  # two workers both saw 2 of 3 finished and asked
    assert keeps_place(study, a, 3) and not keeps_place(study, b, 3)
    assert not study_budget(study, 3).open and not study_budget(study, 3).done
    study.tell(b, state=optuna.trial.TrialState.PRUNED)
    c = study.ask()  # a third worker, after b was pruned: still behind a
    assert not keeps_place(study, c, 3)
    # c's worker dies before pruning it, a's worker dies mid-trial: a fails (it holds a place), c is pruned
    time.sleep(0.1)
    assert fail_stale_trials(study, 3) == 0  # first look: never-beaten trials get a beat
    time.sleep(1.3)
    assert fail_stale_trials(study, 3) == 1
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "FAIL", 3: "PRUNED", 4: "PRUNED"}
    assert settle(study, 3).done


@pytest.mark.parametrize("kind", ["journal", "sqlite", "postgresql"])
def test_stale_trials_fail_after_the_grace_period_on_every_storage(kind: str, tmp_path: Path, request) -> None:
    spec = {"journal": str(tmp_path / "h.log"), "sqlite": f"sqlite:///{tmp_path / 'h.db'}"}.get(kind)
    if kind == "postgresql":
        spec = request.getfixturevalue("postgres")()
    called = []
    storage = open_storage(spec, heartbeat_interval=1, grace_period=1,
                           stale_trial_callback=lambda study, trial: called.append(trial.number))
    assert isinstance(storage, HeartbeatJournalStorage if kind == "journal" else HeartbeatRDBStorage)
    study = optuna.create_study(storage=storage)
    beating = study.ask()
    storage.record_heartbeat(beating._trial_id)
    silent = study.ask()  # its worker died before its first beat
    assert fail_stale_trials(study) == 0  # the first look stamps it
    time.sleep(2.1)
    storage.record_heartbeat(beating._trial_id)  # still alive
    time.sleep(0.5)
    assert fail_stale_trials(study) == 1
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {beating.number: "RUNNING", silent.number: "FAIL"} and called == [silent.number]


def test_a_local_tune_and_a_sync_of_its_storage_hold_the_same_rows(tmp_path: Path) -> None:
    """tune() keeps each measurement's store row in its trial: sync rebuilds the same rows, and skips them."""
    spec = str(tmp_path / "j.log")
    with Store(tmp_path / "local.db") as store:
        result = tune(generate("fewhuge", rows=50), backend=CpuReferenceBackend(), store=store,
                      storage=open_storage(spec), trials=8)
        local = store.trials(result.fingerprint)
        report = sync_storage(open_storage(spec), store)
        assert report.added == 0 and report.present == len(local) > 0
    with Store(tmp_path / "synced.db") as store:
        report = sync_storage(open_storage(spec), store)
        assert report.added == len(local)
        synced = store.trials(result.fingerprint)
    key = lambda row: row["trial_uid"]  # noqa: E731
    assert [{k: v for k, v in r.items() if k != "id"} for r in sorted(synced, key=key)] == [
        {k: v for k, v in r.items() if k != "id"} for r in sorted(local, key=key)]


def test_a_worker_whose_cuda_context_broke_records_the_trial_and_exits_for_a_restart(
    matrices: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.measure.evaluate import ContextLostError, TrialResult
    from tuner.search import loop as search
    from tuner.search import worker

    def broken(backend, family, A, params, reference, x, **kw):
        result = TrialResult(family.name, dict(params), "failed", error_kind="launch_error",
                             error="CUDARuntimeError: an illegal memory access was encountered")
        raise ContextLostError("broke the CUDA context", result)

    monkeypatch.setattr(search, "evaluate", broken)
    spec = str(tmp_path / "s.log")
    out = runner.invoke(worker.app, [str(matrices), "--storage", spec, "--trials-per-matrix", "3",
                                     "--device", "cpu-reference"])
    assert out.exit_code == worker.CONTEXT_LOST, out.output
    assert '"ev": "fatal"' in out.output and "CUDA context" in out.output
    (trials,) = studies(spec).values()
    (failed,) = [t for t in trials if t.state.name == "FAIL"]
    assert failed.user_attrs[RECORD_ATTR]["error_kind"] == "launch_error"


# -- the commands' inputs ----------------------------------------------------------------------------------


def test_sources_take_files_folders_and_manifests(matrices: Path, tmp_path: Path) -> None:
    files = sorted(matrices.glob("*.mtx"))
    manifest = tmp_path / "list.txt"
    manifest.write_text(f"# two of them\n{files[0]}\n\n{os.path.relpath(files[1], tmp_path)}\n")
    tsv = tmp_path / "MANIFEST.tsv"
    tsv.write_text("name\tfile\n" + "".join(f"{f.stem}\t{f}\n" for f in files[2:4]))
    srcs = read_sources([manifest, tsv, files[5], matrices])
    assert [s.name for s in srcs] == [f.stem for f in (*files[:4], files[5], *files)]
    manifest.write_text("nope.mtx\n")
    with pytest.raises(FileNotFoundError, match="nope.mtx"):
        read_sources([manifest])
    tsv.write_text("name\tsize\nA\t3\n")
    with pytest.raises(InvalidConfigError, match="'path' or 'file'"):
        read_sources([tsv])


def test_tune_many_refuses_bad_setups_with_one_line(matrices: Path, tmp_path: Path) -> None:
    def run(*args: str):
        return runner.invoke(cli, ["tune-many", str(matrices), "--trials-per-matrix", "2", *args],
                             env={"COLUMNS": "160"})

    sqlite = run("--storage", f"sqlite:///{tmp_path / 'o.db'}", "--device", "cpu-reference", "--workers", "2")
    assert sqlite.exit_code == 1 and "SQLite serves one process only" in sqlite.output
    bad = run("--storage", str(tmp_path / "studies.txt"), "--device", "cpu-reference")
    assert bad.exit_code == 1 and "journal:PATH" in bad.output
    gpu = run("--storage", str(tmp_path / "s.log"), "--workers", "2")
    assert gpu.exit_code == 1 and "--workers is for --device cpu-reference" in gpu.output
    empty = runner.invoke(cli, ["tune-many", str(tmp_path), "--storage", str(tmp_path / "s.log"),
                                "--trials-per-matrix", "2", "--device", "cpu-reference"])
    assert empty.exit_code == 1 and "nothing to tune" in empty.output
