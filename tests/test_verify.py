"""tuner.measure.verify and the backends' queued timing: the float64 reference where the matrix is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from tests.kernel_cases import CASES
from tuner.matrix.io import as_csr
from tuner.measure.backend import CpuReferenceBackend
from tuner.measure.verify import Reference


@pytest.fixture
def A() -> sp.csr_matrix:
    return as_csr(sp.random(300, 200, density=0.05, format="csr", random_state=1))


def test_a_right_product_passes_and_errors_are_named(A) -> None:
    ref = Reference.build(A, "float32", seed=2)
    y = (A.astype(np.float32) @ ref.x).astype(np.float32)
    ok, rel, msg = ref.check(y)
    assert ok and rel <= ref.rtol and msg == ""
    wrong = y.copy()
    wrong[7] += 1.0
    ok, rel, msg = ref.check(wrong)
    assert not ok and "row 7" in msg and rel > ref.rtol
    unwritten = y.copy()
    unwritten[[3, 9]] = np.nan
    ok, rel, msg = ref.check(unwritten)
    assert not ok and rel == float("inf") and "2 entries of y not finite (first: row 3)" in msg
    assert not ref.check(y[:-1])[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_degenerate_matrices(name: str) -> None:
    A = CASES[name]()
    ref = Reference.build(A, "float64")
    assert ref.check(A @ ref.x)[0]


def test_a_longest_row_the_caller_knows_sets_the_bound() -> None:
    """plan() passes the features' npr_max: the same bound as the reference's own pass over the rows."""
    A = CASES["huge_row"]()
    longest = int(np.diff(A.indptr).max())
    own = Reference.build(A, "float32")
    assert (Reference.build(A, "float32", npr_max=longest).rtol, own.atol) == (own.rtol, own.atol)
    assert Reference.build(A, "float32", npr_max=4 * longest).rtol > own.rtol


def test_cpu_queued_timing_gives_each_product_a_sample() -> None:
    samples = CpuReferenceBackend().time_queued([lambda: None, lambda: sum(range(1000))], repeats=3)
    assert len(samples) == 2 and all(len(s) == 3 and min(s) >= 0 for s in samples)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reference_on_the_gpu_equals_the_one_on_the_host(name: str) -> None:
    import cupy
    import cupyx.scipy.sparse as cusp

    A = CASES[name]()
    for dtype in ("float64", "float32"):
        host, dev = Reference.build(A, dtype), Reference.build(cusp.csr_matrix(A.astype(dtype)), dtype)
        assert isinstance(dev.x, cupy.ndarray) and dev.x.dtype == np.dtype(dtype)
        x = dev.x.get()  # uniform in [-1, 1] (1 by rounding to float32), and the same for the same seed
        assert x.size == 0 or (x.min() >= -1.0 and x.max() <= 1.0 and (x.size < 64 or x.std() > 0.4))
        assert np.array_equal(Reference.build(cusp.csr_matrix(A.astype(dtype)), dtype).x.get(), x)
        npr_max = int(np.diff(A.indptr).max(initial=0))
        behind = Reference.build(cusp.csr_matrix(A.astype(dtype)), dtype, npr_max=npr_max, behind=True)
        cupy.cuda.get_current_stream().synchronize()  # waits for the side stream: its event is queued here
        assert (behind.rtol, behind.atol) == (dev.rtol, dev.atol)
        assert np.array_equal(behind.x.get(), dev.x.get())  # cuSPARSE may sum a long row in another order:
        np.testing.assert_allclose(behind.y.get(), dev.y.get(), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(behind.scale.get(), dev.scale.get(), rtol=1e-12, atol=1e-300)
        assert (dev.rtol, dev.atol) == (host.rtol, host.atol)
        x64 = dev.x.get().astype(np.float64)
        A64 = A.astype(dtype).astype(np.float64)  # the values the GPU holds
        np.testing.assert_allclose(dev.y.get(), A64 @ x64, rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(dev.scale.get(), abs(A64) @ np.abs(x64), rtol=1e-12, atol=1e-300)
        y = cusp.csr_matrix(A.astype(dtype)) @ dev.x
        assert dev.check(y)[0] and dev.check(y.get())[0]  # on either side
        if A.shape[0]:  # the one-pass check's worst relative error is the definition's, computed on the host
            err = np.maximum(np.abs(y.get().astype(np.float64) - dev.y.get()) - dev.atol, 0.0)
            want = float((err / np.maximum(dev.scale.get(), np.finfo(np.float64).tiny)).max())
            assert dev.check(y)[1] == pytest.approx(want, rel=1e-15, abs=0.0)
        if A.shape[0] and A[0].nnz:  # a wrong value, every entry finite: the one-pass check finds it too
            wrong = y.copy()
            wrong[0] += 1.0
            ok, rel, msg = dev.check(wrong)
            assert not ok and rel > dev.rtol and msg.startswith("row 0:")
        if A.shape[0]:
            y[0] += 1.0 if A[0].nnz else 0.0
            y[-1] = cupy.nan
            ok, _, msg = dev.check(y)
            assert not ok and "not finite" in msg


@pytest.mark.gpu
def test_checking_several_ys_at_once_on_the_gpu_answers_as_checking_each() -> None:
    """check_all: one read-back for the ys on the GPU, each answer :meth:`check`'s (a wrong value, a NaN, a y on
    the host, a y of the wrong shape among right ones); checked_prepares on the GPU, each config as alone."""
    import cupy
    import cupyx.scipy.sparse as cusp

    from kernels import get_family
    from tuner.measure.backend import GpuBackend
    from tuner.measure.evaluate import checked_prepare, checked_prepares

    A = cusp.csr_matrix(as_csr(sp.random(3000, 2000, density=0.01, format="csr", random_state=5)))
    ref = Reference.build(A, "float64")
    y = A @ ref.x
    wrong, unwritten = y.copy(), y.copy()
    wrong[11] += 1.0
    unwritten[5] = cupy.nan
    ys = [y, wrong, y.get(), unwritten, y[:-1], y]
    together = ref.check_all(ys)
    assert [ok for ok, _, _ in together] == [True, False, True, False, False, True]
    assert together == [ref.check(v) for v in ys]
    backend = GpuBackend()
    configs = [(get_family(k), p) for k, p in [("csr_vector", {"threads_per_row": 4}), ("nut", {"rows_per_panel": 3}),
                                               ("csr5", {}), ("cusparse", {})]]
    checked = checked_prepares(backend, configs, A, ref, ref.x)
    assert [r.error_kind for r, _, _ in checked] == [None, "invalid_config", None, None]
    for (r, prepared, out), (family, params) in zip(checked, configs, strict=True):
        s = checked_prepare(backend, family, A, params, ref, ref.x)[0]
        assert (r.state, r.error_kind, r.error) == (s.state, s.error_kind, s.error)
        if prepared is not None:  # each product's own y was checked (an order of summing may differ: not ==)
            assert ref.check(out) == (True, pytest.approx(r.rel_error, abs=ref.rtol), "")


@pytest.mark.gpu
def test_the_gpu_reference_sums_rows_that_span_many_threads_and_warps() -> None:
    """reference_spmv.cu balances entries across threads: a full row of 300,000 entries (an arrow: 37,500
    threads, whole warps in the row) and rows of every length up to 3,000 between empty ones, in both dtypes,
    equal SciPy's float64 products to float64 rounding of their terms (|A|·|x|)."""
    import cupyx.scipy.sparse as cusp

    from tests.kernel_cases import arrow

    rng = np.random.default_rng(3)
    lengths = np.where(rng.random(4000) < 0.4, 0, rng.integers(1, 3000, 4000))
    ragged = as_csr(sp.csr_matrix((rng.uniform(-1, 1, lengths.sum()), rng.integers(0, 5000, lengths.sum()),
                                   np.concatenate([[0], np.cumsum(lengths)])), shape=(4000, 5000)))
    for A in (arrow(300_000), ragged):
        for dtype in ("float64", "float32"):
            ref = Reference.build(cusp.csr_matrix(A.astype(dtype)), dtype)
            x64, A64 = ref.x.get().astype(np.float64), A.astype(dtype).astype(np.float64)
            scale = abs(A64) @ np.abs(x64)
            np.testing.assert_allclose(ref.scale.get(), scale, rtol=1e-13, atol=0)
            assert np.all(np.abs(ref.y.get() - A64 @ x64) <= 1e-13 * scale)
            assert ref.check(cusp.csr_matrix(A.astype(dtype)) @ ref.x)[0]
            empty = np.diff(A.indptr) == 0
            assert not ref.y.get()[empty].any() and not ref.scale.get()[empty].any()


