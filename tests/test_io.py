"""tuner.matrix.io: reading .mtx files, the canonical CSR form, as_csr's inputs, write_mtx, matrix_name."""

from __future__ import annotations

import copy
import gzip
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

import tuner.matrix.io
from common.errors import MatrixFormatError
from tests.conftest import shared_manifest
from tuner.matrix.io import as_csr, matrix_name, read_mtx, write_mtx

BANNER = "%%MatrixMarket matrix coordinate real general\n"


def assert_canonical(A: sp.csr_matrix, dtype: type = np.float64) -> None:
    """Check the canonical form independently of SciPy's flags: int32, sorted, no duplicates."""
    assert type(A) is sp.csr_matrix
    assert A.indptr.dtype == np.int32 and A.indices.dtype == np.int32
    assert A.data.dtype == dtype and A.data.flags.c_contiguous
    assert len(A.indptr) == A.shape[0] + 1 and A.indptr[0] == 0 and A.indptr[-1] == len(A.indices)
    rows = np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))
    keys = rows * A.shape[1] + A.indices
    assert np.all(np.diff(keys) > 0), "column indices not strictly increasing within rows"
    assert A.has_canonical_format


def write(tmp_path: Path, text: str, name: str = "m.mtx") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- the shared matrices


@pytest.mark.parametrize("row", shared_manifest(), ids=lambda row: row["name"])
def test_shared_matrix_matches_scipy(shared_dir: Path, row: dict[str, str]) -> None:
    path = shared_dir / row["file"]
    if row["field"] == "complex":
        with pytest.raises(MatrixFormatError, match="complex") as info:
            read_mtx(path)
        assert row["file"] in str(info.value)
        return
    A = read_mtx(path)
    assert_canonical(A)
    expected = scipy.io.mmread(gzip.open(path)).tocsr()
    expected.sum_duplicates()
    assert A.shape == expected.shape == (int(row["rows"]), int(row["cols"]))
    assert A.nnz == expected.nnz
    np.testing.assert_array_equal(A.indptr, expected.indptr)
    np.testing.assert_array_equal(A.indices, expected.indices)
    np.testing.assert_allclose(A.data, expected.data, rtol=1e-15, atol=0)
    per_row = np.diff(A.indptr)
    assert per_row.max(initial=0) == int(row["npr_max"])
    assert np.count_nonzero(per_row == 0) == int(row["empty_rows"])


# --------------------------------------------------------------------------- malformed files


MALFORMED = {
    "bad banner": ("%%MatrixMarkt matrix coordinate real general\n2 2 1\n1 1 1\n", ["line 1", "banner"]),
    "no banner": ("2 2 1\n1 1 1\n", ["line 1", "banner"]),
    "bad field": ("%%MatrixMarket matrix coordinate foo general\n2 2 1\n1 1 1\n", ["line 1", "foo"]),
    "bad size line": (BANNER + "% a comment\n2 x 1\n1 1 1\n", ["line 3", "size line"]),
    "short size line": (BANNER + "2 2\n1 1 1\n", ["line 2", "size line"]),
    "negative size": (BANNER + "-2 2 1\n1 1 1\n", ["line 2", "negative"]),
    "non-numeric value": (BANNER + "%\n%\n3 3 3\n1 1 1.0\n2 2 abc\n3 3 1\n", ["line 6", "floating-point"]),
    "non-integer index": (BANNER + "3 3 2\n1 1 1\n2.5 2 1\n", ["line 4", "integer"]),
    "column out of range": (BANNER + "3 3 2\n1 1 1\n2 4 2\n", ["line 4", "column index 4", "3 x 3"]),
    "row index 0": (BANNER + "3 3 2\n1 1 1\n0 1 2\n", ["line 4", "row index 0", "3 x 3"]),
    "too few entries": (BANNER + "3 3 3\n1 1 1\n2 2 2\n", ["line 4", "too few entries", "announces 3"]),
    "too many entries": (BANNER + "3 3 1\n1 1 1\n2 2 2\n", ["line 4", "too long"]),
    "empty file": ("", ["empty"]),
    "complex": (
        "%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 1 1 2\n",
        ["complex values are not supported"],
    ),
    "hermitian": (
        "%%MatrixMarket matrix coordinate complex hermitian\n2 2 1\n2 1 1 2\n",
        ["complex values are not supported"],
    ),
    "dense array": ("%%MatrixMarket matrix array real general\n2 1\n1\n2\n", ["array", "coordinate"]),
    "NaN and Inf": (BANNER + "3 3 3\n1 1 1\n2 1 nan\n3 3 -inf\n", ["2 NaN or Inf", "row 2, column 1"]),
    "extra field": (BANNER + "3 3 2\n1 1 1.0 extra\n2 2 2\n", ["line 3", "4 fields", "'real' entry has 3"]),
    "extra field on the last line": (BANNER + "%\n3 3 2\n1 1 1\n\n2 2 2 7\n", ["line 6", "4 fields"]),
    "a value in a pattern file": (
        "%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 1\n2 2 1.0\n",
        ["line 4", "3 fields", "'pattern' entry has 2"],
    ),
    "extra field, symmetric": (
        "%%MatrixMarket matrix coordinate integer symmetric\n2 2 1\n2 1 3 4\n", ["line 3", "4 fields"],
    ),
}


