"""Hostile uploads against a real ``tuner serve`` on 127.0.0.1: every bound answers at once, and costs no memory.

Each case is made at test time (nothing large is committed): a gzip bomb of
2 GiB of zero bytes (the issue's ``head -c 2G /dev/zero | gzip -1``, built as
members of 64 MiB), a line of 100 MB, a valid header followed by a body that
would hold a billion entries, a file that takes longer than the parse bound, a
client trickling its body. A body is streamed chunk by chunk and the client
stops sending as soon as the answer comes, as a client that reads while it
writes does: the answer must come before the body is all sent. Each case
checks the status, the bound named in ``detail``, the time to the answer, and
the growth of the server's resident memory (``VmRSS`` of its process, and of
its process tree, from ``/proc``), then that the store and the spool folder
are as they were.
"""

from __future__ import annotations

import gzip
import json
import select
import socket
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.test_service import MTX_HEADER, TOKEN, snapshot
from tests.test_service_live import loadtest_module, start_server, stop_server
from tuner.matrix.generate import generate
from tuner.matrix.io import write_mtx

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads memory from /proc (Linux)")

BOUNDARY = "hostile-boundary"
BODY_TIMEOUT_S = 2.0
PARSE_TIMEOUT_S = 2.0
MB = 1 << 20


def rss_mb(pids: list[int]) -> float:
    """Resident memory of the live processes among ``pids``, in MiB."""
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += int(status.split("VmRSS:")[1].split()[0])
    return total / 1024


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    detail: str
    sent: int  # bytes of the body sent before the answer came
    seconds: float  # from the first byte sent to the whole answer read


def chunked(parts: Iterable[bytes]) -> Iterator[bytes]:
    for part in parts:
        if part:
            yield b"%x\r\n%s\r\n" % (len(part), part)
    yield b"0\r\n\r\n"


def multipart(filename: str, data: Iterable[bytes]) -> Iterator[bytes]:
    yield (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
           "Content-Type: application/octet-stream\r\n\r\n").encode()
    yield from data
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


def send(port: int, path: str, body: Iterable[bytes], *, length: int | None = None, pause: float = 0.0,
         token: bool = False) -> Answer:
    """POST ``body`` (chunked, unless ``length`` is given) and stop sending as soon as the server answers."""
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: multipart/form-data; boundary={BOUNDARY}"]
    head.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if token:
        head.append(f"Authorization: Bearer {TOKEN}")
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    start = time.monotonic()
    sent = 0
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        for piece in body if length is not None else chunked(body):
            if select.select([sock], [], [], 0)[0]:
                break  # the answer has come
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
            if pause:
                time.sleep(pause)
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.split(b"\r\n\r\n", 1)[1]) < _length(raw):
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
        seconds = time.monotonic() - start
    finally:
        sock.close()
    head_text, _, content = raw.partition(b"\r\n\r\n")
    lines = head_text.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Answer(int(lines[0].split()[1]), headers, json.loads(content).get("detail", ""), sent, seconds)


