"""One config, measured honestly: prepare, check y against the reference, then time.

A config that fails is an outcome, not a crash: its failure is classified
(``compile_error``, ``launch_error``, ``wrong_answer``, ``out_of_memory``,
``timeout``, ``invalid_config``, and ``not_applicable`` where the family refused the
matrix whatever its parameters) with the message, and the search goes on.
Only a failure that leaves the CUDA context unusable stops the search.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.errors import InvalidConfigError, NotApplicableError, TunerError
from kernels import Family, Prepared, canonical
from tuner.measure.backend import Backend, Timing
from tuner.measure.metrics import gbps, gflops
from tuner.measure.verify import Reference

NOT_APPLICABLE = "not_applicable"
"""The error kind of a family's refusal of a matrix, whatever its parameters (:class:`NotApplicableError`)."""

# Exception class names (CuPy's are matched by name so CuPy stays an optional import).
_KINDS = {
    "CompileException": "compile_error",
    "NVRTCError": "compile_error",
    "OutOfMemoryError": "out_of_memory",
    "MemoryError": "out_of_memory",
    "CUDARuntimeError": "launch_error",
    "CUDADriverError": "launch_error",
    "CUSPARSEError": "launch_error",
}
# Errors after which every later launch in this process fails too.
_STICKY = ("illegal address", "ILLEGAL_ADDRESS", "IllegalAddress", "misaligned", "MISALIGNED",
           "launch failure", "LAUNCH_FAILED", "unspecified launch", "IllegalInstruction")