@pytest.mark.parametrize(("text", "fragments"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_file_names_file_and_line(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, text, "broken.mtx")
    with pytest.raises(MatrixFormatError) as info:
        read_mtx(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(
    "header",
    [
        "%%MatrixMarket matrix coordinate real general\n3000000000 2 1\n",
        "%%MatrixMarket matrix coordinate real general\n2 3000000000 1\n",
        "%%MatrixMarket matrix coordinate real general\n2 2 3000000000\n",
        "%%MatrixMarket matrix coordinate real symmetric\n60000 60000 1500000000\n",
    ],
    ids=["rows", "cols", "nnz", "symmetric nnz doubled"],
)
def test_int32_overflow_fails_on_the_header_alone(tmp_path: Path, header: str) -> None:
    # The entry below is malformed: an error about it would mean the entries were read.
    path = write(tmp_path, header + "not an entry\n")
    with pytest.raises(MatrixFormatError, match=r"line 2: .*32-bit"):
        read_mtx(path)


@pytest.mark.parametrize("name", ["big.mtx", "big.mtx.gz"])
def test_error_early_in_a_large_file_is_an_exception(tmp_path: Path, name: str) -> None:
    # fast_matrix_market 1.7.6 used to abort the process here when reading a Python stream.
    rng = np.random.default_rng(0)
    row, col = rng.integers(0, 30_000, (2, 400_000))
    good = tmp_path / "good.mtx"
    write_mtx(good, sp.coo_matrix((rng.uniform(size=400_000), (row, col)), shape=(30_000, 30_000)))
    lines = good.read_bytes().split(b"\n")
    lines[10] = b"1 1 oops"
    text = b"\n".join(lines)
    path = tmp_path / name
    path.write_bytes(gzip.compress(text, compresslevel=1) if name.endswith(".gz") else text)
    with pytest.raises(MatrixFormatError, match="line 11: Invalid floating-point"):
        read_mtx(path)


@pytest.mark.parametrize("name", ["big.mtx", "big.mtx.gz"])
def test_fields_are_counted_across_the_reads_of_a_large_file(tmp_path: Path, name: str) -> None:
    """Entries split across fast_matrix_market's reads and the counted MiBs, blank lines and odd
    whitespace are fine; one extra field far into the file is found, on its line."""
    rng = np.random.default_rng(1)
    row, col = rng.integers(0, 30_000, (2, 200_000))
    good = tmp_path / "good.mtx"
    write_mtx(good, sp.coo_matrix((rng.uniform(size=200_000), (row, col)), shape=(30_000, 30_000)))
    lines = good.read_bytes().split(b"\n")
    lines[5] = b"\t" + lines[5].replace(b" ", b"  \t") + b" \r"
    lines[7:7] = [b"", b"   "]
    path = tmp_path / name
    compress = gzip.compress if name.endswith(".gz") else bytes
    path.write_bytes(compress(b"\n".join(lines)))
    assert read_mtx(path).nnz == read_mtx(good).nnz
    lines[-3] += b" 1"
    path.write_bytes(compress(b"\n".join(lines)))
    with pytest.raises(MatrixFormatError, match=f"line {len(lines) - 2}: 4 fields"):
        read_mtx(path)


def test_missing_file_is_a_matrix_format_error(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.mtx"
    with pytest.raises(MatrixFormatError, match="nowhere.mtx: file not found") as info:
        read_mtx(path)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_directory_and_corrupt_gzip_are_matrix_format_errors(tmp_path: Path) -> None:
    with pytest.raises(MatrixFormatError, match="cannot read"):
        read_mtx(tmp_path)
    truncated = tmp_path / "cut.mtx.gz"
    truncated.write_bytes(gzip.compress((BANNER + "1 1 1\n1 1 1\n").encode())[:-12])
    with pytest.raises(MatrixFormatError, match="cut.mtx.gz: cannot read"):
        read_mtx(truncated)


def test_gzip_is_told_by_magic_bytes_not_by_name(tmp_path: Path) -> None:
    text = BANNER + "2 2 1\n2 1 5\n"
    hidden = tmp_path / "zipped.mtx"
    hidden.write_bytes(gzip.compress(text.encode()))
    assert read_mtx(hidden).toarray().tolist() == [[0, 0], [5, 0]]
    fake = write(tmp_path, text, "plain.mtx.gz")  # plain text whatever its name says
    assert read_mtx(fake).toarray().tolist() == [[0, 0], [5, 0]]


def test_a_file_without_newlines_fails_at_its_first_line_not_in_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.mtx.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as f:  # 256 MiB of zero bytes, 256 KiB on disk
        for _ in range(16):
            f.write(bytes(16 << 20))
    with pytest.raises(MatrixFormatError, match=r"bomb.mtx.gz, line 1: longer than 1048576 bytes") as info:
        read_mtx(bomb)
    assert info.value.bound == "line length"


def test_read_mtx_watched_says_how_far_it_read(tmp_path: Path) -> None:
    from tuner.matrix.generate import generate

    A = generate("powerlaw", rows=200_000, seed=3)
    for name in ("w.mtx", "w.mtx.gz"):
        path = tmp_path / name
        write_mtx(path, A)
        size, seen = path.stat().st_size, []
        B = tuner.matrix.io.read_mtx_watched(
            path, on_progress=lambda done, total, seen=seen: seen.append((done, total)), every=0.001)
        assert (B != A).nnz == 0 and seen[-1] == (size, size)
        assert all(0 <= done <= total == size for done, total in seen)
        if Path("/proc/self/fdinfo").exists():
            assert any(0 < done < size for done, _ in seen), seen  # fdinfo: its position while it read


# --------------------------------------------------------------------------- fields and symmetry


FIELDS = {
    "pattern general": (
        "%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 3\n2 1\n",
        [[0, 0, 1], [1, 0, 0]],
    ),
    "pattern symmetric": (
        "%%MatrixMarket matrix coordinate pattern symmetric\n3 3 3\n1 1\n3 1\n3 2\n",
        [[1, 0, 1], [0, 0, 1], [1, 1, 0]],
    ),
    "integer": (
        "%%MatrixMarket matrix coordinate integer general\n2 2 2\n1 2 -7\n2 2 3\n",
        [[0, -7], [0, 3]],
    ),
    "real symmetric (diagonal not doubled)": (
        "%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n1 1 2.5\n2 1 -1\n3 2 4\n",
        [[2.5, -1, 0], [-1, 0, 4], [0, 4, 0]],
    ),
    "skew-symmetric": (
        "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 2\n2 1 3\n3 1 -2\n",
        [[0, -3, 2], [3, 0, 0], [-2, 0, 0]],
    ),
    "integer skew-symmetric": (
        "%%MatrixMarket matrix coordinate integer skew-symmetric\n2 2 1\n2 1 5\n",
        [[0, -5], [5, 0]],
    ),
    "duplicates summed": (BANNER + "2 2 3\n1 1 1\n2 2 4\n1 1 2\n", [[3, 0], [0, 4]]),
    "comments and blank lines": (BANNER + "% note\n%\n2 2 2\n1 1 1\n\n2 2 2\n", [[1, 0], [0, 2]]),
}


@pytest.mark.parametrize(("text", "dense"), FIELDS.values(), ids=FIELDS.keys())
def test_fields_and_symmetries_expand(tmp_path: Path, text: str, dense: list[list[float]]) -> None:
    A = read_mtx(write(tmp_path, text))
    assert_canonical(A)
    np.testing.assert_array_equal(A.toarray(), dense)


def test_explicit_zeros_are_kept(tmp_path: Path) -> None:
    A = read_mtx(write(tmp_path, BANNER + "2 2 2\n1 2 0\n2 1 0.0\n"))
    assert_canonical(A)
    assert A.nnz == 2 and A.indices.tolist() == [1, 0] and A.data.tolist() == [0, 0]


@pytest.mark.parametrize(
    ("text", "shape", "indptr"),
    [
        (BANNER + "3 4 0\n", (3, 4), [0, 0, 0, 0]),
        (BANNER + "0 5 0\n", (0, 5), [0]),
        (BANNER + "0 0 0\n", (0, 0), [0]),
        (BANNER + "4 4 2\n1 1 1\n4 4 1\n", (4, 4), [0, 1, 1, 1, 2]),
    ],
    ids=["zero nnz", "zero rows", "0 x 0", "empty rows"],
)
def test_empty_shapes_are_valid(tmp_path: Path, text: str, shape: tuple[int, int], indptr: list[int]) -> None:
    A = read_mtx(write(tmp_path, text))
    assert_canonical(A)
    assert A.shape == shape and A.indptr.tolist() == indptr


def test_read_dtype(tmp_path: Path) -> None:
    path = write(tmp_path, BANNER + "1 1 1\n1 1 0.1\n")
    assert read_mtx(path).data.dtype == np.float64
    A = read_mtx(path, dtype="float32")
    assert_canonical(A, np.float32)
    assert A.data[0] == np.float32(0.1)


# --------------------------------------------------------------------------- write_mtx


@pytest.mark.parametrize("name", ["round.mtx", "round.mtx.gz"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_write_read_round_trip(tmp_path: Path, name: str, dtype: type) -> None:
    A = as_csr(sp.random(50, 70, density=0.1, format="csr", random_state=1, dtype=dtype))
    A.data[0] = 0.0  # an explicit zero survives the round trip
    path = tmp_path / name
    write_mtx(path, A, comment="made by test_io")
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    B = read_mtx(path, dtype=dtype)
    assert_canonical(B, dtype)
    assert B.shape == A.shape
    np.testing.assert_array_equal(B.indptr, A.indptr)
    np.testing.assert_array_equal(B.indices, A.indices)
    np.testing.assert_array_equal(B.data, A.data)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        head = f.read(200)
    assert head.startswith("%%MatrixMarket matrix coordinate real general")
    assert "made by test_io" in head
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keep.mtx"
    write_mtx(path, sp.eye(3, format="csr"))
    before = path.read_bytes()

    def crash(stream, *args, **kwargs):
        stream.write(b"%%MatrixMarket matrix coordinate real general\n3 3 3\n1 1")
        raise OSError("disk full")

    monkeypatch.setattr(tuner.matrix.io.fmm, "mmwrite", crash)
    with pytest.raises(OSError, match="disk full"):
        write_mtx(path, sp.eye(4, format="csr"))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.mtx"]


# --------------------------------------------------------------------------- as_csr


def reference(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dense = rng.uniform(-1, 1, (7, 5))
    dense[rng.random((7, 5)) < 0.6] = 0
    dense[2] = 0  # an empty row
    return dense


def with_int64_indices(A):
    """Widen a COO, CSR or CSC matrix's index arrays to int64 (SciPy's constructors narrow them)."""
    if A.format == "coo":
        A.coords = tuple(index.astype(np.int64) for index in A.coords)
    else:
        A.indptr, A.indices = A.indptr.astype(np.int64), A.indices.astype(np.int64)
    return A


@pytest.mark.parametrize(
    "build",
    [sp.coo_matrix, sp.csc_matrix, sp.csr_matrix, sp.bsr_matrix, sp.lil_matrix, sp.csr_array, sp.coo_array],
    ids=lambda f: f.__name__,
)
def test_as_csr_from_scipy_formats(build) -> None:
    dense = reference()
    A = build(dense)
    if A.format in ("coo", "csr", "csc"):
        A = with_int64_indices(A)
        assert (A.row if A.format == "coo" else A.indices).dtype == np.int64
    B = as_csr(A)
    assert_canonical(B)
    np.testing.assert_array_equal(B.toarray(), dense)


def test_as_csr_sums_duplicates_and_sorts_without_touching_the_input() -> None:
    indptr = np.array([0, 3, 3, 5], dtype=np.int64)
    indices = np.array([4, 0, 4, 2, 1], dtype=np.int64)
    data = np.array([1.0, 2.0, 3.0, 0.0, 5.0])
    A = sp.csr_matrix((data, indices, indptr), shape=(3, 5))
    A.indices, A.indptr = indices, indptr  # keep int64, unsorted, duplicated
    snapshot = copy.deepcopy((A.indptr, A.indices, A.data))
    B = as_csr(A)
    assert_canonical(B)
    assert B.indptr.tolist() == [0, 2, 2, 4]
    assert B.indices.tolist() == [0, 4, 1, 2]
    assert B.data.tolist() == [2.0, 4.0, 5.0, 0.0]
    for before, after in zip(snapshot, (A.indptr, A.indices, A.data), strict=True):
        np.testing.assert_array_equal(before, after)
        assert before.dtype == after.dtype
    assert not np.shares_memory(B.data, A.data)


def test_as_csr_coo_duplicates_summed_input_unchanged() -> None:
    row = np.array([1, 0, 1, 1], dtype=np.int32)
    col = np.array([2, 1, 2, 0], dtype=np.int32)
    A = sp.coo_matrix((np.array([1.0, 2.0, 3.0, 4.0]), (row, col)), shape=(2, 3))
    B = as_csr(A)
    assert_canonical(B)
    np.testing.assert_array_equal(B.toarray(), [[0, 2, 0], [4, 0, 4]])
    assert A.nnz == 4 and A.row.tolist() == [1, 0, 1, 1] and A.data.tolist() == [1, 2, 3, 4]


def test_as_csr_triple_is_copied_not_shared() -> None:
    indptr = np.array([0, 2, 3], dtype=np.int32)
    indices = np.array([1, 0, 0], dtype=np.int32)
    data = np.array([1.0, 2.0, 3.0])
    B = as_csr((indptr, indices, data))
    assert_canonical(B)
    assert B.shape == (2, 2) and B.indices.tolist() == [0, 1, 0] and B.data.tolist() == [2, 1, 3]
    assert indices.tolist() == [1, 0, 0] and data.tolist() == [1, 2, 3]
    assert not any(
        np.shares_memory(a, b) for a in (indptr, indices, data) for b in (B.indptr, B.indices, B.data)
    )


@pytest.mark.parametrize(
    ("triple", "shape", "expected_shape"),
    [
        (([0, 1, 2], [3, 0], [1.0, 2.0]), None, (2, 4)),
        (([0, 1, 2], [3, 0], [1.0, 2.0]), (2, 10), (2, 10)),
        (([0, 0, 0], [], []), None, (2, 0)),
        (([0], [], []), None, (0, 0)),
        (([0], [], []), (0, 7), (0, 7)),
    ],
)
def test_as_csr_valid_triples(triple, shape, expected_shape) -> None:
    B = as_csr(triple, shape=shape)
    assert_canonical(B)
    assert B.shape == expected_shape
    assert B.nnz == len(triple[1])


INVALID_TRIPLES = {
    "indptr not from 0": ((([1, 2], [0], [1.0]), None), "start at 0"),
    "empty indptr": ((([], [], []), None), "start at 0"),
    "indptr decreasing": ((([0, 2, 1, 3], [0, 1, 2], [1.0, 2, 3]), None), "non-decreasing"),
    "indptr end": ((([0, 1, 2], [0, 1, 2], [1.0, 2, 3]), None), "ends at 2 but there are 3 indices"),
    "lengths differ": ((([0, 2], [0, 1], [1.0]), None), "one value per index"),
    "negative index": ((([0, 2], [0, -1], [1.0, 2]), None), "column index -1"),
    "index past shape": ((([0, 2], [0, 5], [1.0, 2]), (1, 5)), "column index 5"),
    "rows mismatch": ((([0, 1], [0], [1.0]), (2, 2)), "needs an indptr of length 3, got 2"),
    "negative shape": ((([0, 1], [0], [1.0]), (1, -1)), "must not be negative"),
    "negative index, no shape": ((([0, 1], [-3], [1.0]), None), "column index -3"),
    "float indices": ((([0, 1], [0.5], [1.0]), None), "integers"),
    "2-D indptr": ((([[0, 1]], [0], [1.0]), None), "1-D"),
    "huge shape": ((([0], [], []), (0, 3_000_000_000)), "32-bit"),
}


@pytest.mark.parametrize(("args", "match"), INVALID_TRIPLES.values(), ids=INVALID_TRIPLES.keys())
def test_as_csr_invalid_triples(args, match: str) -> None:
    triple, shape = args
    with pytest.raises(MatrixFormatError, match=match):
        as_csr(triple, shape=shape)


@pytest.mark.parametrize(
    ("values", "requested", "expected"),
    [
        (np.float32, None, np.float32),
        (np.float64, None, np.float64),
        (np.int64, None, np.float64),
        (np.int8, None, np.float64),
        (np.bool_, None, np.float64),
        (np.float64, "float32", np.float32),
        (np.float32, "float64", np.float64),
        (np.int32, np.dtype("float32"), np.float32),
        (np.float64, np.float64, np.float64),
    ],
)
def test_as_csr_dtype_rules(values, requested, expected) -> None:
    A = sp.csr_matrix(np.array([[1, 0], [0, 1]], dtype=values))
    B = as_csr(A, dtype=requested)
    assert_canonical(B, expected)
    np.testing.assert_array_equal(B.toarray(), np.eye(2))


@pytest.mark.parametrize("requested", ["int32", np.float16, "complex128", "float128x"])
def test_as_csr_rejects_other_dtypes(requested) -> None:
    with pytest.raises(MatrixFormatError, match="use 'float32' or 'float64'"):
        as_csr(sp.eye(2, format="csr"), dtype=requested)


def test_as_csr_rejects_complex_values() -> None:
    with pytest.raises(MatrixFormatError, match="complex values are not supported"):
        as_csr(sp.eye(2, format="csr", dtype=np.complex128))
    with pytest.raises(MatrixFormatError, match="complex values are not supported"):
        as_csr(([0, 1], [0], np.array([1j])))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_as_csr_rejects_nonfinite_values_and_says_where(bad: float) -> None:
    A = sp.csr_matrix(np.array([[1.0, 0, 2], [0, 0, 0], [0, 3, 4]]))
    A.data[2] = bad  # row 2, column 1
    for source in (A, A.tocoo(), (A.indptr, A.indices, A.data)):
        with pytest.raises(MatrixFormatError, match=rf"1 NaN or Inf value\(s\); the first is {bad} at row 2, column 1"):
            as_csr(source)
    assert np.isnan(A.data[2]) or np.isinf(A.data[2])  # the input is left as it was


@pytest.mark.parametrize("dense", [np.eye(3), np.asmatrix(np.eye(3))], ids=["ndarray", "matrix"])
def test_as_csr_rejects_dense(dense) -> None:
    with pytest.raises(MatrixFormatError, match="pass a sparse matrix"):
        as_csr(dense)


@pytest.mark.parametrize(("thing", "name"), [([[1, 0]], "list"), (None, "NoneType"), ({"a": 1}, "dict")])
def test_as_csr_rejects_other_types_by_name(thing, name: str) -> None:
    with pytest.raises(MatrixFormatError, match=f"of type builtins.{name}"):
        as_csr(thing)


def test_as_csr_rejects_int32_overflowing_shape() -> None:
    A = sp.coo_matrix(
        (np.ones(1), (np.array([0], dtype=np.int64), np.array([2_999_999_999], dtype=np.int64))),
        shape=(1, 3_000_000_000),
    )
    with pytest.raises(MatrixFormatError, match="32-bit"):
        as_csr(A)


def test_as_csr_reads_paths_and_checks_shape(tmp_path: Path) -> None:
    path = write(tmp_path, BANNER + "2 3 1\n2 3 4\n")
    for source in (path, str(path)):
        A = as_csr(source, dtype="float32")
        assert_canonical(A, np.float32)
        assert A.shape == (2, 3) and A[1, 2] == 4
    with pytest.raises(MatrixFormatError, match=r"shape=\(3, 3\) given"):
        as_csr(path, shape=(3, 3))
    with pytest.raises(MatrixFormatError, match=r"shape=\(2, 2\) given"):
        as_csr(sp.eye(3, format="csr"), shape=(2, 2))


@pytest.mark.gpu
def test_as_csr_from_cupy() -> None:
    import cupy
    import cupyx.scipy.sparse

    dense = reference()
    B = as_csr(cupyx.scipy.sparse.csr_matrix(cupy.asarray(dense)))
    assert_canonical(B)
    np.testing.assert_array_equal(B.toarray(), dense)
    with pytest.raises(MatrixFormatError, match="pass a sparse matrix"):
        as_csr(cupy.asarray(dense))


@pytest.mark.gpu
def test_as_device_csr_checks_the_values_of_a_matrix_it_keeps_on_the_gpu_every_time() -> None:
    import cupy
    import cupyx.scipy.sparse

    from tuner.matrix.io import as_device_csr

    A = cupyx.scipy.sparse.csr_matrix(cupy.asarray(reference()))
    assert as_device_csr(A) is A  # canonical: kept where it is
    A.data[-1] = cupy.nan  # the structure is the same; every call passes over the values again
    row, col = (int(v) for v in np.argwhere(reference())[-1])
    where = f"the first is nan at row {row}, column {col}"
    with pytest.raises(MatrixFormatError, match=f"1 NaN or Inf value\\(s\\); {where}"):
        as_device_csr(A)


# --------------------------------------------------------------------------- matrix_name


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("dir/G3_circuit.mtx.gz", "G3_circuit"),
        (Path("/x/west0067.mtx"), "west0067"),
        ("notes.txt", "notes.txt"),
        (sp.eye(2, format="csr"), "csr_matrix"),
        (([0], [], []), "tuple"),
    ],
)
def test_matrix_name(source, name: str) -> None:
    assert matrix_name(source) == name
