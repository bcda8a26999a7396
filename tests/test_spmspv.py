"""SpMSpV: both modes' CPU references (and the GPU against them), the executor's input rules, BFS."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from common.errors import InvalidConfigError, StoreError
from db.store import Store
from kernels import get_family
from kernels.spmspv import DENSE, MODES, SPARSE
from tests.conftest import REPO
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.execute.algorithms import bfs, frontier_matrix
from tuner.execute.spmspv import SpMSpVExecutor, as_sparse_vector, plan_spmspv
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.generate import generate
from tuner.matrix.io import as_csr
from tuner.select import spmspv_selector

CONFIGS = [("sparse", {"merge": "spa"}), ("sparse", {"merge": "sort"}),
           ("dense", {"rows_per_panel": 256, "cols_per_tile": 1024, "threads": 128}), ("dense", {}),
           ("dense", {"kernel": "csr_vector", "threads_per_row": 4}), ("dense", {"kernel": "cusparse"})]


def sparse_x(n: int, fill: float, seed: int, dtype: str = "float64") -> tuple[np.ndarray, np.ndarray]:
    """A canonical x with about ``fill`` * n nonzeros (at least one when n > 0 and fill > 0)."""
    rng = np.random.default_rng(seed)
    k = min(n, max(1, round(fill * n))) if fill else 0
    idx = np.sort(rng.choice(n, size=k, replace=False)).astype(np.int32)
    return idx, rng.uniform(-1, 1, k).astype(dtype)


def expected(A: sp.csr_matrix, idx: np.ndarray, val: np.ndarray) -> np.ndarray:
    x = np.zeros(A.shape[1])
    x[idx] = val
    return A.astype(np.float64) @ x


def check(A: sp.csr_matrix, y: tuple[np.ndarray, np.ndarray], want: np.ndarray, dtype: str) -> None:
    """y = (indices, values) is canonical and equals ``want`` within the dtype's rounding."""
    idx, val = (np.asarray(a) for a in y)
    assert idx.dtype == np.int32 and val.dtype == np.dtype(dtype)
    assert np.all(np.diff(idx) > 0) and np.all(val != 0)
    dense = np.zeros(A.shape[0])
    dense[idx] = val
    eps = np.finfo(dtype).eps
    scale = abs(A).astype(np.float64) @ np.ones(A.shape[1])
    bound = 8 * eps * np.maximum(scale, 1.0) * max(1, int(np.diff(A.indptr).max(initial=1))) ** 0.5 + 1e-30
    assert np.all(np.abs(dense - want) <= bound)
    missing = np.setdiff1d(np.flatnonzero(np.abs(want) > bound), idx)
    assert missing.size == 0, f"rows {missing[:5]} are nonzero but missing from y"


# -- CPU references -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,params", CONFIGS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_modes_on_hard_cases(case: str, mode: str, params: dict) -> None:
    A = CASES[case]()
    prepared = MODES[mode].prepare_reference(A, params)
    for fill, seed in ((0.0, 0), (1e-9, 1), (0.1, 2), (1.0, 3)):
        idx, val = sparse_x(A.shape[1], fill, seed)
        check(A, MODES[mode].run_reference(prepared, idx, val), expected(A, idx, val), "float64")


@pytest.mark.parametrize("name", shared_cases())
def test_reference_modes_on_shared_matrices(name: str, shared_dir) -> None:
    A = load_shared(name)
    for mode, params in CONFIGS[:3]:
        prepared = MODES[mode].prepare_reference(A, params)
        for fill, seed in ((1e-9, 1), (0.02, 2), (1.0, 3)):
            idx, val = sparse_x(A.shape[1], fill, seed)
            check(A, MODES[mode].run_reference(prepared, idx, val), expected(A, idx, val), "float64")


