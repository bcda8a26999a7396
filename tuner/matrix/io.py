"""Matrix input and output in one canonical form.

Every other module relies on :func:`as_csr`'s result: a ``scipy.sparse.csr_matrix``
with int32 ``indptr`` and ``indices``, column indices sorted within each row,
duplicates summed (``has_canonical_format``), and C-contiguous float64 or float32
values. Explicitly stored zeros are kept: they are stored entries, and an SpMV
kernel reads them like any other.

Matrix Market files are parsed by ``fast_matrix_market`` (parallel C++); its
errors are turned into :class:`~common.errors.MatrixFormatError` naming the file
and, where it applies, the line. A missing or unreadable file is a
``MatrixFormatError`` too (chained from the ``OSError``), so the CLI and the
service only ever see the project's own errors.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import os
import re
import secrets
import threading
import traceback
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import fast_matrix_market as fmm
import numpy as np
import scipy.sparse as sp

from common.errors import InvalidConfigError, MatrixFormatError
from kernels._narrow import note_narrow_rows
from kernels.csr_vector import note_empty_rows
from tuner.matrix.bounds import GZIP_MAGIC, ReadLimits, scan_mtx

if TYPE_CHECKING:
    from tuner.matrix.structure_gpu import Structure

__all__ = [
    "INDEX_MAX", "as_csr", "as_device_csr", "check_dtype", "dtype_name", "kept_on_device", "matrix_name",
    "read_mtx", "read_mtx_watched", "stays_on_device", "value_dtype", "write_mtx",
]

INDEX_MAX = int(np.iinfo(np.int32).max)
"""Largest row count, column count or nnz that int32 indices and indptr can hold."""

_VALUE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_FMM_LINE = re.compile(r"Line (\d+): (.*)", re.DOTALL)
_FMM_TRUNCATED = re.compile(r"Truncated file\. Expected another (\d+) lines")
_SPACE = 32  # bytes up to the space (whitespace, control characters) separate a line's fields
_COUNT_BYTES = 1 << 20  # bytes whose fields are counted at once (fast_matrix_market reads 1 KiB at a time)
_T = TypeVar("_T")


# --------------------------------------------------------------------------- reading .mtx


def check_dtype(dtype: str) -> str:
    """A value dtype asked for by name (a CLI option, a request): 'float64' or 'float32'."""
    if dtype not in ("float64", "float32"):
        raise InvalidConfigError(f"--dtype {dtype!r} is not supported; choose float64 or float32")
    return dtype


def read_mtx(path: str | os.PathLike[str], *, dtype: Any = None) -> sp.csr_matrix:
    """Read a Matrix Market file (plain or gzip, told by its magic bytes) into canonical CSR.

    Coordinate format only, fields real / integer / pattern (pattern gives ones),
    symmetry general / symmetric / skew-symmetric, mirrored to the full matrix
    like ``scipy.io.mmread``. The header is checked before any entry is read, so
    a complex or too large (int32) matrix fails at once, and its lines are read
    with a bounded length first (:class:`ReadLimits`), so a file without newlines
    fails at once too, rather than being read into memory as one line. NaN and Inf values are
    rejected. Every failure, a missing file included, is a ``MatrixFormatError``
    whose message names the file and, where it applies, the line.

    >>> A = read_mtx("G3_circuit.mtx.gz")  # doctest: +SKIP
    """
    path = os.fspath(path)
    with contextlib.suppress(OSError):  # a missing file: _parse says so
        scan_mtx(path, name=path, limits=ReadLimits(), header_only=True)  # a file without newlines stops here
    header = _parse(path, fmm.read_header, lambda msg: _header_error(path, msg))
    _check_header(path, header)
    (data, (row, col)), shape, fields = _parse(
        path, lambda f: (*fmm.read_coo(f, generalize_symmetry=True), f.fields),
        lambda msg: _body_error(path, header, msg),
    )
    _check_fields(path, header, fields)
    _check_finite(path, data[: header.nnz], row, col)
    return _from_scipy(sp.coo_matrix((data, (row, col)), shape=shape), dtype, None)


def _is_gzip(path: str) -> bool:
    """Whether the file starts with the gzip magic bytes (whatever its name says)."""
    with open(path, "rb") as raw:
        return raw.read(2) == GZIP_MAGIC


def _open(path: str) -> IO[bytes]:
    """Open the file for binary reading, decompressing it when it is gzip data."""
    return gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb")


class _ReadOnly:
    """A binary file with ``read`` alone: fast_matrix_market then never seeks it, which, done when its
    cursor is destroyed on some errors, aborts the process for a plain Python file object.

    It counts the fields of what was read (:attr:`fields`), a MiB at a time: fast_matrix_market
    takes what it needs from a line and skips the rest, so only the count tells extra fields.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._read = stream.read
        self._pending = bytearray()
        self._fields = 0
        self._after_space = True

    def read(self, size: int = -1) -> bytes:
        data = self._read(size)
        self._pending += data
        if len(self._pending) >= _COUNT_BYTES:
            self._count()
        return data

    @property
    def fields(self) -> int:
        """The fields read so far (see :func:`_fields`)."""
        self._count()
        return self._fields

    def _count(self) -> None:
        if self._pending:
            self._fields += _fields(self._pending, after_space=self._after_space)
            self._after_space = self._pending[-1] <= _SPACE
            self._pending = bytearray()


