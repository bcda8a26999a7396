"""Bounded load test of ``POST /recommend`` (feature vectors), or a soak of mixed traffic, on loopback.

By default it builds a throwaway store holding ``--matrices`` synthetic
matrices (rows written through ``Store.add_matrix``, a tuned best config for
every other one), starts ``tuner serve --device cpu-reference`` with
``--workers`` processes on 127.0.0.1 on a free port, sends exactly
``--requests`` requests over ``--concurrency`` keep-alive connections, stops
the server and prints throughput and latency percentiles. Half the feature
vectors carry the fingerprint of a tuned matrix (answer 'tuned', read from the
store), half carry none (answer 'default'). ``--url`` targets a server already
running, which must be on a loopback address.

The client is a small asyncio HTTP/1.1 client from the standard library (a
general-purpose client would spend more CPU than the server it measures), run
in ``--client-procs`` processes that share the connections and the requests
(one such process tops out well below what a many-worker server answers).
Every connection is opened, and has one untimed request answered, before the
clock starts in all of them at once (``warm_up_seconds`` says how long that
took). Each request's latency is taken in its process, from its send to the
last byte of its answer; the percentiles are over all requests of all
processes, and the throughput is all of them over the time from the common
start to the last answer. Two modes:

- closed loop (default): each connection sends its next request as soon as
  the previous answer is in. Latency then includes queueing at the server:
  by Little's law the mean latency is ``concurrency / throughput``.
- open loop (``--rate R``): request ``i`` is due at ``start + i / R``; its
  latency counts from when it was due (so a stalled server is not hidden).

The result also says how busy the client processes were (``client_busy``,
their CPU time over their wall time: near 1 the client, not the server, set
the pace) and, for a server it started (read from /proc, so on Linux), the
server's CPU time per request and how the connections were spread over its
worker processes (``connections_per_server_process``), and its resident
memory (all its processes' RSS) at the start, every 30 s, and at the end.

Soak (``--soak SECONDS``): mixed traffic for that long, open loop at ``--rate``
(300 req/s unless given), over ``--concurrency`` connections, to a server
started with a token: in the proportions of ``SOAK_MIX``, feature vectors,
small valid uploads (plain and gzip), uploads the parser refuses (422), hostile
uploads crossing each bound (gzip bombs, a size line announcing 10^9 rows, a
body past its size line's bound, a header of 1 MiB of comments: 413 or 422),
and tuning jobs (202, or 429 when the queue is full). One request of each kind
is answered before the clock starts. The result adds, per kind, the latency
percentiles and the statuses, the answers outside the kind's expected ones,
the count of 5xx, and the jobs' final states; it exits non-zero on any 5xx or
unexpected answer.

Examples::

    python bench/loadtest.py                                   # 20 000 requests, 200 connections, 10 000 matrices
    python bench/loadtest.py --workers 8 --client-procs 4 --json out.json
    python bench/loadtest.py --rate 2000 --json out.json
    python bench/loadtest.py --url http://127.0.0.1:8000 --requests 5000
    python bench/loadtest.py --soak 600 --workers 2 --json soak.json     # 10 minutes of mixed traffic
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import ipaddress
import json
import multiprocessing
import os
import platform
import queue
import random
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.queues import Queue
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
    from tuner.matrix.features import FEATURE_NAMES
    from tuner.measure.backend import CpuReferenceBackend

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


def post(host: str, port: int, path: str, body: bytes, content_type: str, token: str | None = None) -> bytes:
    """A whole HTTP/1.1 POST request, with its Content-Length."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def vector_requests(host: str, port: int, bodies: list[bytes]) -> list[tuple[str, bytes]]:
    """``POST /recommend`` of each JSON body, labelled 'vector'."""
    return [("vector", post(host, port, "/recommend", b, "application/json")) for b in bodies]


# -- the soak's traffic ---------------------------------------------------------------------------

SOAK_MIX = {  # kind: (requests in 1000, the statuses that are right for it)
    "vector": (900, ("200",)),
    "upload": (50, ("200",)),
    "bad upload": (24, ("422",)),
    "hostile upload": (25, ("413", "422")),
    "tune": (1, ("202", "429")),
}
_BOUNDARY = "soak-boundary"


