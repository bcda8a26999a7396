"""The REST service through FastAPI's TestClient: every endpoint, every kind of bad input.

The app runs with ``device='cpu-reference'`` on a store in a temporary folder;
rejected requests are checked to leave the store exactly as it was.
"""

from __future__ import annotations

import gzip
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from common.errors import MatrixFormatError, StoreError
from db.store import Store
from kernels import BASELINE, REGISTRY, get_family
from service import Settings, create_app
from service.jobs import JobQueue
from tuner.matrix.features import FEATURE_NAMES, extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.generate import generate
from tuner.matrix.io import read_mtx, write_mtx
from tuner.measure.backend import CpuReferenceBackend

with warnings.catch_warnings():  # Starlette 1.x prefers httpx2 for its TestClient; httpx still works
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DEVICE = CpuReferenceBackend().info.id
OTHER_GPU = "NVIDIA H100 80GB HBM3 (sm_90)"


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        db=tmp_path / "tuner.db", device="cpu-reference", token=TOKEN, data_dir=tmp_path / "service",
        default_trials=4, max_upload_bytes=256 * 1024, max_matrix_size=100_000, max_json_bytes=16 * 1024,
    )
    return Settings(**{**values, **overrides})


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
def client(settings: Settings):
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def mtx(tmp_path: Path) -> Path:
    path = tmp_path / "poisson.mtx"
    write_mtx(path, generate("poisson2d", n=12))
    return path


def vector_of(path: Path) -> tuple[str, dict[str, float]]:
    A = read_mtx(path)
    return fingerprint(A), extract_features(A)


def seed_store(db: Path, n: int = 3) -> list[str]:
    """``n`` matrices; the first has a best config on the server's device (with cuSPARSE's time)
    and one on a GPU, the second a failed trial only."""
    fps = [f"{i:02d}" + "ab" * 15 for i in range(n)]
    with Store(db) as store:
        store.add_device({"id": DEVICE, "name": "cpu", "kind": "cpu-reference"})
        store.add_device({"id": OTHER_GPU, "name": "NVIDIA H100", "kind": "gpu"})
        for i, fp in enumerate(fps):
            store.add_matrix(fp, name=f"m{i}", rows=100 + i, cols=100 + i, nnz=500 + i,
                             features={"rows": 100 + i, "cols": 100 + i, "nnz": 500 + i, "npr_mean": 5.0})
        base = {"fingerprint": fps[0], "dtype": "float64", "state": "ok", "verified": True}
        store.add_trial({**base, "device": DEVICE, "kernel": "cusparse", "params": {"algorithm": "default"},
                         "time_s": 4e-5, "gflops": 25.0})
        store.add_trial({**base, "device": DEVICE, "kernel": "csr_vector",
                         "params": {"threads_per_row": 4, "block_size": 128}, "time_s": 2e-5, "gflops": 50.0})
        store.set_cusparse_time(fps[0], device=DEVICE, dtype="float64", time_s=4e-5)
        store.add_trial({**base, "device": OTHER_GPU, "kernel": "csr_scalar", "params": {"block_size": 64},
                         "time_s": 1e-6, "gflops": 1000.0})
        store.add_trial({"fingerprint": fps[1], "device": DEVICE, "dtype": "float64", "kernel": "csr_scalar",
                         "params": {"block_size": 64}, "state": "failed", "error_kind": "wrong_answer",
                         "error": "y differs", "verified": False})
    return fps


def snapshot(db: Path) -> str:
    """Every row of the store, as SQL text (to show that a rejected request changed nothing)."""
    with sqlite3.connect(db) as conn:
        return "\n".join(conn.iterdump())


