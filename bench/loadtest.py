"""Bounded load test of ``POST /recommend`` (feature vectors) on loopback.

By default it builds a throwaway store holding ``--matrices`` synthetic
matrices (rows written through ``Store.add_matrix``, a tuned best config for
every other one), starts ``uvicorn`` on 127.0.0.1 on a free port with
``--device cpu-reference``, sends exactly ``--requests`` requests over
``--concurrency`` keep-alive connections, stops the server and prints
throughput and latency percentiles. Half the feature vectors carry the
fingerprint of a tuned matrix (answer 'tuned', read from the store), half
carry none (answer 'default'). ``--url`` targets a server already running,
which must be on a loopback address.

The client is a small asyncio HTTP/1.1 client from the standard library (a
general-purpose client would spend more CPU than the server it measures).
Every connection is opened, and has one untimed request answered, before the
clock starts (``warm_up_seconds`` says how long that took). Two modes:

- closed loop (default): each connection sends its next request as soon as
  the previous answer is in. Latency then includes queueing at the server:
  by Little's law the mean latency is ``concurrency / throughput``.
- open loop (``--rate R``): request ``i`` is due at ``start + i / R``; its
  latency counts from when it was due (so a stalled server is not hidden).

Examples::

    python bench/loadtest.py                                   # 20 000 requests, 200 connections, 10 000 matrices
    python bench/loadtest.py --rate 2000 --json out.json
    python bench/loadtest.py --url http://127.0.0.1:8000 --requests 5000
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import platform
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]


# -- the store ------------------------------------------------------------------------------------


def build_store(path: Path, n: int, *, seed: int = 0) -> list[tuple[str, dict[str, float], bool]]:
    """Write ``n`` synthetic matrices (and a best config for every other one); return their vectors.

    Each entry is ``(fingerprint, features, tuned)``. Rows go in through the Store's own methods.
    """
    sys.path.insert(0, str(REPO))
    from db.store import Store
    from tuner.backend import CpuReferenceBackend
    from tuner.features import FEATURE_NAMES

    rng = random.Random(seed)
    device = CpuReferenceBackend().info
    out = []
    with Store(path) as store:
        store.db.execute("PRAGMA synchronous = NORMAL")  # a throwaway store: no fsync per matrix
        store.add_device(device.record(10.0))
        trials = []
        for i in range(n):
            rows = rng.randint(100, 2_000_000)
            cols = rows if rng.random() < 0.8 else rng.randint(100, 2_000_000)
            nnz = min(rows * cols, int(rows * rng.uniform(1, 60)))
            features = {name: round(rng.uniform(0, 10), 4) for name in FEATURE_NAMES}
            features.update(rows=float(rows), cols=float(cols), nnz=float(nnz), density=nnz / (rows * cols))
            fp = secrets.token_hex(16)
            store.add_matrix(fp, name=f"synthetic-{i}", rows=rows, cols=cols, nnz=nnz, features=features)
            tuned = i % 2 == 0
            if tuned:
                trials.append({"fingerprint": fp, "device": device.id, "dtype": "float64", "kernel": "csr_vector",
                               "params": {"threads_per_row": 8, "block_size": 256}, "state": "ok",
                               "time_s": rng.uniform(1e-5, 1e-3), "gflops": rng.uniform(1, 500), "verified": True})
            out.append((fp, features, tuned))
            if len(trials) >= 500 or i == n - 1:
                store.add_trials(trials)
                trials = []
        if store.count_matrices() != n:
            raise RuntimeError(f"the store holds {store.count_matrices()} matrices, expected {n}")
    return out


def request_bodies(vectors: list[tuple[str, dict[str, float], bool]], k: int, *, seed: int = 1) -> list[bytes]:
    """``k`` JSON bodies: half with a tuned matrix's fingerprint, half with none."""
    rng = random.Random(seed)
    tuned = [v for v in vectors if v[2]]
    bodies = []
    for i in range(k):
        fp, features, _ = rng.choice(tuned or vectors)
        body = dict(features, fingerprint=fp) if i % 2 == 0 else dict(features)
        bodies.append(json.dumps(body).encode())
    return bodies


# -- the server -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, *, proc: subprocess.Popen | None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it answered")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the server at {url} did not answer /health within {timeout} s")


