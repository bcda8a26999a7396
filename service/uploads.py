"""Uploads: a multipart body streamed to a file on disk under hard bounds, then read as a matrix.

The body is never held in memory: each chunk goes to a temporary file in the
service's spool folder as it arrives, and the request fails the moment the
body passes a bound: 413 past ``max_upload_bytes`` (at once, when its
Content-Length says it will), 408 when it has not all come within
``body_timeout_s``. The file part is looked at on the way in: its header is
decompressed (gzip) in bounded steps and read with a bounded line length, so a
file without newlines (a gzip bomb of zeros) fails at its first chunk, and a
size line announcing more than ``max_matrix_size`` rows, columns or entries
fails before the rest arrives; the size line then bounds the file's size
(``max_bytes_per_entry`` an entry). :func:`read_upload` reads the file whole,
under the same bounds (in a child process: see :mod:`service.parsing`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import scipy.sparse as sp
from fastapi import HTTPException, Request, status
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from common.errors import MatrixFormatError
from service.settings import Settings
from tuner.matrix.bounds import Inflater, MtxScan, ReadLimitError, ReadLimits, scan_mtx
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.io import read_mtx

FILE_FIELD = "file"
MAX_FIELDS = 16
MAX_FIELD_BYTES = 16 * 1024
_GZIP_MAGIC = b"\x1f\x8b"
_STATUS_OF_BOUND = {"line length": status.HTTP_422_UNPROCESSABLE_CONTENT}  # the size bounds: 413


@dataclass
class Upload:
    """A received multipart body: the file part on disk and the small text fields."""

    path: Path
    filename: str
    size: int = 0
    fields: dict[str, str] = field(default_factory=dict)


def _too_large(limit: int, headers: dict[str, str] | None = None) -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        f"the upload is larger than this server accepts ({limit} bytes; see --max-upload-mb)",
        headers=headers,
    )


def _bad(message: str) -> HTTPException:
    return HTTPException(status.HTTP_400_BAD_REQUEST, f"malformed multipart body: {message}")


def refusal(exc: MatrixFormatError, headers: dict[str, str] | None = None) -> HTTPException:
    """The HTTP answer to a file that cannot be read: 413 past a size bound, else 422; ``detail`` names the bound."""
    if isinstance(exc, ReadLimitError):
        code = _STATUS_OF_BOUND.get(exc.bound, status.HTTP_413_CONTENT_TOO_LARGE)
    elif isinstance(exc, MatrixTooLargeError):
        code = status.HTTP_413_CONTENT_TOO_LARGE
    else:
        code = status.HTTP_422_UNPROCESSABLE_CONTENT
    return HTTPException(code, str(exc), headers=headers)


class MatrixTooLargeError(MatrixFormatError):
    """The file's size line announces more rows, columns or entries than the server accepts."""


def check_declared(scan: MtxScan, max_size: int) -> None:
    """MatrixTooLargeError when the size line read by ``scan`` announces more than ``max_size`` of anything."""
    if scan.declared is not None and max(scan.declared) > max_size:
        rows, cols, nnz = scan.declared
        raise MatrixTooLargeError(
            f"{scan.name}: the size line announces {rows} x {cols} with {nnz} entries; this server accepts at "
            f"most {max_size} rows, columns and entries (max_matrix_size)"
        )