def multipart(filename: str, data: bytes, fields: dict[str, str] | None = None) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body with ``data`` in field ``file`` (and ``fields``), and its Content-Type."""
    out = b"".join(f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                   for k, v in (fields or {}).items())
    out += (f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{_BOUNDARY}--\r\n".encode()
    return out, f"multipart/form-data; boundary={_BOUNDARY}"


def soak_files(seed: int = 2) -> dict[str, list[tuple[str, bytes]]]:
    """The files the soak uploads, by kind: small valid matrices (plain and gzip), files the parser
    refuses, and hostile ones (gzip bombs, a size line announcing 10^9 rows, a body past its size line's
    bound, a line of 1 MiB)."""
    import gzip

    sys.path.insert(0, str(REPO))
    from tuner.matrix.generate import generate

    header = b"%%MatrixMarket matrix coordinate real general\n"
    valid = []
    for name, A in (("poisson", generate("poisson2d", n=40)), ("banded", generate("banded", rows=3000, seed=seed)),
                    ("powerlaw", generate("powerlaw", rows=5000, seed=seed))):
        coo = A.tocoo()
        text = header + f"{A.shape[0]} {A.shape[1]} {A.nnz}\n".encode() + "".join(
            f"{i + 1} {j + 1} {v:.17g}\n" for i, j, v in zip(coo.row, coo.col, coo.data, strict=True)).encode()
        valid += [(f"{name}.mtx", text), (f"{name}.mtx.gz", gzip.compress(text))]
    rng = random.Random(seed)
    bad = [("random.mtx", bytes(rng.getrandbits(8) for _ in range(4096))), ("empty.mtx", b""),
           ("truncated.mtx", header + b"10 10 5\n1 1 1\n2 2 2\n"),
           ("out-of-range.mtx", header + b"3 3 2\n1 1 1\n4 1 1\n")]
    many = b"1000000 1000000 1000000\n"  # a size line whose bound on the file is 64 MB
    hostile = [  # one for each bound: line length (the first two), size line, decompressed size, header size
        ("bomb.mtx.gz", gzip.compress(bytes(64 << 20), compresslevel=9)),  # 64 MiB of zeros in 64 KiB
        ("line.mtx.gz", gzip.compress(header + many + b"1 1 " + bytes(64 << 20), compresslevel=9)),
        ("rows.mtx", header + b"1000000000 10 10\n1 1 1\n"),
        ("entries.mtx.gz", gzip.compress(header + b"1000 1000 100\n" + b"1 1 1.0\n" * 1_000_000)),
        ("comments.mtx", header + b"% a comment\n" * 100_000 + many),
    ]
    return {"upload": valid, "bad upload": bad, "hostile upload": hostile}


def soak_requests(host: str, port: int, vectors: list[tuple[str, dict[str, float], bool]], *, token: str,
                  k: int = 2000, seed: int = 3) -> list[tuple[str, bytes]]:
    """``k`` requests in the proportions of :data:`SOAK_MIX`, shuffled: feature vectors, uploads of each kind of
    :func:`soak_files` to ``POST /recommend``, and tuning jobs (``POST /tune``, 3 trials of a small matrix)."""
    files = soak_files()
    bodies = iter(request_bodies(vectors, k))
    out = []
    for kind, (per_mille, _) in SOAK_MIX.items():
        for i in range(max(1, k * per_mille // 1000)):
            if kind == "vector":
                out.append((kind, post(host, port, "/recommend", next(bodies), "application/json")))
            elif kind == "tune":
                body, media = multipart("tune.mtx", files["upload"][0][1],
                                        {"trials": "3", "kernels": "csr_scalar,cusparse"})
                out.append((kind, post(host, port, "/tune", body, media, token)))
            else:
                name, data = files[kind][i % len(files[kind])]
                out.append((kind, post(host, port, "/recommend", *multipart(name, data))))
    random.Random(seed).shuffle(out)
    return out


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
def local_server(db: Path, *, workers: int, access_log: bool, token: str | None = None) -> Iterator[tuple[str, int]]:
    """``tuner serve`` on 127.0.0.1 on a free port, serving ``db`` with the CPU-reference device (and taking
    tuning jobs with ``token``); yields its URL and process id, and stops it (SIGINT, as a user would) on exit."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if token:
        env["SPMV_TUNER_TOKEN"] = token
    cmd = [sys.executable, "-m", "tuner", "serve", "--host", "127.0.0.1", "--port", str(port), "--db", str(db),
           "--device", "cpu-reference", "--workers", str(workers), "--log-level", "warning",
           "--access-log" if access_log else "--no-access-log"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc=proc)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its session: the worker processes too
            proc.wait()


