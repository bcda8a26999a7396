"""The corpus file (tuner.select.corpus): a store's trials out to one compact file and back, idempotently."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from common.errors import InvalidConfigError, TunerError
from db.store import Store
from tuner.cli import app
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.generate import generate
from tuner.select.corpus import export_corpus, import_corpus, read_corpus

DEVICES = ({"id": "GPU A (sm_90)", "name": "GPU A", "kind": "gpu", "compute_capability": "90", "sms": 132,
            "memory_bytes": 80 << 30, "copy_bandwidth_gbs": 2800.0, "driver": "13000"},
           {"id": "GPU B (sm_80)", "name": "GPU B", "kind": "gpu"})


def _fill(store: Store) -> None:
    """Six generated matrices with real features; on two devices and both dtypes, ok and failed trials,
    one trial without a uid (as an old store holds), and a cuSPARSE time on one best row. The best family
    is csr_scalar, or csr_vector where csr_scalar failed (every other matrix)."""
    for d in DEVICES:
        store.add_device(d)
    trials = []
    for i, (kind, size) in enumerate((("poisson2d", 8), ("powerlaw", 300), ("lp", 60), ("banded", 90),
                                      ("uniform", 200), ("emptyrows", 400))):
        A = generate(kind, **{"n" if kind == "poisson2d" else "rows": size}, seed=i)
        fp = fingerprint(A)
        store.add_matrix(fp, name=f"{kind}-{size}", rows=A.shape[0], cols=A.shape[1], nnz=A.nnz,
                         features=extract_features(A))
        for device in (d["id"] for d in DEVICES):
            for dtype in ("float64", "float32"):
                for j, (kernel, params) in enumerate((("cusparse", {"algorithm": "default"}),
                                                      ("csr_vector", {"threads_per_row": 4, "block_size": 128}),
                                                      ("csr_scalar", {"block_size": 64}))):
                    base = {"fingerprint": fp, "device": device, "dtype": dtype, "kernel": kernel, "params": params,
                            "study": f"{fp}|{device}|{dtype}|r0", "trial_number": j,
                            "trial_uid": f"{fp}-{device}-{dtype}-{j}"}
                    if j == 2 and i % 2:
                        trials.append({**base, "state": "failed", "error_kind": "launch_error", "verified": 0,
                                       "error": "CUDARuntimeError: too many resources requested"})
                    else:
                        t = 1e-5 * (1 + i) * (3 - j + (dtype == "float32"))
                        trials.append({**base, "state": "ok", "verified": 1, "time_s": t, "time_p10_s": 0.9 * t,
                                       "time_p90_s": 1.1 * t, "prepare_s": 1e-3, "gflops": 2 * A.nnz / t / 1e9,
                                       "gbps": 1.0, "rel_error": 1e-12})
    trials[0].pop("trial_uid")
    store.add_trials(trials)
    first = trials[0]
    store.set_cusparse_time(first["fingerprint"], device=first["device"], dtype=first["dtype"], time_s=4e-5)


def _content(store: Store) -> dict[str, list]:
    """Everything the corpus carries, without local ids and write times."""
    trials = [{k: v for k, v in r.items() if k not in ("id", "trial_uid")}
              for r in store.db["trials"].rows_where(order_by="id")]
    best = [{k: v for k, v in r.items() if k not in ("trial_id", "updated_at")}
            for r in store.db["best"].rows_where(order_by="fingerprint, device, dtype")]
    return {
        "trials": sorted(trials, key=lambda r: json.dumps(r, sort_keys=True)),
        "best": best,
        "features": list(store.db["features"].rows_where(order_by="fingerprint")),
        "matrices": [{k: v for k, v in r.items() if k != "created_at"}
                     for r in store.db["matrices"].rows_where(order_by="fingerprint")],
        "devices": list(store.db["devices"].rows_where(order_by="id")),
    }


@pytest.fixture
def source():
    with Store(memory=True) as store:
        _fill(store)
        yield store


def test_round_trip_gives_the_same_trials_best_and_features_and_a_second_import_adds_nothing(source, tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    written = export_corpus(source, path)
    assert (written.devices, written.matrices, written.trials) == (2, 6, 72)
    assert written.per_dtype == {"float64": 36, "float32": 36}
    with Store(tmp_path / "fresh.db") as fresh:
        first = import_corpus(fresh, path)
        assert (first.trials, first.trials_added, first.matrices, first.devices) == (72, 72, 6, 2)
        assert first.best == source.db["best"].count == 24
        assert _content(fresh) == _content(source)
        assert import_corpus(fresh, path).trials_added == 0  # again: nothing twice
        assert fresh.db["trials"].count == 72 and _content(fresh) == _content(source)
    # into the store it came from: only the trial without a uid there comes back (its uid is derived)
    assert import_corpus(source, path).trials_added == 1


def test_export_filters_by_device_and_dtype_and_is_deterministic(source, tmp_path):
    one = export_corpus(source, tmp_path / "a.jsonl.gz", device="GPU A (sm_90)", dtype="float32")
    assert (one.devices, one.matrices, one.trials) == (1, 6, 18)
    kinds = [kind for kind, _ in read_corpus(tmp_path / "a.jsonl.gz")]
    assert kinds[0] == "header" and kinds.count("device") == 1 and kinds.count("trial") == 18
    assert kinds.index("device") < kinds.index("matrix") < kinds.index("trial")
    export_corpus(source, tmp_path / "b.jsonl.gz", device="GPU A (sm_90)", dtype="float32")
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(InvalidConfigError, match="unknown device 'nope'"):
        export_corpus(source, tmp_path / "c.jsonl.gz", device="nope")


NOT_A_CORPUS = (
    ("plain.txt", b"hello", "plain.txt"),
    ("other.jsonl.gz", gzip.compress(b'{"format": "something else"}\n'), "not an spmv-tuner corpus"),
    ("newer.jsonl.gz", gzip.compress(b'{"format": "spmv-tuner-corpus", "version": 99}\n'), "version 99"),
    ("broken.jsonl.gz", gzip.compress(b'{"format": "spmv-tuner-corpus", "version": 1}\n{"trial": \n'), "line 2"),
    ("empty.jsonl.gz", gzip.compress(b""), "empty"),
    ("binary.jsonl.gz", gzip.compress(b"\xff\xfe\x00garbage\n"), "cannot read the corpus"),
)
"""(file name, its bytes, what the error must say) for files that import_corpus refuses."""


def test_a_file_that_is_not_a_corpus_is_refused_with_its_name(tmp_path):
    with Store(memory=True) as store:
        for name, content, message in NOT_A_CORPUS:
            path = tmp_path / name
            path.write_bytes(content)
            with pytest.raises(InvalidConfigError, match=message):
                import_corpus(store, path)
            assert store.db["trials"].count == 0, name


def _lines(path: Path) -> list[bytes]:
    return gzip.decompress(path.read_bytes()).splitlines(keepends=True)


def test_a_damaged_corpus_adds_nothing_at_all(source, tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    export_corpus(source, path)
    lines = _lines(path)
    cut = tmp_path / "cut.jsonl.gz"  # cut at a line boundary: every line parses, the header's counts do not match
    cut.write_bytes(gzip.compress(b"".join(lines[: len(lines) // 2])))
    truncated = tmp_path / "truncated.jsonl.gz"  # the gzip stream itself cut short, late in the file
    truncated.write_bytes(path.read_bytes()[: -40])
    bad_trial = tmp_path / "bad_trial.jsonl.gz"  # the last trial names a matrix the file does not hold
    last = max(i for i, line in enumerate(lines) if line.startswith(b'{"trial"'))
    record = json.loads(lines[last])
    record["trial"]["fingerprint"] = "0" * 32
    lines[last] = json.dumps(record).encode() + b"\n"
    bad_trial.write_bytes(gzip.compress(b"".join(lines)))
    for damaged, match in ((cut, "incomplete"), (truncated, "cannot read"), (bad_trial, "unknown matrix")):
        with Store(tmp_path / f"{damaged.stem}.db") as fresh:
            with pytest.raises(TunerError, match=match):
                import_corpus(fresh, damaged)
            assert [fresh.db[t].count for t in ("devices", "matrices", "trials", "best")] == [0, 0, 0, 0], damaged


def test_cli_export_import_and_train_from_a_corpus(source, tmp_path: Path):
    db = tmp_path / "source.db"
    with Store(db) as store:
        _fill(store)
    runner = CliRunner()
    path = tmp_path / "c.jsonl.gz"
    out = runner.invoke(app, ["corpus", "export", str(path), "--db", str(db)], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "72 trials (float32: 36, float64: 36) of 6 matrices on 2 devices" in out.output
    fresh = tmp_path / "fresh.db"
    out = runner.invoke(app, ["corpus", "import", str(path), "--db", str(fresh)], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "72 of 72 trials added" in out.output
    out = runner.invoke(app, ["train", "--db", str(tmp_path / "t.db"), "--corpus", str(path), "--device",
                              "GPU A (sm_90)", "--cv", "3"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "72 of 72 trials added" in out.output and "saved model 1" in out.output
    bad = runner.invoke(app, ["corpus", "import", str(tmp_path / "missing.jsonl.gz"), "--db", str(fresh)])
    assert bad.exit_code == 1 and "missing.jsonl.gz" in bad.output


def test_a_survey_replaces_a_familys_trials_on_the_corpus_matrices_only(source, tmp_path: Path):
    """csr_vector measured again (narrow columns) on four of the six matrices and on one the corpus lacks: the
    corpus's csr_vector trials go, the survey's on its own matrices come in, the other families stay, and the
    survey's trials of a family not named (csr_scalar at a block the corpus never ran) stay out."""
    base = tmp_path / "base.jsonl.gz"
    export_corpus(source, base)
    known = [m["fingerprint"] for m in source.db["matrices"].rows_where(order_by="fingerprint")]
    narrow = {"threads_per_row": 4, "block_size": 128, "indices": "narrow"}
    with Store(memory=True) as survey:
        survey.add_device(DEVICES[0])
        extra = generate("uniform", rows=50, seed=9)
        survey.add_matrix("e" * 32, name="extra", rows=50, cols=extra.shape[1], nnz=extra.nnz,
                          features=extract_features(extra))
        for fp in known[:4]:
            survey.add_matrix(fp, **{k: source.matrix(fp)[k] for k in ("name", "rows", "cols", "nnz")})
        survey.add_trials([{"fingerprint": fp, "device": DEVICES[0]["id"], "dtype": "float64", "kernel": "csr_vector",
                            "params": narrow, "study": "portfolio", "trial_uid": f"s-{fp}", "state": "ok",
                            "verified": 1, "time_s": 1e-6} for fp in [*known[:4], "e" * 32]])
        survey.add_trials([{"fingerprint": known[0], "device": DEVICES[0]["id"], "dtype": "float64",
                            "kernel": "csr_scalar", "params": {"block_size": 512}, "study": "portfolio",
                            "trial_uid": "s-scalar", "state": "ok", "verified": 1, "time_s": 1e-7}])
        export_corpus(survey, tmp_path / "survey.jsonl.gz")
    out = tmp_path / "out.jsonl.gz"
    runner = CliRunner()
    done = runner.invoke(app, ["corpus", "replace", str(base), str(tmp_path / "survey.jsonl.gz"), str(out),
                               "--family", "csr_vector"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    trials = [r for kind, r in read_corpus(out) if kind == "trial"]
    vector = [t for t in trials if t["kernel"] == "csr_vector"]
    assert {t["fingerprint"] for t in vector} == set(known[:4]) and all(t["params"] == narrow for t in vector)
    assert len(trials) - len(vector) == 72 - 24  # cuSPARSE and csr_scalar: every one kept, the survey's left out
    assert not [t for t in trials if t["params"] == {"block_size": 512}]
    assert {r["fingerprint"] for kind, r in read_corpus(out) if kind == "matrix"} == set(known)
    unknown = runner.invoke(app, ["corpus", "replace", str(base), str(base), str(out), "--family", "nope"])
    assert unknown.exit_code == 1 and "unknown kernel 'nope'" in unknown.output