@pytest.mark.gpu
def test_gpu_queued_timing_brackets_each_product() -> None:
    import cupy

    from tuner.measure.backend import GpuBackend

    backend = GpuBackend()
    a = cupy.ones(1 << 26, dtype=cupy.float32)  # 256 MB: a pass of it takes ~0.1 ms, longer than a launch
    one, two = (lambda: a.sum()), (lambda: (a.sum(), a.sum()))
    one(), two()
    backend.synchronize()
    for flush_l2 in (False, True):  # warm, and cold: the flush before each product is not in its sample
        samples = backend.time_queued([one, two], repeats=5, flush_l2=flush_l2)
        assert [len(s) for s in samples] == [5, 5] and min(min(s) for s in samples) > 0
        assert 1.5 < np.median(samples[1]) / np.median(samples[0]) < 2.5  # two passes take about twice one


@pytest.mark.gpu
def test_gpu_queued_cold_timing_of_short_products_keeps_host_time_out() -> None:
    """A product of ~20 us (one elementwise kernel: a launch of a few us), queued cold 20 times behind the
    gates, times as it does alone (time(): a gate before each product)."""
    import cupy

    from tuner.measure.backend import GpuBackend

    backend = GpuBackend()
    a = cupy.ones(1 << 23, dtype=cupy.float32)
    b = cupy.empty_like(a)
    fn = lambda: cupy.multiply(a, 1.5, out=b)  # noqa: E731
    fn()
    alone = backend.time(fn, repeats=20, flush_l2=True).median_s
    queued = np.median(backend.time_queued([fn, fn], repeats=10, flush_l2=True))
    assert 0.8 < queued / alone < 1.25