def test_sparse_decomposition_touches_only_the_active_columns() -> None:
    A = as_csr(sp.random(50, 40, density=0.2, random_state=3))
    prepared = SPARSE.prepare_reference(A)
    idx = np.array([2, 9, 17, 39], dtype=np.int32)
    offsets, owner, position = SPARSE.products(prepared, idx)
    csc = A.tocsc()
    assert offsets.tolist() == np.r_[0, np.cumsum(np.diff(csc.indptr)[idx])].tolist()
    for e, c in enumerate(idx):  # product p of x entry e reads column c's entries in order
        assert position[owner == e].tolist() == list(range(csc.indptr[c], csc.indptr[c + 1]))


def test_both_modes_leave_out_exact_zeros_from_cancellation() -> None:
    A = as_csr(sp.csr_matrix(np.array([[1.0, -1.0, 0.0], [1.0, 0.0, 2.0]])))
    for mode, params in CONFIGS:
        prepared = MODES[mode].prepare_reference(A, params)
        idx, val = MODES[mode].run_reference(prepared, np.array([0, 1], np.int32), np.array([1.0, 1.0]))
        assert idx.tolist() == [1] and val.tolist() == [1.0]


# -- input rules ----------------------------------------------------------------------------------


def test_sparse_vector_forms_agree_and_duplicates_are_summed() -> None:
    want_idx, want_val = [1, 4, 7], [3.0, -1.0, 2.0]
    forms = [
        (np.array([4, 1, 7, 1]), np.array([-1.0, 1.0, 2.0, 2.0])),  # unsorted, 1 twice: summed
        sp.csr_matrix((want_val, ([0, 0, 0], want_idx)), shape=(1, 9)),
        sp.csc_array((want_val, (want_idx, [0, 0, 0])), shape=(9, 1)),
        (np.array(want_idx, dtype=np.uint16), np.array([3, -1, 2])),
    ]
    for x in forms:
        idx, val = as_sparse_vector(x, 9, np.float32)
        assert idx.dtype == np.int32 and val.dtype == np.float32
        assert idx.tolist() == want_idx and val.tolist() == want_val


@pytest.mark.parametrize("x,error,match", [
    ((np.array([0, 9]), np.ones(2)), ValueError, r"index 9, outside \[0, 9\)"),
    ((np.array([-1]), np.ones(1)), ValueError, "index -1"),
    ((np.array([0, 1]), np.ones(3)), ValueError, "one length"),
    ((np.array([0.5]), np.ones(1)), ValueError, "integers"),
    ((np.array([1]), np.array([np.nan])), ValueError, "NaN"),
    ((np.array([1]), np.array([1j])), ValueError, "real"),
    (sp.csr_matrix((2, 9)), ValueError, r"shape \(1, 9\) or \(9, 1\)"),
    (np.ones(9), TypeError, "plan\\(A\\)"),
])
def test_bad_sparse_vectors_are_rejected_with_what_is_wrong(x, error, match) -> None:
    with pytest.raises(error, match=match):
        as_sparse_vector(x, 9, np.float64)


# -- the executor (CPU references here; the GPU path below) ----------------------------------------


def test_plan_spmspv_without_gpu_runs_the_references_and_picks_modes_by_fill(monkeypatch) -> None:
    monkeypatch.setattr("tuner.execute.spmspv.gpu_available", lambda: False)
    A = generate("powerlaw", rows=3000, seed=2)
    ex = plan_spmspv(A)
    assert ex.selector_source == "default" and ex.xp is np
    assert ex.crossover() == pytest.approx(spmspv_selector.DEFAULT_CROSSOVER, rel=0.15)
    few, many = sparse_x(3000, 0.001, 1), sparse_x(3000, 0.5, 2)
    for x, mode in ((few, "sparse"), (many, "dense")):
        check(A, ex(x), expected(A, *x), "float64")
        assert ex.last_mode == mode
        y = ex(x, dense=True, mode="sparse" if mode == "dense" else "dense")
        assert y.shape == (3000,) and np.allclose(y, expected(A, *x))
    assert set(ex.memory) == {"csr_bytes", "sparse_vs_csr", "dense_vs_csr"}
    assert 0.9 < ex.memory["sparse_vs_csr"] < 1.2 and ex.memory["dense_vs_csr"] > 0.5
    assert "dense from fill" in ex.explain() and "the dense mode runs nut" in ex.explain()
    with pytest.raises(ValueError, match="unknown SpMSpV mode"):
        ex(few, mode="hybrid")


