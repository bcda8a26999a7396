"""``csr5``: the tiles, their transposed copies and descriptors, the lanes' segmented sum, the carries, the tail
and the fix-up.

CPU (any machine): the decomposition against a brute force written entry by entry (hand-made, random and
hypothesis-drawn rows, small tiles); a hand example with its carries written out; the reference against
SciPy on the shapes that break tiles (empty rows at tile boundaries, a row spanning many tiles, a tile of
many empty rows, fewer entries than a tile, a multiple of a tile, no entries, one row, one column,
rectangular) and on shared matrices; when the fix-up has work; the memory ratio; CSR5's choice of sigma;
the 32-bit guard. GPU (marked ``gpu``): the descriptors and transposed copies equal to the reference's,
carries and y within the bound of the reference's and SciPy's, for every sigma, in both dtypes.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import MatrixFormatError
from kernels import get_family
from kernels._reference import products
from kernels.csr5 import (
    BLOCK_SIZES,
    FLOAT64_SIGMA,
    INDEX_MAX,
    OMEGA,
    SIGMAS,
    Csr5,
    check_size,
    decompose,
    needs_fixup,
    set_sigma,
    spmv_reference,
    transposed,
)
from tests.kernel_cases import CASES, arrow, gpu_runs, load_shared
from tuner.measure.verify import Reference

FAMILY = Csr5()
DTYPES = ("float64", "float32")
CPU_CONFIGS = (
    FAMILY.space.defaults(),
    {"sigma": 4, "block_size": 64, "indices": "int32"},
    {"sigma": 6, "block_size": 512},
    {"sigma": 32, "block_size": 256, "indices": "int32"},
)
GPU_CONFIGS = tuple(
    {"sigma": s, "block_size": BLOCK_SIZES[n % len(BLOCK_SIZES)], "indices": ("narrow", "int32")[n % 2]}
    for n, s in enumerate(SIGMAS)
)
# Shared matrices with what tiles find hard: huge rows (arrow, lp_fit2d), many empty rows
# (LFAT5_hypersparse, mbeacxc), power-law rows (rajat01, ca-HepPh_rawids).
SHARED = ("arrow", "lp_fit2d", "LFAT5_hypersparse", "mbeacxc", "rajat01", "ca-HepPh_rawids")


def _rows(lengths: list[int], *, cols: int | None = None, seed: int = 0) -> sp.csr_matrix:
    """Rows of the given lengths (0: empty), columns spread over ``cols`` (default: the longest row), values
    from a fixed seed."""
    rng = np.random.default_rng(seed)
    cols = cols or max(1, *lengths)
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    indices = np.concatenate([np.sort(rng.choice(cols, n, replace=False)) for n in lengths] or [[]])
    data = rng.uniform(-1, 1, int(indptr[-1]))
    return sp.csr_matrix((data, indices.astype(np.int32), indptr), shape=(len(lengths), cols))


TILE4 = OMEGA * 4  # a tile of sigma = 4
HARD = {
    # rows ending exactly at tile boundaries, each followed by empty rows: the next tile starts a row
    "empty_rows_at_tile_boundaries": lambda: _rows([TILE4, 0, 0, TILE4, 0, TILE4 - 1, 1, 0, 5], cols=400),
    # empty rows right before a tile's first entry, inside a row's tile, and a row ending one entry short
    "empty_rows_around_boundaries": lambda: _rows([TILE4 - 1, 0, 0, 2, 0, TILE4 - 2, 0, 0, 0, TILE4 + 3], cols=400),
    "row_spanning_many_tiles": lambda: _rows([3, 0, 5000, 2, 0, 0, 1], cols=6000),
    "tile_of_many_empty_rows": lambda: _rows([1] + [0] * 10_000 + [1] * 40 + [0] * 3000 + [200, 0], cols=300),
    "fewer_entries_than_a_tile": lambda: _rows([0, 3, 0, 0, 20, 1, 0], cols=50),
    "a_multiple_of_a_tile": lambda: _rows([40, 0, 88, 2 * TILE4, 0, 0, 7, 121], cols=300),
    "empty_rows_after_the_last_tile": lambda: _rows([TILE4 * 3] + [0] * 500, cols=400),
    "empty_rows_before_the_first_entry": lambda: _rows([0] * 700 + [TILE4 + 9, 3], cols=400),
    "short_rows": lambda: _rows([1, 2, 0, 3] * 300, cols=10),
}


@functools.cache
def _case(name: str, dtype: str) -> sp.csr_matrix:
    make = HARD.get(name) or CASES.get(name)
    return (make() if make else load_shared(name)).astype(dtype)


def _brute_decomposition(indptr: np.ndarray, sigma: int, omega: int) -> dict[str, np.ndarray]:
    """``tile_ptr``, ``dirty``, ``flags`` written entry by entry, from their definitions."""
    indptr = [int(v) for v in indptr]
    m, nnz, tile = len(indptr) - 1, indptr[-1], omega * sigma
    n_tiles = nnz // tile
    row_of = [r for r in range(m) for _ in range(indptr[r + 1] - indptr[r])]
    starts = {indptr[r] for r in range(m) if indptr[r + 1] > indptr[r]}
    tile_ptr = [row_of[t * tile] for t in range(n_tiles)] + [row_of[n_tiles * tile] if n_tiles * tile < nnz else m]
    dirty = [int(any(indptr[r] == indptr[r + 1] for r in range(0 if t == 0 else tile_ptr[t] + 1, tile_ptr[t + 1])))
             for t in range(n_tiles)]
    flags = [sum(1 << k for k in range(sigma) if t * tile + lane * sigma + k in starts)
             for t in range(n_tiles) for lane in range(omega)]
    return {"tile_ptr": np.array(tile_ptr), "dirty": np.array(dirty), "flags": np.array(flags)}


def _check_decomposition(indptr: np.ndarray, sigma: int, omega: int) -> dict[str, np.ndarray]:
    dec = decompose(indptr, sigma=sigma, omega=omega)
    assert dec["tile_ptr"].dtype == np.int32 and dec["dirty"].dtype == np.uint8 and dec["flags"].dtype == np.uint32
    for key, want in _brute_decomposition(indptr, sigma, omega).items():
        np.testing.assert_array_equal(dec[key], want, err_msg=key)
    return dec


def _check_against_scipy(A, dtype: str, params: dict) -> None:
    ref = Reference.build(A, dtype, seed=1)  # y = A @ x by SciPy in float64; the bound scales with |A|·|x|
    y = FAMILY.run_reference(FAMILY.prepare_reference(A, params), ref.x)
    assert y.dtype == np.dtype(dtype)
    ok, _, msg = ref.check(y)  # a row no step writes stays NaN and fails here
    assert ok, f"{params}: {msg}"


# -- the space ------------------------------------------------------------------------------------
def test_space_and_instantiations():
    params = {p.name: p for p in FAMILY.space.params}
    assert list(params) == ["sigma", "block_size", "indices"]
    assert params["sigma"].values == SIGMAS and params["block_size"].values == BLOCK_SIZES
    assert all(b % 32 == 0 for b in BLOCK_SIZES) and max(SIGMAS) <= 32  # a flag word a lane
    assert FAMILY.space.defaults() == {"sigma": 16, "block_size": 128, "indices": "narrow"}
    for dtype, ctype in (("float64", "double"), ("float32", "float")):
        exprs = FAMILY.name_expressions(dtype)
        assert len(set(exprs)) == len(exprs) == 2 * len(SIGMAS) + 3
        assert {f"csr5_spmv<{ctype}, {s}, {n}>" for s in SIGMAS for n in ("true", "false")} | {
            "csr5_rows", "csr5_tiles", f"csr5_transpose<{ctype}>"} == set(exprs)
    assert get_family("csr5") is not None and FAMILY.describe()["params"] == FAMILY.space.to_dict()


def test_conformance_suite_runs_every_sigma():
    from tests.test_kernels import configs

    sample = configs("csr5")
    assert {c["sigma"] for c in sample} == set(SIGMAS)
    assert {c["block_size"] for c in sample} == set(BLOCK_SIZES) and {c["indices"] for c in sample} == {"narrow",
                                                                                                        "int32"}


@pytest.mark.parametrize(("npr", "sigma"), [(1.0, 4), (4.9, 4), (5.0, 4), (6.5, 6), (13.0, 12), (27.0, 24),
                                            (32.0, 32), (200.0, 32), (256.9, 32), (300.0, 6)])
def test_sigma_as_csr5_picks_it_from_the_mean_row(npr, sigma):
    assert set_sigma(npr) == sigma
    own = {"sigma": sigma, "block_size": 128, "indices": "narrow"}
    assert FAMILY.unranked_config({"npr_mean": npr}, 4) == own == FAMILY.judged_config({"npr_mean": npr}, 4)
    # float64: at most FLOAT64_SIGMA, while a second opinion is still taught by setSigma's own
    assert FAMILY.unranked_config({"npr_mean": npr}, 8) == {**own, "sigma": min(sigma, FLOAT64_SIGMA)}
    assert FAMILY.judged_config({"npr_mean": npr}, 8) == own
    assert FAMILY.unranked_config(None, 4) == FAMILY.space.defaults() == FAMILY.judged_config(None, 8)
    assert FAMILY.unranked_config(None, 8) == {**FAMILY.space.defaults(), "sigma": FLOAT64_SIGMA}


def test_a_race_enters_setsigmas_config_and_the_same_with_sigma_8_or_16_where_that_is_setsigmas() -> None:
    """setSigma is a rule of thumb: a race measures its sigma and 8 (16 where setSigma's is 8); in float64 the
    same two, 8 first where setSigma's is more."""
    assert [p["sigma"] for p in FAMILY.unranked_configs({"npr_mean": 27.0}, 4)] == [24, 8]
    assert [p["sigma"] for p in FAMILY.unranked_configs({"npr_mean": 27.0}, 8)] == [8, 24]
    assert [p["sigma"] for p in FAMILY.unranked_configs({"npr_mean": 8.5}, 4)] == [8, 16]
    assert [p["sigma"] for p in FAMILY.unranked_configs({"npr_mean": 8.5}, 8)] == [8, 16]
    assert [p["sigma"] for p in FAMILY.unranked_configs({"npr_mean": 2.0}, 8)] == [4, 8]
    assert [p["sigma"] for p in FAMILY.unranked_configs(None, 4)] == [16, 8]
    assert [p["sigma"] for p in FAMILY.unranked_configs(None, 8)] == [8, 16]
    assert all(p["block_size"] == 128 and p["indices"] == "narrow" for p in FAMILY.unranked_configs(None, 8))


def test_a_search_seeds_the_races_sigmas_and_those_beside_its_first() -> None:
    """A search measures what the race enters and the sigmas beside its first in the space, each once."""
    assert [p["sigma"] for p in FAMILY.unranked_seeds({"npr_mean": 2.0}, 8)] == [4, 8, 6]
    assert [p["sigma"] for p in FAMILY.unranked_seeds({"npr_mean": 12.0}, 4)] == [12, 8, 16]
    assert [p["sigma"] for p in FAMILY.unranked_seeds({"npr_mean": 12.0}, 8)] == [8, 12, 6]
    assert [p["sigma"] for p in FAMILY.unranked_seeds({"npr_mean": 100.0}, 4)] == [32, 8, 24]
    assert [p["sigma"] for p in FAMILY.unranked_seeds({"npr_mean": 100.0}, 8)] == [8, 32, 6, 12]
    assert all(FAMILY.space.validate(p, family="csr5") == p for p in FAMILY.unranked_seeds(None, 4))


# -- the decomposition against a brute force ------------------------------------------------------
@pytest.mark.parametrize(
    "lengths",
    [[3, 0, 2], [0, 0, 0, 5], [5, 0, 0, 0], [1], [0, 1], [40], [1, 0] * 20, [0] * 30 + [200] + [0] * 10 + [1],
     [4, 4, 0, 4, 0, 0, 4], [8, 0, 8, 0, 0, 8, 1]],
)
@pytest.mark.parametrize(("sigma", "omega"), [(1, 1), (1, 2), (2, 2), (4, 2), (3, 4), (4, 32)])
def test_decomposition_matches_a_brute_force(lengths, sigma, omega):
    _check_decomposition(np.concatenate(([0], np.cumsum(lengths))), sigma, omega)


@pytest.mark.parametrize("name", sorted(HARD))
@pytest.mark.parametrize("sigma", [4, 6, 32])
def test_decomposition_of_the_hard_cases(name, sigma):
    A = _case(name, "float64")
    dec = _check_decomposition(A.indptr, sigma, OMEGA)
    n_tiles, tile = A.nnz // (OMEGA * sigma), OMEGA * sigma
    assert dec["tile_ptr"].size == n_tiles + 1 and dec["flags"].size == n_tiles * OMEGA
    # lane l's k-th entry of tile t sits at t*tile + k*32 + l of the copies
    t, k, lane = np.meshgrid(np.arange(n_tiles), np.arange(sigma), np.arange(OMEGA), indexing="ij")
    np.testing.assert_array_equal(transposed(A.data, sigma=sigma, n_tiles=n_tiles),
                                  A.data[(t * tile + lane * sigma + k).ravel()])
    if n_tiles:
        assert dec["flags"][0] & 1  # the first entry starts a row: tile 0 carries nothing


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.one_of(st.just(0), st.integers(0, 6), st.integers(15, 90)), min_size=1, max_size=60),
    sigma=st.integers(1, 6),
    omega=st.integers(1, 5),
)
def test_reference_reproduces_the_product_for_any_geometry(lengths, sigma, omega):
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    if indptr[-1] == 0:
        return
    dec = _check_decomposition(indptr, sigma, omega)
    prods = np.random.default_rng(1).uniform(-1, 1, int(indptr[-1]))
    y, carry = spmv_reference(indptr, prods, dec, sigma=sigma, omega=omega)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    np.testing.assert_allclose(y, np.bincount(rows, prods, minlength=len(lengths)), rtol=1e-12, atol=1e-12)
    if not needs_fixup(indptr, dec["tile_ptr"], omega * sigma):
        assert np.all(carry == 0)  # the fix-up, skipped, would have added nothing


