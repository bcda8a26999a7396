"""The service as users run it: real uvicorn processes on 127.0.0.1, spoken to over HTTP.

- ``tuner serve`` (``service.cli.serve``) starts, answers every capability, and stops on SIGINT;
- two server processes sharing one store run tuning jobs at the same time while
  readers poll: no trial is lost, no request fails, nothing says "database is locked";
- ``tuner serve --workers N`` spreads keep-alive connections over its worker processes (one
  ``SO_REUSEPORT`` socket each), replaces a worker that dies, and stops them all on SIGINT;
- the load-test script runs at a tiny scale, and so does its soak of mixed traffic.
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
from tuner.matrix.generate import generate
from tuner.matrix.io import write_mtx

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SERVE = "import typer; from service.cli import serve; app = typer.Typer(); app.command()(serve); app()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path, data_dir: Path, log: Path, *extra: str,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPMV_TUNER_TOKEN": TOKEN, "SPMV_TUNER_DATA_DIR": str(data_dir),
           **(env or {})}
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


def loadtest_module():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import loadtest
    finally:
        sys.path.remove(str(REPO / "bench"))
    return loadtest


needs_proc = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads connections from /proc (Linux)")


def open_connections(url: str, n: int) -> list[socket.socket]:
    """``n`` keep-alive connections, each with one request answered (so its worker has accepted it)."""
    port = int(url.rsplit(":", 1)[1])
    conns = []
    for _ in range(n):
        conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        conn.sendall(b"GET /kernels HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(12).startswith(b"HTTP/1.1 200")
        conns.append(conn)
    return conns


def worker_pids(pids: list[int]) -> list[int]:
    """The server's worker processes among ``pids`` (not its parent, not multiprocessing's resource tracker)."""
    return [pid for pid in pids if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


@needs_proc
def test_serve_workers_share_the_connections_and_are_replaced(tmp_path):
    loadtest = loadtest_module()
    proc, url = start_server(tmp_path / "tuner.db", tmp_path / "service", tmp_path / "server.log", "--workers", "2")
    port = int(url.rsplit(":", 1)[1])
    try:
        conns = open_connections(url, 40)
        spread = loadtest.connections_per_process(loadtest.process_tree(proc.pid), port)
        assert len(spread) == 2 and sum(spread) == 40 and min(spread) >= 5, spread  # hashed: ~20 each
        for conn in conns:
            conn.close()
        workers = worker_pids(loadtest.process_tree(proc.pid))
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "starting another" not in (tmp_path / "server.log").read_text():
            time.sleep(0.1)
        conns = open_connections(url, 40)  # every one answered: the replacement took over the socket
        spread = loadtest.connections_per_process(loadtest.process_tree(proc.pid), port)
        assert len(spread) == 2 and sum(spread) == 40, spread
        for conn in conns:
            conn.close()
        workers = worker_pids(loadtest.process_tree(proc.pid))
    finally:
        code = stop_server(proc)
    log = (tmp_path / "server.log").read_text()
    assert code == 0, log
    assert "starting another" in log and "Traceback" not in log
    assert len(workers) == 2 and not any(Path(f"/proc/{pid}").exists() for pid in workers)


def test_reuse_port_sockets(tmp_path):
    from service.workers import reuse_port_sockets

    sockets = reuse_port_sockets("127.0.0.1", 0, 3)
    try:
        assert len({s.getsockname() for s in sockets}) == 1  # one free port, shared
        with pytest.raises(OSError):  # a second server on the same port fails rather than sharing it
            reuse_port_sockets("127.0.0.1", sockets[0].getsockname()[1], 2)
    finally:
        for s in sockets:
            s.close()


def test_loadtest_script_tiny(tmp_path):
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "loadtest.py"), "--requests", "300", "--concurrency",
                        "20", "--matrices", "50", "--workers", "2", "--client-procs", "2", "--json", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    assert result["completed"] == 300 and result["errors"] == 0 and result["statuses"] == {"200": 300}
    assert result["p50_ms"] <= result["p99_ms"] <= result["max_ms"] and result["throughput_rps"] > 0
    assert result["client_procs"] == 2 and result["workers"] == 2 and 0 < result["client_busy"]
    if Path("/proc/net/tcp").exists():
        assert sum(result["connections_per_server_process"]) == 20 and result["server_cpu_us_per_request"] > 0
    assert "req/s" in r.stdout


def test_loadtest_soak_tiny(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "loadtest.py"), "--soak", "6", "--rate", "50",
                        "--concurrency", "20", "--matrices", "50", "--workers", "2", "--json", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    assert result["server_errors_5xx"] == 0 and result["unexpected"] == {} and result["completed"] == 300
    assert {"vector", "upload", "bad upload", "hostile upload"} <= set(result["kinds"]) <= set(result["mix"])
    assert result["kinds"]["hostile upload"]["statuses"].keys() <= {"413", "422"}
    assert result["server_rss_mb_start"] > 0 and result["server_rss_mb_end"] > 0 and result["jobs"]  # one warmed
    assert "5xx: 0" in r.stdout


def test_loadtest_merges_the_client_processes():
    loadtest = loadtest_module()
    assert loadtest.split(200, 3) == [67, 67, 66] and sum(loadtest.split(7, 4)) == 7
    parts = [{"latencies": [0.001, 0.003], "statuses": {"200": 2}, "started": 10.0, "ended": 11.0, "warm_up_s": 0.1},
             {"latencies": [0.002], "statuses": {"200": 1, "ConnectionResetError": 1}, "started": 10.5,
              "ended": 12.0, "warm_up_s": 0.2}]
    result = loadtest.merge(parts, requests=4, concurrency=3, rate=None)
    assert result["completed"] == 3 and result["seconds"] == 2.0 and result["throughput_rps"] == 1.5
    assert result["p50_ms"] == 2.0 and result["max_ms"] == 3.0 and result["errors"] == 1
    assert result["statuses"] == {"200": 3, "ConnectionResetError": 1} and result["warm_up_seconds"] == 0.2


def test_loadtest_refuses_non_loopback_targets():
    loadtest = loadtest_module()
    with pytest.raises(SystemExit, match="not a loopback address"):
        loadtest.check_loopback("http://192.0.2.1:8000")
    with pytest.raises(SystemExit, match="not a loopback address"):  # refused before anything is sent to it
        loadtest.main(["--url", "http://192.0.2.1:8000", "--requests", "1"])
    assert loadtest.check_loopback("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