def test_the_dense_mode_runs_any_family_and_names_a_bad_one() -> None:
    A = generate("uniform", rows=500, seed=3)
    prepared = DENSE.prepare_reference(A, {"kernel": "suraa", "threshold": 16})
    assert prepared.params["kernel"] == "suraa" and prepared.params["threshold"] == 16
    x = sparse_x(500, 0.2, 4)
    check(A, DENSE.run_reference(prepared, *x), expected(A, *x), "float64")
    assert DENSE.prepare_reference(A).params == {"kernel": "nut", **get_family("nut").space.defaults()}
    with pytest.raises(InvalidConfigError, match="unknown kernel 'nope'"):
        DENSE.prepare_reference(A, {"kernel": "nope"})
    with pytest.raises(InvalidConfigError, match="spmspv dense mode \\(csr_vector\\)"):
        DENSE.prepare_reference(A, {"kernel": "csr_vector", "rows_per_panel": 256})


def test_the_small_sort_size_is_the_same_in_python_and_cuda() -> None:
    import re

    from kernels import spmspv

    source = (REPO / "kernels" / "spmspv.cu").read_text()
    assert int(re.search(r"#define SMALL_SORT (\d+)", source).group(1)) == spmspv.SMALL_SORT


def test_plan_with_op_spmspv_and_an_unknown_op(monkeypatch) -> None:
    from tuner.execute.plan import plan

    monkeypatch.setattr("tuner.execute.spmspv.gpu_available", lambda: False)
    assert isinstance(plan(CASES["random"](), op="spmspv"), SpMSpVExecutor)
    with pytest.raises(ValueError, match="unknown op"):
        plan(CASES["random"](), op="spgemm")


# -- BFS --------------------------------------------------------------------------------------------


def bfs_cases() -> list[tuple[str, sp.csr_matrix]]:
    graphs = [("powerlaw", generate("powerlaw", rows=4000, seed=3)), ("uniform", generate("uniform", rows=2000)),
              ("poisson2d", generate("poisson2d", n=30)), ("emptyrows", generate("emptyrows", rows=3000))]
    return graphs + [(name, CASES[name]()) for name in ("one_by_one", "random")]


def scipy_levels(A: sp.csr_matrix) -> np.ndarray:
    """Hops from vertex 0 by SciPy's shortest paths on the pattern (-1: unreachable)."""
    pattern = sp.csr_matrix((np.ones(A.nnz), A.indices, A.indptr), shape=A.shape)
    hops = shortest_path(pattern, method="D", unweighted=True, indices=0)
    return np.where(np.isinf(hops), -1, hops).astype(np.int32)


@pytest.mark.parametrize("mode", [None, "sparse", "dense"])
def test_bfs_matches_scipy_shortest_paths(mode, monkeypatch) -> None:
    monkeypatch.setattr("tuner.execute.spmspv.gpu_available", lambda: False)
    for name, A in bfs_cases():
        assert bfs(A, 0, mode=mode).tolist() == scipy_levels(A).tolist(), name


def test_bfs_on_shared_graphs(shared_dir, monkeypatch) -> None:
    monkeypatch.setattr("tuner.execute.spmspv.gpu_available", lambda: False)
    for name in ("karate", "bcspwr10", "arrow", "west0479"):
        A = load_shared(name)
        assert bfs(A, 0).tolist() == scipy_levels(A).tolist(), name


