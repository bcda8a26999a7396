"""The ``ipcsr`` family: its row blocks, its decision tree, its reference, its GPU kernel.

CPU part: the vectorized block builder against a plain transcription of the
paper's greedy (hand-made matrices, random row lengths, every shared matrix),
the block invariants, the decision tree, the reference's lane layout and y, and
the builder's speed. GPU part (``gpu``): the GPU block table equals the
reference's and y matches it, on the hard cases and every shared matrix.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels._family import Prepared
from kernels.ipcsr import (
    DEFAULT_SHARED_SIZE,
    SHARED_SIZES,
    SPACE,
    THREADS_PER_BLOCK,
    Ipcsr,
    block_table,
    long_row_span,
    paper_shared_size,
    row_blocks,
    split_long_rows,
    threads_per_row,
)
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.matrix.io import as_csr
from tuner.measure.verify import Reference

FAMILY = Ipcsr()
DTYPES = ("float64", "float32")

# A few configs that reach every branch: each nt, the smallest and largest staging area
# (16384 values is > 48 KB in both dtypes), every tree threshold, long rows whole and in pieces.
CONFIGS = [
    {"shared_size": 512, "nt": 64, "tree_t1": 2, "tree_t2": 32, "long_chunks": 1},
    {"shared_size": 16384, "nt": 128, "tree_t1": 8, "tree_t2": 1024},
    SPACE.defaults(),
    {"shared_size": 8192, "nt": 512, "tree_t1": 4, "tree_t2": 128, "long_chunks": 16},
    {"shared_size": 512, "nt": 1024, "tree_t1": 2, "tree_t2": 8, "long_chunks": 2},
]
GPU_CONFIGS = [
    {"shared_size": s, "nt": nt, "tree_t1": t1, "tree_t2": t2, "long_chunks": c}
    for nt in THREADS_PER_BLOCK
    for s, t1, t2, c in ((512, 2, 32, 1), (16384, 8, 1024, 0), (4096, 4, 128, 4), (512, 4, 128, 0))
]


@functools.cache
def matrix(name: str, dtype: str = "float64") -> sp.csr_matrix:
    return (CASES[name]() if name in CASES else load_shared(name)).astype(dtype)


def from_lengths(lengths, cols: int | None = None, seed: int = 0) -> sp.csr_matrix:
    """A CSR matrix with the given row lengths, sorted distinct columns, random values."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cols = cols or max(1, int(lengths.max(initial=0)))
    rng = np.random.default_rng(seed)
    indices = np.concatenate([np.sort(rng.choice(cols, n, replace=False)) for n in lengths] or [[]])
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    data = rng.uniform(-1, 1, int(indptr[-1]))
    return as_csr(sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(len(lengths), cols)))


def greedy_blocks(lengths, shared_size: int, nt: int) -> list[int]:
    """The paper's Algorithms 4 + 6 as written: one row at a time (the test oracle)."""
    starts, total, rows, i, m = [0], 0, 0, 0, len(lengths)
    while i < m:
        total += int(lengths[i])
        rows += 1
        if total > shared_size and rows > 1:  # the row does not fit: it opens the next block
            starts.append(i)
            total = rows = 0
            continue
        if total >= shared_size or rows == nt:  # full, by nonzeros or by rows (or a long row alone)
            starts.append(i + 1)
            total = rows = 0
        i += 1
    if starts[-1] != m:
        starts.append(m)
    return starts