# -- a hand example: omega = 2, sigma = 2 (tiles of 4 entries) ------------------------------------
# rows: 0: e0 | 1, 2 empty | 3: e1 .. e9 | 4 empty | 5: e10 e11 e12; a_e = e + 1, x = 1: y = 1, 0, 0, 54, 0, 36.
# Tiles e0-e3 (lanes e0 e1 | e2 e3), e4-e7, e8-e11; e12 the tail. Tile 0 writes row 0 (1) and row 3's
# start (2 + 3 + 4) and zeroes rows 1, 2 (dirty); tile 1 holds row 3 only (carry 5 + 6 + 7 + 8); tile 2
# hands 9 + 10 to row 3, writes row 5's start (11 + 12) and zeroes row 4 (dirty); the tail carries 13 of row 5.
HAND_LENGTHS = [1, 0, 0, 9, 0, 3]
HAND_TILE_PTR = [0, 3, 3, 5]
HAND_DIRTY = [1, 0, 1]
HAND_FLAGS = [0b11, 0, 0, 0, 0, 0b01]
HAND_CARRY = [26, 19, 13]
HAND_Y = [1, 0, 0, 54, 0, 36]


def test_hand_example():
    indptr = np.concatenate(([0], np.cumsum(HAND_LENGTHS)))
    dec = _check_decomposition(indptr, 2, 2)
    np.testing.assert_array_equal(dec["tile_ptr"], HAND_TILE_PTR)
    np.testing.assert_array_equal(dec["dirty"], HAND_DIRTY)
    np.testing.assert_array_equal(dec["flags"], HAND_FLAGS)
    y, carry = spmv_reference(indptr, np.arange(1.0, 14.0), dec, sigma=2, omega=2)
    np.testing.assert_array_equal(carry, HAND_CARRY)
    np.testing.assert_array_equal(y, HAND_Y)
    assert needs_fixup(indptr, dec["tile_ptr"], 4)


