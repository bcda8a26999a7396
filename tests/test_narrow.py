"""Narrow columns (kernels/_narrow.py): which segments take 16-bit offsets, when they pay, the products of
csr_vector (a row a segment), merge_path and csr5 (a tile a segment) through them on the CPU and the GPU, the
GPU's encoding equal to the reference's (the conformance suite, tests/test_kernels.py, runs every config on
every case; its matrices have fewer than 65,536 columns, so every segment there is narrow)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from kernels import get_family
from kernels._narrow import OFFSET_LIMIT, encode, group_lanes, narrow_columns
from kernels.csr5 import OMEGA, tile_bounds
from kernels.rcm import renumbered
from tests.kernel_cases import gpu_runs
from tuner.matrix.io import as_csr

COLS = 3 * OFFSET_LIMIT


def _mixed(seed: int = 0) -> sp.csr_matrix:
    """300 rows of 200 K columns: rows 0-99 a run of 40 columns somewhere, rows 100-199 empty but every
    tenth (one entry), rows 200-299 ten columns spread over all of them, row 155 columns 0 and 65,536 (a span
    just too wide) and row 165 columns 7 and 65,542 (the widest narrow one)."""
    rng = np.random.default_rng(seed)
    rows, cols = [], []
    for i in range(100):
        start = int(rng.integers(0, COLS - 40))
        rows += [i] * 40
        cols += range(start, start + 40)
    for i in range(100, 200, 10):
        rows.append(i)
        cols.append(int(rng.integers(0, COLS)))
    rows += [155, 155, 165, 165]
    cols += [0, OFFSET_LIMIT, 7, 7 + OFFSET_LIMIT - 1]
    for i in range(200, 300):
        rows += [i] * 10
        cols += list(rng.choice(COLS, 10, replace=False))
    A = sp.csr_matrix((rng.uniform(-1, 1, len(rows)), (rows, cols)), shape=(300, COLS))
    return as_csr(A)


def _local(seed: int = 0) -> sp.csr_matrix:
    """3,100 rows of 200 K columns: rows 0-2999 twenty columns within 100 of 60 x row (a band drifting
    across all the columns: narrow rows and narrow tiles), rows 3000-3099 ten spread columns (wide ones)."""
    rng = np.random.default_rng(seed)
    band = np.repeat(np.arange(3000), 20)
    cols = 60 * band + rng.integers(0, 100, band.size)
    spread = np.repeat(np.arange(3000, 3100), 10)
    rows, cols = np.concatenate([band, spread]), np.concatenate([cols, rng.integers(0, COLS, spread.size)])
    return as_csr(sp.csr_matrix((rng.uniform(-1, 1, rows.size), (rows, cols)), shape=(3100, COLS)))


def test_rows_spanning_fewer_than_65536_columns_take_offsets_from_their_lowest():
    A = _mixed()
    base, offsets = narrow_columns(A.indptr, A.indices)
    rows = [A.indices[a:b] for a, b in zip(A.indptr[:-1], A.indptr[1:], strict=True)]
    lowest = np.array([r.min() if r.size else 0 for r in rows])
    span = np.array([np.ptp(r) if r.size else 0 for r in rows])
    np.testing.assert_array_equal(base, np.where(span < OFFSET_LIMIT, lowest, -1))
    assert (base[:100] >= 0).all() and (base[200:] == -1).all() and base[101] == 0  # an empty row
    assert base[155] == -1 and base[165] == 7
    rows = np.repeat(np.arange(300), np.diff(A.indptr))
    narrow = base[rows] >= 0
    np.testing.assert_array_equal(base[rows][narrow] + offsets[narrow].astype(np.int64), A.indices[narrow])
    assert offsets.dtype == np.uint16 and (offsets[~narrow] == 0).all()


def test_offsets_are_kept_only_where_they_save_bytes():
    """Each row's base word costs 4 bytes, each offset saves 2: narrow rows must hold more than 2 entries for
    each row of the matrix."""
    wide = _mixed()
    wide = as_csr(wide[200:])  # ten spread columns a row: no row is narrow
    assert narrow_columns(wide.indptr, wide.indices) is None
    diagonal = as_csr(sp.identity(1000, format="csr"))  # one entry a row: 2 bytes saved, 4 spent
    assert narrow_columns(diagonal.indptr, diagonal.indices) is None
    band = as_csr(sp.diags([1.0, 2.0, 3.0], [-1, 0, 1], shape=(1000, 1000), format="csr"))  # 3 a row: pays
    assert narrow_columns(band.indptr, band.indices) is not None


FAMILIES = ("csr_vector", "merge_path", "csr5")
PARAMS = {"csr_vector": {"threads_per_row": 4}, "merge_path": {}, "csr5": {"sigma": 4}}


@pytest.mark.parametrize("indices", ["narrow", "int32"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_reference_multiplies_through_the_offsets(family, indices):
    f = get_family(family)
    for A in (_mixed(), _local()):
        prepared = f.prepare_reference(A, {**PARAMS[family], "indices": indices})
        x = np.random.default_rng(1).uniform(-1, 1, COLS)
        np.testing.assert_allclose(f.run_reference(prepared, x), A @ x, rtol=1e-12, atol=1e-12)
    assert ("base" in prepared.extra) == (indices == "narrow")  # _local: narrow rows and tiles pay
    if indices == "narrow":
        base = prepared.extra["base"]
        assert (base >= 0).any() and (base == -1).any()


def _unsorted(A: sp.csr_matrix) -> sp.csr_matrix:
    """A with each row's entries in reverse order (rcm's renumbered matrices are not sorted by column)."""
    order = np.concatenate([np.arange(b - 1, a - 1, -1) for a, b in zip(A.indptr[:-1], A.indptr[1:], strict=True)])
    return sp.csr_matrix((A.data[order], A.indices[order], A.indptr), shape=A.shape)


def _segments(family: str, prepared) -> np.ndarray:
    """Where the family cuts its columns into segments: rows, merge-path tiles or csr5's tiles (of its
    transposed copy)."""
    if family == "csr5":
        return tile_bounds(prepared.extra["tile_ptr"].size - 1, OMEGA * prepared.params["sigma"], np)
    return prepared.extra["tile_nz"] if family == "merge_path" else prepared.A.indptr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("family", "params"), [("csr_vector", {"threads_per_row": 2}),
                                                ("csr_vector", {"threads_per_row": 32}),
                                                ("merge_path", {"loads": "block"}),
                                                ("merge_path", {"loads": "thread", "items_per_thread": 3}),
                                                ("csr5", {"sigma": 4}), ("csr5", {"sigma": 32})])
def test_gpu_encodes_the_columns_as_the_reference_does(family, params, dtype):
    f = get_family(family)
    cases = (_local(), _unsorted(_local(2)))
    if family == "csr_vector":  # a row a segment: the widest narrow row and the narrowest wide one
        cases += (_mixed(), renumbered(_mixed(3), np.arange(300)[::-1], np.arange(COLS)))
    for A in cases:
        A = A.astype(dtype)
        _, cpu, gpu, expected, _, y = gpu_runs(f, A, dtype, params)
        base = gpu.extra["base"].get()
        np.testing.assert_array_equal(base, cpu.extra["base"])
        narrow = np.repeat(base, np.diff(_segments(family, cpu))) >= 0
        np.testing.assert_array_equal(gpu.extra["offsets"].get()[narrow], cpu.extra["offsets"][narrow])
        np.testing.assert_allclose(y, expected, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-6)


def test_a_segment_gets_a_thread_for_about_four_of_the_mean_ones_entries():
    """The power of 2 nearest a quarter of the mean (on a log scale: 4 from 11.3 to 22.6 entries), 2 at least
    above one entry, 32 at most."""
    means = (0, 1, 1.01, 3.8, 11.3, 11.4, 22.6, 22.7, 45.2, 45.3, 90.5, 90.6, 3000)
    assert [group_lanes(round(100 * mean), 100) for mean in means] == [1, 1, 2, 2, 2, 4, 4, 8, 8, 16, 16, 32, 32]
    assert group_lanes(0, 0) == 1


def _short(mean: int, seed: int) -> sp.csr_matrix:
    """5,000 rows of 1 to 2 x mean - 1 entries (a tenth empty, three of 30 x mean) near 40 x row, and a fifth
    of the rows with one entry far off (wide)."""
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(5000) < 0.1, 0, rng.integers(1, max(2, 2 * mean), 5000))
    lengths[[7, 2500, 4999]] = 30 * mean
    rows = np.repeat(np.arange(5000), lengths)
    cols = np.minimum(40 * rows + rng.integers(0, 4000, rows.size), COLS - 1)
    far = rng.random(rows.size) < 0.2 / np.maximum(np.repeat(lengths, lengths), 1)
    cols[far] = (cols[far] + 2 * OFFSET_LIMIT) % COLS
    return as_csr(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(5000, COLS)))


def _long_segments() -> tuple[np.ndarray, np.ndarray]:
    """(ptr, indices) of segments around the entry limit: 65,537 and 65,536 entries of one column (a tile's
    columns may repeat), rows of 65,536 and 65,537 consecutive columns, a row of 60,000 random columns, two
    short rows."""
    rng = np.random.default_rng(3)
    segments = [np.full(OFFSET_LIMIT + 1, 5), np.full(OFFSET_LIMIT, 5), np.arange(OFFSET_LIMIT),
                np.arange(OFFSET_LIMIT + 1), np.sort(rng.choice(COLS, 60_000, replace=False)), np.arange(9, 12),
                np.array([70_000])]
    ptr = np.concatenate([[0], np.cumsum([s.size for s in segments])]).astype(np.int32)
    return ptr, np.concatenate(segments).astype(np.int32)


def test_a_segment_of_more_entries_than_the_offsets_reach_is_wide_whatever_its_columns():
    """More than 65,536 entries: wide, even where they repeat one column (the GPU does not read them); 65,536
    consecutive columns are the longest narrow row."""
    ptr, indices = _long_segments()
    base, _, narrow_entries = encode(ptr, indices)
    assert base.tolist() == [-1, 5, 0, -1, -1, 9, 70_000]
    assert narrow_entries == 2 * OFFSET_LIMIT + 3 + 1


@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [1, 2, 32])
def test_gpu_encodes_long_segments_as_the_reference_does(lanes):
    """The segments around the entry limit, and a row of 60,000 random columns (its threads stop reading once
    their own columns span too far): the GPU's base, offsets and count are the reference's."""
    import cupy

    from kernels._narrow import encode_on_gpu

    ptr, indices = _long_segments()
    base, offsets, narrow_entries = encode(ptr, indices)
    narrow = np.repeat(base, np.diff(ptr)) >= 0
    gpu = encode_on_gpu(cupy.asarray(ptr), cupy.asarray(indices), lanes)
    np.testing.assert_array_equal(gpu[0].get(), base)
    np.testing.assert_array_equal(gpu[1].get()[narrow], offsets[narrow])
    assert gpu[2] == narrow_entries


@pytest.mark.gpu
@pytest.mark.parametrize("mean", [1, 2, 3, 6, 12, 40])
def test_gpu_groups_of_any_size_encode_segments_as_the_reference_does(mean):
    """narrow_offsets with 1 to 32 threads a segment (group_lanes' pick among them), long rows
    among short ones taking the group's loop: the same base, offsets and count of narrow entries as the
    reference."""
    import cupy

    from kernels._narrow import encode_on_gpu

    A = _short(mean, seed=mean)
    base, offsets, narrow_entries = encode(A.indptr, A.indices)
    assert (base == -1).any() and (base >= 0).any()
    narrow = np.repeat(base, np.diff(A.indptr)) >= 0
    ptr, indices = cupy.asarray(A.indptr), cupy.asarray(A.indices)
    for lanes in (1, 2, 4, 8, 16, 32):
        gpu = encode_on_gpu(ptr, indices, lanes)
        np.testing.assert_array_equal(gpu[0].get(), base)
        np.testing.assert_array_equal(gpu[1].get()[narrow], offsets[narrow])
        assert gpu[2] == narrow_entries


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_keeps_int32_columns_where_offsets_do_not_pay(family):
    f = get_family(family)
    for A, params in ((as_csr(_mixed()[200:]), {}), (_local(), {"indices": "int32"})):
        _, cpu, gpu, expected, _, y = gpu_runs(f, A, "float64", params)
        assert "base" not in gpu.extra and "base" not in cpu.extra
        np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


def test_a_count_known_before_decides_whether_offsets_pay():
    """A row family given the entries of its narrow rows (plan()'s structure pass counts them) takes that count's
    answer without counting again; the matrix object carries it (note_narrow_rows), and a stale count changes the
    choice, never the product: a wide row's base is -1 whatever the count said."""
    from kernels._narrow import attach, narrow_rows, note_narrow_rows

    A = _local()
    counted = encode(A.indptr, A.indices)[2]
    assert narrow_rows(A) is None
    note_narrow_rows(A, counted)
    assert narrow_rows(A) == counted
    extra: dict = {}
    assert attach(extra, {"indices": "narrow"}, A.indptr, A.indices, narrow_rows(A))
    np.testing.assert_array_equal(extra["base"], narrow_columns(A.indptr, A.indices)[0])
    assert not attach({}, {"indices": "narrow"}, A.indptr, A.indices, 0)  # said to pay nothing: int32 columns
    assert not attach({}, {"indices": "int32"}, A.indptr, A.indices, counted)
    wide = as_csr(_mixed()[200:])  # no narrow row, said to hold many: offsets written, wide rows marked
    extra = {}
    assert attach(extra, {"indices": "narrow"}, wide.indptr, wide.indices, 10 * wide.shape[0])
    assert (extra["base"] == -1).all()
    f = get_family("csr_vector")
    prepared = f.prepare_reference(wide, {"threads_per_row": 4, "indices": "narrow"})
    prepared.extra.update(extra)
    x = np.random.default_rng(1).uniform(-1, 1, COLS)
    np.testing.assert_allclose(f.run_reference(prepared, x), wide @ x, rtol=1e-12, atol=1e-12)


class _OutOfMemory(Exception):
    """CuPy's out-of-memory error, as the stand-ins of :func:`_encode_stand_in` raise it."""


def _encode_stand_in(monkeypatch) -> tuple[list, tuple]:
    """queue_encode replaced by a stand-in that logs its (ptr, gate) and returns two arrays told apart by identity,
    and CuPy's out-of-memory error by :class:`_OutOfMemory`: rows_written_once on any machine."""
    from types import SimpleNamespace

    import kernels._narrow as narrow

    calls: list = []
    written = (np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.uint16))

    def queue_encode(ptr, indices, gate=None):
        calls.append((ptr, gate))
        return written

    monkeypatch.setattr(narrow, "queue_encode", queue_encode)
    monkeypatch.setattr(narrow, "require_cupy", lambda: SimpleNamespace(
        cuda=SimpleNamespace(memory=SimpleNamespace(OutOfMemoryError=_OutOfMemory))))
    return calls, written


def test_rows_written_once_are_taken_by_the_preparations_of_that_matrix_only(monkeypatch):
    """A race writes a new matrix's 16-bit row columns once, before it knows what it runs (rows_written_once):
    only where the structure pass counted rows that pay, only for preparations of the same arrays, only within;
    where the GPU has no room for them, each preparation writes its own."""
    import kernels._narrow as narrow

    calls, written = _encode_stand_in(monkeypatch)
    A = _local()
    counted = encode(A.indptr, A.indices)[2]
    narrow.note_narrow_rows(A, counted)
    params = {"indices": "narrow"}
    with narrow.rows_written_once(A):
        extra: dict = {}
        assert narrow.attach(extra, params, A.indptr, A.indices, narrow.narrow_rows(A))
        assert (extra["base"], extra["offsets"]) == written and calls == [(A.indptr, None)]
        other: dict = {}  # the same columns in other arrays: written apart
        assert narrow.attach(other, params, A.indptr.copy(), A.indices.copy(), counted)
        np.testing.assert_array_equal(other["base"], narrow_columns(A.indptr, A.indices)[0])
    after: dict = {}
    assert narrow.attach(after, params, A.indptr, A.indices, counted) and after["base"] is not written[0]
    for noted in (0, None):  # offsets that do not pay, or rows nobody counted: nothing written ahead
        B = _local(seed=2)
        if noted is not None:
            narrow.note_narrow_rows(B, noted)
        with narrow.rows_written_once(B):
            pass
    assert calls == [(A.indptr, None)]

    def no_room(ptr, indices, gate=None):
        raise _OutOfMemory

    monkeypatch.setattr(narrow, "queue_encode", no_room)
    with narrow.rows_written_once(A):
        extra = {}
        assert narrow.attach(extra, params, A.indptr, A.indices, counted)
        np.testing.assert_array_equal(extra["base"], narrow_columns(A.indptr, A.indices)[0])


def test_rows_written_behind_a_gate_are_taken_only_where_it_opened(monkeypatch):
    """A prediction queues the row columns before the rows are counted, behind its ranking (rows_written_once with
    a gate): queued whatever the count, and taken by a preparation of the same arrays only where the gate says
    the GPU's pick took them and, the count known by then, they pay."""
    import kernels._narrow as narrow

    calls, written = _encode_stand_in(monkeypatch)
    A = _local()
    counted = encode(A.indptr, A.indices)[2]
    params = {"indices": "narrow"}
    for opened in (True, False):
        gate = narrow.PickGate(words=None, at=0, takes=None, taken=lambda opened=opened: opened)
        with narrow.rows_written_once(A, gate=gate):  # nothing counted yet: queued all the same
            extra: dict = {}
            assert narrow.attach(extra, params, A.indptr, A.indices, counted)
            assert (extra["base"] is written[0]) == opened and calls[-1] == (A.indptr, gate)
            if not opened:  # written by the preparation itself
                np.testing.assert_array_equal(extra["base"], narrow_columns(A.indptr, A.indices)[0])
            assert not narrow.attach({}, params, A.indptr, A.indices, 0)  # they do not pay: int32 columns
    assert len(calls) == 2


def test_the_row_families_with_narrow_indices_read_the_row_columns():
    """reads_row_columns: csr_vector and csr_scalar asking for narrow indices take the columns of the matrix's own
    rows; with int32 indices, other families (rcm's rows are renumbered, csr5 and merge_path narrow tiles) and an
    unknown family do not."""
    from kernels import REGISTRY
    from kernels._narrow import reads_row_columns

    takes = {name for name, family in REGISTRY.items() if reads_row_columns(family, {"indices": "narrow"})}
    assert takes == {"csr_vector", "csr_scalar"}
    assert not reads_row_columns(REGISTRY["csr_vector"], {"indices": "int32"})
    assert not reads_row_columns(None, {"indices": "narrow"})


@pytest.mark.gpu
def test_gpu_a_closed_gate_writes_nothing_and_an_open_one_what_no_gate_writes():
    """narrow_offsets behind a gate (a config's place as a double, a byte a config): where the place names a config
    whose byte is set it writes what it writes ungated (queue_encode with a PickGate); where it names another, or
    none (-1), nothing: base and offsets keep what they held, and the count of narrow entries stays 0."""
    import cupy

    from kernels._cuda import get_kernels
    from kernels._narrow import CU_FILE, KERNELS, PickGate, group_lanes, queue_encode

    A = _short(6, seed=3)
    ptr, indices = cupy.asarray(A.indptr), cupy.asarray(A.indices)
    base, offsets, _ = encode(A.indptr, A.indices)
    narrow = np.repeat(base, np.diff(A.indptr)) >= 0
    takes = cupy.asarray(np.array([0, 1, 0], dtype=np.uint8))
    got = queue_encode(ptr, indices, gate=PickGate(cupy.asarray(np.array([7.0, 1.0])), 1, takes, lambda: True))
    np.testing.assert_array_equal(got[0].get(), base)
    np.testing.assert_array_equal(got[1].get()[narrow], offsets[narrow])
    kernel = get_kernels(CU_FILE, KERNELS)["narrow_offsets"]
    segments = A.shape[0]
    for picked in (0.0, 2.0, -1.0):
        held = cupy.full(segments, -7, dtype=cupy.int32), cupy.full(A.nnz, 9, dtype=cupy.uint16)
        count = cupy.zeros(1, dtype=cupy.uint64)
        kernel((64,), (256,), (np.int32(segments), np.int32(group_lanes(A.nnz, segments)), ptr, indices, *held,
                               count, cupy.asarray(np.array([7.0, picked])), np.int64(1), takes))
        assert (held[0].get() == -7).all() and (held[1].get() == 9).all() and int(count.get()[0]) == 0


@pytest.mark.gpu
def test_gpu_row_families_prepared_within_share_the_rows_written_once():
    """Within rows_written_once, csr_vector and csr_scalar prepared on plan()'s matrix take the same base and
    offsets (one copy), the very ones each writes for itself, and multiply as the reference does."""
    import cupy
    import cupyx.scipy.sparse as cusp

    from kernels._narrow import rows_written_once
    from tuner.matrix.fingerprint import device_csr_and_fingerprint

    A = _local()
    B = device_csr_and_fingerprint(cusp.csr_matrix(A))[0]
    x = np.random.default_rng(4).uniform(-1, 1, COLS)
    alone = get_family("csr_vector").prepare(B, {"indices": "narrow"})
    with rows_written_once(B):
        prepared = [get_family(name).prepare(B, {"indices": "narrow"}) for name in ("csr_vector", "csr_scalar")]
    assert prepared[0].extra["base"] is prepared[1].extra["base"] is not alone.extra["base"]
    np.testing.assert_array_equal(prepared[0].extra["base"].get(), alone.extra["base"].get())
    for p in prepared:
        y = get_family(p.family).run(p, cupy.asarray(x)).get()
        np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_plan_writes_row_columns_ahead_for_a_race_and_behind_a_predictions_ranking(monkeypatch, tmp_path):
    """plan() of a matrix new to the store writes its 16-bit row columns ahead: a race before it ranks
    (rows_written_once, the count read back), a prediction behind its ranking kernel, gated by that kernel's pick
    (the gate opened exactly where the pick takes them, and its preparation took those very columns then); none
    without a selector (cuSPARSE runs); products right."""
    import inspect

    import cupy
    import cupyx.scipy.sparse as cusp

    import kernels._narrow as narrow
    from db.store import Store
    from kernels import canonical, get_family
    from tuner.execute.plan import plan
    from tuner.select.shipped import DATA_DIR

    calls = []
    real = narrow.queue_encode

    def queue_encode(*args, **kwargs):
        written = real(*args, **kwargs)
        calls.append((inspect.stack()[1].function, kwargs.get("gate"), written))
        return written

    monkeypatch.setattr(narrow, "queue_encode", queue_encode)
    A = _local()
    assert narrow._pays(encode(A.indptr, A.indices)[2], A.shape[0])
    x = np.random.default_rng(6).uniform(-1, 1, COLS)
    cases = ((tmp_path / "none", "predict"), (DATA_DIR, "predict"), (DATA_DIR, "race"))
    for case, (models, effort) in enumerate(cases):
        monkeypatch.setenv("SPMV_TUNER_MODELS", str(models))
        calls.clear()
        ex = plan(cusp.csr_matrix(A), effort=effort, db=Store(tmp_path / f"{case}.db"))
        if models != DATA_DIR:
            assert ex.source == "default" and calls == []
        else:
            caller, gate, written = calls[0]
            assert caller == "rows_written_once" and (gate is not None) == (effort == "predict"), (effort, calls)
        if models == DATA_DIR and effort == "predict":
            takes = narrow.reads_row_columns(get_family(ex.kernel), canonical(ex.kernel, ex.params))
            assert ex.source == "predicted" and gate.taken() == takes
            assert (ex._prepared.extra.get("base") is written[0]) == takes, (ex.kernel, ex.params)
        np.testing.assert_allclose(ex(cupy.asarray(x)).get(), A @ x, rtol=1e-12, atol=1e-12)
        if ex.race is not None:
            assert ex.race.recorded.result() > 0  # the race's laps written before the store's folder goes


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["csr_vector", "csr_scalar"])
def test_plan_counts_narrow_rows_in_its_structure_pass_and_the_row_families_take_it(family):
    """The structure pass counts the entries of rows spanning fewer than 65,536 columns as the reference
    encoding does; the matrix plan() works on carries that count, and a row family prepared on it writes the same
    offsets as one that counts for itself, and multiplies the same, stale counts included."""
    import cupy
    import cupyx.scipy.sparse as cusp

    from kernels._narrow import narrow_rows, note_narrow_rows
    from tuner.matrix.fingerprint import device_csr_and_fingerprint
    from tuner.matrix.structure_gpu import structure_pass

    f = get_family(family)
    x = np.random.default_rng(1).uniform(-1, 1, COLS)
    for A in (_mixed(), _local(), _short(3, seed=3), as_csr(_mixed()[200:]), as_csr(sp.csr_matrix((4, COLS)))):
        counted = encode(A.indptr, A.indices)[2]
        on_gpu = cusp.csr_matrix(A)
        assert structure_pass(on_gpu.indptr, on_gpu.indices).narrow_rows == counted
        B = device_csr_and_fingerprint(on_gpu)[0]
        assert narrow_rows(B) == counted
        plain = f.prepare(cusp.csr_matrix(A), {"indices": "narrow"})
        for noted in (counted, 0, 10 * A.shape[0]):
            note_narrow_rows(B, noted)
            prepared = f.prepare(B, {"indices": "narrow"})
            if noted == counted:
                assert ("base" in prepared.extra) == ("base" in plain.extra)
                if "base" in plain.extra:
                    np.testing.assert_array_equal(prepared.extra["base"].get(), plain.extra["base"].get())
            y = f.run(prepared, cupy.asarray(x)).get()
            np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)