def _fields(data: bytes | bytearray, *, after_space: bool = True) -> int:
    """How many fields begin in ``data``: runs of bytes above the space (``after_space``: whether the bytes
    before ``data`` ended with a separator, so that a field running on from them is not counted again)."""
    solid = np.frombuffer(data, np.uint8) > _SPACE
    return int(np.count_nonzero(solid[1:] > solid[:-1])) + bool(solid.size and solid[0] and after_space)


@contextlib.contextmanager
def _fmm_source(path: str) -> Iterator[Any]:
    """What fast_matrix_market reads: the file (decompressed when it is gzip data) as a read-only stream.

    fast_matrix_market 1.7.6 decompresses by the name's suffix only, hence the magic bytes here; and a
    stream rather than the path, which its own C++ reader would open, because that reader holds the
    GIL to the end (no progress can be shown meanwhile: :func:`read_mtx_watched`).
    """
    with _open(path) as stream:
        yield _ReadOnly(stream)


def _parse(
    path: str, read: Callable[[str | IO[bytes]], _T], explain: Callable[[str], MatrixFormatError]
) -> _T:
    """Run a fast_matrix_market reader on the file; its errors become ``explain(message)``."""
    try:
        with _fmm_source(path) as source:
            try:
                return read(source)
            except BaseException as e:
                # fast_matrix_market's cursor, kept alive by the traceback, seeks a stream when it is
                # destroyed: destroy it now, while the stream is open (else the process aborts).
                traceback.clear_frames(e.__traceback__)
                raise
    except FileNotFoundError as e:
        raise MatrixFormatError(f"{path}: file not found") from e
    except (OSError, EOFError, zlib.error) as e:
        raise MatrixFormatError(f"{path}: cannot read the file: {e}") from e
    except (ValueError, OverflowError) as e:
        raise explain(str(e)) from e


def _raw_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """The file's lines as bytes, numbered from 1: a light scan, used to check a header and explain an error."""
    with _open(path) as stream:
        yield from enumerate(stream, 1)


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """The file's lines as text, numbered from 1, without surrounding whitespace."""
    for number, line in _raw_lines(path):
        yield number, line.decode("utf-8", errors="replace").strip()


def _size_line(path: str) -> int:
    """Number of the header's size line: the first line after the banner that is not a comment."""
    number = 0
    for number, text in _lines(path):
        if number > 1 and text and not text.startswith("%"):
            return number
    return number + 1