class _FileGuard:
    """Checks the file part as it arrives: every line and the size of a plain file; the header, and the
    compressed size against the bound on the decompressed one, of a gzip file (whose body is checked
    when it is read, in the parse, so that the event loop decompresses no more than a header)."""

    def __init__(self, name: str, limits: ReadLimits, max_size: int) -> None:
        self.scan = MtxScan(name, limits)
        self.max_size = max_size
        self.head = b""  # the first bytes, until there are two to tell gzip by
        self.inflater: Inflater | None = None
        self.compressed: bool | None = None
        self.raw = 0

    def feed(self, data: bytes) -> None:
        if self.compressed is None:
            self.head += data
            if len(self.head) < 2:
                return
            data, self.head = self.head, b""
            self.compressed = data[:2] == _GZIP_MAGIC
            self.inflater = Inflater() if self.compressed else None
        self.raw += len(data)
        if self.inflater is None:
            self._scan(data)
        elif not self.scan.header_done:
            try:
                for out in self.inflater.feed(data):
                    self._scan(out)
                    if self.scan.header_done:
                        break
            except zlib.error as e:
                raise MatrixFormatError(f"{self.scan.name}: cannot read the file: {e}") from None
        elif (limit := self.scan.limit) is not None and self.raw > limit + limit // 100 + 65536:
            # deflate never grows data by more than a fraction of a percent (plus headers)
            raise ReadLimitError(
                f"{self.scan.name}: {self.raw} bytes compressed, so more than the {limit} bytes its size line "
                f"allows once decompressed ({self.scan.limits.entry_bytes} bytes an entry besides its header)",
                bound="decompressed size", limit=limit,
            )

    def _scan(self, data: bytes) -> None:
        done = self.scan.header_done
        self.scan.feed(data)
        if self.scan.header_done and not done:
            check_declared(self.scan, self.max_size)


class _Receiver:
    """python-multipart callbacks writing the ``file`` part to ``out`` (through a :class:`_FileGuard`) and
    keeping the other fields."""

    def __init__(self, out: IO[bytes], upload: Upload, guard: tuple[ReadLimits, int]) -> None:
        self.out, self.upload = out, upload
        self.guard_options = guard
        self.guard: _FileGuard | None = None
        self.header_name = bytearray()
        self.header_value = bytearray()
        self.headers: dict[bytes, bytes] = {}
        self.current: str | None = None  # field name of the part being read
        self.value = bytearray()
        self.file_seen = False
        self.ended = False

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": lambda data, start, end: self.header_name.extend(data[start:end]),
            "on_header_value": lambda data, start, end: self.header_value.extend(data[start:end]),
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self.headers, self.current, self.value = {}, None, bytearray()

    def on_header_end(self) -> None:
        self.headers[bytes(self.header_name).lower()] = bytes(self.header_value)
        self.header_name.clear()
        self.header_value.clear()

    def on_headers_finished(self) -> None:
        kind, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        if kind != b"form-data" or b"name" not in options:
            raise _bad("a part without a Content-Disposition: form-data header naming it")
        name = options[b"name"].decode("utf-8", errors="replace")
        if name == FILE_FIELD:
            if self.file_seen:
                raise _bad(f"more than one '{FILE_FIELD}' part")
            self.file_seen = True
            raw = options.get(b"filename", b"upload.mtx").decode("utf-8", errors="replace")
            self.upload.filename = Path(raw.replace("\\", "/")).name[:200] or "upload.mtx"
            self.guard = _FileGuard(self.upload.filename, *self.guard_options)
        elif len(self.upload.fields) >= MAX_FIELDS:
            raise _bad(f"more than {MAX_FIELDS} fields")
        self.current = name

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.current == FILE_FIELD:
            chunk = data[start:end]
            self.out.write(chunk)
            self.upload.size += end - start
            if self.guard is not None:
                self.guard.feed(chunk)
            return
        self.value.extend(data[start:end])
        if len(self.value) > MAX_FIELD_BYTES:
            raise _bad(f"field {self.current!r} is longer than {MAX_FIELD_BYTES} bytes")

    def on_part_end(self) -> None:
        if self.current is not None and self.current != FILE_FIELD:
            try:
                self.upload.fields[self.current] = self.value.decode("utf-8")
            except UnicodeDecodeError:
                raise _bad(f"field {self.current!r} is not UTF-8 text") from None

    def on_end(self) -> None:
        self.ended = True


def body_timed_out(timeout: float) -> HTTPException:
    """408 for a body that did not arrive in time; the connection is closed (the client is too slow to keep)."""
    return HTTPException(
        status.HTTP_408_REQUEST_TIMEOUT,
        f"the request's body did not arrive within {timeout:g} s (body_timeout_s)",
        headers={"Connection": "close"},
    )