class ContextLostError(TunerError):
    """A kernel corrupted the CUDA context; the process must restart (the study resumes)."""

    def __init__(self, message: str, result: TrialResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class TrialResult:
    """The outcome of one config on one matrix."""

    kernel: str
    params: dict[str, Any]
    state: str  # 'ok' | 'failed'
    timing: Timing | None = None
    prepare_s: float | None = None
    rel_error: float | None = None
    error_kind: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def record(self, *, shape: tuple[int, int], nnz: int, dtype: str) -> dict[str, Any]:
        """The store's trial columns that this result determines."""
        t = self.timing
        return {
            "kernel": self.kernel,
            "params": self.params,
            "state": self.state,
            "time_s": t.median_s if t else None,
            "time_p10_s": t.p10_s if t else None,
            "time_p90_s": t.p90_s if t else None,
            "prepare_s": self.prepare_s,
            "gflops": gflops(nnz, t.median_s) if t else None,
            "gbps": gbps(*shape, nnz, dtype, t.median_s) if t else None,
            "verified": int(self.ok),
            "rel_error": self.rel_error,
            "error_kind": self.error_kind,
            "error": self.error,
        }


def classify(exc: BaseException) -> str:
    if isinstance(exc, NotApplicableError):
        return NOT_APPLICABLE
    if isinstance(exc, InvalidConfigError):
        return "invalid_config"
    for cls in type(exc).__mro__:
        if cls.__name__ in _KINDS:
            return _KINDS[cls.__name__]
    return "launch_error"


def evaluate(
    backend: Backend,
    family: Family,
    A: Any,
    params: dict[str, Any],
    reference: Reference,
    x: Any,
    *,
    max_run_s: float = 2.0,
    repeats: int = 100,
    max_duration: float = 0.5,
) -> TrialResult:
    """Prepare ``family`` with ``params`` on ``A``, verify one product, then time it.

    ``x`` is ``reference.x`` already on the backend's device. A single product
    slower than ``max_run_s`` is recorded as a ``timeout`` and not repeated.
    """
    result, prepared, out = checked_prepare(backend, family, A, params, reference, x, max_run_s=max_run_s)
    if prepared is None:
        return result
    try:
        result.timing = backend.time(
            lambda: backend.run(family, prepared, x, out), repeats=repeats, max_duration=max_duration
        )
        result.state = "ok"
    except Exception as exc:  # every failure of a config is an outcome
        _failed(result, exc, family, params)
    return result


def checked_prepare(
    backend: Backend,
    family: Family,
    A: Any,
    params: dict[str, Any],
    reference: Reference,
    x: Any,
    *,
    max_run_s: float = 2.0,
) -> tuple[TrialResult, Prepared | None, Any]:
    """Prepare and check one product against ``reference``: ``(result, prepared, out)``, the last two None
    when the config failed (``result`` says how). A passing result is not yet timed (state 'failed' until
    it is); ``out`` is the output buffer to time it with.
    """
    return checked_prepares(backend, [(family, params)], A, reference, x, max_run_s=max_run_s)[0]


def checked_prepares(
    backend: Backend,
    configs: Sequence[tuple[Family, dict[str, Any]]],
    A: Any,
    reference: Reference,
    x: Any,
    *,
    max_run_s: float = 2.0,
) -> list[tuple[TrialResult, Prepared | None, Any]]:
    """:func:`checked_prepare` of several configs, in their order: each prepared (and its preparation timed)
    in turn, then every product queued, waited for once and checked with one read-back
    (:meth:`Reference.check_all`), where one config at a time waited twice each (five entrants of a race on
    the unseen rgg and sawtooth matrices on an H100: 2.4-3.1 ms, one at a time 2.6-3.6 ms). Where the
    products took more than ``max_run_s`` together, each that passed runs again alone to find those that take
    longer than that."""
    results = [TrialResult(family.name, canonical(family.name, params), "failed") for family, params in configs]
    staged: dict[int, tuple[Prepared, Any]] = {}
    for i, ((family, params), result) in enumerate(zip(configs, results, strict=True)):
        try:
            prepared, result.prepare_s = backend.timed_prepare(family, A, params)
            staged[i] = prepared, backend.full(prepared.shape[0], float("nan"), prepared.dtype)
        except Exception as exc:  # every failure of a config is an outcome
            _failed(result, exc, family, params)
    start = time.perf_counter()
    for i in list(staged):
        try:
            backend.run(configs[i][0], staged[i][0], x, staged[i][1])
        except Exception as exc:
            del staged[i]
            _failed(results[i], exc, *configs[i])
    try:
        backend.synchronize()
        elapsed = time.perf_counter() - start
        checks = reference.check_all([out for _, out in staged.values()])
    except Exception as exc:  # an error no launch raised (a broken context), or the checks' memory
        if len(staged) > 1 and _breaks_context(exc):
            for i in staged:
                _record(results[i], exc)
            named = "; ".join(f"{configs[i][0].name} {configs[i][1]}" for i in staged)
            raise ContextLostError(f"one of {named} broke the CUDA context ({type(exc).__name__}: {exc}); run the "
                                   "command again", results[next(iter(staged))]) from exc
        for i in staged:
            _failed(results[i], exc, *configs[i])
        return [(result, None, None) for result in results]
    for i, (passed, rel_error, message) in zip(list(staged), checks, strict=True):
        results[i].rel_error = rel_error
        if not passed:
            del staged[i]
            results[i].error_kind, results[i].error = "wrong_answer", message
    for i in list(staged) if elapsed > max_run_s else ():
        if (once := _one_product(backend, configs[i][0], *staged[i], x)) > max_run_s:
            del staged[i]
            results[i].error_kind = "timeout"
            results[i].error = f"one product took {once:.2f} s (limit {max_run_s} s)"
    return [(result, *staged.get(i, (None, None))) for i, result in enumerate(results)]


def _one_product(backend: Backend, family: Family, prepared: Prepared, out: Any, x: Any) -> float:
    """Wall seconds of one product alone."""
    backend.synchronize()
    start = time.perf_counter()
    backend.run(family, prepared, x, out)
    backend.synchronize()
    return time.perf_counter() - start


def _failed(result: TrialResult, exc: Exception, family: Family, params: dict[str, Any]) -> None:
    """Record ``exc`` on ``result``; a failure that broke the CUDA context raises ContextLostError."""
    _record(result, exc)
    if _breaks_context(exc):
        raise ContextLostError(
            f"{family.name} {params} broke the CUDA context ({result.error}); "
            "run the command again: the study resumes where it stopped",
            result,
        ) from exc


def _record(result: TrialResult, exc: BaseException) -> None:
    """``exc`` as ``result``'s error: its kind (:func:`classify`) and its message."""
    result.error_kind, result.error = classify(exc), f"{type(exc).__name__}: {exc}"[:2000]


def _breaks_context(exc: BaseException) -> bool:
    """Whether ``exc`` left the CUDA context unusable (every later launch fails too)."""
    return any(s in str(exc) or s in type(exc).__name__ for s in _STICKY)


def round_robin(backend: Backend, fns: Sequence[Callable[[], object]], *, rounds: int = 3, repeats: int = 100,
                max_duration: float = 0.3, flush_l2: bool = False) -> list[Timing]:
    """Time several products in the same process, ``rounds`` rounds of each in turn (:meth:`Backend.time`), so
    drift hits them alike: per product, the median over rounds of each round's median, the spread from all
    rounds. ``flush_l2``: every product cold (the benchmarks' figures)."""
    per_round: list[list[Timing]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, timings in zip(fns, per_round, strict=True):
            timings.append(backend.time(fn, repeats=repeats, max_duration=max_duration, flush_l2=flush_l2))
    return [Timing(median_s=float(np.median([t.median_s for t in ts])), p10_s=min(t.p10_s for t in ts),
                   p90_s=max(t.p90_s for t in ts), repeats=sum(t.repeats for t in ts)) for ts in per_round]


def time_interleaved(
    backend: Backend,
    configs: list[tuple[Family, dict[str, Any]]],
    A: Any,
    x: Any,
    *,
    rounds: int = 3,
    repeats: int = 100,
    max_duration: float = 0.3,
    flush_l2: bool = False,
) -> list[tuple[Timing, float]]:
    """Prepare several configs, then time them :func:`round_robin`: per config, its Timing and its one-time
    ``prepare`` seconds. Used for the comparison with cuSPARSE at the end of a tuning run and by the benchmark.
    """
    prepared = [backend.timed_prepare(f, A, p) for f, p in configs]
    outs = [backend.full(pr.shape[0], 0.0, pr.dtype) for pr, _ in prepared]
    fns = [lambda f=family, p=pr, o=out: backend.run(f, p, x, o)
           for (family, _), (pr, _), out in zip(configs, prepared, outs, strict=True)]
    timings = round_robin(backend, fns, rounds=rounds, repeats=repeats, max_duration=max_duration, flush_l2=flush_l2)
    return [(timing, prepare_s) for timing, (_, prepare_s) in zip(timings, prepared, strict=True)]
