"""The probes behind the 2026-11-25 changes to the race and to csr_vector, on the matrices of bench/unseen.py.

A: NuT's configs (rows per panel x columns per tile x threads x slabs) beside cuSPARSE's two algorithms,
   merge_path and csr_vector, cold, each with its preparation time: which configs beat cuSPARSE where the
   race had none of them (bursts), and how many slabs win where x outgrows the L2 (kernels/nut.py
   FIT_SLABS). Result: bench/results/2026-11-26_NVIDIA-H100-80GB-HBM3-sm-90_probe_unseen_nut.json.
B: csr_vector against the kernel before 9449a8d (one entry in flight a lane), same configs, same run, and
   the same y (checked). Result: ..._probe_unseen_csr_vector.txt. (The batches of 2 and 8 entries that
   kernels/csr_vector.cu quotes ran on an intermediate version of the kernel, the batch a macro.)
C: merge_path's configs (items a thread x block size x loads): whether a default other than the race's
   beats cuSPARSE. Result: ..._probe_unseen_merge_path.json.
A, B and C ran at 530f5cb on an H100.
D: NuT's rows per panel, 2048 to 16384, with one slab and with the slabs Nut.adapt fits to this GPU's L2
   (x columns per tile x threads): how many rows a panel should hold on a large matrix. The space stops at
   8192 rows: the 16384-row configs ran (the H200 run committed in 7d3d737) with kernels/nut.py's ROWS_PER_PANEL
   widened by hand, and fail as invalid configs without it. Result: ..._probe_unseen_rows_per_panel.json.
E: rcm (reverse Cuthill-McKee, then csr_vector) against csr_vector with the same groups: what renumbering
   gains where the numbering scatters the columns (perm27), and what it costs to prepare. Run at a3495a2,
   when the order came from SciPy on the host (seconds); since f0bf567 it is made on the GPU.
F: csr_vector, rcm and merge_path with narrow columns (16-bit offsets from a row's or a tile's lowest,
   kernels/_narrow.py) against int32 columns, same configs otherwise: what the offsets gain on the local
   matrices.
G: NuT past Nut.adapt's slabs, where x is several times the L2: 4 and 8 slabs, 1, 2 and 4 bands, 512 and 1024
   threads, panels and tiles as adapt fits them: whether kernels/nut.py's FIT_SLABS (4) holds on matrices with
   more entries a row than bursts, the matrix it was chosen on. MATRICES may name bench/unseen.py's or the
   issue18 suite's (``issue18:lp``: its matrix whose name starts so), SCALE sizes them (default 1).
H: NuT of one slab where x fits the L2 (set j's subsetcols), beside the 4-slab config the race's join rule took
   there before stop 67 (its best-ranked NuT config): panels of 1024 to 8192 rows, tiles, threads, and csr5.
   Result: ..._probe_nut_subsetcols-67.json.
I: set l's races that fell short of a 40-trial search (cliques and termdoc in float64, topheavy): NuT of one slab
   at every panel (2048 to 8192 rows), tile and thread count, csr5's sigma and block sizes, and the SURAA config
   the search found on cliques, beside cuSPARSE. Result: ..._probe_unseen_l68.json.

J: NuT with its dense panels cut by rows (kernels/nut.py ``_cut_dense_panels``, stop 79) against the panels
   whole (as before), the same configs, same run, the same y (checked): panels of 2048 to 8192 rows, tiles of
   4096 and 16384 columns, 512 and 1024 threads, one slab and the slabs Nut.adapt fits, and the config the
   H200's ranking put first on denseblock in float32. Only configs whose panels the cut changes are timed.
   Results: ..._probe_nut_dense_panels-79.txt, -gu-79.txt (sets g-u) with a tile of more than one work-item cap
   cut, -caps-79.txt with more than 8 (kernels/nut.py DENSE_TILE_CAPS); ..._probe_nut_heavy_panels-79.txt: an
   earlier rule, which cut every panel of more than the cap's nonzeros, hub rows' too.

K: NuT's work items (kernels/nut.py ``item_starts``, stop 80) against item_cap's cuts alone, as before it (an eighth
   of an SM's share of the nonzeros, at least 4 times a group's mean), and against the rule with a gathered column
   costing nothing (``GATHER_COST`` 0): the configs of J's kind (panels of 256 to 8192 rows), same y (checked), cold,
   round-robin; only configs whose items a rule changes are timed. Why: on a band with 64 dense rows the panels
   holding a dense row (an x gather an entry) kept the launch waiting (ncu: SMs active 56 % of the time), and with
   512 threads a block the 2 x SMs panels of a matrix of few rows left half of the GPU's blocks without work.
   Results: ..._probe_nut_items-80.txt (the kept rule); the rules tried before it, each its own run:
   ..._probe_nut_item_floor-80.txt (no floor, a floor of twice the mean), ..._items-median-80.txt,
   ..._items-share-80.txt, ..._items-gain10-80.txt. J and K share _nut_variants_ab since stop 80 (J's lines then
   name its panel counts as K's name their items).

    git show 0079c85:kernels/csr_vector.cu > .gpu/csr_vector_prev.cu       # B only
    python bench/probe_unseen_configs.py PART MATRICES OUT [SCALE]         # PART: A to K; MATRICES: a,b,...
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from unseen_matrices import MATRICES, from_suite  # noqa: E402

from kernels import get_family  # noqa: E402
from kernels._cuda import c_type, grid  # noqa: E402
from tuner.measure.backend import GpuBackend  # noqa: E402
from tuner.measure.evaluate import round_robin  # noqa: E402

TPR = (2, 4, 8, 16, 32)
BASE = [("cusparse", {"algorithm": "csr_alg1"}), ("cusparse", {"algorithm": "csr_alg2"})]
CONFIGS = {
    "A": BASE
    + [("nut", {"rows_per_panel": r, "cols_per_tile": c, "threads": t, "slabs": s, "bands": 1})
       for r, c, t, s in itertools.product((2048, 8192), (4096, 16384), (512, 1024), (1, 2, 4, 8))]
    + [("merge_path", {"loads": lo, "items_per_thread": i, "block_size": bs})
       for lo, i, bs in (("block", 6, 64), ("thread", 2, 256), ("block", 4, 128))]
    + [("csr_vector", {"threads_per_row": t, "block_size": 256}) for t in (2, 4, 8, 32)],
    "C": BASE
    + [("merge_path", {"loads": "block", "items_per_thread": i, "block_size": bs})
       for i, bs in itertools.product((4, 5, 6, 7, 9, 12, 16), (64, 128, 256))]
    + [("merge_path", {"loads": "thread", "items_per_thread": i, "block_size": bs})
       for i, bs in itertools.product((2, 3, 4), (128, 256))],
    "H": BASE
    + [("nut", {"rows_per_panel": r, "cols_per_tile": c, "slabs": s, "threads": t, **({"bands": 1} if s > 1 else {})})
       for r, c, s, t in ((2048, 4096, 4, 512), (2048, 4096, 1, 512), (2048, 4096, 1, 1024), (8192, 16384, 1, 1024),
                          (2048, 16384, 1, 1024), (1024, 4096, 1, 512), (4096, 8192, 1, 1024), (8192, 4096, 1, 512))]
    + [("csr5", {"sigma": 8, "block_size": 128, "indices": "narrow"})],
    "I": BASE
    + [("nut", {"rows_per_panel": r, "cols_per_tile": c, "threads": t, "slabs": 1})
       for r, c, t in itertools.product((2048, 4096, 8192), (4096, 8192, 16384), (512, 1024))]
    + [("csr5", {"sigma": s, "block_size": b, "indices": "narrow"}) for s, b in itertools.product((8, 16, 24, 32),
                                                                                                  (128, 256))]
    + [("suraa", {"g1_mode": "block", "g3_entries": 4, "grouping": "row", "layout": layout, "scalar_block": 128,
                  "threshold": 16}) for layout in ("sorted", "original")],
    "E": BASE + [(k, {"threads_per_row": t, "block_size": 256}) for k in ("csr_vector", "rcm") for t in (2, 4, 8, 16)],
    "F": BASE + [("merge_path", {"indices": i}) for i in ("narrow", "int32")]
    + [("csr_vector", {"threads_per_row": t, "indices": i}) for t in TPR for i in ("narrow", "int32")]
    + [("rcm", {"threads_per_row": t, "indices": i}) for t in (4, 8) for i in ("narrow", "int32")],
}
def rows_per_panel_configs(A: Any, l2_bytes: int) -> list[tuple[str, dict[str, Any]]]:
    """D's configs on A: cuSPARSE, then NuT at every rows per panel, one slab and the fitted slabs."""
    nut = get_family("nut")
    configs = list(BASE)
    for r, c, t in itertools.product((2048, 4096, 8192, 16384), (4096, 16384), (512, 1024)):
        one = {"rows_per_panel": r, "cols_per_tile": c, "threads": t, "slabs": 1}
        fitted = nut.adapt(one, cols=A.shape[1], itemsize=A.dtype.itemsize, l2_bytes=l2_bytes)
        configs += [("nut", p) for p in (one, fitted) if p is not None]
    return configs


