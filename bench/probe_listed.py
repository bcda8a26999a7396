"""csr_vector over the nonempty rows alone against over every row, on unseen matrices with many empty rows.

csr_vector lists the nonempty rows where at least :data:`kernels.csr_vector.EMPTY_SHARE` of them are empty
(:func:`kernels.csr_vector.listed_rows`). For each matrix named (bench/unseen.py's) and each dtype, timed cold
(L2 flushed before every product) and interleaved: cuSPARSE's two algorithms, and csr_vector at each threads a
row, with the rows listed and without (``CsrVector(lists_rows=False)``, as rcm's inner kernel runs), each
checked against cuSPARSE's y. Results: ``bench/results/*_probe_listed-*.txt``.

    python bench/probe_listed.py --only topheavy,bursts,everyother,hypersparse,invertedindex
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import unseen  # noqa: E402

from kernels import BASELINE, BASELINE_CONFIGS, get_family  # noqa: E402
from kernels.csr_vector import THREADS_PER_ROW, CsrVector  # noqa: E402
from tuner.measure.evaluate import round_robin  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="topheavy,bursts,everyother,hypersparse,invertedindex")
    args = ap.parse_args()
    import cupyx.scipy.sparse as cusp

    from tuner.measure.backend import GpuBackend

    backend = GpuBackend()
    for m in unseen.MATRICES:
        if m.name in args.only.split(","):
            host = m.make(1.0)
            for dtype in ("float64", "float32"):
                probe(backend, m.name, cusp.csr_matrix(host.astype(dtype)), dtype)


def probe(backend, name: str, A, dtype: str) -> None:
    """csr_vector listed and whole at each threads a row against cuSPARSE (printed, us)."""
    import cupy

    x = cupy.random.RandomState(0).random_sample(A.shape[1]).astype(dtype)
    cus = get_family(BASELINE)
    base = [cus.prepare(A, params) for _, params in BASELINE_CONFIGS]
    y_ref = cus.run(base[0], x).copy()
    runs: list[tuple[str, object]] = [(f"cusparse {params}", lambda p=p: cus.run(p, x))
                                      for (_, params), p in zip(BASELINE_CONFIGS, base, strict=True)]
    for lists in (True, False):
        family = CsrVector(lists_rows=lists)
        for tpr in THREADS_PER_ROW:
            prepared = family.prepare(A, {"threads_per_row": tpr})
            label = f"csr_vector {tpr} a row, {'listed' if 'listed' in prepared.extra else 'every row'}"
            runs.append((label, lambda f=family, p=prepared: f.run(p, x)))
    times = round_robin(backend, [fn for _, fn in runs], rounds=3, repeats=20, flush_l2=True)
    best = min(t.median_s for t in times[:2])
    empty = A.shape[0] - int(cupy.count_nonzero(cupy.diff(A.indptr)))
    print(f"{name} {dtype}: {A.shape[0]} x {A.shape[1]}, {A.nnz} nonzeros, {empty / A.shape[0]:.0%} of the rows "
          f"empty; cuSPARSE's best {best * 1e6:.1f} us")
    for (label, fn), t in zip(runs, times, strict=True):
        y = fn()
        error = float(cupy.abs(y - y_ref).max() / max(float(cupy.abs(y_ref).max()), 1e-30))
        print(f"  {label:40s} {t.median_s * 1e6:8.1f} us  {best / t.median_s:5.2f}x  error {error:.1e}", flush=True)


if __name__ == "__main__":
    main()