def test_bfs_rejects_what_is_not_a_graph_search() -> None:
    with pytest.raises(ValueError, match="square"):
        frontier_matrix(CASES["rectangular_wide"]())
    with pytest.raises(ValueError, match="outside"):
        bfs(CASES["random"](), 1000)


# -- the mode selector ------------------------------------------------------------------------------


def synthetic_store(device: str = "GPU X (sm_90)") -> Store:
    """A store with SpMSpV times from a cost model: sparse ~ fill * nnz, dense ~ nnz + rows (crossover ~3%)."""
    store = Store(memory=True)
    store.add_device({"id": device, "name": "GPU X", "kind": "gpu"})
    rng = np.random.default_rng(0)
    trials = []
    for kind, size in [(k, s) for k in ("powerlaw", "uniform", "banded") for s in (500, 1000, 2000, 4000)]:
        A = generate(kind, rows=size, seed=size)
        fp = fingerprint(A)
        store.add_matrix(fp, name=f"{kind}-{size}", rows=size, cols=size, nnz=A.nnz, features=extract_features(A))
        for seed, fill in enumerate((1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)):
            k = max(1, round(fill * size))
            noise = rng.uniform(0.95, 1.05, 2)
            sparse = (5e-6 + 30 * k / size * A.nnz * 1e-9) * noise[0]
            dense = (8e-6 + A.nnz * 1e-9) * noise[1]
            trials += [{"fingerprint": fp, "device": device, "dtype": "float32", "mode": m, "params": {},
                        "x_nnz": k, "x_seed": seed, "time_s": t} for m, t in (("sparse", sparse), ("dense", dense))]
    store.add_spmspv_trials(trials)
    return store


def test_selector_learns_the_crossover_and_beats_fixed_modes() -> None:
    store = synthetic_store()
    X, y, weight, groups, times = spmspv_selector.training_rows(store, device="GPU X (sm_90)", dtype="float32")
    assert X.shape == (72, len(spmspv_selector.SELECTOR_FEATURES)) and set(y) == {"sparse", "dense"}
    report = spmspv_selector.evaluate(X, y, weight, groups, times, cv=4)
    table = report["table"]
    assert report["matrices"] == 12 and table["svm"]["accuracy"] >= 0.85
    assert table["svm"]["time_vs_oracle"] < min(table["always sparse"]["time_vs_oracle"],
                                                table["always dense"]["time_vs_oracle"])
    model = spmspv_selector.ModeSelector(cv=4).fit(X, y, sample_weight=weight, groups=groups)
    fills, modes = model.crossover_table(store.matrix(groups[0])["features"])
    assert modes[0] == "sparse" and modes[-1] == "dense"


def test_selector_is_stored_per_task_and_device() -> None:
    from tuner.select.model import latest_row

    store = synthetic_store()
    X, y, weight, groups, _ = spmspv_selector.training_rows(store, device="GPU X (sm_90)", dtype="float32")
    model = spmspv_selector.ModeSelector(cv=4).fit(X, y, sample_weight=weight, groups=groups)
    spmspv_selector.save(store, model, device="GPU X (sm_90)", dtype="float32", metrics={"rows": len(y)})
    loaded, source = spmspv_selector.load(store, device="GPU X (sm_90)", dtype="float32")
    assert source == "trained" and (loaded.predict(X) == model.predict(X)).all()
    assert spmspv_selector.load(store, device="GPU Y (sm_80)", dtype="float32") == (None, "default")
    assert latest_row(store, device="GPU X (sm_90)", dtype="float32") is None  # not an SpMV kernel selector
    with pytest.raises(StoreError, match="both modes"):
        spmspv_selector.training_rows(store, device="GPU X (sm_90)", dtype="float64")