def wait_job(client: Any, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}").json()
        if job["state"] in ("done", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


def assert_error(response: Any, status: int, *words: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    for word in words:
        assert word in body["detail"], body["detail"]
    return body


# -- POST /recommend with a feature vector --------------------------------------------------------


def test_recommend_feature_vector_gives_the_default(client):
    r = client.post("/recommend", json={"rows": 1000, "cols": 1000, "nnz": 5000, "npr_max": 9})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["kernel"] == BASELINE and body["params"] == get_family(BASELINE).space.defaults()
    assert body["source"] == "default" and body["expected_gflops"] is None and body["ratio_to_cusparse"] is None
    assert body["device"] == DEVICE and body["device_kind"] == "cpu-reference" and body["dtype"] == "float64"
    assert (body["rows"], body["cols"], body["nnz"], body["fingerprint"]) == (1000, 1000, 5000, None)


def test_recommend_whole_feature_vector_from_extract_features(client, mtx):
    fp, features = vector_of(mtx)
    r = client.post("/recommend", json=features)  # what extract_features returns is a valid body as it is
    assert r.status_code == 200 and r.json()["source"] == "default"


def test_recommend_known_fingerprint_is_tuned(client, settings):
    fps = seed_store(settings.db_path)
    r = client.post("/recommend", json={"rows": 100, "cols": 100, "nnz": 500, "fingerprint": fps[0]})
    body = r.json()
    assert r.status_code == 200 and body["source"] == "tuned"
    assert body["kernel"] == "csr_vector" and body["params"] == {"threads_per_row": 4, "block_size": 128}
    assert body["expected_gflops"] == 50.0 and body["ratio_to_cusparse"] == pytest.approx(2.0)


def test_recommend_fingerprint_without_best_or_unknown_is_default(client, settings):
    fps = seed_store(settings.db_path)
    for fp, shape in ((fps[1], (101, 101, 501)), ("ff" * 16, (100, 100, 500))):
        r = client.post("/recommend", json=dict(zip(("rows", "cols", "nnz"), shape, strict=True), fingerprint=fp))
        assert r.status_code == 200 and r.json()["source"] == "default", r.text


def test_recommend_device_and_dtype_query(client, settings):
    fps = seed_store(settings.db_path)
    vector = {"rows": 100, "cols": 100, "nnz": 500, "fingerprint": fps[0]}
    r = client.post("/recommend", params={"device": OTHER_GPU}, json=vector)
    body = r.json()
    assert body["source"] == "tuned" and body["kernel"] == "csr_scalar" and body["device"] == OTHER_GPU
    assert body["device_kind"] == "gpu" and body["ratio_to_cusparse"] is None
    r = client.post("/recommend", params={"dtype": "float32"}, json=vector)
    assert r.json()["source"] == "default" and r.json()["dtype"] == "float32"
    r = client.post("/recommend", params={"dtype": "float64", "colour": "red"}, json=vector)  # unknown: ignored
    assert r.status_code == 200 and r.json()["source"] == "tuned"


@pytest.mark.parametrize(("params", "name"), [({"dtype": "float16"}, "dtype"), ({"device": ""}, "device"),
                                               ({"device": "x" * 201}, "device")])
def test_recommend_bad_query_is_422_naming_it(client, params, name):
    body = assert_error(client.post("/recommend", params=params, json={"rows": 1, "cols": 1, "nnz": 1}), 422, name)
    assert [e["loc"] for e in body["errors"]] == [["query", name]]


def test_recommend_query_is_in_the_schema(client):
    params = client.get("/openapi.json").json()["paths"]["/recommend"]["post"]["parameters"]
    by_name = {p["name"]: p for p in params}
    assert set(by_name) == {"device", "dtype", "race"} and all(p["in"] == "query" and not p["required"] for p in params)
    assert by_name["dtype"]["schema"]["enum"] == ["float64", "float32"]


def test_recommend_upload(client, mtx, tmp_path):
    fp, _ = vector_of(mtx)
    r = client.post("/recommend", files={"file": ("poisson.mtx", mtx.read_bytes())})
    assert r.status_code == 200, r.text
    assert r.json()["fingerprint"] == fp and r.json()["source"] == "default" and r.json()["nnz"] == 12 * 12 * 5 - 48
    gz = gzip.compress(mtx.read_bytes())
    r = client.post("/recommend", files={"file": ("poisson.mtx.gz", gz, "application/gzip")})
    assert r.status_code == 200 and r.json()["fingerprint"] == fp
    assert not list((tmp_path / "service" / "spool").iterdir())  # the spooled uploads are gone


def test_recommend_race_measures_on_the_server_device_and_stores_every_lap(client, mtx, settings):
    fp, _ = vector_of(mtx)
    files = {"file": ("poisson.mtx", mtx.read_bytes())}
    r = client.post("/recommend?race=true", files=files, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["source"] == "raced" and body["fingerprint"] == fp and body["ratio_to_cusparse"] is not None
    raced = [line.lstrip("* ").split()[0] for line in body["race"]]  # no selector: csr5 and NuT among them
    assert raced.count("cusparse") == 2 and {"csr5", "nut"} <= set(raced)
    starred = [line for line in body["race"] if line.startswith("*")]  # the winner: the fastest, or cuSPARSE
    assert len(starred) == 1 and starred[0].startswith(f"* {body['kernel']} ")  # within 3 % of it (a tie)
    with Store(settings.db) as store:
        rows = store.trials(fp, dtype="float64")
        assert len(rows) == len(raced) and {r["study"] for r in rows} == {"race"}
    again = client.post("/recommend?race=true", files=files, headers=AUTH).json()  # measured: from the store
    assert again["source"] == "raced" and again["race"] is None and again["kernel"] == body["kernel"]
    plain = client.post("/recommend", json={**vector_of(mtx)[1], "fingerprint": fp}).json()
    assert (plain["source"], plain["kernel"], plain["params"]) == ("raced", body["kernel"], body["params"])


@pytest.mark.parametrize(("headers", "kwargs", "status", "words"), [
    ({}, {"files": {"file": ("a.mtx", b"")}}, 401, ["Bearer"]),
    ({"Authorization": "Bearer wrong"}, {"files": {"file": ("a.mtx", b"")}}, 401, ["wrong token"]),
    (AUTH, {"json": {"rows": 1, "cols": 1, "nnz": 1}}, 422, ["needs the matrix"]),
])
def test_recommend_race_needs_the_token_and_a_file(client, headers, kwargs, status, words):
    r = client.post("/recommend?race=true", headers=headers, **kwargs)
    assert r.status_code == status and all(w in r.json()["detail"] for w in words), r.text


# -- POST /recommend: bad input ---------------------------------------------------------------------

JSON = {"Content-Type": "application/json"}
BAD_VECTORS = [
    ("malformed JSON", b'{"rows": 10, "cols": 10,', 400, ["malformed JSON"]),
    ("not an object", b"[1, 2, 3]", 422, ["object"]),
    ("empty body", b"", 400, ["malformed JSON"]),
    ("not UTF-8", b'{"rows": "\xff"}', 400, ["malformed JSON"]),
    ("NaN literal", b'{"rows": NaN, "cols": 1, "nnz": 0}', 422, ["rows", "finite"]),
    ("missing features", b'{"rows": 10}', 422, ["missing required feature(s): cols, nnz"]),
    ("unknown feature", b'{"rows": 1, "cols": 1, "nnz": 1, "colour": 3}', 422, ["unknown feature(s): colour"]),
    ("string value", b'{"rows": "10", "cols": 10, "nnz": 10}', 422, ["rows"]),
    ("boolean value", b'{"rows": 10, "cols": true, "nnz": 10}', 422, ["cols"]),
    ("null size", b'{"rows": 10, "cols": 10, "nnz": null}', 422, ["nnz"]),
    ("nested value", b'{"rows": 10, "cols": 10, "nnz": 1, "density": [1]}', 422, ["density"]),
    ("negative size", b'{"rows": -1, "cols": 10, "nnz": 0}', 422, ["rows", "greater than or equal to 0"]),
    ("negative feature", b'{"rows": 1, "cols": 1, "nnz": 1, "npr_std": -0.5}', 422, ["npr_std"]),
    ("fractional size", b'{"rows": 2.5, "cols": 10, "nnz": 0}', 422, ["rows", "whole number"]),
    ("infinite", b'{"rows": 1e999, "cols": 10, "nnz": 0}', 422, ["rows", "finite"]),
    ("beyond int32", b'{"rows": 3000000000, "cols": 10, "nnz": 0}', 422, ["rows"]),
    ("nnz above rows x cols", b'{"rows": 2, "cols": 2, "nnz": 5}', 422, ["exceeds rows"]),
    ("empty fingerprint", b'{"rows": 2, "cols": 2, "nnz": 1, "fingerprint": ""}', 422, ["fingerprint"]),
    ("numeric fingerprint", b'{"rows": 2, "cols": 2, "nnz": 1, "fingerprint": 12}', 422, ["fingerprint"]),
    ("deep nesting", b'{"rows": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, ["malformed JSON"]),
]


@pytest.mark.parametrize(("body", "status", "words"), [case[1:] for case in BAD_VECTORS],
                         ids=[case[0] for case in BAD_VECTORS])
def test_recommend_rejects_bad_vectors(client, settings, body, status, words):
    seed_store(settings.db_path)
    before = snapshot(settings.db_path)
    assert_error(client.post("/recommend", content=body, headers=JSON), status, *words)
    assert snapshot(settings.db_path) == before


def test_recommend_validation_errors_list_each_problem(client):
    body = assert_error(client.post("/recommend", json={"rows": -1, "colour": 1}), 422)
    kinds = {(tuple(e["loc"]), e["type"]) for e in body["errors"]}
    assert (("body", "rows"), "greater_than_equal") in kinds and (("body", "colour"), "extra_forbidden") in kinds
    assert (("body", "nnz"), "missing") in kinds


def test_recommend_rejects_a_fingerprint_of_another_shape(client, settings):
    fps = seed_store(settings.db_path)
    r = client.post("/recommend", json={"rows": 7, "cols": 100, "nnz": 500, "fingerprint": fps[0]})
    assert_error(r, 422, "belongs to a 100 x 100 matrix")


def test_recommend_rejects_other_requests(client, settings):
    seed_store(settings.db_path)
    before = snapshot(settings.db_path)
    assert_error(client.post("/recommend", json={"rows": 1, "cols": 1, "nnz": 1}, params={"device": "TPU v9"}),
                 422, "unknown device 'TPU v9'", DEVICE)
    assert_error(client.post("/recommend", json={"rows": 1, "cols": 1, "nnz": 1}, params={"dtype": "float16"}),
                 422, "dtype")
    assert_error(client.post("/recommend", content=b"rows=1", headers={"Content-Type": "text/plain"}),
                 415, "application/json")
    assert_error(client.post("/recommend"), 415)
    big = b'{"rows": 1, "cols": 1, "nnz": 1, "fingerprint": "' + b"a" * 20_000 + b'"}'
    assert_error(client.post("/recommend", content=big, headers=JSON), 413, "larger than")
    assert_error(client.get("/recommend"), 405)
    assert snapshot(settings.db_path) == before


def test_recommend_json_limit_holds_without_content_length(client):
    def chunks():
        yield b'{"rows": 1, "cols": 1, "nnz": 1, "fingerprint": "'
        for _ in range(40):
            yield b"a" * 1000
        yield b'"}'

    assert_error(client.post("/recommend", content=chunks(), headers=JSON), 413)


MTX_HEADER = b"%%MatrixMarket matrix coordinate real general\n"


@pytest.mark.parametrize(
    ("content", "status", "words"),
    [
        (MTX_HEADER + b"3 3 2\n1 1 1.0\n4 2 2.0\n", 422, ["bad.mtx, line 4", "row"]),
        (MTX_HEADER + b"3 3 3\n1 1 1.0\n", 422, ["bad.mtx", "too few entries"]),
        (MTX_HEADER + b"3 three 2\n", 422, ["bad.mtx"]),
        (b"%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 1 1.0 2.0\n", 422, ["bad.mtx", "complex"]),
        (MTX_HEADER + b"2 2 1\n1 1 nan\n", 422, ["bad.mtx"]),
        (b"", 422, ["bad.mtx", "empty"]),
        (b"hello world\n", 422, ["bad.mtx"]),
        (b"\x1f\x8b\x08\x00garbage", 422, ["bad.mtx"]),
        (MTX_HEADER + b"5000000 5000000 10\n1 1 1.0\n", 413, ["announces", "at most 100000"]),
        (gzip.compress(MTX_HEADER + b"10 10 900000000\n"), 413, ["announces"]),
    ],
    ids=["index out of range", "truncated", "bad size line", "complex", "nan", "empty", "not mtx", "bad gzip",
         "too many rows", "gzip announcing too many entries"],
)
def test_recommend_rejects_bad_uploads(client, settings, content, status, words):
    seed_store(settings.db_path)
    before = snapshot(settings.db_path)
    body = assert_error(client.post("/recommend", files={"file": ("bad.mtx", content)}), status, *words)
    assert str(settings.service_dir) not in body["detail"]  # the spool path is never shown
    assert snapshot(settings.db_path) == before


def test_recommend_rejects_malformed_multipart(client, settings):
    seed_store(settings.db_path)
    before = snapshot(settings.db_path)
    assert_error(client.post("/recommend", files={"other": ("a.mtx", b"x")}), 422, "no 'file' part")
    assert_error(client.post("/recommend", content=b"--x\r\n", headers={"Content-Type": "multipart/form-data"}),
                 400, "boundary")
    truncated = b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.mtx"\r\n\r\n%%Matrix'
    assert_error(client.post("/recommend", content=truncated,
                             headers={"Content-Type": "multipart/form-data; boundary=XyZ"}), 400, "malformed")
    nonsense = b"this is not multipart at all" * 10
    assert_error(client.post("/recommend", content=nonsense,
                             headers={"Content-Type": "multipart/form-data; boundary=XyZ"}), 400, "malformed")
    two = {"file": ("a.mtx", b"1")}
    r = client.post("/recommend", files=[("file", two["file"]), ("file", two["file"])])
    assert_error(r, 400, "more than one 'file'")
    assert snapshot(settings.db_path) == before


def test_recommend_rejects_oversized_uploads(client, settings):
    big = MTX_HEADER + b"%" * (300 * 1024) + b"\n1 1 0\n"
    assert_error(client.post("/recommend", files={"file": ("big.mtx", big)}), 413, "larger than")

    def chunks():  # no Content-Length: the limit holds while the body streams in
        yield b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="big.mtx"\r\n\r\n'
        for _ in range(400):
            yield b"%" * 1024

    r = client.post("/recommend", content=chunks(), headers={"Content-Type": "multipart/form-data; boundary=XyZ"})
    assert_error(r, 413, "larger than")
    assert not list((settings.service_dir / "spool").iterdir())


# -- GET /kernels, /matrices ------------------------------------------------------------------------


def test_kernels_come_from_the_registry(client):
    body = client.get("/kernels").json()
    assert body["count"] == len(REGISTRY) == len(body["data"])
    assert body["data"] == [f.describe() for f in REGISTRY.values()]


def test_matrices_paginated(client, settings):
    fps = seed_store(settings.db_path, n=5)
    body = client.get("/matrices").json()
    assert body["count"] == 5 and [m["fingerprint"] for m in body["data"]] == fps
    page = client.get("/matrices", params={"skip": 1, "limit": 2}).json()
    assert [m["fingerprint"] for m in page["data"]] == fps[1:3] and page["count"] == 5
    assert client.get("/matrices", params={"skip": 10}).json() == {"data": [], "count": 5}
    assert set(body["data"][0]) == {"fingerprint", "name", "rows", "cols", "nnz", "created_at"}


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"limit": "ten"}, {"skip": -1},
                                    {"skip": 2**63}, {"skip": 1.5}])
def test_matrices_bad_pagination(client, params):
    body = assert_error(client.get("/matrices", params=params), 422)
    assert body["errors"][0]["loc"][0] == "query"


def test_matrix_detail(client, settings):
    fps = seed_store(settings.db_path)
    body = client.get(f"/matrices/{fps[0]}").json()
    assert body["fingerprint"] == fps[0] and body["rows"] == 100 and body["trial_count"] == 3
    assert body["features"] == {"rows": 100.0, "cols": 100.0, "nnz": 500.0, "npr_mean": 5.0}
    best = {b["device"]: b for b in body["best"]}
    assert best[DEVICE]["kernel"] == "csr_vector" and best[DEVICE]["ratio_to_cusparse"] == pytest.approx(2.0)
    assert best[OTHER_GPU]["ratio_to_cusparse"] is None
    assert client.get(f"/matrices/{fps[1]}").json()["best"] == []


def test_matrix_trials_paginated_and_filtered(client, settings):
    fps = seed_store(settings.db_path)
    body = client.get(f"/matrices/{fps[0]}/trials").json()
    assert body["count"] == 3 and [t["kernel"] for t in body["data"]] == ["cusparse", "csr_vector", "csr_scalar"]
    assert body["data"][0]["verified"] is True and body["data"][1]["params"] == {"threads_per_row": 4,
                                                                                  "block_size": 128}
    page = client.get(f"/matrices/{fps[0]}/trials", params={"skip": 1, "limit": 1}).json()
    assert [t["kernel"] for t in page["data"]] == ["csr_vector"] and page["count"] == 3
    only = client.get(f"/matrices/{fps[0]}/trials", params={"device": OTHER_GPU}).json()
    assert only["count"] == 1 and only["data"][0]["device"] == OTHER_GPU
    assert client.get(f"/matrices/{fps[0]}/trials", params={"kernel": "cusparse", "dtype": "float32"}).json() == {
        "data": [], "count": 0}
    failed = client.get(f"/matrices/{fps[1]}/trials").json()["data"][0]
    assert failed["state"] == "failed" and failed["error_kind"] == "wrong_answer" and failed["verified"] is False


def test_unknown_fingerprint_is_404(client, settings):
    seed_store(settings.db_path)
    assert_error(client.get("/matrices/" + "0" * 32), 404, "no matrix with fingerprint")
    assert_error(client.get("/matrices/" + "0" * 32 + "/trials"), 404, "no matrix")
    assert_error(client.get("/matrices/" + "0" * 200), 422)
    assert_error(client.get(f"/matrices/{'0' * 32}/trials", params={"dtype": "int8"}), 422)
    assert_error(client.get("/no/such/route"), 404)


# -- POST /tune and GET /jobs -----------------------------------------------------------------------


def test_tune_upload_runs_a_job(client, settings, mtx):
    fp, _ = vector_of(mtx)
    r = client.post("/tune", headers=AUTH, files={"file": ("poisson.mtx", mtx.read_bytes())},
                    data={"trials": "5", "kernels": "csr_scalar, cusparse"})
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/jobs/{job['id']}"
    assert job["state"] in ("queued", "running") and job["fingerprint"] == fp and job["name"] == "poisson"
    assert job["progress"] == {"done": 0, "total": 5} and job["kernels"] == ["csr_scalar", "cusparse"]
    done = wait_job(client, job["id"])
    assert done["state"] == "done", done
    assert done["progress"] == {"done": 5, "total": 5} and done["device"] == DEVICE
    result = done["result"]
    assert {s["kernel"] for s in result["summary"]} == {"csr_scalar", "cusparse"}
    assert result["best"] == result["summary"][0] and result["trials_ok"] + result["trials_cached"] == 5
    stored = client.get(f"/matrices/{fp}").json()
    assert stored["trial_count"] == result["trials_ok"] + result["trials_failed"] and stored["name"] == "poisson"
    r = client.post("/recommend", files={"file": ("poisson.mtx", mtx.read_bytes())})
    assert r.json()["source"] == "tuned" and r.json()["ratio_to_cusparse"] is not None
    assert client.get("/jobs").json()["data"][0]["id"] == job["id"]


def test_tune_again_by_fingerprint(client, mtx):
    r = client.post("/tune", headers=AUTH, files={"file": ("poisson.mtx.gz", gzip.compress(mtx.read_bytes()))},
                    data={"trials": "3", "dtype": "float32", "name": "P"})
    first = wait_job(client, r.json()["id"])
    assert first["state"] == "done" and first["dtype"] == "float32" and first["name"] == "P"
    r = client.post("/tune", headers=AUTH, json={"fingerprint": first["fingerprint"], "trials": 2})
    assert r.status_code == 202, r.text
    again = wait_job(client, r.json()["id"])
    assert again["state"] == "done" and again["name"] == "P" and again["dtype"] == "float64"
    assert again["trials"] == 2


def test_jobs_run_one_at_a_time_in_order(client, mtx):
    ids = [client.post("/tune", headers=AUTH, files={"file": ("p.mtx", mtx.read_bytes())},
                       data={"trials": "3", "dtype": dtype}).json()["id"]
           for dtype in ("float64", "float32", "float64")]
    seen_running = []
    while True:
        listed = client.get("/jobs").json()["data"]  # one consistent view of every job
        seen_running.append(sum(j["state"] == "running" for j in listed))
        if all(j["state"] in ("done", "failed") for j in listed):
            break
        time.sleep(0.02)
    jobs = [client.get(f"/jobs/{i}").json() for i in ids]
    assert max(seen_running) <= 1 and all(j["state"] == "done" for j in jobs)
    for earlier, later in zip(jobs, jobs[1:], strict=False):
        assert later["started_at"] >= earlier["finished_at"]


@pytest.mark.parametrize(
    ("headers", "status", "words"),
    [({}, 401, ["Bearer"]), ({"Authorization": "Bearer nope"}, 401, ["wrong token"]),
     ({"Authorization": f"Basic {TOKEN}"}, 401, ["Bearer"]), ({"Authorization": "Bearer"}, 401, [])],
    ids=["no token", "wrong token", "wrong scheme", "empty"],
)
def test_tune_needs_the_token(client, settings, mtx, headers, status, words):
    fps = seed_store(settings.db_path)
    before = snapshot(settings.db_path)
    r = client.post("/tune", headers=headers, files={"file": ("p.mtx", mtx.read_bytes())})
    assert_error(r, status, *words)
    assert r.headers["www-authenticate"] == "Bearer"
    assert_error(client.post("/tune", headers=headers, json={"fingerprint": fps[0]}), status)
    assert snapshot(settings.db_path) == before and client.get("/jobs").json()["count"] == 0


def test_tune_without_a_configured_token_is_403(tmp_path, mtx):
    with TestClient(create_app(make_settings(tmp_path, token=""))) as c:
        assert_error(c.post("/tune", headers=AUTH, files={"file": ("p.mtx", mtx.read_bytes())}), 403,
                     "no token is configured")
        assert c.get("/jobs").json()["count"] == 0


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [({"trials": "0"}, 422, ["trials"]), ({"trials": "-1"}, 422, ["trials"]), ({"trials": "many"}, 422, ["trials"]),
     ({"trials": "100000"}, 422, ["more than this server allows"]), ({"dtype": "int8"}, 422, ["dtype"]),
     ({"kernels": "csr_scalar,warp_magic"}, 422, ["unknown kernel(s) warp_magic"]),
     ({"colour": "red"}, 422, ["colour"])],
    ids=["zero trials", "negative trials", "trials not a number", "too many trials", "bad dtype", "unknown kernel",
         "unknown field"],
)
def test_tune_rejects_bad_options(client, settings, mtx, data, status, words):
    seed_store(settings.db_path)
    before = snapshot(settings.db_path)
    assert_error(client.post("/tune", headers=AUTH, files={"file": ("p.mtx", mtx.read_bytes())}, data=data),
                 status, *words)
    assert snapshot(settings.db_path) == before and client.get("/jobs").json()["count"] == 0