def _line_count(path: str) -> int:
    """Number of lines in the file (a light scan, used only to explain an error)."""
    return sum(1 for _ in _lines(path))


def _header_error(path: str, message: str) -> MatrixFormatError:
    """A header error, with the line fast_matrix_market named or else the size line."""
    if next(_lines(path), None) is None:
        return MatrixFormatError(f"{path}: the file is empty")
    numbered = _FMM_LINE.fullmatch(message)
    if numbered:
        return MatrixFormatError(f"{path}, line {numbered[1]}: malformed header: {numbered[2]}")
    return MatrixFormatError(f"{path}, line {_size_line(path)}: malformed size line: {message}")


def _body_error(path: str, header: fmm.header, message: str) -> MatrixFormatError:
    """An entry error, with its line; index errors also say which index, its value and the shape."""
    truncated = _FMM_TRUNCATED.match(message)
    if truncated:
        found = header.nnz - int(truncated[1])
        return MatrixFormatError(
            f"{path}, line {_line_count(path)}: too few entries: the header announces {header.nnz}, "
            f"the file ends after {found}"
        )
    numbered = _FMM_LINE.fullmatch(message)
    if not numbered:
        return MatrixFormatError(f"{path}: {message}")
    number, detail = int(numbered[1]), numbered[2]
    if "index out of bounds" in detail:
        detail = _index_detail(path, header, number, detail)
    return MatrixFormatError(f"{path}, line {number}: {detail}")


def _index_detail(path: str, header: fmm.header, number: int, detail: str) -> str:
    """Say which index of entry line ``number`` is out of range, its value, and the shape."""
    which = "row" if detail.startswith("Row") else "column"
    text = next((text for n, text in _lines(path) if n == number), "")
    fields = text.split()
    value = fields[0 if which == "row" else 1] if len(fields) > 1 else "?"
    limit = header.nrows if which == "row" else header.ncols
    return (
        f"{which} index {value} is out of range 1..{limit} "
        f"for a {header.nrows} x {header.ncols} matrix (line: {text!r})"
    )


def _check_header(path: str, header: fmm.header) -> None:
    """Reject, before reading any entry, what the canonical form cannot hold."""
    if header.field == "complex":
        raise MatrixFormatError(f"{path}: complex values are not supported (field 'complex')")
    if header.format != "coordinate":
        raise MatrixFormatError(
            f"{path}: the '{header.format}' (dense) format is not supported; store the matrix as 'coordinate'"
        )
    mirrored = header.symmetry != "general"
    entries = 2 * header.nnz if mirrored else header.nnz
    if max(header.nrows, header.ncols, entries) > INDEX_MAX:
        expansion = f" (up to {entries} once the {header.symmetry} storage is mirrored)" if mirrored else ""
        raise MatrixFormatError(
            f"{path}, line {_size_line(path)}: a {header.nrows} x {header.ncols} matrix with "
            f"{header.nnz} stored entries{expansion} does not fit 32-bit indices "
            f"(at most {INDEX_MAX} rows, columns and entries)"
        )


def _check_fields(path: str, header: fmm.header, fields: int) -> None:
    """Every entry line holds exactly the fields the header's field says: 2 (pattern) or 3 (with a value).

    ``fields``, the count of the whole file, must be the header's plus that many per entry (blank lines
    hold none); only when it is not are the lines read again, to name the first that is wrong.
    """
    per_line = 2 if header.field == "pattern" else 3
    lines = _raw_lines(path)
    in_header = sum(_fields(line) for _, line in itertools.islice(lines, _size_line(path)))
    if fields == in_header + per_line * header.nnz:
        return
    what = "row, column" if per_line == 2 else "row, column, value"
    for number, line in lines:
        if (found := _fields(line)) not in (0, per_line):
            raise MatrixFormatError(f"{path}, line {number}: {found} fields where a '{header.field}' entry has "
                                    f"{per_line} ({what})")
    raise MatrixFormatError(f"{path}: {fields - in_header} fields in {header.nnz} entries of {per_line} ({what})")