def _length(raw: bytes) -> int:
    for line in raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def repeated(block: bytes, total: int) -> Iterator[bytes]:
    """``block`` over and over, ``total`` bytes in all, 1 MiB at a time (made as it is sent)."""
    piece = block * max(1, MB // len(block))
    while total > 0:
        yield piece[:total]
        total -= len(piece)


def gzipped(parts: Iterable[bytes]) -> Iterator[bytes]:
    """The gzip stream of ``parts``, compressed as it is sent."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    for part in parts:
        yield z.compress(part)
    yield z.flush()


def bomb_2gib() -> bytes:
    """2 GiB of zero bytes, gzip -1: 32 members of 64 MiB each (one compressed, repeated)."""
    return gzip.compress(bytes(64 * MB), compresslevel=1) * 32


HEADER_OF_MANY = MTX_HEADER + b"1000000 1000000 5000000\n"  # 5 M entries: a bound of 320 MB on the file


CASES = {
    # name: (route, the file's parts, streamed (chunked, cut when the bound is crossed) or all sent first
    # (with a Content-Length), the status, words of its detail, seconds to the answer at most)
    "gzip bomb, 2 GiB of zeros": ("/recommend", lambda: [bomb_2gib()], False, 422,
                                  ["line 1: longer than 4096 bytes"], 1.0),
    "gzip bomb to /tune": ("/tune", lambda: [bomb_2gib()], False, 422, ["line 1: longer than 4096 bytes"], 1.0),
    "a 100 MB line": ("/recommend", lambda: [HEADER_OF_MANY, b"1 1 ", *repeated(b"9", 100 * MB)], True, 422,
                      ["line 3: longer than 4096 bytes"], 2.0),
    "a 100 MB line, gzip": ("/recommend", lambda: gzipped([HEADER_OF_MANY, b"1 1 ", *repeated(b"9", 100 * MB)]),
                            True, 422, ["line 3: longer than 4096 bytes"], 3.0),
    "a billion entries after a header of 1000": (
        "/recommend", lambda: [MTX_HEADER + b"1000000 1000000 1000\n", *repeated(b"1 1 1.0\n", 8_000_000_000)],
        True, 413, ["once decompressed", "announces 1000 entries"], 2.0),
    "a billion entries after a header of 1000, gzip": (
        "/recommend", lambda: gzipped([MTX_HEADER + b"1000000 1000000 1000\n",
                                       *repeated(b"1 1 1.0\n", 8_000_000_000)]),
        True, 413, ["once decompressed", "1000 entries"], 3.0),
    "a size line announcing 10^9 rows": ("/recommend", lambda: [MTX_HEADER + b"1000000000 10 10\n"], False, 413,
                                         ["announces 1000000000 x 10", "at most 50000000"], 1.0),
    "longer to parse than the bound": (  # 30 M entries (in 200 KiB): some 5 s of parsing on one core
        "/recommend", lambda: gzipped([MTX_HEADER + b"1000 1000 30000000\n", *repeated(b"1 1 1\n", 180_000_000)]),
        False, 413, [f"parsing took longer than {PARSE_TIMEOUT_S:g} s"], PARSE_TIMEOUT_S + 1.0),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, list[int], Path]]:
    """One server for every case (default bounds, shorter timeouts); yields its port, its process ids
    (the server, then its tree) and its folder; warmed up by one valid upload."""
    tmp = tmp_path_factory.mktemp("bounds")
    env = {"SPMV_TUNER_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S), "SPMV_TUNER_PARSE_TIMEOUT_S": str(PARSE_TIMEOUT_S)}
    proc, url = start_server(tmp / "tuner.db", tmp / "service", tmp / "server.log", env=env)
    port = int(url.rsplit(":", 1)[1])
    try:
        write_mtx(tmp / "ok.mtx", generate("banded", rows=2000, seed=1))
        for _ in range(3):
            r = httpx.post(url + "/recommend", files={"file": ("ok.mtx", (tmp / "ok.mtx").read_bytes())}, timeout=30)
            assert r.status_code == 200, r.text
        yield port, [proc.pid, *loadtest_module().process_tree(proc.pid)[1:]], tmp
    finally:
        assert stop_server(proc) == 0, (tmp / "server.log").read_text()


def measured(server: tuple[int, list[int], Path], run) -> tuple[Answer, float, float]:
    """``run()``'s answer and the growth of the server's RSS and of its tree's (MiB), the store unchanged."""
    port, pids, tmp = server
    before = snapshot(tmp / "tuner.db")
    tree = loadtest_module().process_tree(pids[0])
    rss, rss_tree = rss_mb(pids[:1]), rss_mb(tree)
    answer = run(port)
    time.sleep(0.2)  # the parse's child process, if any, exits
    grown = rss_mb(pids[:1]) - rss, rss_mb(loadtest_module().process_tree(pids[0])) - rss_tree
    assert snapshot(tmp / "tuner.db") == before
    assert not list((tmp / "service" / "spool").iterdir())
    assert not (tmp / "service" / "matrices").exists() or not list((tmp / "service" / "matrices").iterdir())
    return answer, *grown


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_upload_is_refused_at_once_and_costs_no_memory(server, case):
    route, parts, stream, status, words, most_s = CASES[case]

    body = multipart("hostile.mtx", parts()) if stream else list(multipart("hostile.mtx", parts()))

    def run(port: int) -> Answer:
        return send(port, route, body, length=None if stream else sum(map(len, body)), token=route == "/tune")

    answer, grown, grown_tree = measured(server, run)
    print(f"\n{case}: {answer.status} in {answer.seconds:.3f} s after {answer.sent / MB:.1f} MiB sent; "
          f"server RSS {grown:+.1f} MiB, process tree {grown_tree:+.1f} MiB: {answer.detail}")
    assert answer.status == status, answer.detail
    assert all(w in answer.detail for w in words), answer.detail
    assert answer.seconds < most_s and grown < 100 and grown_tree < 100
    if stream:  # cut as the bound was crossed: far from all of it was sent
        assert answer.sent < 64 * MB and answer.headers.get("connection") == "close"


def test_a_slow_client_times_out_and_the_worker_serves_others_meanwhile(server):
    body = list(multipart("slow.mtx", [MTX_HEADER + b"3 3 1\n1 1 1\n"]))
    data = b"".join(body)
    quick: list[float] = []

    def run(port: int) -> Answer:
        def trickle() -> Iterator[bytes]:
            for i in range(len(data) - 1):  # never the last byte
                if i == 5:  # the worker is free for others while this body trickles in
                    start = time.monotonic()
                    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
                    quick.append(time.monotonic() - start)
                yield data[i : i + 1]

        return send(port, "/recommend", trickle(), length=len(data), pause=0.1)

    answer, grown, grown_tree = measured(server, run)
    print(f"\nslow client: {answer.status} in {answer.seconds:.2f} s after {answer.sent} bytes; /health meanwhile "
          f"in {quick[0] * 1e3:.0f} ms; server RSS {grown:+.1f} MiB: {answer.detail}")
    assert answer.status == 408 and "did not arrive within 2 s" in answer.detail
    assert BODY_TIMEOUT_S <= answer.seconds < BODY_TIMEOUT_S + 1.5 and answer.headers["connection"] == "close"
    assert quick[0] < 0.5 and grown < 100


def test_a_valid_large_upload_gives_its_memory_back(server, tmp_path):
    path = tmp_path / "large.mtx.gz"
    write_mtx(path, generate("powerlaw", rows=100_000, seed=2))  # 1.1 M entries
    data = path.read_bytes()

    def run(port: int) -> Answer:
        body = list(multipart("large.mtx.gz", [data]))
        return send(port, "/recommend", body, length=sum(map(len, body)))

    answer, grown, grown_tree = measured(server, run)
    print(f"\nvalid upload of {len(data) / MB:.0f} MiB (1.1 M entries): {answer.status} in {answer.seconds:.2f} s; "
          f"server RSS {grown:+.1f} MiB, process tree {grown_tree:+.1f} MiB")
    assert answer.status == 200 and grown < 100 and grown_tree < 100