def test_tune_rejects_bad_bodies(client, settings):
    fps = seed_store(settings.db_path)
    before = snapshot(settings.db_path)
    assert_error(client.post("/tune", headers=AUTH, files={"file": ("bad.mtx", MTX_HEADER + b"2 2 1\n3 1 1\n")}),
                 422, "bad.mtx, line 3")
    assert_error(client.post("/tune", headers=AUTH, files={"file": ("extra.mtx", MTX_HEADER + b"2 2 1\n1 1 1 9\n")}),
                 422, "extra.mtx, line 3: 4 fields")
    assert_error(client.post("/tune", headers=AUTH, json={"fingerprint": "0" * 32}), 404, "no matrix")
    assert_error(client.post("/tune", headers=AUTH, json={"fingerprint": fps[0]}), 409, "no copy")
    assert_error(client.post("/tune", headers=AUTH, json={"fingerprint": "../../etc/passwd"}), 404)
    assert_error(client.post("/tune", headers=AUTH, json={"trials": 3}), 422, "fingerprint")
    assert_error(client.post("/tune", headers=AUTH, json={"fingerprint": fps[0], "trials": -2}), 422, "trials")
    assert_error(client.post("/tune", headers={**AUTH, **JSON}, content=b"{"), 400, "malformed JSON")
    assert_error(client.post("/tune", headers={**AUTH, "Content-Type": "text/csv"}, content=b"a,b"), 415)
    big = MTX_HEADER + b"%" * (300 * 1024)
    assert_error(client.post("/tune", headers=AUTH, files={"file": ("big.mtx", big)}), 413)
    assert snapshot(settings.db_path) == before and client.get("/jobs").json()["count"] == 0