@pytest.mark.gpu
def test_gpu_queued_timing_keeps_a_slow_host_out() -> None:
    """A host that takes 2 ms before each launch (a busy host; the GIL held by another thread): the gate holds
    the stream until the products are queued, so they time as the same product launched at once does, not
    2 ms each."""
    import time

    import cupy

    from tuner.measure.backend import GpuBackend

    backend = GpuBackend()
    a = cupy.ones(1 << 23, dtype=cupy.float32)
    b = cupy.empty_like(a)
    fast = lambda: cupy.multiply(a, 1.5, out=b)  # noqa: E731

    def slow() -> None:
        time.sleep(0.002)
        fast()

    fast()
    alone = backend.time(fast, repeats=20, flush_l2=True).median_s
    queued = backend.time_queued([slow, fast, slow], repeats=6, flush_l2=True)
    assert [len(s) for s in queued] == [6, 6, 6]
    assert 0.8 < np.median(queued) / alone < 1.25 and max(map(max, queued)) < 1e-3


@pytest.mark.gpu
def test_gpu_timing_keeps_the_host_out_from_between_a_products_launches() -> None:
    """A product of two launches with 2 ms of host time between them (csr5's product and its fix-up on a busy
    host): time() counts the kernels alone, as for the same two launched at once, cold and warm. Other tests'
    kernels on the same GPU (the suite's workers) can slow one of the two timings: the closest of three tries
    counts; the 2 ms between the launches, were it counted, would be in all three."""
    import time

    import cupy

    from tuner.measure.backend import GpuBackend

    backend = GpuBackend()
    a = cupy.ones(1 << 23, dtype=cupy.float32)
    b = cupy.empty_like(a)

    def both() -> None:
        cupy.multiply(a, 1.5, out=b)
        cupy.multiply(b, 1.5, out=a)

    def apart() -> None:
        cupy.multiply(a, 1.5, out=b)
        time.sleep(0.002)
        cupy.multiply(b, 1.5, out=a)

    both()
    for flush_l2 in (True, False):
        tries = [(backend.time(both, repeats=20, flush_l2=flush_l2).median_s,
                  backend.time(apart, repeats=10, flush_l2=flush_l2).median_s) for _ in range(3)]
        fast, slow = min(tries, key=lambda t: abs(math.log(t[1] / t[0])))
        assert 0.8 < slow / fast < 1.25 and slow < 1e-3, tries