def _check_finite(path: str, stored: np.ndarray, row: np.ndarray, col: np.ndarray) -> None:
    """Reject NaN and Inf among the stored values (the file's own entries, in file order)."""
    bad = np.flatnonzero(~np.isfinite(stored))
    if bad.size:
        k = bad[0]
        raise MatrixFormatError(
            f"{path}: {bad.size} NaN or Inf value(s); the first is {stored[k]} "
            f"at row {row[k] + 1}, column {col[k] + 1} (1-based, as in the file)"
        )


# --------------------------------------------------------------------------- any input → CSR


def as_csr(A: Any, *, dtype: Any = None, shape: tuple[int, int] | None = None) -> sp.csr_matrix:
    """Turn any supported matrix into the canonical CSR form; the input is never modified.

    Accepts a path (read with :func:`read_mtx`), a SciPy sparse matrix or array of
    any format and index dtype, a CuPy sparse matrix (copied to the host), or an
    ``(indptr, indices, data)`` triple (shape from ``shape=``, else
    ``len(indptr) - 1`` rows and ``max(indices) + 1`` columns). For the other
    inputs ``shape=``, when given, must match.

    ``dtype``: None keeps float32 and turns every other real type (float64,
    integer, bool) into float64; ``'float32'`` or ``'float64'`` converts.

    >>> as_csr(([0, 1, 2], [1, 0], [3.0, 4.0])).toarray()
    array([[0., 3.],
           [4., 0.]])
    """
    if isinstance(A, str | os.PathLike):
        return _check_shape(read_mtx(A, dtype=dtype), shape)
    if type(A).__module__.startswith("cupy"):
        return as_csr(_from_cupy(A), dtype=dtype, shape=shape)
    if sp.issparse(A):
        return _from_scipy(A, dtype, shape)
    if isinstance(A, tuple) and len(A) == 3:
        return _from_triple(*A, dtype=dtype, shape=shape)
    if isinstance(A, np.ndarray) or hasattr(A, "__array__"):
        raise MatrixFormatError(
            f"dense {type(A).__name__} given: pass a sparse matrix (e.g. scipy.sparse.csr_matrix(A))"
        )
    raise MatrixFormatError(
        f"unsupported matrix input of type {type(A).__module__}.{type(A).__qualname__}: pass a path, "
        "a SciPy or CuPy sparse matrix, or an (indptr, indices, data) tuple"
    )


def as_device_csr(A: Any, *, dtype: Any = None) -> Any:
    """The canonical CSR form of :func:`as_csr`, on the GPU (a ``cupyx.scipy.sparse.csr_matrix``).

    A canonical CuPy CSR matrix with int32 indices stays where it is: no copy
    through the host, only its values converted on the GPU when ``dtype``
    asks for another type (canonical, and its values finite: one pass over it,
    :func:`tuner.matrix.structure_gpu.structure_pass`). Anything else goes through
    :func:`as_csr`, then to the GPU.
    """
    import cupyx.scipy.sparse as cusp

    from tuner.matrix.structure_gpu import structure_pass

    if stays_on_device(A):
        found = structure_pass(A.indptr, A.indices, values=A.data)
        if found.canonical:
            return kept_on_device(A, dtype, found)
    B = cusp.csr_matrix(as_csr(A, dtype=dtype))  # canonical on the host, so on the GPU
    B.has_canonical_format = True  # CuPy's own flag: its check (a thread a row, then a reduction) never runs on B
    return B