def test_tune_queue_full_is_429_and_the_next_server_runs_the_waiting_jobs(tmp_path, mtx, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(JobQueue, "_work", lambda self: None)  # no worker: jobs stay queued
        with TestClient(create_app(make_settings(tmp_path, max_queued_jobs=1))) as c:
            first = c.post("/tune", headers=AUTH, files={"file": ("p.mtx", mtx.read_bytes())})
            assert first.status_code == 202 and first.json()["queue_position"] == 0
            r = c.post("/tune", headers=AUTH, files={"file": ("p.mtx", mtx.read_bytes())})
            assert_error(r, 429, "waiting") and r.headers["retry-after"] == "60"
            job_id = first.json()["id"]
    # the server stopped with the job waiting: the next one on the same folder takes it over and runs it
    with TestClient(create_app(make_settings(tmp_path))) as c:
        job = wait_job(c, job_id)
        assert job["state"] == "done" and job["restarts"] == 1 and job["progress"] == {"done": 4, "total": 4}
        assert "spmv_jobs_taken_over_total 1.0" in c.get("/metrics").text


def test_jobs_of_a_server_process_that_is_gone_are_resumed_or_failed_with_the_reason(settings, mtx):
    """Job files as server processes left them: a running one of a dead process resumes (its trial left
    RUNNING is failed), the others fail saying why, and a live process's job is left alone."""
    import fcntl
    import json

    import optuna

    from service.jobs import Job
    from service.uploads import keep_matrix
    from tuner.search.storage import default_storage, open_storage
    from tuner.search.study import study_name

    A = read_mtx(mtx)
    fp = fingerprint(A)
    keep_matrix(settings.service_dir / "matrices", fp, A)
    study = optuna.create_study(study_name=study_name(fp, CpuReferenceBackend().info, "float64"),
                                storage=open_storage(default_storage(settings.db_path)))
    orphan = study.ask()  # the trial the dead process was measuring
    jobs_dir = settings.service_dir / "jobs"
    (jobs_dir / "owners").mkdir(parents=True)
    live = open(jobs_dir / "owners" / "live.lock", "wb")  # a server process that is still running
    fcntl.flock(live, fcntl.LOCK_EX)
    (jobs_dir / "owners" / "dead.lock").touch()  # one that was killed (the kernel dropped its lock)
    files = {
        "resumed": Job("1" * 32, fp, "p", DEVICE, "float64", 6, None, state="running", done=2, ok=2).record("dead"),
        "other device": Job("2" * 32, fp, "p", OTHER_GPU, "float64", 6, None).record("dead"),
        "crash loop": Job("3" * 32, fp, "p", DEVICE, "float64", 6, None, state="running", crashes=2).record("dead"),
        "matrix gone": Job("4" * 32, "ee" * 16, "q", DEVICE, "float64", 6, None).record("dead"),
        "live owner": Job("5" * 32, fp, "p", DEVICE, "float64", 6, None).record("live"),
    }
    for record in files.values():
        (jobs_dir / f"{record['id']}.json").write_text(json.dumps(record))
    try:
        with TestClient(create_app(settings)) as c:
            jobs = {name: wait_job(c, record["id"]) if name != "live owner" else c.get(f"/jobs/{record['id']}").json()
                    for name, record in files.items()}
            assert c.get("/jobs").json()["count"] == 4  # the live process's job stays its own
    finally:
        live.close()
    resumed = jobs["resumed"]
    assert resumed["state"] == "done" and resumed["restarts"] == 1 and resumed["progress"] == {"done": 6, "total": 6}
    assert resumed["result"]["trials_ok"] + resumed["result"]["trials_failed"] >= 2
    assert study.trials[orphan.number].state == optuna.trial.TrialState.FAIL
    assert not [t for t in study.get_trials() if t.state == optuna.trial.TrialState.RUNNING]
    for name, words in (("other device", "it was for device"), ("crash loop", "died 3 times"),
                        ("matrix gone", "no longer keeps its matrix")):
        assert jobs[name]["state"] == "failed" and words in jobs[name]["error"], jobs[name]
    assert jobs["live owner"]["state"] == "queued" and jobs["live owner"]["restarts"] == 0
    assert not (jobs_dir / "owners" / "dead.lock").exists() and (jobs_dir / "owners" / "live.lock").exists()


def test_failed_job_reports_its_error(client, mtx, monkeypatch):
    import tuner.search.loop

    def broken(*args, **kwargs):
        raise StoreError("this store cannot be written")

    monkeypatch.setattr(tuner.search.loop, "tune", broken)
    r = client.post("/tune", headers=AUTH, files={"file": ("p.mtx", mtx.read_bytes())})
    job = wait_job(client, r.json()["id"])
    assert job["state"] == "failed" and "cannot be" in job["error"] and job["result"] is None
    monkeypatch.setattr(tuner.search.loop, "tune", lambda *a, **k: 1 / 0)
    job = wait_job(client, client.post("/tune", headers=AUTH, files={"file": ("p.mtx", mtx.read_bytes())}
                                       ).json()["id"])
    assert job["state"] == "failed" and "internal error: ZeroDivisionError" in job["error"]
    assert client.get("/health").json()["status"] == "ok"  # the worker lives on


def test_unknown_job_is_404(client):
    assert_error(client.get("/jobs/" + "0" * 32), 404, "no job")
    assert_error(client.get("/jobs/..%2F..%2Fetc%2Fpasswd"), 404)
    assert_error(client.get("/jobs/" + "z" * 100), 422)
    assert_error(client.get("/jobs", params={"limit": 0}), 422)


# -- GET /health, /metrics, the schema ------------------------------------------------------------


def test_health(client):
    body = client.get("/health").json()
    assert body["status"] == "ok" and body["store"]["reachable"] is True and body["store"]["matrices"] == 0
    assert body["device"] == {"id": DEVICE, "kind": "cpu-reference", "gpu_present": False}
    assert body["model"]["loaded"] is False and body["jobs"] == {"queued": 0, "running": 0}


def test_health_when_the_store_fails(client, monkeypatch):
    from service.deps import ThreadStores

    def fail(self):
        raise StoreError("disk on fire")

    monkeypatch.setattr(ThreadStores, "get", fail)
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "unavailable" and "disk on fire" in r.json()["store"]["error"]
    assert_error(client.get("/matrices"), 503, "disk on fire")


def test_metrics(client, mtx):
    client.post("/recommend", json={"rows": 1, "cols": 1, "nnz": 1})
    client.post("/recommend", json={"rows": -1, "cols": 1, "nnz": 1})
    client.get("/matrices/abcdef")
    client.get("/some/random/path")
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    assert 'spmv_http_requests_total{method="POST",route="/recommend",status="200"} 1' in text
    assert 'spmv_http_requests_total{method="POST",route="/recommend",status="422"} 1' in text
    assert 'spmv_http_requests_total{method="GET",route="/matrices/{fingerprint}",status="404"} 1' in text
    assert 'route="unmatched",status="404"' in text and "/some/random/path" not in text
    assert 'spmv_http_request_duration_seconds_bucket{method="POST",route="/recommend",le="+Inf"} 2' in text
    assert 'spmv_http_request_duration_seconds_count{method="POST",route="/recommend"} 2' in text
    assert 'spmv_jobs{state="queued"} 0.0' in text and "spmv_jobs_submitted_total 0.0" in text
    for line in text.splitlines():  # every sample line is "name{labels} value"
        if not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])


