"""Bounded reading of Matrix Market files: what an upload may cost before and while it is parsed.

:class:`ReadLimits` bounds a file's lines, header, announced size and
decompressed bytes; :class:`Inflater` decompresses gzip in bounded steps, so a
bomb never expands past one step; :class:`MtxScan` checks bytes as they come
(the service's uploads, as they stream in) and :func:`scan_mtx` a whole file.
:func:`tuner.matrix.io.read_mtx` reads a file's header through it, so a file
without newlines fails at its first line, not after filling memory.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

from common.errors import MatrixFormatError

__all__ = ["GZIP_MAGIC", "Inflater", "MtxScan", "ReadLimitError", "ReadLimits", "scan_mtx"]

GZIP_MAGIC = b"\x1f\x8b"
"""The first bytes of a gzip file."""



_CHUNK = 1 << 20  # bytes read, and at most decompressed, at once
_NEWLINE = 10


class ReadLimitError(MatrixFormatError):
    """A file crossed one of the bounds of :class:`ReadLimits`: ``bound`` names it, ``limit`` is its value."""

    def __init__(self, message: str, *, bound: str = "", limit: int = 0) -> None:
        super().__init__(message)
        self.bound, self.limit = bound, limit


@dataclass(frozen=True)
class ReadLimits:
    """Bounds on a Matrix Market file's decompressed bytes, checked as they are read (None: no bound).

    ``line_bytes``: any one line, so a file without newlines is cut there and not read as one huge
    line. ``header_bytes``: the banner, comments and size line together. ``entry_bytes``: bytes a file
    may hold per entry its size line announces (at most ``max_entries`` of them; ``max_entries``
    too when the size line is unreadable), besides its header: a bound on the whole file, however
    well it compresses. :func:`read_mtx` applies the default, a 1 MiB line, to the header alone.
    """

    line_bytes: int | None = 1 << 20
    header_bytes: int | None = None
    entry_bytes: int | None = None
    max_entries: int | None = None


class Inflater:
    """Gzip data (every member) decompressed in steps of at most ``_CHUNK`` bytes, so a bomb never
    expands in memory at once."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(31)
        self._fresh = True  # the current member has had no input yet

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decompressed bytes of ``data``, chunk by chunk; ``zlib.error`` for data that is not gzip."""
        while data:
            self._fresh = False
            out = self._d.decompress(data, _CHUNK)
            data = self._d.unconsumed_tail
            if self._d.eof:
                data = self._d.unused_data + data
                self._d, self._fresh = zlib.decompressobj(31), True
            if out:
                yield out

    @property
    def complete(self) -> bool:
        """Whether the data so far ends at the end of a gzip member."""
        return self._fresh


class MtxScan:
    """Checks a file's decompressed bytes against ``limits`` as they come (:meth:`feed`), reading its size line.

    Raises :class:`ReadLimitError`, naming ``name``, the line and the bound, at the chunk that crosses
    a bound, so the rest of the file is never read. ``declared`` is the size line's (rows, cols,
    entries) once read (None while in the header, or when the line is not three integers, which
    the parser then explains); ``limit`` the bytes the whole file may hold, known from then on.
    """

    def __init__(self, name: str, limits: ReadLimits) -> None:
        self.name, self.limits = name, limits
        self.header_done = False
        self.declared: tuple[int, int, int] | None = None
        self.limit: int | None = None
        self.total = 0  # decompressed bytes fed
        self._line = 1  # number of the line being read
        self._run = 0  # bytes of that line so far (body)
        self._pending = bytearray()  # that line so far (header)

    def feed(self, data: bytes) -> None:
        start = 0 if self.header_done else self._header(data)
        self.total += len(data)
        if self.limit is not None and self.total > self.limit:
            entries = "its size line announces" if self.declared else "this server accepts"
            n = self.declared[2] if self.declared else self.limits.max_entries
            raise ReadLimitError(
                f"{self.name}: more than {self.limit} bytes once decompressed ({entries} {n} entries, and a file "
                f"may hold {self.limits.entry_bytes} bytes an entry besides its header)",
                bound="decompressed size", limit=self.limit,
            )
        if start < len(data):
            self._body(memoryview(data)[start:])

    def _too_long(self, line: int) -> ReadLimitError:
        limit = self.limits.line_bytes or 0
        return ReadLimitError(f"{self.name}, line {line}: longer than {limit} bytes (the bound on a line's length: "
                              "a Matrix Market line is a few dozen bytes)", bound="line length", limit=limit)

    def _header(self, data: bytes) -> int:
        """Read header lines from ``data``; where the body starts in it (``len(data)`` while in the header)."""
        pos, lines, most = 0, self.limits.line_bytes, self.limits.header_bytes
        while pos < len(data):
            newline = data.find(b"\n", pos)
            end = len(data) if newline < 0 else newline
            self._pending += data[pos:end]
            if lines is not None and len(self._pending) > lines:
                raise self._too_long(self._line)
            if most is not None and self.total + end > most:
                raise ReadLimitError(f"{self.name}: no size line within the first {most} bytes (the bound on "
                                     "the header: banner, comments and size line)", bound="header size", limit=most)
            if newline < 0:
                return len(data)
            pos = newline + 1
            self._header_line(bytes(self._pending), end=self.total + pos)
            self._pending.clear()
            self._line += 1
            if self.header_done:
                return pos
        return pos

    def _header_line(self, line: bytes, *, end: int) -> None:
        text = line.strip()
        if self._line == 1 or not text or text.startswith(b"%"):
            return  # the banner, a comment or a blank line
        self.header_done = True
        fields = text.split()
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            rows, cols, nnz = (int(f) for f in fields)
            self.declared = (rows, cols, nnz)
        entries = self.declared[2] if self.declared else self.limits.max_entries
        if self.limits.max_entries is not None and entries is not None:
            entries = min(entries, self.limits.max_entries)
        if self.limits.entry_bytes is not None and entries is not None:
            self.limit = end + self.limits.entry_bytes * max(entries, 1)

    def _body(self, data: memoryview) -> None:
        """Check the length of every line in ``data`` (a vectorized search for newlines)."""
        limit = self.limits.line_bytes
        if limit is None:
            return
        newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == _NEWLINE)
        if not newlines.size:
            self._run += len(data)
            if self._run > limit:
                raise self._too_long(self._line)
            return
        if self._run + newlines[0] > limit:
            raise self._too_long(self._line)
        if newlines.size > 1:
            gaps = np.diff(newlines) - 1
            k = int(np.argmax(gaps))
            if gaps[k] > limit:
                raise self._too_long(self._line + k + 1)
        self._line += newlines.size
        self._run = len(data) - int(newlines[-1]) - 1
        if self._run > limit:
            raise self._too_long(self._line)


def scan_mtx(
    path: str | os.PathLike[str], *, name: str, limits: ReadLimits, copy_to: IO[bytes] | None = None,
    header_only: bool = False,
) -> MtxScan:
    """Read a file (plain or gzip) through :class:`MtxScan`, in bounded chunks; stop at the first bound crossed.

    ``copy_to`` gets the decompressed bytes (a plain copy for the parser); ``header_only`` stops at
    the size line. Unreadable gzip data is a MatrixFormatError naming ``name``.
    """
    scan = MtxScan(name, limits)
    with open(path, "rb") as raw:
        inflater = Inflater() if raw.read(2) == GZIP_MAGIC else None
        raw.seek(0)
        try:
            while chunk := raw.read(_CHUNK):
                for data in inflater.feed(chunk) if inflater else (chunk,):
                    scan.feed(data)
                    if copy_to is not None:
                        copy_to.write(data)
                    if header_only and scan.header_done:
                        return scan
        except zlib.error as e:
            raise MatrixFormatError(f"{name}: cannot read the file: {e}") from None
    if inflater is not None and not inflater.complete and not header_only:
        raise MatrixFormatError(f"{name}: cannot read the file: the compressed data ends before its end marker")
    return scan