def test_spmspv_trials_are_validated() -> None:
    store = synthetic_store()
    before = store.db["spmspv_trials"].count
    good = {"fingerprint": store.matrices()[0]["fingerprint"], "device": "GPU X (sm_90)", "dtype": "float32",
            "mode": "sparse", "x_nnz": 3, "x_seed": 0, "time_s": 1e-5}
    for bad in ({**good, "mode": "hybrid"}, {**good, "time_s": -1.0}, {**good, "x_nnz": None}):
        with pytest.raises(StoreError):
            store.add_spmspv_trials([good, bad])
    assert store.db["spmspv_trials"].count == before  # nothing half-written


def test_default_rule_and_lookup() -> None:
    mode_at = spmspv_selector.mode_lookup(spmspv_selector.default_table())
    assert mode_at(1e-9) == "sparse" and mode_at(1.0) == "dense"
    assert mode_at(spmspv_selector.DEFAULT_CROSSOVER * 0.8) == "sparse"
    assert mode_at(spmspv_selector.DEFAULT_CROSSOVER * 1.25) == "dense"
    fills = np.array([1e-4, 1e-2, 1.0])  # midpoints 1e-3 and 0.1 on a log scale; a tie goes to the lower point
    at = spmspv_selector.mode_lookup((fills, np.array(["a", "b", "c"])))
    assert [at(f) for f in (0.0, 1e-4, 1e-3, 1.01e-3, 0.1, 0.11, 1.0, 5.0)] == ["a", "a", "a", "b", "b", "c", "c", "c"]


# -- the GPU path against the references -------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode,params", CONFIGS)
def test_gpu_modes_match_their_references(mode: str, params: dict, dtype: str) -> None:
    import cupy
    import cupyx.scipy.sparse as cusp

    matrices = [CASES[c]() for c in sorted(CASES)] + [load_shared(n) for n in shared_cases()]
    for A in matrices:
        A = A.astype(dtype)
        prepared = MODES[mode].prepare(cusp.csr_matrix(A), params)
        reference = MODES[mode].prepare_reference(A, params)
        for fill, seed in ((0.0, 0), (1e-9, 1), (0.05, 2), (1.0, 3)):
            idx, val = sparse_x(A.shape[1], fill, seed, dtype)
            got = MODES[mode].run(prepared, cupy.asarray(idx), cupy.asarray(val))
            got = tuple(cupy.asnumpy(a) for a in got)
            check(A, got, expected(A, idx, val), dtype)
            # The reference of the same decomposition agrees too (rows whose sum is within rounding of
            # zero may be in one and not the other: float32 atomics may cancel them exactly).
            check(A, MODES[mode].run_reference(reference, idx, val), expected(A, idx, val), dtype)
        if mode == "sparse" and params["merge"] == "spa" and A.nnz:  # the accumulator is left clean
            assert not prepared.extra["acc"].any() and not prepared.extra["mark"].any()