def kept_on_device(A: Any, dtype: Any, found: Structure) -> Any:
    """``A``, a CuPy CSR matrix of int32 indices that :func:`~tuner.matrix.structure_gpu.structure_pass` found
    canonical (``found``), as :func:`as_device_csr` gives it: in ``dtype`` (its values converted on the GPU where
    they are of another type), flagged canonical, with the pass's count of narrow rows
    (:func:`kernels._narrow.note_narrow_rows`) and of empty rows (:func:`kernels.csr_vector.note_empty_rows`);
    MatrixFormatError where its values are not real, it holds more entries than int32 can count, or NaN or Inf
    values (naming the first)."""
    import cupyx.scipy.sparse as cusp

    wanted = value_dtype(np.dtype(A.dtype), dtype)
    _check_index_range(A.shape, A.nnz)
    if found.nonfinite:
        _check_finite_values(A.data, A.indptr, A.indices)
    B = A if wanted == A.dtype else cusp.csr_matrix((A.data.astype(wanted), A.indices, A.indptr), shape=A.shape)
    B.has_canonical_format = True
    note_narrow_rows(B, found.narrow_rows)
    note_empty_rows(B, B.shape[0] - found.nonempty_rows)
    return B


def stays_on_device(A: Any) -> bool:
    """Whether :func:`as_device_csr` may keep ``A`` where it is, if canonical: a CuPy CSR matrix with int32
    ``indptr`` and ``indices`` (no import of CuPy for anything else)."""
    return (type(A).__module__.startswith("cupyx") and getattr(A, "format", None) == "csr"
            and A.indptr.dtype == np.int32 and A.indices.dtype == np.int32)


def _from_cupy(A: Any) -> Any:
    """Copy a CuPy sparse matrix to the host (CuPy is imported only when one is given)."""
    import cupyx.scipy.sparse

    if not cupyx.scipy.sparse.issparse(A):
        raise MatrixFormatError(f"dense {type(A).__name__} given: pass a sparse matrix (cupyx.scipy.sparse)")
    return A.get()


def _from_scipy(A: Any, dtype: Any, shape: tuple[int, int] | None) -> sp.csr_matrix:
    """Canonical CSR from a SciPy sparse matrix or array of any format."""
    _check_shape(A, shape)
    values_as = value_dtype(A.dtype, dtype)
    _check_index_range(A.shape, 0)  # before tocsr, which would allocate shape[0] + 1 row pointers
    B = A.tocsr(copy=True)
    return _canonical(B.indptr, B.indices, B.data, B.shape, values_as)


def _from_triple(
    indptr: Any, indices: Any, data: Any, *, dtype: Any, shape: tuple[int, int] | None
) -> sp.csr_matrix:
    """Canonical CSR from validated ``(indptr, indices, data)`` array-likes (copied, never shared)."""
    indptr = _index_array(indptr, "indptr")
    indices = _index_array(indices, "indices")
    data = np.asarray(data)
    if data.ndim != 1 or len(data) != len(indices):
        raise MatrixFormatError(
            f"data must be 1-D with one value per index: shape {data.shape} for {len(indices)} indices"
        )
    values_as = value_dtype(data.dtype, dtype)
    shape = _triple_shape(indptr, indices, shape)
    _validate_triple(indptr, indices, shape)
    _check_index_range(shape, len(indices))
    return _canonical(
        indptr.astype(np.int32), indices.astype(np.int32), data.astype(values_as), shape, values_as
    )


