"""What the probe scripts of bench/ share: the unseen matrices they name, and runs timed against cuSPARSE's best.

Imported by ``probe_firsttouch.py``, ``probe_listed.py`` and ``probe_rowsort.py`` (each puts bench/ and the
repository on ``sys.path`` first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import unseen_matrices

from kernels import BASELINE, BASELINE_CONFIGS, get_family
from tuner.measure.evaluate import round_robin

DTYPES = ("float64", "float32")


def each_unseen(only: str, build: Callable[[unseen_matrices.Unseen], unseen_matrices.Unseen] = lambda m: m
                ) -> Iterator[tuple[str, Any, str]]:
    """(name, the matrix on the GPU, dtype) for each matrix of bench/unseen_matrices.py named in ``only``
    (comma-separated), built at scale 1 (after ``build``: probe_firsttouch permutes its columns), in float64 then
    float32."""
    import cupyx.scipy.sparse as cusp

    for m in unseen_matrices.MATRICES:
        if m.name in only.split(","):
            made = build(m)
            host = made.make(1.0)
            for dtype in DTYPES:
                yield made.name, cusp.csr_matrix(host.astype(dtype)), dtype


def against_cusparse(backend: Any, A: Any, x: Any, runs: Sequence[tuple[str, Callable[[], Any]]], header: str,
                     unchecked: Sequence[str] = ()) -> None:
    """Time cuSPARSE's two algorithms and ``runs`` (label, a product returning its y) on ``A`` and ``x``, cold (L2
    flushed before every product) and interleaved, 3 rounds of 20; print ``header`` with cuSPARSE's best, then each
    run's median, its speed against that best and its y's largest error against cuSPARSE's (relative to y's
    largest entry; none for the labels in ``unchecked``)."""
    import cupy

    cus = get_family(BASELINE)
    base = [cus.prepare(A, params) for _, params in BASELINE_CONFIGS]
    y_ref = cus.run(base[0], x).copy()
    timed = [(f"cusparse {params}", lambda p=p: cus.run(p, x)) for (_, params), p in zip(BASELINE_CONFIGS, base,
                                                                                          strict=True)]
    timed += list(runs)
    times = round_robin(backend, [fn for _, fn in timed], rounds=3, repeats=20, flush_l2=True)
    best = min(t.median_s for t in times[:2])
    print(f"{header}; cuSPARSE's best {best * 1e6:.1f} us")
    for (label, fn), t in zip(timed, times, strict=True):
        y = fn()
        error = "" if label in unchecked else \
            f"  error {float(cupy.abs(y - y_ref).max() / max(float(cupy.abs(y_ref).max()), 1e-30)):.1e}"
        print(f"  {label:48s} {t.median_s * 1e6:8.1f} us  {best / t.median_s:5.2f}x{error}", flush=True)
