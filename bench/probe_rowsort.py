"""How rowsort and rcm write y, and what rowsort's preparation costs, on unseen matrices renumbering is for.

For each matrix named (bench/unseen.py's) and each dtype: the family (rowsort, or rcm with ``--family rcm``)
with y written in place (each row's sum to its row of A), to a copy in B's order gathered after (``out =
copy[inverse]``, :func:`kernels.rcm.renumbered_product`: sequential writes, the reads from a copy just written)
and to a copy scattered after (``out[rows] = copy``, how both wrote it before stop 65), at 2 and 4 threads a row,
beside csr_vector on A as it is and cuSPARSE's two algorithms, all timed cold (L2 flushed before every product)
and interleaved; then, for rowsort, the preparation's steps, each synchronized (median of 5): the order (with its
checks), the copy of the matrix, csr_vector's own preparation on it, and the sort alone on 64- and 32-bit keys.
Results: ``bench/results/*_probe_rowsort-*.txt``.

    python bench/probe_rowsort.py --only rowperm7,tallshuffled,rowhash9
    python bench/probe_rowsort.py --family rcm --only perm27,mesh2d
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import probing  # noqa: E402

import kernels.rcm as rcm  # noqa: E402
import kernels.rowsort as rowsort  # noqa: E402
from common.errors import InvalidConfigError  # noqa: E402
from kernels import BASELINE, get_family  # noqa: E402

WAYS = ("in_place", "gather", "scatter")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="rowperm7,tallshuffled,rowhash9,twofield")
    ap.add_argument("--family", default="rowsort", choices=("rowsort", "rcm"))
    args = ap.parse_args()
    from tuner.measure.backend import GpuBackend

    backend = GpuBackend()
    for name, A, dtype in probing.each_unseen(args.only):
        probe(backend, name, A, dtype, args.family)


def probe(backend, name: str, A, dtype: str, kernel: str) -> None:
    """The ways of writing y timed on ``A``, then rowsort's preparation's steps (printed)."""
    import cupy

    from tuner.measure.verify import Reference

    vector, cusparse, family = get_family("csr_vector"), get_family(BASELINE), get_family(kernel)
    x = cupy.asarray(Reference.build(A, dtype).x)
    runs, names, keep = [], [], []
    for tpr in (2, 4):
        params = {"threads_per_row": tpr, "block_size": 256}
        for way in WAYS:
            rcm.writes_in_place = (lambda *a, _w=way: _w == "in_place")
            try:
                prepared = family.prepare(A, params)
            except InvalidConfigError as e:
                print(f"== {name} {dtype} {A.shape} nnz {A.nnz}: {kernel} refused: {e}", flush=True)
                return _preparation(name, A, kernel, None)
            ex, out = prepared.extra, cupy.empty(A.shape[0], dtype=dtype)
            if way == "scatter":  # B's rows (the copy path keeps their inverse) scattered to
                rows = cupy.empty_like(ex["inverse"])
                rows[ex["inverse"]] = cupy.arange(rows.size, dtype=rows.dtype)

                def run(ex=ex, out=out, rows=rows):
                    x_b = cupy.take(x, ex["cols"], out=ex["x_renumbered"]) if "cols" in ex else x
                    rcm._INNER.launch(ex["inner"], x_b, ex["y_renumbered"])
                    out[rows] = ex["y_renumbered"]
            else:
                def run(prepared=prepared, out=out):
                    family.run(prepared, x, out)
            run()
            runs.append(run)
            names.append(f"{kernel} tpr {tpr} {way}")
            keep.append((prepared, out))
        plain = vector.prepare(A, params)
        out = cupy.empty(A.shape[0], dtype=dtype)
        runs.append(lambda plain=plain, out=out: vector.run(plain, x, out))
        names.append(f"csr_vector tpr {tpr} on A")
        keep.append((plain, out))
    for algorithm in ("csr_alg1", "csr_alg2"):
        p = cusparse.prepare(A, {"algorithm": algorithm})
        out = cupy.empty(A.shape[0], dtype=dtype)
        runs.append(lambda p=p, out=out: cusparse.run(p, x, out))
        names.append(f"cusparse {algorithm}")
        keep.append((p, out))
    samples = backend.time_queued(runs, repeats=7, flush_l2=True)
    seconds = {n: statistics.median(s) for n, s in zip(names, samples, strict=True)}
    base = min(seconds["cusparse csr_alg1"], seconds["cusparse csr_alg2"])
    print(f"== {name} {dtype} {A.shape} nnz {A.nnz}: cuSPARSE best {base * 1e6:.1f} us", flush=True)
    for n, s in seconds.items():
        print(f"   {n:28s} {s * 1e6:8.1f} us  {base / s:5.3f}x", flush=True)
    _preparation(name, A, kernel, base)


def _preparation(name: str, A, kernel: str, base: float | None) -> None:
    """rowsort's preparation's steps on ``A``, each synchronized, medians of 5 (printed; in SpMVs of ``base``
    seconds where given): where the order is refused, how long the refusal took."""
    import cupy

    if kernel != "rowsort":
        return
    steps: dict[str, list[float]] = {"order": [], "copy": [], "inner": []}
    refused: list[float] = []
    for _ in range(5):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        try:
            rows = rowsort.row_order(A.indptr, A.indices, A.shape[1], cupy)
        except InvalidConfigError:
            cupy.cuda.runtime.deviceSynchronize()
            refused.append(time.perf_counter() - t0)
            continue
        cupy.cuda.runtime.deviceSynchronize()
        t1 = time.perf_counter()
        B = rcm.renumbered_on_gpu(A, rows, None)
        cupy.cuda.runtime.deviceSynchronize()
        t2 = time.perf_counter()
        rcm._INNER.prepare(B, {"threads_per_row": 2})
        cupy.cuda.runtime.deviceSynchronize()
        t3 = time.perf_counter()
        for k, v in zip(steps, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            steps[k].append(v)
    if refused:
        print(f"   {name}: the order refused in {statistics.median(refused) * 1e3:.2f} ms (median of 5)", flush=True)
        return
    lengths = cupy.diff(A.indptr)
    middle = A.indices[cupy.minimum(A.indptr[:-1] + lengths // 2, A.nnz - 1)]
    wide = middle.astype(cupy.int64) * A.shape[0] + cupy.arange(A.shape[0], dtype=cupy.int64)
    for what, key in (("argsort int64", wide), ("argsort int32", middle)):
        cupy.argsort(key)
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            cupy.argsort(key)
        cupy.cuda.runtime.deviceSynchronize()
        print(f"   {what}: {(time.perf_counter() - t0) / 5 * 1e3:.2f} ms")
    medians = {k: statistics.median(v) for k, v in steps.items()}
    print("   preparation: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in medians.items())
          + (f" ({sum(medians.values()) / base:.0f} SpMVs)" if base else ""), flush=True)


if __name__ == "__main__":
    main()