def _index_array(values: Any, name: str) -> np.ndarray:
    """A 1-D integer array (an empty array-like counts as integer)."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise MatrixFormatError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise MatrixFormatError(f"{name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _triple_shape(indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int] | None) -> tuple[int, int]:
    """The given shape, else ``len(indptr) - 1`` rows and ``max(indices) + 1`` columns."""
    if shape is None:
        return len(indptr) - 1, max(int(indices.max(initial=-1)) + 1, 0)
    rows, cols = (int(size) for size in shape)
    if rows < 0 or cols < 0:
        raise MatrixFormatError(f"shape must not be negative, got {tuple(shape)}")
    return rows, cols


def _validate_triple(indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int]) -> None:
    """Check that ``indptr`` and ``indices`` describe a valid CSR structure of ``shape``."""
    rows, cols = shape
    if len(indptr) == 0 or indptr[0] != 0:
        raise MatrixFormatError(f"indptr must start at 0, got {indptr[:1].tolist() or 'an empty indptr'}")
    if len(indptr) != rows + 1:
        raise MatrixFormatError(f"shape {shape} needs an indptr of length {rows + 1}, got {len(indptr)}")
    if indptr[-1] != len(indices):
        raise MatrixFormatError(f"indptr ends at {indptr[-1]} but there are {len(indices)} indices")
    drops = np.flatnonzero(np.diff(indptr) < 0)
    if drops.size:
        i = drops[0]
        raise MatrixFormatError(
            f"indptr must be non-decreasing: indptr[{i}] = {indptr[i]} > indptr[{i + 1}] = {indptr[i + 1]}"
        )
    outside = np.flatnonzero((indices < 0) | (indices >= cols))
    if outside.size:
        k = outside[0]
        row = int(np.searchsorted(indptr, k, side="right")) - 1
        raise MatrixFormatError(
            f"column index {indices[k]} (indices[{k}], row {row}) is out of range 0..{cols - 1} "
            f"for shape {shape}"
        )


def dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, at once for the value dtypes: NumPy's is Python code, some 0.03 ms each time ``plan()``
    asked it on the GPU machines' hosts."""
    return _VALUE_NAMES.get(dtype) or str(dtype)


_VALUE_NAMES = {dtype: str(dtype) for dtype in _VALUE_DTYPES}


def value_dtype(current: np.dtype, requested: Any) -> np.dtype:
    """The canonical value dtype for values of ``current`` dtype and the ``dtype=`` argument."""
    if current.kind == "c":
        raise MatrixFormatError("complex values are not supported")
    if current.kind not in "biuf":
        raise MatrixFormatError(f"values of dtype {current} are not supported: give real numbers")
    if requested is None:
        return np.dtype(np.float32) if current == np.float32 else np.dtype(np.float64)
    try:
        wanted = np.dtype(requested)
    except TypeError as e:
        raise MatrixFormatError(f"unknown dtype {requested!r}: use 'float32' or 'float64'") from e
    if wanted not in _VALUE_DTYPES:
        raise MatrixFormatError(f"dtype {wanted} is not supported: use 'float32' or 'float64'")
    return wanted


def _check_index_range(shape: tuple[int, int], nnz: int) -> None:
    """Reject a shape or an nnz that int32 indices and indptr cannot hold."""
    if max(*shape, nnz) > INDEX_MAX:
        raise MatrixFormatError(
            f"a {shape[0]} x {shape[1]} matrix with {nnz} stored entries does not fit 32-bit indices "
            f"(at most {INDEX_MAX} rows, columns and entries)"
        )


def _check_shape(A: Any, shape: tuple[int, int] | None) -> Any:
    """Return ``A`` when ``shape`` is None or matches its shape, else raise."""
    if shape is not None and tuple(A.shape) != tuple(shape):
        raise MatrixFormatError(f"shape={tuple(shape)} given, but the matrix is {A.shape[0]} x {A.shape[1]}")
    return A


def _canonical(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, shape: tuple[int, int], dtype: np.dtype
) -> sp.csr_matrix:
    """Build the canonical CSR from arrays this module owns (they may be sorted in place)."""
    _check_index_range(shape, len(indices))
    A = sp.csr_matrix(
        (
            np.ascontiguousarray(data, dtype=dtype),
            indices.astype(np.int32, copy=False),
            indptr.astype(np.int32, copy=False),
        ),
        shape=shape,
        copy=False,
    )
    A.sum_duplicates()  # sorts each row's indices too
    _check_finite_values(A.data, A.indptr, A.indices)
    return A