def test_hand_example_through_the_family():
    """One tile of 128 entries with sigma = 4 holds more than the 13 entries: all of them are the tail."""
    indptr = np.concatenate(([0], np.cumsum(HAND_LENGTHS))).astype(np.int32)
    A = sp.csr_matrix((np.arange(1.0, 14.0), np.r_[0, np.arange(9), 0, 1, 2].astype(np.int32), indptr), shape=(6, 9))
    prepared = FAMILY.prepare_reference(A, {"sigma": 4})
    with pytest.raises(RuntimeError, match="run the prepared matrix once"):
        FAMILY.decomposition(prepared)
    np.testing.assert_array_equal(FAMILY.run_reference(prepared, np.ones(9)), HAND_Y)
    dec = FAMILY.decomposition(prepared)
    np.testing.assert_array_equal(dec["tile_ptr"], [0])  # no full tile; the tail starts at row 0
    assert dec["carry"].size == 0 and prepared.extra["tail_row"] == 0 and not prepared.extra["fixup"]


# -- the reference against SciPy ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(HARD) + sorted(CASES))
def test_reference_matches_scipy_on_hard_cases(name, dtype):
    for params in CPU_CONFIGS:
        _check_against_scipy(_case(name, dtype), dtype, params)


def test_the_hard_cases_are_hard():
    """Each hand-made case has the geometry its name says, with sigma = 4 (tiles of 128 entries)."""
    def dec(name):
        return decompose(_case(name, "float64").indptr, sigma=4)

    A = _case("empty_rows_at_tile_boundaries", "float64")
    assert np.all(np.isin(np.arange(1, 4) * TILE4, A.indptr))  # tiles 1-3 begin at a row start
    assert dec("empty_rows_at_tile_boundaries")["dirty"].any()
    assert np.bincount(dec("row_spanning_many_tiles")["tile_ptr"]).max() >= 5000 // TILE4  # one row, many tiles
    many = dec("tile_of_many_empty_rows")
    assert many["dirty"][0] and many["tile_ptr"][1] > 13_000  # tile 0's rows hold 13 000 empty ones
    assert dec("fewer_entries_than_a_tile")["tile_ptr"].size == 1
    assert _case("a_multiple_of_a_tile", "float64").nnz % (2 * TILE4) == 0
    assert dec("a_multiple_of_a_tile")["tile_ptr"][-1] == _case("a_multiple_of_a_tile", "float64").shape[0]