@contextlib.asynccontextmanager
async def receive_upload(request: Request, settings: Settings) -> AsyncIterator[Upload]:
    """Stream a ``multipart/form-data`` body with one ``file`` part to the spool folder; the file is removed
    afterwards.

    Raises HTTPException: 413 past ``max_upload_bytes`` or a size bound of the file part (see
    :class:`_FileGuard`), 422 for a line past ``max_line_bytes`` or unreadable gzip data, 408 when the
    body takes longer than ``body_timeout_s``, 400 for a malformed body, 422 for no ``file`` part. A
    request refused while its body still arrives, with no Content-Length to bound the rest, is
    answered with ``Connection: close`` so the server stops reading it.
    """
    spool_dir, max_bytes, timeout = settings.service_dir / "spool", settings.max_upload_bytes, settings.body_timeout_s
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes, {"Connection": "close"})
    close = None if declared is not None else {"Connection": "close"}
    _, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if not boundary:
        raise _bad("the Content-Type header has no boundary")
    spool_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="upload-", suffix=".part", dir=spool_dir)
    upload = Upload(Path(name), "upload.mtx")
    try:
        with os.fdopen(fd, "wb") as out:
            receiver = _Receiver(out, upload, (settings.read_limits, settings.max_matrix_size))
            try:
                with anyio.fail_after(timeout):
                    parser = MultipartParser(boundary, receiver.callbacks())
                    received = 0
                    async for chunk in request.stream():
                        received += len(chunk)
                        if received > max_bytes:
                            raise _too_large(max_bytes, close)
                        parser.write(chunk)
                parser.finalize()
            except TimeoutError:
                raise body_timed_out(timeout) from None
            except MatrixFormatError as exc:
                raise refusal(exc, close) from None
            except FormParserError as exc:
                raise _bad(str(exc)) from None
            except ClientDisconnect:
                raise _bad("the client disconnected before the body ended") from None
        if not receiver.ended:
            raise _bad("the body ends before its closing boundary")
        if not receiver.file_seen:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                f"no '{FILE_FIELD}' part: send the Matrix Market file as multipart field '{FILE_FIELD}'",
            )
        yield upload
    finally:
        upload.path.unlink(missing_ok=True)


# -- reading the uploaded matrix ------------------------------------------------------------------


@dataclass
class ParsedMatrix:
    fingerprint: str
    features: dict[str, float]


def keep_matrix(keep_dir: Path, fingerprint: str, A: Any) -> None:
    """Keep a copy of an uploaded matrix (``<fingerprint>.npz``), so a job can read it when it runs, and a
    later job, or the same one after a restart, can tune it again by fingerprint."""
    target = keep_dir / f"{fingerprint}.npz"
    if target.exists():
        return
    keep_dir.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{fingerprint}.{os.getpid()}.npz")
    try:
        sp.save_npz(temporary, A, compressed=False)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def read_upload(path: Path, *, display_name: str, dtype: str, limits: ReadLimits, max_size: int, scratch: Path,
                keep_dir: Path | None = None) -> ParsedMatrix:
    """The uploaded matrix's fingerprint and features; errors name the upload, not the spool file.

    The file is read through :func:`tuner.matrix.bounds.scan_mtx` first (every bound of ``limits``; gzip data is
    decompressed into a plain copy, ``scratch``, which the caller removes), then parsed by
    :func:`tuner.matrix.io.read_mtx`. With ``keep_dir`` the matrix is kept there (:func:`keep_matrix`). Runs
    in a child process (:mod:`service.parsing`).
    """
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
    source = str(scratch if compressed else path)
    with open(scratch, "wb") if compressed else contextlib.nullcontext() as plain:
        scan = scan_mtx(path, name=display_name, limits=limits, copy_to=plain)
    check_declared(scan, max_size)
    try:
        A = read_mtx(source, dtype=dtype)
    except MatrixFormatError as exc:
        raise type(exc)(str(exc).replace(source, display_name)) from None
    if A.nnz > max_size:
        raise MatrixTooLargeError(f"{display_name}: {A.nnz} entries after symmetry; at most {max_size} accepted")
    fp = fingerprint(A)
    if keep_dir is not None:
        keep_matrix(keep_dir, fp, A)
    return ParsedMatrix(fp, extract_features(A))