def _check_finite_values(data: Any, indptr: Any, indices: Any) -> None:
    """Reject NaN and Inf among a CSR matrix's values (NumPy or CuPy arrays: on the GPU only where
    :func:`~tuner.matrix.structure_gpu.structure_pass` counted some), naming how many and where the first is:
    a product with them would only spread them through y, and no kernel's result could be checked against a
    reference."""
    if isinstance(data, np.ndarray):
        xp = np
    else:
        import cupy as xp
    bad = xp.flatnonzero(~xp.isfinite(data))  # one pass, as _check_finite's over a file's values
    if bad.size:
        k = int(bad[0])
        row = int(xp.searchsorted(indptr, k, side="right")) - 1
        raise MatrixFormatError(f"the matrix holds {bad.size} NaN or Inf value(s); the first is {float(data[k])} at "
                                f"row {row}, column {int(indices[k])} (0-based)")


# --------------------------------------------------------------------------- writing and naming


def write_mtx(path: str | os.PathLike[str], A: Any, *, comment: str = "") -> None:
    """Write ``A`` (anything :func:`as_csr` takes) as a general coordinate real Matrix Market file.

    Gzip-compressed when the path ends with ``.gz``. The file is written to a
    temporary name in the same directory and then renamed over ``path``, so a
    crash never leaves a half-written file behind; an ``OSError`` while writing
    propagates and leaves any earlier file at ``path`` as it was.
    """
    A = as_csr(A)
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(temporary, "xb") as raw:
            with _compressing(raw, target.name) as stream:
                fmm.mmwrite(stream, A, comment=comment, field="real", symmetry="general")
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _compressing(raw: IO[bytes], name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
    """The stream to write through: gzip when the target's name ends with ``.gz``, else ``raw``."""
    if name.endswith(".gz"):
        return gzip.GzipFile(name, "wb", fileobj=raw)
    return contextlib.nullcontext(raw)


def matrix_name(source: Any) -> str:
    """A human name: the file name without ``.mtx`` / ``.mtx.gz`` for a path, else the class name."""
    if isinstance(source, str | os.PathLike):
        name = Path(source).name
        for suffix in (".mtx.gz", ".mtx"):
            if name.endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)]
        return name
    return type(source).__name__


# --------------------------------------------------------------------------- reading with progress


def read_mtx_watched(
    path: str | os.PathLike[str], *, dtype: Any = None, on_progress: Callable[[int, int], None], every: float = 0.2
) -> sp.csr_matrix:
    """:func:`read_mtx` in a worker thread, calling ``on_progress(position, size)`` every ``every`` seconds meanwhile.

    ``position`` is how far into the file (its compressed bytes, for gzip) the reader is, from the
    descriptors this process holds on it (``/proc/self/fdinfo``: Linux; elsewhere it stays 0). For a
    progress bar on a large file, whose size nothing caps on the command line.
    """
    try:
        size, real = os.path.getsize(path), os.path.realpath(path)
    except OSError:
        return read_mtx(path, dtype=dtype)  # it says what is wrong
    outcome: list[Any] = []

    def read() -> None:  # fast_matrix_market lets go of the GIL between reads of the stream
        try:
            outcome.append(read_mtx(path, dtype=dtype))
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)

    worker = threading.Thread(target=read, name="read_mtx", daemon=True)  # a daemon: Ctrl-C does not wait for it
    worker.start()
    while True:
        worker.join(every)
        if not worker.is_alive():
            break
        on_progress(_position(real), size)
    on_progress(size, size)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _position(real: str) -> int:
    """The furthest position of this process's descriptors open on the file ``real`` (0 where unknown)."""
    furthest = 0
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if os.readlink(f"/proc/self/fd/{fd}") == real:
                    with open(f"/proc/self/fdinfo/{fd}") as info:
                        furthest = max(furthest, int(info.readline().split()[1]))
    return furthest
