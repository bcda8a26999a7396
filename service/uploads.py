"""Uploads: a multipart body streamed to a file on disk under a hard size limit, then read as a matrix.

The body is never held in memory: each chunk goes to a temporary file in the
service's spool folder as it arrives, and the request fails with 413 the
moment the body passes the limit (or at once, when its Content-Length says
it will). The file is then read by :func:`tuner.matrix.io.read_mtx` in a worker
thread, after a look at the size line so that a small file announcing a huge
matrix is refused before anything is allocated.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import tempfile
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fastapi import HTTPException, Request, status
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from common.errors import MatrixFormatError
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.io import read_mtx

FILE_FIELD = "file"
MAX_FIELDS = 16
MAX_FIELD_BYTES = 16 * 1024
_HEADER_SCAN_LINES = 10_000


@dataclass
class Upload:
    """A received multipart body: the file part on disk and the small text fields."""

    path: Path
    filename: str
    size: int = 0
    fields: dict[str, str] = field(default_factory=dict)


def _too_large(limit: int) -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        f"the upload is larger than this server accepts ({limit} bytes; see --max-upload-mb)",
    )


def _bad(message: str) -> HTTPException:
    return HTTPException(status.HTTP_400_BAD_REQUEST, f"malformed multipart body: {message}")


class _Receiver:
    """python-multipart callbacks writing the ``file`` part to ``out`` and keeping the other fields."""

    def __init__(self, out: IO[bytes], upload: Upload) -> None:
        self.out, self.upload = out, upload
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
        elif len(self.upload.fields) >= MAX_FIELDS:
            raise _bad(f"more than {MAX_FIELDS} fields")
        self.current = name

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.current == FILE_FIELD:
            self.out.write(data[start:end])
            self.upload.size += end - start
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


@contextlib.asynccontextmanager
async def receive_upload(request: Request, *, spool_dir: Path, max_bytes: int) -> AsyncIterator[Upload]:
    """Stream a ``multipart/form-data`` body with one ``file`` part to disk; the file is removed afterwards.

    Raises HTTPException: 413 past ``max_bytes``, 400 for a malformed body or no ``file`` part.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    _, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if not boundary:
        raise _bad("the Content-Type header has no boundary")
    spool_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="upload-", suffix=".part", dir=spool_dir)
    upload = Upload(Path(name), "upload.mtx")
    try:
        with os.fdopen(fd, "wb") as out:
            receiver = _Receiver(out, upload)
            try:
                parser = MultipartParser(boundary, receiver.callbacks())
                received = 0
                async for chunk in request.stream():
                    received += len(chunk)
                    if received > max_bytes:
                        raise _too_large(max_bytes)
                    parser.write(chunk)
                parser.finalize()
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


class MatrixTooLargeError(MatrixFormatError):
    """The file's size line announces more rows, columns or entries than the server accepts."""


@dataclass
class ParsedMatrix:
    A: Any
    fingerprint: str
    features: dict[str, float]


def _declared_size(path: Path) -> tuple[int, ...] | None:
    """rows, cols, nnz from the size line of a coordinate file (plain or gzip), or None if not found."""
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    try:
        with gzip.open(path, "rb") if gz else open(path, "rb") as stream:
            for number, line in enumerate(stream):
                if number >= _HEADER_SCAN_LINES:
                    return None
                text = line.strip()
                if number == 0 or not text or text.startswith(b"%"):
                    continue
                fields = text.split()
                return tuple(int(f) for f in fields[:3]) if len(fields) == 3 else None
    except (OSError, EOFError, zlib.error, ValueError):
        return None  # read_mtx says what is wrong
    return None


def read_upload(path: Path, *, display_name: str, dtype: str, max_size: int) -> ParsedMatrix:
    """The uploaded matrix with its fingerprint and features; errors name the upload, not the spool file.

    Runs in a worker thread (parsing a large file takes seconds).
    """
    try:
        declared = _declared_size(path)
        if declared is not None and max(declared) > max_size:
            raise MatrixTooLargeError(
                f"{path}: the size line announces {declared[0]} x {declared[1]} with {declared[2]} entries; "
                f"this server accepts at most {max_size} rows, columns and entries"
            )
        A = read_mtx(path, dtype=dtype)
        if A.nnz > max_size:
            raise MatrixTooLargeError(f"{path}: {A.nnz} entries after symmetry; at most {max_size} accepted")
    except MatrixFormatError as exc:
        raise type(exc)(str(exc).replace(str(path), display_name)) from None
    return ParsedMatrix(A, fingerprint(A), extract_features(A))