@pytest.mark.gpu
def test_gpu_queued_timing_reuses_its_gates_past_the_last_slot(monkeypatch) -> None:
    """More products than the slots hold gates for (here 2 slots of 4 products, 20 products): the queue waits
    for the GPU after every 2 gates and uses the slots again; every product is timed, as alone."""
    import cupy

    import tuner.measure.backend as backend_module

    backend_module._gate_flags()  # made with its slots before they are cut to 2
    monkeypatch.setattr(backend_module, "GATE_PRODUCTS", 4)
    monkeypatch.setattr(backend_module, "GATE_SLOTS", 2)
    backend = backend_module.GpuBackend()
    a = cupy.ones(1 << 23, dtype=cupy.float32)
    b = cupy.empty_like(a)
    fast = lambda: cupy.multiply(a, 1.5, out=b)  # noqa: E731
    fast()
    alone = backend.time(fast, repeats=20, flush_l2=True).median_s
    queued = backend.time_queued([fast, fast], repeats=10, flush_l2=True)
    assert [len(s) for s in queued] == [10, 10] and 0.8 < np.median(queued) / alone < 1.25
    assert not backend_module._gate_flags()[:2, 1].any()  # its two slots passed (others may hold older calls')


@pytest.mark.gpu
def test_gpu_queued_timing_of_a_product_that_waits_on_the_gpu_falls_back(monkeypatch) -> None:
    """A product that synchronizes holds the gate until it times out; its samples would count host time,
    so every product is timed again one at a time, and the next call's gates are clean."""
    import cupy

    import tuner.measure.backend as backend_module

    monkeypatch.setattr(backend_module, "GATE_TIMEOUT_NS", 20_000_000)
    backend = backend_module.GpuBackend()
    a = cupy.ones(1 << 23, dtype=cupy.float32)
    b = cupy.empty_like(a)
    fast = lambda: cupy.multiply(a, 1.5, out=b)  # noqa: E731

    def waits() -> None:
        fast()
        cupy.cuda.Device().synchronize()

    fast()
    alone = backend.time(fast, repeats=20, flush_l2=True).median_s
    fell_back = backend.time_queued([fast, waits], repeats=4, flush_l2=True)
    assert backend_module._gate_flags()[0, 1] == 1  # the gate timed out
    assert [len(s) for s in fell_back] == [4, 4] and 0.8 < np.median(fell_back[0]) / alone < 1.25
    clean = backend.time_queued([fast], repeats=4, flush_l2=True)
    assert backend_module._gate_flags()[0, 1] == 0 and 0.8 < np.median(clean) / alone < 1.25


@pytest.mark.gpu
def test_the_copy_bandwidth_is_measured_once_a_process() -> None:
    """Every plan() makes a backend; the 1 GB copy that measures the bandwidth runs for the first only."""
    import time

    from tuner.measure.backend import GpuBackend

    first = GpuBackend().copy_bandwidth_gbs()
    backend = GpuBackend()
    start = time.perf_counter()
    again = backend.copy_bandwidth_gbs()
    assert again == first > 100 and time.perf_counter() - start < 1e-3