@pytest.mark.gpu
def test_gpu_executor_and_bfs() -> None:
    import cupy

    A = generate("powerlaw", rows=20_000, seed=4)
    ex = plan_spmspv(A)
    assert ex.xp is cupy
    for fill, seed in ((1e-4, 1), (0.3, 2)):
        idx, val = sparse_x(A.shape[1], fill, seed)
        y = ex((cupy.asarray(idx), cupy.asarray(val)))
        check(A, tuple(cupy.asnumpy(a) for a in y), expected(A, idx, val), "float64")
    idx, val = as_sparse_vector((cupy.asarray([4, 1, 7, 1]), cupy.asarray([-1.0, 1.0, 2.0, 2.0])), 9, np.float32,
                                cupy)  # unsorted, 1 twice: summed on the GPU too
    assert idx.tolist() == [1, 4, 7] and val.tolist() == [3.0, -1.0, 2.0] and val.dtype == np.float32
    for name, G in bfs_cases():
        want = scipy_levels(G)
        for mode in (None, "sparse", "dense"):
            assert bfs(G, 0, mode=mode).tolist() == want.tolist(), (name, mode)
    assert DENSE.structure_bytes(ex._prepared["dense"]) >= 0
    assert ex.params["dense"]["kernel"] in ex.explain()  # the SpMV plan(A) runs: cuSPARSE or a prediction


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_sparse_mode_on_both_sides_of_its_one_block_paths(dtype: str) -> None:
    """x entries below and above SCAN_BLOCK, touched rows below and above SMALL_SORT, and cancellation."""
    import cupy
    import cupyx.scipy.sparse as cusp

    from kernels.spmspv import SCAN_BLOCK, SMALL_SORT

    A = generate("uniform", rows=200_000, seed=5).astype(dtype)  # 16 entries a row
    prepared = SPARSE.prepare(cusp.csr_matrix(A))
    for k in (1, SMALL_SORT // 32, SMALL_SORT // 8, SCAN_BLOCK, SCAN_BLOCK + 1, 100_000):
        idx, val = sparse_x(A.shape[1], k / A.shape[1], k, dtype)
        got = tuple(cupy.asnumpy(a) for a in SPARSE.run(prepared, cupy.asarray(idx), cupy.asarray(val)))
        check(A, got, expected(A, idx, val), dtype)
        assert not prepared.extra["acc"].any() and not prepared.extra["mark"].any()
    C = as_csr(sp.csr_matrix(np.array([[1.0, -1.0, 0.0], [1.0, 0.0, 2.0]], dtype=dtype)))  # row 0 cancels
    small = SPARSE.prepare(cusp.csr_matrix(C))
    idx, val = SPARSE.run(small, cupy.asarray([0, 1], dtype=cupy.int32), cupy.asarray([1.0, 1.0], dtype=dtype))
    assert idx.tolist() == [1] and val.tolist() == [1.0]
    n = 3 * SMALL_SORT  # many rows, half of them cancelling: the host-sorted path compacts as well
    D = as_csr(sp.csr_matrix(sp.hstack([sp.eye(n), sp.diags(np.where(np.arange(n) % 2, 1.0, -1.0))]).astype(dtype)))
    many = SPARSE.prepare(cusp.csr_matrix(D))
    idx, val = SPARSE.run(many, cupy.arange(2 * n, dtype=cupy.int32), cupy.ones(2 * n, dtype=dtype))
    assert idx.tolist() == list(range(1, n, 2)) and cupy.all(val == 2).item()


def test_train_command_trains_saves_and_ships_the_spmspv_selector(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from tuner.cli import app
    from tuner.select import shipped

    db = tmp_path / "s.db"
    memory = synthetic_store()
    with Store(db) as store:  # the synthetic measurements, in a file the command can open
        store.add_device({"id": "GPU X (sm_90)", "name": "GPU X", "kind": "gpu"})
        for m in memory.db["matrices"].rows:
            store.add_matrix(m["fingerprint"], name=m["name"], rows=m["rows"], cols=m["cols"], nnz=m["nnz"],
                             features=memory.matrix(m["fingerprint"])["features"])
        store.add_spmspv_trials(memory.spmspv_trials(device="GPU X (sm_90)", dtype="float32"))
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv(shipped.ENV, str(models))
    result = CliRunner().invoke(app, ["train", "--task", "spmspv", "--db", str(db), "--dtype", "float32", "--cv", "4",
                                      "--ship", "--ship-dir", str(models)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "always sparse" in result.output and "saved the SpMSpV selector" in result.output
    with Store(db) as store:
        assert spmspv_selector.load(store, device="GPU X (sm_90)", dtype="float32")[1] == "trained"
    assert spmspv_selector.load(None, device="GPU X (sm_90)", dtype="float32")[1] == "shipped"
    other = CliRunner().invoke(app, ["train", "--task", "spmspv", "--db", str(db), "--dtype", "float64"])
    assert other.exit_code == 1 and "both modes" in other.output
    bad = CliRunner().invoke(app, ["train", "--task", "spmm", "--db", str(db)])
    assert bad.exit_code == 1 and "unknown task 'spmm'" in bad.output