def test_openapi_lists_every_endpoint(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/recommend", "/kernels", "/matrices", "/matrices/{fingerprint}", "/matrices/{fingerprint}/trials",
            "/tune", "/jobs", "/jobs/{job_id}", "/health", "/metrics"} <= set(paths)
    body = paths["/recommend"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert set(FEATURE_NAMES) <= set(body["application/json"]["schema"]["properties"])
    assert paths["/tune"]["post"]["security"] == [{"HTTPBearer": []}]


def test_app_without_lifespan_answers_503_not_500(settings):
    c = TestClient(create_app(settings))  # not entered: the lifespan never ran
    assert_error(c.get("/matrices"), 503, "not open")


# -- tuner serve ------------------------------------------------------------------------------------


def test_serve_refuses_bad_options_with_one_line(tmp_path):
    import typer

    from service.cli import serve

    app = typer.Typer()
    app.command()(serve)
    r = CliRunner().invoke(app, ["--device", "tpu", "--db", str(tmp_path / "t.db")])
    assert r.exit_code == 1 and "unknown device 'tpu'" in r.output
    from kernels._cuda import gpu_available

    if not gpu_available():
        r = CliRunner().invoke(app, ["--device", "gpu", "--db", str(tmp_path / "t.db")])
        assert r.exit_code == 1 and "cpu-reference" in r.output
    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0 and "--workers" in r.output and "--token" in r.output


def test_settings_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPMV_TUNER_DB", str(tmp_path / "x.db"))
    monkeypatch.setenv("SPMV_TUNER_TOKEN", "abc")
    monkeypatch.setenv("SPMV_TUNER_DEVICE", "cpu-reference")
    monkeypatch.setenv("SPMV_TUNER_MAX_UPLOAD_BYTES", "1234")
    s = Settings()
    assert s.db_path == tmp_path / "x.db" and s.token.get_secret_value() == "abc" and s.max_upload_bytes == 1234
    assert s.service_dir == tmp_path / "service"
    monkeypatch.setenv("SPMV_TUNER_TOKEN", "")
    assert Settings().token is None


def test_parses_past_the_slots_wait_in_the_queue_and_past_it_get_503(tmp_path):
    """One slot, one place in the queue: a slow parse holds the slot, the next upload waits its turn,
    the one after is told 503 with Retry-After at once; every parse process is let go at the end."""
    import anyio
    from fastapi import HTTPException

    from service.parsing import Parser, ParseTask

    settings = make_settings(tmp_path, max_matrix_size=50_000_000)
    slow = tmp_path / "slow.part"  # 10 M entries in 430 KiB: seconds of parsing on one thread
    slow.write_bytes(gzip.compress(MTX_HEADER + b"1000 1000 10000000\n" + b"1 1 1.0\n" * 10_000_000, 1))
    quick = tmp_path / "quick.part"
    quick.write_bytes(MTX_HEADER + b"2 2 1\n1 1 1.0\n")
    parser = Parser(slots=1, queue=1, timeout_s=60)
    outcomes: dict[str, Any] = {}

    async def parse(name: str, path: Path, delay: float) -> None:
        await anyio.sleep(delay)
        try:
            parsed = await parser.parse(ParseTask(path, name, "float64", settings.read_limits, 50_000_000))
            outcomes[name] = (parsed.features["nnz"], time.monotonic())
        except HTTPException as exc:
            outcomes[name] = (exc.status_code, exc.headers, time.monotonic() - delay - began)

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(parse, "slow", slow, 0.0)
            tasks.start_soon(parse, "waits", quick, 0.1)
            tasks.start_soon(parse, "refused", quick, 0.2)

    parser.start()
    began = time.monotonic()
    try:
        anyio.run(main)
    finally:
        parser.stop()
    nnz, slow_done = outcomes["slow"]
    assert nnz == 1.0 and slow_done - began > 0.3  # ten million duplicates of one entry, still parsing at 0.2 s
    assert outcomes["waits"][0] == 1.0 and outcomes["waits"][1] >= slow_done  # served after the slow one
    status, headers, seconds = outcomes["refused"]
    assert status == 503 and int(headers["Retry-After"]) >= 1 and seconds < 0.1
    assert not list(tmp_path.glob("*.part.mtx"))  # the decompressed copies are gone


def test_upload_guard_checks_the_file_as_it_arrives():
    """The checks made on a file part chunk by chunk: a bomb stops at its first line, a size line
    announcing too much at once, a body past the size line's bound at the chunk that crosses it."""
    from service.uploads import MatrixTooLargeError, _FileGuard
    from tuner.matrix.bounds import ReadLimitError, ReadLimits

    limits = ReadLimits(line_bytes=100, header_bytes=1000, entry_bytes=10, max_entries=1000)
    ok = MTX_HEADER + b"% comment\n\n3 4 2\n1 1 1\n2 2 2\n"
    for data in (ok, gzip.compress(ok)):
        guard = _FileGuard("a.mtx", limits, 1000)
        for i in range(len(data)):  # one byte at a time: the gzip magic, lines and the size line split anywhere
            guard.feed(data[i : i + 1])
        assert guard.scan.declared == (3, 4, 2)
    guard = _FileGuard("bomb.mtx.gz", limits, 1000)
    with pytest.raises(ReadLimitError, match=r"bomb.mtx.gz, line 1: longer than 100 bytes") as info:
        guard.feed(gzip.compress(b"\0" * (1 << 24)))
    assert info.value.bound == "line length" and guard.scan.total < 2 << 20  # not 16 MiB inflated
    with pytest.raises(MatrixTooLargeError, match="announces 5000 x 5 with 5 entries; .* at most 1000"):
        _FileGuard("b.mtx", limits, 1000).feed(MTX_HEADER + b"5000 5 5\n")
    guard = _FileGuard("c.mtx", limits, 1000)
    guard.feed(MTX_HEADER + b"3 3 2\n")
    guard.feed(b"1 1 1\n" * 3)
    with pytest.raises(ReadLimitError, match="more than 72 bytes once decompressed .* announces 2 entries") as info:
        guard.feed(b"1 1 1\n")
    assert info.value.bound == "decompressed size" and info.value.limit == len(MTX_HEADER) + 6 + 20
    with pytest.raises(ReadLimitError, match="no size line within the first 1000 bytes"):
        _FileGuard("d.mtx", limits, 1000).feed(MTX_HEADER + b"% comment\n" * 200)
    with pytest.raises(MatrixFormatError, match="e.mtx: cannot read the file"):
        _FileGuard("e.mtx", limits, 1000).feed(b"\x1f\x8bnot gzip at all")


def test_a_stored_selector_answers_predicted_for_a_complete_feature_vector(settings, mtx):
    """With a model for the server's device, an untuned matrix's full vector (or file) gets 'predicted'."""
    import numpy as np

    from kernels import config_key
    from tuner.matrix.features import FEATURE_NAMES
    from tuner.select.model import DeviceSpec, KernelSelector, save_model

    seed_store(settings.db)
    rng = np.random.default_rng(0)
    X = rng.uniform(1, 100, size=(12, len(FEATURE_NAMES)))
    times = [{config_key("csr_vector", {"threads_per_row": 16, "block_size": 64}): 1e-4}] * 12
    with Store(settings.db) as store:
        save_model(store, KernelSelector(n_estimators=10).fit(
            X, times, dtype="float64", device=DeviceSpec(DEVICE, 100.0, 0, 8)), device=DEVICE, dtype="float64")
    with TestClient(create_app(settings)) as client:
        health = client.get("/health").json()
        assert health["model"]["loaded"] is True and "float64" in health["model"]["detail"]
        _, features = vector_of(mtx)
        body = client.post("/recommend", json=features).json()
        assert body["source"] == "predicted" and body["kernel"] == "csr_vector"
        assert body["params"] == {"threads_per_row": 16, "block_size": 64, "indices": "narrow"}  # what runs
        assert body["confidence"] == 1.0  # one config only: every tree ranks it first
        partial = client.post("/recommend", json={k: features[k] for k in ("rows", "cols", "nnz")}).json()
        assert partial["source"] == "default" and partial["confidence"] is None  # the model needs every feature
        with mtx.open("rb") as f:
            assert client.post("/recommend", files={"file": ("poisson.mtx", f)}).json()["source"] == "predicted"
