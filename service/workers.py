"""``tuner serve --workers N``: N uvicorn processes, each accepting on its own ``SO_REUSEPORT`` socket.

uvicorn's own ``--workers`` hands one listening socket to every process, and an
event loop accepts every connection pending when it wakes: a burst of new
keep-alive connections lands on a few processes while others stay idle (200
connections over 4 workers went 130/58/12/0 on loopback), and each client then
stays on the process it landed on. Here the parent binds one socket per worker
to the same address with ``SO_REUSEPORT`` (Linux), so the kernel spreads new
connections over them by a hash of the client's address and port (200 over 8:
between 13 and 34 each). Every socket listens before any worker starts, so
connections that come early wait for their worker rather than crowding the
first one up; a worker that dies is replaced on its socket.

Each process builds the app, then freezes what is alive (modules, routes,
models: some 90 000 objects) out of the garbage collector's sight: otherwise
every full collection under load scans them all and stalls the process's
requests for some 30 ms.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import signal
import socket
import threading
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

log = logging.getLogger("uvicorn.error")
_spawn = multiprocessing.get_context("spawn")


def reuse_port_sockets(host: str, port: int, count: int, *, backlog: int = 2048) -> list[socket.socket]:
    """``count`` sockets listening on (host, port) together; ``port=0`` picks a free one. OSError if taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # A plain bind first: with SO_REUSEPORT alone, a second server of the same user would share the port
    # with a running one instead of failing.
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            sock.listen(backlog)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _serve(config: uvicorn.Config, sockets: list[socket.socket] | None = None) -> bool:
    """uvicorn with ``config`` until SIGINT or SIGTERM (then a graceful shutdown); whether the app started."""
    try:
        config.load()
    except SystemExit:  # uvicorn has logged why the app cannot be imported
        return False
    except Exception:
        log.exception("cannot build the app")
        return False
    gc.collect()
    gc.freeze()
    server = uvicorn.Server(config)
    try:
        server.run(sockets)
    except KeyboardInterrupt:
        pass
    return server.started


def _worker(config: uvicorn.Config, sock: socket.socket) -> None:
    """One worker process, serving on ``sock``."""
    config.configure_logging()
    if not _serve(config, [sock]):
        raise SystemExit(STARTUP_FAILURE)


def _start(config: uvicorn.Config, sock: socket.socket) -> BaseProcess:
    process = _spawn.Process(target=_worker, args=(config, sock), name="spmv-tuner-worker")
    process.start()
    return process


def run(app: str, *, host: str, port: int, workers: int, **options: Any) -> None:
    """Serve ``app`` (an import string) with uvicorn in ``workers`` processes; ``options`` go to uvicorn.

    One worker runs in this process; more run in child processes, one listening socket each, and this
    process supervises them (a worker that exits is started again). Returns after SIGINT or SIGTERM once
    every worker has stopped;
    exits with uvicorn's startup-failure code when a worker cannot start the app.
    """
    config = uvicorn.Config(app, host=host, port=port, workers=workers, **options)
    if workers == 1:
        if not _serve(config):
            raise SystemExit(STARTUP_FAILURE)
        return
    try:
        sockets = reuse_port_sockets(host, port, workers, backlog=config.backlog)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port, exc)
        raise SystemExit(STARTUP_FAILURE) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    processes = [_start(config, sock) for sock in sockets]
    log.info("Uvicorn running on http://%s:%d in %d worker processes (pids %s; Press CTRL+C to quit)",
             host, sockets[0].getsockname()[1], workers, ", ".join(str(p.pid) for p in processes))
    failed = False
    try:
        while not stop.is_set():
            wait([p.sentinel for p in processes], timeout=0.5)
            for i, process in enumerate(processes):
                if process.exitcode is None or stop.is_set():
                    continue
                if process.exitcode == STARTUP_FAILURE:
                    log.error("worker [%d] could not start the app: stopping", process.pid)
                    failed = True
                    stop.set()
                else:
                    log.warning("worker [%d] exited with code %s: starting another", process.pid, process.exitcode)
                    processes[i] = _start(config, sockets[i])
    finally:
        for process in processes:
            if process.exitcode is None:
                process.terminate()  # SIGTERM: uvicorn finishes the requests in flight, then stops
        for process in processes:
            process.join()
        for sock in sockets:
            sock.close()
    if failed:
        raise SystemExit(STARTUP_FAILURE)