@contextmanager
def local_server(db: Path, *, workers: int, access_log: bool):
    """uvicorn on 127.0.0.1 on a free port, serving ``db`` with the CPU-reference device; stopped on exit."""
    port = free_port()
    env = {**os.environ, "SPMV_TUNER_DB": str(db), "SPMV_TUNER_DEVICE": "cpu-reference",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory", "--host", "127.0.0.1",
           "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    if not access_log:
        cmd.append("--no-access-log")
    proc = subprocess.Popen(cmd, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc=proc)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def check_loopback(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise SystemExit(f"--url must be http://HOST:PORT, got {url!r}")
    for info in socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP):
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            raise SystemExit(f"{parts.hostname} is not a loopback address: this load test only targets this machine")
    return parts.hostname, parts.port or 80


# -- the client -----------------------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def run_load(host: str, port: int, bodies: list[bytes], *, requests: int, concurrency: int,
                   rate: float | None, max_seconds: float) -> dict[str, Any]:
    prefix = (f"POST /recommend HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
              "Content-Length: ").encode()
    payloads = [prefix + str(len(b)).encode() + b"\r\n\r\n" + b for b in bodies]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    next_index = 0
    # Every client connects and has one untimed request answered first (a burst of new connections waits
    # for the server to accept them, which is not what this measures); then the clock starts.
    connections = await asyncio.gather(*(asyncio.open_connection(host, port) for _ in range(concurrency)))
    warm_start = time.perf_counter()

    async def warm_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payloads[0])
        await _read_response(reader)

    await asyncio.gather(*(warm_up(r, w) for r, w in connections))
    warm_up_s = time.perf_counter() - warm_start
    start = time.perf_counter()
    deadline = start + max_seconds

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal next_index
        try:
            while next_index < requests and time.perf_counter() < deadline:
                i = next_index
                next_index += 1
                due = time.perf_counter()
                if rate:
                    due = start + i / rate
                    if (wait := due - time.perf_counter()) > 0:
                        await asyncio.sleep(wait)
                writer.write(payloads[i % len(payloads)])
                try:
                    status, body = await _read_response(reader)
                except (asyncio.IncompleteReadError, ConnectionError) as exc:
                    statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    continue
                latencies.append(time.perf_counter() - due)
                key = str(status)
                statuses[key] = statuses.get(key, 0) + 1
                if status == 200 and i % 97 == 0:  # spot-check that answers are whole JSON objects
                    json.loads(body)
        finally:
            writer.close()

    results = await asyncio.gather(*(client(r, w) for r, w in connections), return_exceptions=True)
    elapsed = time.perf_counter() - start
    failures = [r for r in results if isinstance(r, BaseException)]
    for exc in failures:
        statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3 if latencies else float("nan")

    return {
        "requests": requests,
        "completed": len(latencies),
        "concurrency": concurrency,
        "mode": f"open loop at {rate:g} req/s" if rate else "closed loop",
        "seconds": elapsed,
        "throughput_rps": len(latencies) / elapsed if elapsed else 0.0,
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": latencies[-1] * 1e3 if latencies else float("nan"),
        "mean_ms": statistics.fmean(latencies) * 1e3 if latencies else float("nan"),
        "statuses": statuses,
        "errors": sum(n for s, n in statuses.items() if s != "200"),
        "warm_up_seconds": warm_up_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="requests to send in all (default 20000)")
    ap.add_argument("--concurrency", type=int, default=200, help="connections at once (default 200)")
    ap.add_argument("--matrices", type=int, default=10_000, help="matrices in the generated store (default 10000)")
    ap.add_argument("--rate", type=float, default=None, help="open loop: requests per second (default: closed loop)")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes of the local server")
    ap.add_argument("--access-log", action="store_true", help="keep uvicorn's access log on (off by default)")
    ap.add_argument("--max-seconds", type=float, default=300.0, help="stop sending after this long (default 300)")
    ap.add_argument("--url", help="a running server on a loopback address (default: start one)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    if min(args.requests, args.concurrency, args.matrices, args.workers) < 1:
        ap.error("--requests, --concurrency, --matrices and --workers must be at least 1")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    with tempfile.TemporaryDirectory(prefix="spmv-loadtest-") as tmp:
        if args.url:
            host, port = check_loopback(args.url)
            wait_ready(args.url.rstrip("/"), proc=None, timeout=10)
            vectors = [(secrets.token_hex(16), {"rows": 1000.0, "cols": 1000.0, "nnz": 5000.0}, False)]
            server = contextmanager(lambda: (yield args.url))()
        else:
            t = time.perf_counter()
            vectors = build_store(Path(tmp) / "tuner.db", args.matrices)
            print(f"store: {args.matrices} matrices written in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            server = local_server(Path(tmp) / "tuner.db", workers=args.workers, access_log=args.access_log)
        bodies = request_bodies(vectors, min(args.requests, 2000))
        with server as url:
            host, port = check_loopback(url)
            result = asyncio.run(run_load(host, port, bodies, requests=args.requests, concurrency=args.concurrency,
                                          rate=args.rate, max_seconds=args.max_seconds))
    result.update(matrices=None if args.url else args.matrices, workers=args.workers, cpus=os.cpu_count(),
                  machine=platform.machine(), python=platform.python_version())
    print(f"{result['completed']}/{result['requests']} requests, {result['concurrency']} connections, "
          f"{result['mode']}, {result['cpus']} CPUs: {result['throughput_rps']:.0f} req/s, "
          f"p50 {result['p50_ms']:.1f} ms, p90 {result['p90_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
          f"max {result['max_ms']:.1f} ms, errors {result['errors']} {result['statuses']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["errors"] == 0 and result["completed"] == args.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