@pytest.mark.parametrize("name", SHARED)
def test_reference_matches_scipy_on_shared_matrices(name, shared_dir):
    for dtype in DTYPES:
        for params in CPU_CONFIGS:
            _check_against_scipy(_case(name, dtype), dtype, params)


# -- when the fix-up runs, memory, the 32-bit guard -----------------------------------------------
def test_fixup_needed_only_where_a_tile_begins_inside_a_row():
    aligned = _rows([TILE4] * 5, cols=200)  # every tile begins a row
    assert not needs_fixup(aligned.indptr, decompose(aligned.indptr, sigma=4)["tile_ptr"], TILE4)
    shifted = _rows([TILE4 + 1] * 5, cols=200)
    assert needs_fixup(shifted.indptr, decompose(shifted.indptr, sigma=4)["tile_ptr"], TILE4)
    tail = _rows([TILE4 * 2 + 3], cols=300)  # the tail begins inside the row
    assert needs_fixup(tail.indptr, decompose(tail.indptr, sigma=4)["tile_ptr"], TILE4)


def test_memory_ratio():
    """The transposed copies hold about the CSR's values and columns again, the descriptors 4 bytes a lane."""
    A = _case("random", "float64")
    for params in ({"sigma": 4, "indices": "int32"}, {"sigma": 32, "indices": "int32"}):
        ratio = FAMILY.memory_ratio(FAMILY.prepare_reference(A, params))
        csr = A.indptr.nbytes + A.indices.nbytes + A.data.nbytes
        assert 0.9 * (A.nnz * 12) / csr < ratio < 1.2
    assert FAMILY.memory_ratio(FAMILY.prepare_reference(CASES["zero_nnz"]())) == 0.0