def slab_configs(A: Any, l2_bytes: int) -> list[tuple[str, dict[str, Any]]]:
    """G's configs on A: cuSPARSE, then NuT as adapt fits it, at 4 and 8 slabs and 1, 2 and 4 bands."""
    nut = get_family("nut")
    configs = list(BASE)
    for t, s, b in itertools.product((512, 1024), (4, 8), (1, 2, 4)):
        one = {"rows_per_panel": 2048, "cols_per_tile": 16384, "threads": t, "slabs": 1}
        fitted = nut.adapt(one, cols=A.shape[1], itemsize=A.dtype.itemsize, l2_bytes=l2_bytes) or one
        configs.append(("nut", {**fitted, "slabs": s, "bands": b}))
    return configs


def sweep(backend: GpuBackend, cp: Any, A: Any, x: Any, configs: list[tuple[str, dict[str, Any]]]) -> list[dict]:
    """Prepare (timed), then time cold, every config; the rows with cuSPARSE's best beside."""
    out = cp.empty(A.shape[0], A.dtype)
    rows = []
    for kernel, params in configs:
        try:
            backend.synchronize()
            start = time.perf_counter()
            fn = _runner(kernel, A, params, x, out)
            backend.synchronize()
            prepare_s = time.perf_counter() - start
            t = backend.time(fn, repeats=6, max_duration=0.3, flush_l2=True)
        except Exception as exc:  # a config that fails here is reported and left out
            print(f"  {kernel} {params} failed: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        rows.append({"kernel": kernel, "params": params, "time_s": t.median_s, "prepare_s": prepare_s})
    base = min(r["time_s"] for r in rows if r["kernel"] == "cusparse")
    return [{**r, "cusparse_best_s": base} for r in rows]


def _runner(kernel: str, A: Any, params: dict[str, Any], x: Any, out: Any) -> Any:
    """The config prepared on A, as a product to time."""
    family = get_family(kernel)
    prepared = family.prepare(A, dict(params))
    return lambda: family.run(prepared, x, out)


def csr_vector_ab(backend: GpuBackend, cp: Any, A: Any, x: Any) -> list[str]:
    """csr_vector and the kernel before it, every group size, cold, round-robin three times; same y."""
    dtype = A.dtype
    names = [f"csr_vector<{c_type(dtype)}, {t}>" for t in TPR]
    prev = cp.RawModule(code=(REPO / ".gpu/csr_vector_prev.cu").read_text(), options=("-std=c++17",),
                        name_expressions=names)
    out = cp.empty(A.shape[0], dtype)
    m = A.shape[0]
    fns = {a: _runner("cusparse", A, {"algorithm": a}, x, out) for a in ("csr_alg1", "csr_alg2")}
    for t, name in zip(TPR, names, strict=True):
        fns[f"new {t}"] = _runner("csr_vector", A, {"threads_per_row": t, "block_size": 256}, x, out)
        k = prev.get_function(name)
        fns[f"prev {t}"] = lambda k=k, t=t: k((grid(m * t, 256),), (256,), (np.int32(m), A.indptr, A.indices, A.data,
                                                                            x, out))
        fns[f"new {t}"]()
        y = out.copy()
        fns[f"prev {t}"]()
        assert bool(cp.array_equal(out, y)), f"csr_vector tpr {t}: y differs from the previous kernel's"
    t = dict(zip(fns, (r.median_s for r in round_robin(backend, list(fns.values()), repeats=8, flush_l2=True)),
                 strict=True))
    base = min(t["csr_alg1"], t["csr_alg2"])
    return [f"   threads_per_row {tpr:2d}: before {base / t[f'prev {tpr}']:.3f}x  now {base / t[f'new {tpr}']:.3f}x"
            for tpr in TPR] + [f"   (cuSPARSE best {base * 1e6:.1f} us)"]


def dense_panels_ab(backend: GpuBackend, cp: Any, A: Any, x: Any) -> list[str]:
    """J: each NuT config with its dense panels cut and whole (``_cut_dense_panels`` patched out)."""
    from kernels import nut

    shapes = itertools.product((2048, 4096, 8192), (4096, 16384), (512, 1024))
    variants = {"cut": contextlib.nullcontext, "whole": lambda: mock.patch.object(nut, "_cut_dense_panels",
                                                                                  lambda *args, **kwargs: None)}
    return _nut_variants_ab(backend, cp, A, x, _nut_configs(A, backend.info.l2_bytes, shapes), variants, "panel_ptr")


def work_items_ab(backend: GpuBackend, cp: Any, A: Any, x: Any) -> list[str]:
    """K: each NuT config with its items cut as kernels/nut.py cuts them now, as before stop 80 (item_cap's cuts
    alone: MIN_SHARE out of reach), and now but with a gathered column costing nothing (GATHER_COST 0)."""
    from kernels import nut

    shapes = ((8192, 16384, 1024), (2048, 4096, 1024), (1024, 4096, 512), (4096, 8192, 1024), (256, 4096, 128))
    variants = {"before": lambda: mock.patch.object(nut, "MIN_SHARE", float("inf")), "now": contextlib.nullcontext,
                "gather 0": lambda: mock.patch.object(nut, "GATHER_COST", 0)}
    return _nut_variants_ab(backend, cp, A, x, _nut_configs(A, backend.info.l2_bytes, shapes), variants, "item_order")


def _nut_configs(A: Any, l2_bytes: int, shapes: Any) -> list[dict[str, Any]]:
    """The config the H200's ranking put first on denseblock in float32, then each (rows a panel, columns a tile,
    threads) of ``shapes`` with one slab and with the slabs Nut.adapt fits to A and this GPU."""
    family = get_family("nut")
    configs = [{"rows_per_panel": 4096, "cols_per_tile": 8192, "threads": 1024, "slabs": 2, "bands": 1}]
    for r, c, t in shapes:
        one = {"rows_per_panel": r, "cols_per_tile": c, "threads": t, "slabs": 1}
        fitted = family.adapt(one, cols=A.shape[1], itemsize=A.dtype.itemsize, l2_bytes=l2_bytes)
        configs += [p for p in (one, fitted) if p is not None and p not in configs]
    return configs


def _nut_variants_ab(backend: GpuBackend, cp: Any, A: Any, x: Any, configs: list[dict[str, Any]],
                     variants: dict[str, Any], counted: str) -> list[str]:
    """Each NuT config prepared under each variant (a context that patches kernels.nut while it prepares); where
    the size of ``counted`` (an array of the build) differs from the first variant's under another, those that
    differ and the first, their y checked against the first's, timed cold round-robin three times beside cuSPARSE's
    two algorithms; the others listed, not timed."""
    family = get_family("nut")
    out = cp.empty(A.shape[0], A.dtype)
    fns = {a: _runner("cusparse", A, {"algorithm": a}, x, out) for a in ("csr_alg1", "csr_alg2")}
    lines = []
    for params in configs:
        prepared = {}
        try:
            for name, patched in variants.items():
                with patched():
                    prepared[name] = family.prepare(A, dict(params))
        except Exception as exc:  # a config that fails here is reported and left out
            lines.append(f"   {params} failed: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        sizes = {k: int(p.extra[counted].size) for k, p in prepared.items()}
        first = next(iter(prepared))
        changed = {k: p for k, p in prepared.items() if k == first or sizes[k] != sizes[first]}
        if len(changed) == 1:
            lines.append(f"   {params}: {counted} of {sizes[first]} under every variant")
            continue
        y = family.run(prepared[first], x, out).copy()
        scale = float(cp.abs(y).max()) or 1.0
        for k, p in changed.items():
            family.run(p, x, out)
            assert float(cp.abs(out - y).max()) <= 1e-3 * scale, f"nut {params} {k}: another y"
        runs = {**fns, **{k: lambda p=p: family.run(p, x, out) for k, p in changed.items()}}
        t = dict(zip(runs, (r.median_s for r in round_robin(backend, list(runs.values()), repeats=6, flush_l2=True)),
                     strict=True))
        base = min(t["csr_alg1"], t["csr_alg2"])
        lines.append(f"   {params}: " + "  ".join(f"{k} ({counted} of {sizes[k]}) {base / t[k]:.3f}x" for k in changed)
                     + f" cuSPARSE (best {base * 1e6:.1f} us)")
        del prepared, changed
        cp.get_default_memory_pool().free_all_blocks()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=list("ABCDEFGHIJK"), help="which probe (see the module's doc)")
    ap.add_argument("matrices", help="comma-separated names of bench/unseen_matrices.py's (or issue18:KIND)")
    ap.add_argument("out", type=Path, help="where the result goes (text for B and J, JSON otherwise)")
    ap.add_argument("scale", type=float, nargs="?", default=1.0, help="the matrices' size (default 1)")
    args = ap.parse_args()
    part, names, out_path, scale = args.part, args.matrices.split(","), args.out, args.scale
    import cupy as cp
    import cupyx.scipy.sparse as cusp

    backend = GpuBackend()
    chosen = {m.name: m for m in MATRICES} | {f"issue18:{m.name.split('-')[0]}": m for m in from_suite("issue18")}
    rows: list[dict] = []
    lines: list[str] = []
    for name in names:
        H = chosen[name].make(scale)
        for dtype in ("float64", "float32"):
            A = cusp.csr_matrix(H.astype(dtype))
            x = cp.random.RandomState(0).random_sample(A.shape[1]).astype(dtype)
            head = f"== {name} {dtype} {A.shape} nnz={A.nnz}"
            if part in "BJK":
                ab = {"B": csr_vector_ab, "J": dense_panels_ab, "K": work_items_ab}[part]
                lines += [head, *ab(backend, cp, A, x)]
            else:
                configs = ({"D": rows_per_panel_configs, "G": slab_configs}[part](A, backend.info.l2_bytes)
                           if part in "DG" else CONFIGS[part])
                found = sweep(backend, cp, A, x, configs)
                rows += [{"matrix": name, "dtype": dtype, "nnz": A.nnz, **r} for r in found]
                best = sorted(found, key=lambda r: r["time_s"])[:6]
                lines += [head] + [f"   {r['cusparse_best_s'] / r['time_s']:.3f}x prepared in "
                                   f"{r['prepare_s'] * 1e3:.1f} ms {r['kernel']} {r['params']}" for r in best]
            print("\n".join(lines[-7:]), flush=True)
            del A, x
            cp.get_default_memory_pool().free_all_blocks()
        if part in "BJK":  # after each matrix: a run cut short keeps what it measured
            out_path.write_text(f"{backend.info.id}\n" + "\n".join(lines) + "\n")
        else:
            out_path.write_text(json.dumps({"device": backend.info.id, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
