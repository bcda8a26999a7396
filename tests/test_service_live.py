"""The service as users run it: real uvicorn processes on 127.0.0.1, spoken to over HTTP.

- ``tuner serve`` (``service.cli.serve``) starts, answers every capability, and stops on SIGINT;
- two server processes sharing one store run tuning jobs at the same time while
  readers poll: no trial is lost, no request fails, nothing says "database is locked";
- the load-test script runs at a tiny scale.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from db.store import Store
from tests.conftest import REPO
from tests.test_service import TOKEN, seed_store, wait_job
from tuner.generate import generate
from tuner.io import write_mtx

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SERVE = "import typer; from service.cli import serve; app = typer.Typer(); app.command()(serve); app()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path, data_dir: Path, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPMV_TUNER_TOKEN": TOKEN, "SPMV_TUNER_DATA_DIR": str(data_dir)}
    cmd = [sys.executable, "-c", SERVE, "--host", "127.0.0.1", "--port", str(port), "--db", str(db),
           "--device", "cpu-reference", "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the server did not answer within 60 s: {log.read_text()}")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    proc, url = start_server(tmp_path / "tuner.db", tmp_path / "service", tmp_path / "server.log")
    try:
        yield url, tmp_path
    finally:
        assert stop_server(proc) == 0, (tmp_path / "server.log").read_text()




def test_serve_over_http(server):
    url, tmp = server
    fps = seed_store(tmp / "tuner.db")
    path = tmp / "A.mtx"
    write_mtx(path, generate("banded", rows=300, seed=1))
    with httpx.Client(base_url=url, timeout=30) as http:
        health = http.get("/health").json()
        assert health["status"] == "ok" and health["device"]["kind"] == "cpu-reference"
        assert http.get("/kernels").json()["count"] >= 3
        assert http.get("/matrices", params={"limit": 2}).json()["count"] == 3
        assert http.get(f"/matrices/{fps[0]}").json()["trial_count"] == 3
        assert http.get(f"/matrices/{fps[0]}/trials").json()["count"] == 3
        tuned = http.post("/recommend", json={"rows": 100, "cols": 100, "nnz": 500, "fingerprint": fps[0]}).json()
        assert tuned["source"] == "tuned"
        r = http.post("/recommend", files={"file": ("A.mtx", path.read_bytes())})
        assert r.status_code == 200 and r.json()["source"] == "default"
        assert http.post("/recommend", content=b"{", headers={"Content-Type": "application/json"}).status_code == 400
        assert http.post("/tune", files={"file": ("A.mtx", path.read_bytes())}).status_code == 401
        r = http.post("/tune", headers=AUTH, files={"file": ("A.mtx", path.read_bytes())}, data={"trials": "4"})
        assert r.status_code == 202, r.text
        job = wait_job(http, r.json()["id"], timeout=120)
        assert job["state"] == "done" and job["progress"] == {"done": 4, "total": 4}
        r = http.post("/recommend", files={"file": ("A.mtx", path.read_bytes())})
        assert r.json()["source"] == "tuned"
        metrics = http.get("/metrics").text
        assert 'spmv_http_requests_total{method="POST",route="/tune",status="202"} 1' in metrics
        assert 'spmv_jobs_finished_total{state="done"} 1.0' in metrics


def test_concurrent_jobs_and_readers_lose_nothing(tmp_path):
    """Two server processes on one store (as two hosts would be) tune at once; readers poll throughout."""
    db = tmp_path / "tuner.db"
    Store(db).close()
    servers = [start_server(db, tmp_path / f"service-{i}", tmp_path / f"server-{i}.log") for i in range(2)]
    problems: list[str] = []
    stop = threading.Event()
    reads = [0]

    def reader(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                for m in http.get("/matrices").json()["data"]:
                    for path in (f"/matrices/{m['fingerprint']}", f"/matrices/{m['fingerprint']}/trials"):
                        r = http.get(path)
                        reads[0] += 1
                        if r.status_code != 200 or "locked" in r.text:
                            problems.append(f"{path}: {r.status_code} {r.text[:200]}")
                    r = http.post("/recommend", json={"rows": m["rows"], "cols": m["cols"], "nnz": m["nnz"],
                                                      "fingerprint": m["fingerprint"]})
                    if r.status_code != 200:
                        problems.append(f"/recommend: {r.status_code} {r.text[:200]}")

    try:
        jobs = []
        for i, (_, url) in enumerate(servers):
            path = tmp_path / f"m{i}.mtx"
            write_mtx(path, generate("powerlaw", rows=2000, seed=i))
            r = httpx.post(url + "/tune", headers=AUTH, files={"file": (path.name, path.read_bytes())},
                           data={"trials": "25"}, timeout=30)
            assert r.status_code == 202, r.text
            jobs.append((url, r.json()["id"]))
        threads = [threading.Thread(target=reader, args=(url,)) for _, url in servers for _ in range(2)]
        for t in threads:
            t.start()
        results = []
        for url, job_id in jobs:
            with httpx.Client(base_url=url, timeout=30) as http:
                results.append(wait_job(http, job_id, timeout=120))
        stop.set()
        for t in threads:
            t.join(60)
        windows = [(j["started_at"], j["finished_at"]) for j in results]
    finally:
        stop.set()
        codes = [stop_server(proc) for proc, _ in servers]
    logs = "".join((tmp_path / f"server-{i}.log").read_text() for i in range(2))
    assert codes == [0, 0], logs
    assert not problems, problems[:5]
    assert reads[0] > 0 and "locked" not in logs and "Traceback" not in logs
    assert all(j["state"] == "done" for j in results), results
    assert windows[0][0] < windows[1][1] and windows[1][0] < windows[0][1], "the two jobs did not overlap"
    with Store(db) as store:
        for job in results:
            stored = store.trials(job["fingerprint"])
            assert len(stored) == job["result"]["trials_ok"] + job["result"]["trials_failed"]
            assert len({t["trial_number"] for t in stored}) == len(stored)
            assert job["result"]["trials_cached"] + len(stored) == 25


def test_loadtest_script_tiny(tmp_path):
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "loadtest.py"), "--requests", "300", "--concurrency",
                        "20", "--matrices", "50", "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    assert result["completed"] == 300 and result["errors"] == 0 and result["statuses"] == {"200": 300}
    assert result["p50_ms"] <= result["p99_ms"] <= result["max_ms"] and result["throughput_rps"] > 0
    assert "req/s" in r.stdout


def test_loadtest_refuses_non_loopback_targets():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import loadtest
    finally:
        sys.path.remove(str(REPO / "bench"))
    with pytest.raises(SystemExit, match="not a loopback address"):
        loadtest.check_loopback("http://192.0.2.1:8000")
    assert loadtest.check_loopback("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
