"""tuner.measure.evaluate: the round-robin timer (the products taken in turn, each figure the median of its rounds)
and several configs checked together as each would be alone."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from kernels import get_family
from kernels.csr_scalar import CsrScalar
from tuner.matrix.io import as_csr
from tuner.measure.backend import CpuReferenceBackend, Timing
from tuner.measure.evaluate import checked_prepare, checked_prepares, round_robin
from tuner.measure.verify import Reference


class _Clock:
    """A backend whose ``time`` runs the product once and hands out the next of the given medians."""

    def __init__(self, medians: list[float]) -> None:
        self.medians = iter(medians)
        self.flushed: list[bool] = []

    def time(self, fn: Any, *, repeats: int, max_duration: float, flush_l2: bool) -> Timing:
        fn()
        self.flushed.append(flush_l2)
        m = next(self.medians)
        return Timing(median_s=m, p10_s=m * 0.9, p90_s=m * 1.1, repeats=repeats)


def test_round_robin_takes_the_products_in_turn_and_the_median_of_their_rounds() -> None:
    order: list[str] = []
    # rounds of (a, b): a's medians 3, 1, 2 and b's 10, 30, 20, as the rounds hand them out in turn
    clock = _Clock([3.0, 10.0, 1.0, 30.0, 2.0, 20.0])
    timings = round_robin(clock, [lambda: order.append("a"), lambda: order.append("b")], rounds=3, repeats=7,
                          flush_l2=True)
    assert order == ["a", "b"] * 3
    assert [t.median_s for t in timings] == [2.0, 20.0]
    assert np.isclose(timings[0].p10_s, 0.9) and np.isclose(timings[0].p90_s, 3.3)
    assert np.isclose(timings[1].p10_s, 9.0) and np.isclose(timings[1].p90_s, 33.0)
    assert [t.repeats for t in timings] == [21, 21]
    assert clock.flushed == [True] * 6


class _DropsLast(CsrScalar):
    """csr_scalar that leaves out each row's last entry where block_size is 64: a wrong answer."""

    def _run_reference(self, prepared, x):
        y = super()._run_reference(prepared, x)
        if prepared.params["block_size"] == 64:
            A = prepared.A
            filled = np.diff(A.indptr) > 0
            last = A.indptr[1:][filled] - 1
            y[np.flatnonzero(filled)] -= A.data[last] * x[A.indices[last]]
        return y


class _Slow(CpuReferenceBackend):
    """The CPU backend where csr_vector's product takes 50 ms."""

    def run(self, family, prepared, x, out):
        if family.name == "csr_vector":
            time.sleep(0.05)
        return super().run(family, prepared, x, out)


def _configs() -> list[tuple[Any, dict[str, Any]]]:
    wrong = _DropsLast()
    return [(wrong, {"block_size": 128}), (wrong, {"block_size": 64}), (get_family("nut"), {"rows_per_panel": 3}),
            (get_family("csr_vector"), {"threads_per_row": 4}), (get_family("cusparse"), {})]


def test_checked_prepares_gives_each_config_what_checking_it_alone_gives() -> None:
    """Several configs checked together (one wait, one read-back on a GPU): each outcome in the order given,
    the same as its own checked_prepare: passed (prepared, its y in ``out``), wrong_answer, invalid_config."""
    A = as_csr(sp.random(300, 200, density=0.05, format="csr", random_state=4))
    ref = Reference.build(A, "float64")
    backend = CpuReferenceBackend()
    together = checked_prepares(backend, _configs(), A, ref, ref.x)
    alone = [checked_prepare(backend, family, A, params, ref, ref.x) for family, params in _configs()]
    assert [r.error_kind for r, _, _ in together] == [None, "wrong_answer", "invalid_config", None, None]
    for (r, prepared, out), (s, _, _) in zip(together, alone, strict=True):
        assert (r.kernel, r.params, r.state, r.error_kind, r.error, r.rel_error) == \
            (s.kernel, s.params, s.state, s.error_kind, s.error, s.rel_error)
        assert (prepared is None) == (out is None) == (r.error_kind is not None)
        if out is not None:
            np.testing.assert_allclose(out, A @ ref.x, rtol=1e-12)
    assert "relative error" in together[1][0].error and together[1][0].rel_error > ref.rtol
    assert checked_prepares(backend, [], A, ref, ref.x) == []


def test_products_slower_together_than_the_limit_run_again_alone_to_find_the_slow_one() -> None:
    A = as_csr(sp.random(300, 200, density=0.05, format="csr", random_state=4))
    ref = Reference.build(A, "float64")
    out = checked_prepares(_Slow(), _configs(), A, ref, ref.x, max_run_s=0.03)
    assert [r.error_kind for r, _, _ in out] == [None, "wrong_answer", "invalid_config", "timeout", None]
    assert "one product took" in out[3][0].error and out[3][1] is None
    assert [r.error_kind for r, _, _ in checked_prepares(_Slow(), _configs(), A, ref, ref.x, max_run_s=1.0)] == \
        [None, "wrong_answer", "invalid_config", None, None]