def test_matrices_beyond_32_bit_indices_are_refused():
    check_size((INDEX_MAX, INDEX_MAX), INDEX_MAX)
    with pytest.raises(MatrixFormatError, match="32-bit"):
        check_size((INDEX_MAX + 1, 3), 10)
    huge = SimpleNamespace(shape=(3, 2**31), nnz=10, dtype=np.dtype(np.float64))  # checked before any array
    with pytest.raises(MatrixFormatError, match=r"csr5: a matrix of shape \(3, 2147483648\)"):
        FAMILY.prepare_reference(huge)


# -- GPU against the reference and SciPy ----------------------------------------------------------
def _gpu_check(A, dtype: str, params: dict) -> None:
    # run twice into NaN: y is written whole, the carries overwritten
    ref, cpu, gpu, expected, _, y = gpu_runs(FAMILY, A, dtype, params)
    bound = 2 * ref.rtol * ref.scale + ref.atol
    assert np.all(np.abs(y - expected) <= bound), f"{params}: GPU differs from its reference"
    if not (A.nnz and A.shape[0]):
        return
    got, want = FAMILY.decomposition(gpu), FAMILY.decomposition(cpu)
    for key in ("tile_ptr", "dirty", "flags", "values", "columns"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{params}: {key}")
    for key in ("tail_row", "fixup", "narrow"):
        assert gpu.extra[key] == cpu.extra[key], f"{params}: {key}"
    if cpu.extra["narrow"]:
        np.testing.assert_array_equal(gpu.extra["base"].get(), cpu.extra["base"])
    # A carry is a partial sum of one row: bounded by the same partial sum of |a||x|.
    abs_prods = products(abs(A), np.abs(ref.x))
    _, carry_scale = spmv_reference(A.indptr, abs_prods, want, sigma=params["sigma"])
    assert np.all(np.abs(got["carry"] - want["carry"]) <= 2 * ref.rtol * carry_scale + ref.atol), f"{params}: carry"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(HARD) + sorted(CASES))
def test_gpu_every_sigma_on_hard_cases(name, dtype):
    for params in GPU_CONFIGS:
        _gpu_check(_case(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_on_shared_matrices(dtype, shared_dir):
    for name in SHARED:
        for params in CPU_CONFIGS:
            _gpu_check(_case(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_arrow_row_across_thousands_of_tiles(dtype):
    """One row of all 200 000 columns plus a diagonal: the fix-up sums the carries of about 1 600 tiles of one
    row (sigma = 4), a warp's worth at a time; rows aligned with the tiles need no fix-up at all."""
    A = arrow(200_000)
    for params in ({"sigma": 4, "block_size": 64}, FAMILY.space.defaults()):
        _gpu_check(A.astype(dtype), dtype, params)
    aligned = _rows([TILE4] * 50, cols=200).astype(dtype)
    _gpu_check(aligned, dtype, {"sigma": 4})