def check_invariants(indptr: np.ndarray, table: dict, shared_size: int, nt: int, span: int = 0) -> None:
    piece = table["block_piece"]
    assert piece.dtype == np.int32 and len(piece) == len(table["block_tpr"])
    first = piece == 0
    whole = np.append(table["block_row_start"][:-1][first], table["block_row_start"][-1])
    # The pieces of a long row: consecutive blocks 0..P-1 at the row's start, P = ceil(nnz / span).
    owner = np.cumsum(first) - 1
    count = np.bincount(owner, minlength=len(whole) - 1)
    np.testing.assert_array_equal(piece, np.arange(len(piece)) - np.repeat(np.cumsum(count) - count, count))
    np.testing.assert_array_equal(table["block_row_start"][:-1], whole[owner])
    nnz = np.diff(indptr.astype(np.int64)[whole])
    expected = np.where((np.diff(whole) == 1) & (nnz > span), -(-nnz // max(span, 1)), 1) if span else 1
    np.testing.assert_array_equal(count, expected)
    starts, tpr = whole, table["block_tpr"][first]
    m = len(indptr) - 1
    assert starts.dtype == np.int32 and tpr.dtype == np.int32
    assert starts[0] == 0 and starts[-1] == m and len(tpr) == len(starts) - 1
    rows = np.diff(starts)
    assert (rows >= 1).all(), "blocks cover every row exactly once, in order"
    assert (rows <= nt).all()
    nnz = np.diff(indptr.astype(np.int64)[starts])
    assert ((nnz <= shared_size) | (rows == 1)).all(), "a block over shared_size is a single row"
    assert ((tpr & (tpr - 1)) == 0).all() and (tpr >= 1).all() and (rows * tpr <= nt).all()
    assert (tpr[rows == 1] == nt).all()


# -- the space -------------------------------------------------------------------------------------
def test_space_and_paper_default():
    assert paper_shared_size(256, 8) == DEFAULT_SHARED_SIZE == 2048  # 228 KB / 8 blocks = 3648 doubles
    assert paper_shared_size(256, 4) == 4096
    assert paper_shared_size(1024, 8) == 8192  # 2 blocks per SM: 114 KB each = 14592 doubles
    assert paper_shared_size(64, 8) == 512  # 32 blocks per SM (also the Hopper cap): 912 doubles
    assert SPACE.defaults() == {"shared_size": 2048, "nt": 256, "tree_t1": 2, "tree_t2": 32, "long_chunks": 0}
    assert SHARED_SIZES == (512, 1024, 2048, 4096, 8192, 16384)
    assert FAMILY.name_expressions("float32") == ("ipcsr<float>",)
    assert FAMILY.name_expressions(np.float64) == ("ipcsr<double>",)
    # The largest config fits Hopper's 227 KB per block in float64, with the reduction area.
    assert FAMILY.shared_bytes({"shared_size": 16384, "nt": 1024}, "float64") <= 227 * 1024


# -- the block builder on hand-made matrices ------------------------------------------------------------
# 15 rows, shared_size 8, nt 4: an empty row (2), a row longer than shared_size (9, 10 nonzeros),
# blocks closed by nt (rows 4-7), by an exact fill (rows 0-3, 11), by an overflowing row (8, 10, 12-13).
LENGTHS_15 = [3, 2, 0, 3, 1, 1, 1, 1, 1, 10, 2, 8, 0, 4, 5]
BLOCKS_15 = [0, 4, 8, 9, 10, 11, 12, 14, 15]


def test_hand_made_blocks_small_sizes():
    indptr = np.concatenate(([0], np.cumsum(LENGTHS_15))).astype(np.int32)
    starts = row_blocks(indptr, 8, 4)
    assert starts.dtype == np.int32
    np.testing.assert_array_equal(starts, BLOCKS_15)
    assert greedy_blocks(LENGTHS_15, 8, 4) == BLOCKS_15
    # rows per block 4 4 1 1 1 1 2 1 -> nt/rows 1 1 4 4 4 4 2 4; one-row blocks use all 4 threads
    np.testing.assert_array_equal(threads_per_row(starts, 4, 2, 32), [1, 1, 4, 4, 4, 4, 2, 4])
    np.testing.assert_array_equal(threads_per_row(starts, 4, 4, 32), [1, 1, 4, 4, 4, 4, 1, 4])


def test_hand_made_reference_small_sizes_sums_chunked_long_row():
    """The same matrix through the reference with shared_size 8 (not a tunable value): chunks of 8."""
    A = from_lengths(LENGTHS_15, cols=12)
    params = {"shared_size": 8, "nt": 4, "tree_t1": 2, "tree_t2": 32, "long_chunks": 0}
    prepared = Prepared("ipcsr", params, A.shape, A.nnz, A.dtype, A)
    FAMILY._prepare_reference(prepared)
    np.testing.assert_array_equal(prepared.extra["block_row_start"], BLOCKS_15)
    # row 9 (10 entries, 4 lanes, chunks of 8): offsets 0..7 -> lanes 0..3,0..3; 8, 9 -> lanes 0, 1
    lo, hi = A.indptr[9], A.indptr[10]
    slot = prepared.extra["slot"][lo:hi] - prepared.extra["slot_start"][9]
    np.testing.assert_array_equal(slot, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
    x = np.random.default_rng(3).uniform(-1, 1, 12)
    ref = Reference.build(A, "float64", seed=3)
    ok, _, msg = ref.check(FAMILY.run_reference(prepared, ref.x))
    assert ok, msg
    np.testing.assert_allclose(FAMILY.run_reference(prepared, x), A @ x, rtol=1e-13, atol=1e-13)


def test_hand_made_blocks_with_tunable_sizes():
    """shared_size 512, nt 64: an exact fill with an empty row, a row of 600 alone, a short last block."""
    lengths = [100, 200, 0, 212, 50, 600, 30, 0, 0, 482, 1, 5, 0, 7, 9]
    A = from_lengths(lengths, cols=700)
    p = FAMILY.prepare_reference(A, {"shared_size": 512, "nt": 64, "tree_t1": 2, "tree_t2": 32})
    np.testing.assert_array_equal(p.extra["block_row_start"], [0, 4, 5, 6, 10, 15])
    assert greedy_blocks(lengths, 512, 64) == [0, 4, 5, 6, 10, 15]
    # rows 4 1 1 4 5 -> nt/rows 16 64 64 16 12
    np.testing.assert_array_equal(p.extra["block_tpr"], [16, 64, 64, 16, 8])
    starts = p.extra["block_row_start"]
    np.testing.assert_array_equal(threads_per_row(starts, 64, 2, 8), [8, 64, 64, 8, 8])
    np.testing.assert_array_equal(threads_per_row(starts, 64, 16, 32), [16, 64, 64, 16, 1])
    # The long row (5) in a block of 64 threads: lane = (offset % 512) % 64; 64 lanes kept.
    lo, hi = A.indptr[5], A.indptr[6]
    np.testing.assert_array_equal(p.extra["slot"][lo:hi] - p.extra["slot_start"][5], np.arange(600) % 64)
    assert p.extra["width"][5] == 64
    ok, _, msg = Reference.build(A, "float64").check(FAMILY.run_reference(p, Reference.build(A, "float64").x))
    assert ok, msg


def test_long_row_wider_block_than_staging_area():
    """nt 1024 > shared_size 512: the chunk holds 512 entries, lanes 512..1023 stay idle."""
    A = from_lengths([600], cols=600)
    p = FAMILY.prepare_reference(A, {"shared_size": 512, "nt": 1024})
    np.testing.assert_array_equal(p.extra["block_row_start"], [0, 1])
    np.testing.assert_array_equal(p.extra["block_tpr"], [1024])
    np.testing.assert_array_equal(p.extra["slot"], np.arange(600) % 512)
    assert p.extra["width"][0] == 512


def test_long_rows_cut_into_pieces():
    """LENGTHS_15 with shared_size 8, span 8 (long_chunks 1): rows 9 (10 nonzeros) and 11 (8) are
    one-row blocks; only row 9 is longer than the span, so it gets 2 pieces."""
    indptr = np.concatenate(([0], np.cumsum(LENGTHS_15))).astype(np.int32)
    starts = row_blocks(indptr, 8, 4)
    tpr = threads_per_row(starts, 4, 2, 32)
    table = split_long_rows(indptr, starts, tpr, 8)
    np.testing.assert_array_equal(table["block_row_start"], [0, 4, 8, 9, 9, 10, 11, 12, 14, 15])
    np.testing.assert_array_equal(table["block_piece"], [0, 0, 0, 0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(table["block_tpr"], [1, 1, 4, 4, 4, 4, 4, 2, 4])
    check_invariants(indptr, table, 8, 4, span=8)
    # span 4 (not a tunable value): row 9 in 3 pieces, rows 11 (8) and 14 (5, alone) in 2; rows 12-13
    # (0 + 4 nonzeros) share a block, so they stay whole
    table = split_long_rows(indptr, starts, tpr, 4)
    np.testing.assert_array_equal(table["block_piece"], [0, 0, 0, 0, 1, 2, 0, 0, 1, 0, 0, 1])
    check_invariants(indptr, table, 8, 4, span=4)
    unsplit = split_long_rows(indptr, starts, tpr, 0)
    np.testing.assert_array_equal(unsplit["block_row_start"], starts)
    assert not unsplit["block_piece"].any()


def test_pieces_reference_adds_each_piece_then_the_pieces_in_order():
    """One row of 1100 entries, shared_size 512, 64 threads, long_chunks 1: pieces of 512, 512 and 76
    entries, each summed by 64 lanes and a tree, then added in order. Entry 0 is 1e16 and entry 512
    is -1e16, all others 1 (the spacing of doubles near 1e16 is 2, so 1e16 + 1 == 1e16):

    - pieces: lane 0 of piece 0 loses its 7 ones (1e16), the other 63 lanes hold 8 each, so the
      piece is 1e16 + 504; piece 1 likewise -1e16 + 504; piece 2 is 76: y = 1008 + 76 = 1084;
    - whole (long_chunks 0): lane 0 runs over the row, 1e16, its 7 ones lost, then -1e16 gives 0,
      and its 9 later ones count: 9 + 1082 from the other lanes = 1091.
    """
    n = 1100
    vals = np.full(n, 1.0)
    vals[0], vals[512] = 1e16, -1e16
    A = as_csr(sp.csr_matrix((vals, np.arange(n), [0, n]), shape=(1, n)))
    params = {"shared_size": 512, "nt": 64, "long_chunks": 1}
    p = FAMILY.prepare_reference(A, params)
    np.testing.assert_array_equal(p.extra["block_piece"], [0, 1, 2])
    np.testing.assert_array_equal(p.extra["width"], [64, 64, 64])
    np.testing.assert_array_equal(p.extra["slot"][[0, 64, 512, 1024]], [0, 0, 64, 128])  # lane 0 of each piece
    assert FAMILY.run_reference(p, np.ones(n))[0] == 1084.0
    whole = FAMILY.prepare_reference(A, {**params, "long_chunks": 0})
    assert FAMILY.run_reference(whole, np.ones(n))[0] == 1091.0


def test_nt_bounds_rows_per_block_with_empty_rows():
    lengths = np.zeros(1000, dtype=np.int64)
    lengths[[10, 500]] = 1
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    for nt in THREADS_PER_BLOCK:
        starts = row_blocks(indptr, 512, nt)
        np.testing.assert_array_equal(starts, [*range(0, 1000, nt), 1000])
    A = from_lengths(lengths, cols=4)
    p = FAMILY.prepare_reference(A, {"nt": 64})
    ref = Reference.build(A, "float64")
    assert ref.check(FAMILY.run_reference(p, ref.x))[0]


def test_decision_tree_choices():
    # rows per block: 3 100 256 1 128 2 with nt 256 -> nt/rows 85 2 1 256 2 128
    starts = np.cumsum([0, 3, 100, 256, 1, 128, 2]).astype(np.int32)
    np.testing.assert_array_equal(threads_per_row(starts, 256, 2, 32), [32, 2, 1, 256, 2, 32])
    np.testing.assert_array_equal(threads_per_row(starts, 256, 4, 128), [64, 1, 1, 256, 1, 128])
    np.testing.assert_array_equal(threads_per_row(starts, 256, 2, 8), [8, 2, 1, 256, 2, 8])
    np.testing.assert_array_equal(threads_per_row(starts, 256, 8, 1024), [64, 1, 1, 256, 1, 128])


def test_reference_reproduces_the_grouping_in_float64():
    """1e16 + 1 - 1e16 + 1: one thread gets 1 (the first 1 is lost), lanes (0+2, 1+3) get 0 + 2."""
    vals = [1e16, 1.0, -1e16, 1.0]
    one_row = as_csr(sp.csr_matrix((vals, [0, 1, 2, 3], [0, 4]), shape=(1, 4)))
    p = FAMILY.prepare_reference(one_row)  # a one-row block: the whole block's tree
    assert p.extra["block_tpr"][0] == 256 and FAMILY.run_reference(p, np.ones(4))[0] == 2.0
    # The same row among 256 rows of 1 entry: nt/rows = 1, the scalar reduction.
    rows = sp.vstack([one_row, sp.eye(255, 4, format="csr")], format="csr")
    p = FAMILY.prepare_reference(as_csr(rows))
    np.testing.assert_array_equal(p.extra["block_tpr"], [1])
    assert FAMILY.run_reference(p, np.ones(4))[0] == 1.0


# -- the builder against the paper's greedy ------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=200),
    shared_size=st.integers(1, 40),
    nt=st.integers(1, 20),
)
def test_builder_equals_the_greedy_on_random_rows(lengths, shared_size, nt):
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    starts = row_blocks(indptr, shared_size, nt)
    assert starts.tolist() == greedy_blocks(lengths, shared_size, nt)
    m, nnz = len(lengths), int(indptr[-1])  # the bound the pointer doubling's rounds rest on
    assert len(starts) - 1 <= min(m, 3 * nnz // shared_size + m // nt + 2)


@pytest.mark.parametrize("params", CONFIGS, ids=lambda p: "-".join(map(str, p.values())))
def test_blocks_on_every_shared_matrix(params, shared_dir):
    params = SPACE.validate(params)
    for name in shared_cases():
        A = matrix(name)
        table = block_table(A.indptr, params)
        check_invariants(A.indptr, table, params["shared_size"], params["nt"], long_row_span(params))
        if A.shape[0] <= 200_000:  # the oracle is a Python loop over rows
            expected = greedy_blocks(np.diff(A.indptr), params["shared_size"], params["nt"])
            whole = table["block_row_start"][np.append(table["block_piece"] == 0, True)]
            assert whole.tolist() == expected, name


# -- the reference's y ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_on_hard_cases(name, dtype):
    A = matrix(name, dtype)
    ref = Reference.build(A, dtype, seed=1)
    for params in CONFIGS:
        p = FAMILY.prepare_reference(A, params)
        if A.nnz and A.shape[0]:
            check_invariants(A.indptr, p.extra, params["shared_size"], params["nt"], long_row_span(p.params))
        y = FAMILY.run_reference(p, ref.x)
        assert y.dtype == np.dtype(dtype) and y.shape == (A.shape[0],)
        ok, _, msg = ref.check(y)
        assert ok, f"{name} {params}: {msg}"


def test_reference_on_every_shared_matrix(shared_dir):
    for name in shared_cases():
        A = matrix(name)
        ref = Reference.build(A, "float64")
        for params in CONFIGS:
            ok, _, msg = ref.check(FAMILY.run_reference(FAMILY.prepare_reference(A, params), ref.x))
            assert ok, f"{name} {params}: {msg}"


# -- speed ---------------------------------------------------------------------------------------------
def synthetic_indptr(rows: int = 1_000_000, nnz: int = 10_000_000, seed: int = 0) -> np.ndarray:
    """Skewed row lengths (mean nnz/rows), a few very long rows and some empty ones."""
    rng = np.random.default_rng(seed)
    lengths = rng.geometric(1.0 / (nnz / rows), rows) - 1
    lengths[rng.choice(rows, 20, replace=False)] = rng.integers(20_000, 60_000, 20)
    return np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)


def test_builder_is_fast_on_a_million_rows():
    indptr = synthetic_indptr()
    for params in (SPACE.defaults(), {"shared_size": 512, "nt": 64, "tree_t1": 2, "tree_t2": 32}):
        params = {**SPACE.defaults(), **params}
        t0 = time.perf_counter()
        table = block_table(indptr, params)
        elapsed = time.perf_counter() - t0
        print(
            f"ipcsr block table, {len(indptr) - 1} rows, {indptr[-1]} nnz, {params}: "
            f"{len(table['block_tpr'])} blocks in {elapsed:.3f} s"
        )
        assert elapsed < 5.0
        check_invariants(indptr, table, params["shared_size"], params["nt"], long_row_span(params))


# -- GPU -------------------------------------------------------------------------------------------------
def _gpu_compare(A, dtype: str, params: dict) -> None:
    import cupy
    import cupyx.scipy.sparse as cusp

    ref = Reference.build(A, dtype, seed=2)
    expected_prep = FAMILY.prepare_reference(A, params)
    expected = FAMILY.run_reference(expected_prep, ref.x)
    prepared = FAMILY.prepare(cusp.csr_matrix(A), params)
    for key in ("block_row_start", "block_tpr", "block_piece"):
        if key in expected_prep.extra:
            got = prepared.extra[key]
            assert isinstance(got, cupy.ndarray), key
            np.testing.assert_array_equal(got.get(), expected_prep.extra[key], err_msg=f"{key} {params}")
    out = cupy.full(A.shape[0], cupy.nan, dtype=dtype)
    y = FAMILY.run(prepared, cupy.asarray(ref.x), out).get()
    ok, _, msg = ref.check(y)
    assert ok, f"{params}: {msg}"
    scale = np.maximum(ref.scale, np.finfo(np.float64).tiny)
    assert np.all(np.abs(y - expected) / scale <= 2 * ref.rtol), f"{params}: GPU differs from its reference"
    if dtype == "float64":  # same rounded products, same additions in the same order: the same bits
        np.testing.assert_array_equal(y, expected, err_msg=f"{params}: float64 sums differ in order")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_reference_on_hard_cases(name, dtype):
    for params in GPU_CONFIGS:
        _gpu_compare(matrix(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_matches_reference_on_every_shared_matrix(dtype, shared_dir):
    for name in shared_cases():
        for params in GPU_CONFIGS:
            try:
                _gpu_compare(matrix(name, dtype), dtype, params)
            except AssertionError as exc:
                raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.gpu
def test_gpu_block_table_on_a_million_rows_equals_the_reference():
    import cupy

    indptr = synthetic_indptr()
    params = SPACE.defaults()
    expected = block_table(indptr, params)
    d_indptr = cupy.asarray(indptr)
    block_table(d_indptr, params, cupy)  # warm-up (CuPy compiles its elementwise kernels)
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    got = block_table(d_indptr, params, cupy)
    cupy.cuda.Device().synchronize()
    print(f"ipcsr GPU block table, 1M rows: {time.perf_counter() - t0:.4f} s")
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key].get(), value)


@pytest.mark.gpu
def test_gpu_large_shared_config_survives_a_smaller_one():
    """The opt-in shared memory limit is only ever raised on the (shared) compiled kernel."""
    import cupy
    import cupyx.scipy.sparse as cusp

    A = matrix("huge_row")
    ref = Reference.build(A, "float64", seed=4)
    d_A = cusp.csr_matrix(A)
    big = FAMILY.prepare(d_A, {"shared_size": 16384, "nt": 1024})
    assert big.extra["kernel"].max_dynamic_shared_size_bytes >= (16384 + 1024) * 8
    small = FAMILY.prepare(d_A, {"shared_size": 512, "nt": 64})
    for prepared in (big, small, big):
        ok, _, msg = ref.check(FAMILY.run(prepared, cupy.asarray(ref.x)).get())
        assert ok, msg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_pieces_of_long_rows_repeat_exactly(dtype):
    """The pieces' tickets wrap back to 0: every product gives the reference's y again (float64: its bits)."""
    import cupy
    import cupyx.scipy.sparse as cusp

    A = matrix("huge_row", dtype)
    params = {"shared_size": 512, "nt": 64, "long_chunks": 1}
    ref = Reference.build(A, dtype, seed=6)
    expected_prep = FAMILY.prepare_reference(A, params)
    assert expected_prep.extra["block_piece"].max() >= 2, "the case must cut a row into several pieces"
    expected = FAMILY.run_reference(expected_prep, ref.x)
    prepared = FAMILY.prepare(cusp.csr_matrix(A), params)
    x = cupy.asarray(ref.x)
    for _ in range(3):
        y = FAMILY.run(prepared, x).get()
        assert ref.check(y)[0]
        if dtype == "float64":
            np.testing.assert_array_equal(y, expected)
    assert not prepared.extra["counters"].any()