def server_stack() -> dict[str, str]:
    """The HTTP parser and event loop uvicorn picks ('auto') in this interpreter, which runs the server too."""
    def have(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    return {"http": "httptools" if have("httptools") else "h11", "loop": "uvloop" if have("uvloop") else "asyncio"}


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...; utime and stime at 11, 12)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc (empty where there is no /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parents[int(entry.name)] = int(_stat(int(entry.name))[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    tree, frontier = [pid], {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier}
        tree += sorted(frontier)
    return tree if pid in parents else []


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of the live processes ``pids``."""
    ticks = 0
    for pid in pids:
        try:
            fields = _stat(pid)
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def connections_per_process(pids: list[int], port: int) -> list[int]:
    """How many established connections to ``port`` each process of ``pids`` holds, most first, zeros left out."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 01: ESTABLISHED
                inodes.add(f"socket:[{fields[9]}]")
    counts = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        held = 0
        for fd in fds:
            try:
                held += os.readlink(fd) in inodes
            except OSError:
                continue
        counts.append(held)
    return sorted((n for n in counts if n), reverse=True)


def accepted_connections(pids: list[int], port: int, expected: int, wait_s: float = 5.0) -> list[int]:
    """:func:`connections_per_process` once the server's processes hold ``expected`` connections, else the fullest
    reading within ``wait_s`` seconds: a client's connection is established before a worker has accepted it, and
    until then no process of the server holds it (read at once, 16 of 20 were held in one run of the tests); a short
    load may end, its connections closed, before the last of them is accepted (the tests on a busy host: none held
    at the last reading)."""
    deadline = time.monotonic() + wait_s
    fullest: list[int] = []
    while pids:
        spread = connections_per_process(pids, port)
        fullest = max(fullest, spread, key=sum)
        if sum(fullest) >= expected or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return fullest


def check_loopback(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise SystemExit(f"--url must be http://HOST:PORT, got {url!r}")
    for info in socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP):
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            raise SystemExit(f"{parts.hostname} is not a loopback address: this load test only targets this machine")
    return parts.hostname, parts.port or 80


# -- the client -----------------------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Status, body, and whether the server closes the connection after it."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            close = value.strip().lower() == b"close"
    return status, await reader.readexactly(length), close




async def run_load(host: str, port: int, payloads: list[tuple[str, bytes]], *, requests: int, concurrency: int,
                   rate: float | None, max_seconds: float, ready: threading.Barrier | None = None) -> dict[str, Any]:
    """One client process's share: ``requests`` requests over ``concurrency`` connections, taken in turn
    from ``payloads`` (whole HTTP requests, each labelled with its kind).

    Every connection is opened and warmed up first; then ``ready`` (a barrier shared with the other
    client processes) is passed, and the clock starts. Returns the raw latencies (seconds), the count of
    each status (or error), both per kind too, the timed phase's start and end on ``time.monotonic``
    (CLOCK_MONOTONIC on Linux: one clock for every process) and the CPU time this process spent in it.
    """
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    kinds: dict[str, dict[str, Any]] = {}
    next_index = 0
    warm = next(p for kind, p in payloads if kind == "vector")
    # Every client connects and has one untimed request answered first (a burst of new connections waits
    # for the server to accept them, which is not what this measures); then the clock starts.
    connections = await asyncio.gather(*(asyncio.open_connection(host, port) for _ in range(concurrency)))
    warm_start = time.perf_counter()

    async def warm_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(warm)
        await _read_response(reader)

    await asyncio.gather(*(warm_up(r, w) for r, w in connections))
    warm_up_s = time.perf_counter() - warm_start
    if ready is not None:
        ready.wait()  # blocks the loop, which has nothing else to do until every process is as far
    cpu = time.process_time()
    started = time.monotonic()
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
                kind, payload = payloads[i % len(payloads)]
                mine = kinds.setdefault(kind, {"latencies": [], "statuses": Counter()})
                writer.write(payload)
                try:
                    status, body, close = await _read_response(reader)
                except (asyncio.IncompleteReadError, ConnectionError) as exc:
                    statuses[type(exc).__name__] += 1
                    mine["statuses"][type(exc).__name__] += 1
                    close = True
                else:
                    latencies.append(time.perf_counter() - due)
                    mine["latencies"].append(latencies[-1])
                    statuses[str(status)] += 1
                    mine["statuses"][str(status)] += 1
                    if status == 200 and i % 97 == 0:  # spot-check that answers are whole JSON objects
                        json.loads(body)
                if close:
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
        finally:
            writer.close()

    results = await asyncio.gather(*(client(r, w) for r, w in connections), return_exceptions=True)
    ended = time.monotonic()
    for exc in results:
        if isinstance(exc, BaseException):
            statuses[type(exc).__name__] += 1
    return {"latencies": latencies, "statuses": dict(statuses), "started": started, "ended": ended,
            "cpu_s": time.process_time() - cpu, "warm_up_s": warm_up_s,
            "kinds": {k: {"latencies": v["latencies"], "statuses": dict(v["statuses"])} for k, v in kinds.items()}}


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` whole shares that differ by at most one."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def _client_process(results: Queue, ready: threading.Barrier, args: tuple[Any, ...], options: dict[str, Any]) -> None:
    """A client process: its share of the load (on uvloop when installed); the outcome goes to ``results``."""
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        results.put(runner(run_load(*args, ready=ready, **options)))
    except BaseException as exc:
        ready.abort()  # the other processes and the parent stop waiting
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _collect(results: Queue, count: int, *, timeout: float) -> list[dict[str, Any]]:
    """What ``count`` client processes put in ``results`` within ``timeout`` seconds (an error for each silent one)."""
    deadline = time.monotonic() + timeout
    parts = []
    for _ in range(count):
        try:
            parts.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            parts.append({"error": f"a client process did not answer within {timeout:g} s"})
    return parts


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants (VmRSS from /proc, in MiB; 0 where there is no /proc)."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError, IndexError):
            total += int(Path(f"/proc/{p}/status").read_text().split("VmRSS:")[1].split()[0])
    return total / 1024


def drive(host: str, port: int, payloads: list[tuple[str, bytes]], *, requests: int, concurrency: int,
          rate: float | None, max_seconds: float, procs: int, server_pid: int | None = None,
          sample_every: float = 30.0) -> dict[str, Any]:
    """The load from ``procs`` client processes, with the connections and requests shared out evenly; the
    server's memory (its process tree's RSS) is read at the start, every ``sample_every`` seconds, and
    at the end."""
    procs = max(1, min(procs, concurrency, requests))
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(procs + 1)  # the clients and this process, which reads the server's CPU time there
    results = ctx.Queue()
    clients = []
    for n, c in zip(split(requests, procs), split(concurrency, procs), strict=True):
        options = {"requests": n, "concurrency": c, "rate": rate * n / requests if rate else None,
                   "max_seconds": max_seconds}
        clients.append(ctx.Process(target=_client_process, args=(results, ready, (host, port, payloads), options)))
    for process in clients:
        process.start()
    server = process_tree(server_pid) if server_pid else []
    try:
        try:
            ready.wait(timeout=120)
        except threading.BrokenBarrierError:
            parts = _collect(results, len(clients), timeout=30)  # each failed, or saw the barrier break
            raise RuntimeError("the clients could not start: " + "; ".join(p["error"] for p in parts)) from None
        spread, cpu = accepted_connections(server, port, concurrency), cpu_seconds(server)
        started, memory = time.monotonic(), [(0.0, rss_mb(server_pid))] if server_pid else []
        done = threading.Event()

        def sample() -> None:
            while server_pid and not done.wait(sample_every):
                memory.append((round(time.monotonic() - started, 1), rss_mb(server_pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        parts = _collect(results, len(clients), timeout=max_seconds + 120)
        done.set()
        server_cpu = cpu_seconds(server) - cpu
        if server_pid:
            memory.append((round(time.monotonic() - started, 1), rss_mb(server_pid)))
    finally:
        for process in clients:
            process.join(timeout=10)
            if process.exitcode is None:
                process.kill()
    if errors := [p["error"] for p in parts if "error" in p]:
        raise RuntimeError("a client process failed: " + "; ".join(errors))
    result = merge(parts, requests=requests, concurrency=concurrency, rate=rate)
    result.update(client_procs=procs, client_cpu_s=sum(p["cpu_s"] for p in parts))
    result["client_busy"] = result["client_cpu_s"] / (procs * max(result["seconds"], 1e-9))
    if server:
        result.update(server_cpu_s=server_cpu, server_cpu_us_per_request=server_cpu / max(1, result["completed"]) * 1e6,
                      connections_per_server_process=spread, server_rss_mb_start=memory[0][1],
                      server_rss_mb_end=memory[-1][1], server_rss_mb_series=memory)
    return result


def _percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted latencies (seconds), in milliseconds."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3 if ordered else float("nan")


def merge(parts: list[dict[str, Any]], *, requests: int, concurrency: int, rate: float | None) -> dict[str, Any]:
    """Totals and percentiles over the requests of every client process, and per kind where the parts say."""
    latencies = sorted(x for p in parts for x in p["latencies"])
    statuses: Counter[str] = Counter()
    for p in parts:
        statuses.update(p["statuses"])
    elapsed = max(p["ended"] for p in parts) - min(p["started"] for p in parts)
    kinds: dict[str, dict[str, Any]] = {}
    for name in sorted({k for p in parts for k in p.get("kinds", {})}):
        mine = sorted(x for p in parts for x in p["kinds"].get(name, {}).get("latencies", []))
        counted = sum((Counter(p["kinds"].get(name, {}).get("statuses", {})) for p in parts), Counter())
        kinds[name] = {"completed": len(mine), "p50_ms": _percentile(mine, 0.50), "p99_ms": _percentile(mine, 0.99),
                       "max_ms": mine[-1] * 1e3 if mine else float("nan"), "statuses": dict(counted)}

    def pct(q: float) -> float:
        return _percentile(latencies, q)

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
        "statuses": dict(statuses),
        "errors": sum(n for s, n in statuses.items() if s != "200"),
        "warm_up_seconds": max(p["warm_up_s"] for p in parts),
        "kinds": kinds,
    }


def default_client_procs() -> int:
    """A quarter of the CPUs this process may run on, 1 to 8: enough to keep a server on the rest busy."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cpus // 4))


def soak_verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Per kind, the answers outside :data:`SOAK_MIX`'s expected statuses (transport errors included), and 5xx."""
    unexpected = {kind: {s: n for s, n in v["statuses"].items() if s not in SOAK_MIX[kind][1]}
                  for kind, v in result["kinds"].items()}
    return {"unexpected": {k: v for k, v in unexpected.items() if v},
            "server_errors_5xx": sum(n for s, n in result["statuses"].items() if s.startswith("5"))}


def jobs_by_state(jobs_dir: Path) -> dict[str, int]:
    """How many tuning jobs the server's job files show in each state."""
    states: Counter[str] = Counter()
    for path in jobs_dir.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            states[json.loads(path.read_text())["state"]] += 1
    return dict(states)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="requests to send in all (default 20000)")
    ap.add_argument("--concurrency", type=int, default=200, help="connections at once (default 200)")
    ap.add_argument("--matrices", type=int, default=10_000, help="matrices in the generated store (default 10000)")
    ap.add_argument("--rate", type=float, default=None, help="open loop: requests per second (default: closed loop)")
    ap.add_argument("--soak", type=float, metavar="SECONDS",
                    help="mixed traffic (SOAK_MIX) for SECONDS, open loop at --rate (default 300 req/s)")
    ap.add_argument("--workers", type=int, default=1, help="worker processes of the local server (default 1)")
    ap.add_argument("--client-procs", type=int, default=default_client_procs(),
                    help=f"client processes sharing the connections (default: CPUs / 4, here {default_client_procs()})")
    ap.add_argument("--access-log", action="store_true", help="keep uvicorn's access log on (off by default)")
    ap.add_argument("--max-seconds", type=float, default=300.0, help="stop sending after this long (default 300)")
    ap.add_argument("--url", help="a running server on a loopback address (default: start one)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    if min(args.requests, args.concurrency, args.matrices, args.workers, args.client_procs) < 1:
        ap.error("--requests, --concurrency, --matrices, --workers and --client-procs must be at least 1")
    if args.soak is not None:
        if args.url:
            ap.error("--soak starts its own server (it needs the token to send tuning jobs): leave --url out")
        args.rate = args.rate or 300.0
        args.requests, args.max_seconds = int(args.rate * args.soak), args.soak + 60
    token = secrets.token_hex(16) if args.soak is not None else None

    with tempfile.TemporaryDirectory(prefix="spmv-loadtest-") as tmp:
        if args.url:
            check_loopback(args.url)  # before anything is sent to it
            wait_ready(args.url.rstrip("/"), proc=None, timeout=10)
            vectors = [(secrets.token_hex(16), {"rows": 1000.0, "cols": 1000.0, "nnz": 5000.0}, False)]
            server = contextmanager(lambda: (yield args.url, None))()
        else:
            t = time.perf_counter()
            vectors = build_store(Path(tmp) / "tuner.db", args.matrices)
            print(f"store: {args.matrices} matrices written in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            server = local_server(Path(tmp) / "tuner.db", workers=args.workers, access_log=args.access_log,
                                  token=token)
        with server as (url, pid):
            host, port = check_loopback(url)
            if token:
                payloads = soak_requests(host, port, vectors, token=token)
                first = [next(p for p in payloads if p[0] == kind) for kind in SOAK_MIX]  # every path warm first
                asyncio.run(run_load(host, port, first, requests=len(first), concurrency=1, rate=None, max_seconds=60))
            else:
                payloads = vector_requests(host, port, request_bodies(vectors, min(args.requests, 2000)))
            result = drive(host, port, payloads, requests=args.requests, concurrency=args.concurrency,
                           rate=args.rate, max_seconds=args.max_seconds, procs=args.client_procs, server_pid=pid)
            if token:
                result.update(soak_seconds=args.soak, mix={k: v[0] for k, v in SOAK_MIX.items()},
                              jobs=jobs_by_state(Path(tmp) / "service" / "jobs"), **soak_verdict(result))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    result.update(matrices=None if args.url else args.matrices, workers=None if args.url else args.workers,
                  server_stack=None if args.url else server_stack(), cpus=cpus,
                  machine=platform.machine(), python=platform.python_version())
    workers = "" if result["workers"] is None else f"{result['workers']} workers, "  # None: a server of --url
    print(f"{result['completed']}/{result['requests']} requests, {result['concurrency']} connections, "
          f"{result['mode']}, {result['cpus']} CPUs, {workers}{result['client_procs']} client "
          f"processes: {result['throughput_rps']:.0f} req/s, p50 {result['p50_ms']:.1f} ms, p90 {result['p90_ms']:.1f} "
          f"ms, p99 {result['p99_ms']:.1f} ms, max {result['max_ms']:.1f} ms, errors {result['errors']} "
          f"{result['statuses']}; clients {result['client_busy']:.0%} busy")
    if "server_cpu_s" in result:
        print(f"server: {result['server_cpu_us_per_request']:.0f} µs CPU per request, connections per process "
              f"{result['connections_per_server_process']}, {result['server_stack']}, RSS "
              f"{result['server_rss_mb_start']:.0f} MiB at the start, {result['server_rss_mb_end']:.0f} at the end")
    if token:
        for kind, v in result["kinds"].items():
            print(f"  {kind}: {v['completed']} answered, p50 {v['p50_ms']:.1f} ms, p99 {v['p99_ms']:.1f} ms, "
                  f"{v['statuses']}")
        print(f"5xx: {result['server_errors_5xx']}, unexpected answers: {result['unexpected'] or 'none'}, "
              f"jobs: {result['jobs']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if token:
        return 0 if not result["unexpected"] and result["server_errors_5xx"] == 0 else 1
    return 0 if result["errors"] == 0 and result["completed"] == args.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
