"""The probes behind the 2026-11-23 figures for specsum and NuT that `tuner bench` does not produce.

A: specsum on small shared matrices: the previous kernel (commit ccdab00), the new one with the
   synchronizer in a second launch, and with it in stage 1's last block; cuSPARSE beside; cold L2.
B: power-law graphs over 10 M rows (the `graphs` suite): cuSPARSE's three algorithms, NuT (the paper's
   tiling, slabs x bands), specsum / ipcsr, and cuSPARSE itself run band x slab (each block of rows x
   columns its own cuSPARSE SpMV, slab after slab, adding into y: what column blocking alone buys with
   cuSPARSE's own core, an upper bound for NuT's slabs); every y verified first; cold L2.
C: large generated matrices, the previous specsum kernel against the new one, same configs, same run.
D: the graphs of B, NuT alone beside cuSPARSE (work items in one launch: slabs x bands, panel sizes),
   its kernel against the one of commit a32c713 (one entry in flight a thread) on the same structure.
E: float32 banded-2M, Poisson-3D and tall-skinny-20M, the previous specsum kernel against the new one.
Results: bench/results/2026-11-23_NVIDIA-H200-sm-90_probe_{graphs_blocking,specsum_ab_large}.json.gz (A and B
ran on an intermediate version of the kernels, before commit 5c80ad6: B's cuSPARSE and blocked-cuSPARSE
rows do not depend on it; C ran on 0ec993a); ..._probe_nut_items.json (D, on 06e9925) and
..._probe_specsum_ab_large_float32.json (E, on 2d574c7).

Needs the previous kernel beside the checkout and the shared matrices in .mats:
    mkdir -p .gpu .mats && git show ccdab00:kernels/specsum.cu > .gpu/specsum_old.cu && cp ../shared/matrices/* .mats
    git show a32c713:kernels/nut.cu > .gpu/nut_prev.cu
    python bench/probe_specsum_nut.py PART SECONDS   (PART: any of A-E; SECONDS: stop adding configs after)
"""

from __future__ import annotations

import json
import os
import sys
import time

import cupy as cp
import numpy as np

import kernels.specsum as ss
from kernels import get_family
from kernels.cusparse import CuSparse
from kernels.nut import Nut
from tuner.matrix.io import read_mtx
from tuner.matrix.suites import SuiteMatrix
from tuner.measure.backend import GpuBackend
from tuner.measure.verify import Reference

OUT = os.environ.get("OUT", "bench/results/probe")
PART = sys.argv[1] if len(sys.argv) > 1 else "AB"
DEADLINE = time.time() + (float(sys.argv[2]) if len(sys.argv) > 2 else 1e9)
be = GpuBackend()
rows_out: list[dict] = []


class OldSpecSum(ss.SpecSum):
    cu_file = "../.gpu/specsum_old.cu"

    def name_expressions(self, dtype):
        from kernels._cuda import c_type
        v = c_type(dtype)
        tiles = tuple(f"specsum_tiles<{v}, {w}, {t}>" for w in ss.W_VALUES for t in ss.T_VALUES)
        return (*tiles, f"specsum_sync<{v}>", f"specsum_fixup<{v}>")

    def _prepare(self, prepared):  # the previous commit's prepare, search mode only
        from kernels._cuda import c_type, get_kernels
        A, p, geo, ex = prepared.A, prepared.params, self._geometry(prepared), prepared.extra
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        v = c_type(prepared.dtype)
        ex["tiles_kernel"] = kernels[f"specsum_tiles<{v}, {p['W']}, {p['T']}>"]
        ex["sync_kernel"] = kernels[f"specsum_sync<{v}>"]
        for key in ("data", "indices"):
            if getattr(A, key).data.ptr % 16:
                ex[key] = getattr(A, key).copy()
        ex["tile_row"] = cp.empty(geo.n_tiles + 1, dtype=np.int32)
        ex["dirty"] = cp.empty(geo.n_tiles, dtype=np.uint8)
        ex["sync_row"] = cp.empty(geo.n_bunches, dtype=np.int32)
        ex["sync_val"] = cp.empty(geo.n_bunches, dtype=prepared.dtype)
        ex["runs"] = 0
        indptr = A.indptr
        starts = (cp.arange(geo.n_bunches, dtype=np.int64) * (geo.S * geo.tile)).astype(indptr.dtype)
        ex["stage2"] = bool((indptr[cp.searchsorted(indptr, starts, side="right") - 1] < starts).any())
        at = cp.cuda.Device().attributes
        ex["resident_warps"] = at["MultiProcessorCount"] * at["MaxThreadsPerMultiProcessor"] // 32
        assert p["dirty"] == "search"

    def _stage1(self, prepared, x, out, *, fused=True):
        A, p, ex, geo = prepared.A, prepared.params, prepared.extra, self._geometry(prepared)
        W, T, B, S = (int(p[k]) for k in ("W", "T", "B", "S"))
        itemsize = np.dtype(prepared.dtype).itemsize
        prods = W * T + (W * T) // (128 // itemsize) + 1
        ex["tiles_kernel"](
            (max(1, -(-geo.n_bunches // B)),), (B * T,),
            (np.int32(prepared.shape[0]), np.int32(prepared.nnz), np.int32(geo.n_tiles), np.int32(geo.n_bunches),
             np.int32(S), np.int32(p["dirty"] == "search"), A.indptr, ex.get("indices", A.indices),
             ex.get("data", A.data), x, out, ex["tile_row"], ex["dirty"], ex["sync_row"], ex["sync_val"]),
            shared_mem=B * (prods * itemsize + T * 4),
        )
        ex["runs"] += 1


class Unfused(ss.SpecSum):
    def _prepare(self, prepared):
        super()._prepare(prepared)
        prepared.extra.pop("ticket", None)


class BlockedCuSparse:
    """cuSPARSE on each (band, slab) block, slab after slab inside a band, adding into y (beta = 1)."""

    name = "cusparse_blocked"

    def __init__(self):
        self.cs = CuSparse()

    def prepare(self, A, params):
        bands, slabs = params["bands"], params["slabs"]
        m, n = A.shape
        parts = []
        for b in range(bands):
            r0, r1 = b * m // bands, (b + 1) * m // bands
            Ab = A[r0:r1]
            for s in range(slabs):
                c0, c1 = s * n // slabs, (s + 1) * n // slabs
                sub = Ab[:, c0:c1]
                p = self.cs.prepare(sub, {"algorithm": params.get("algorithm", "default")})
                if s > 0 and p.nnz:
                    p.extra["beta"] = np.array(1, p.dtype)
                parts.append((r0, r1, c0, c1, s, p))
        cp.get_default_memory_pool().free_all_blocks()
        return parts

    def run(self, parts, x, out):
        for r0, r1, c0, c1, s, p in parts:
            if p.nnz == 0:
                if s == 0:
                    out[r0:r1] = 0
                continue
            self.cs._run(p, x[c0:c1], out[r0:r1])
        return out


def measure(matrix_name, A, dtype, configs, *, rounds=3, repeats=30, max_duration=0.25):
    """configs: (label, family, params). Prepare, verify, then time interleaved, cold."""
    ref = Reference.build(A, dtype)
    A_dev = be.matrix(A)
    x = be.vector(ref.x)
    live = []
    for label, fam, params in configs:
        if time.time() > DEADLINE:
            print(f"  deadline: skipping {label}", flush=True)
            continue
        try:
            be.synchronize()
            t0 = time.perf_counter()
            prepared = fam.prepare(A_dev, params)
            be.synchronize()
            prep = time.perf_counter() - t0
            out = cp.full(A.shape[0], cp.nan, dtype=dtype)
            fam.run(prepared, x, out)
            ok, rel, msg = ref.check(cp.asnumpy(out))
            extra = {}
            if hasattr(fam, "memory_ratio") and not isinstance(prepared, list):
                try:
                    extra["memory_ratio"] = fam.memory_ratio(prepared)
                except Exception:
                    pass
            if not ok:
                rows_out.append(dict(matrix=matrix_name, dtype=dtype, label=label, params=params, error=msg))
                print(f"  WRONG {label}: {msg}", flush=True)
                continue
            live.append([label, fam, params, prepared, out, prep, extra, []])
        except Exception as exc:
            rows_out.append(dict(matrix=matrix_name, dtype=dtype, label=label, params=params, error=repr(exc)[:300]))
            print(f"  FAILED {label}: {exc!r}"[:300], flush=True)
    for _ in range(rounds):
        for item in live:
            label, fam, params, prepared, out, *_ = item
            t = be.time(lambda f=fam, p=prepared, o=out: f.run(p, x, o), repeats=repeats, max_duration=max_duration,
                        flush_l2=True)
            item[7].append(t.median_s)
    base = min((float(np.median(i[7])) for i in live if i[0].startswith("cusparse:")), default=float("nan"))
    for label, _, params, _, _, prep, extra, ts in live:
        med = float(np.median(ts))
        rows_out.append(dict(matrix=matrix_name, dtype=dtype, rows=A.shape[0], nnz=int(A.nnz), label=label,
                             params=params, time_us=med * 1e6, ratio=base / med, prepare_spmvs=prep / med,
                             gflops=2 * A.nnz / med / 1e9, **extra))
    del live
    cp.get_default_memory_pool().free_all_blocks()
    _dump()


def _dump():
    os.makedirs(OUT, exist_ok=True)
    with open(f"{OUT}/explore_{PART}.json", "w") as f:
        json.dump(rows_out, f, indent=1, default=str)


def cusparse_configs():
    fam = get_family("cusparse")
    return [(f"cusparse:{a}", fam, {"algorithm": a}) for a in ("default", "csr_alg1", "csr_alg2")]


def part_a():
    mats = ["LFAT5_hypersparse", "EVA", "Groebner_id2003_aug", "zenios", "Franz6_id1959_aug", "ca-HepPh_rawids",
            "wb-cs-stanford", "bcsstk16", "G3_circuit"]
    specs = [{"B": 2, "S": 2, "T": 32, "W": 8, "dirty": "search"},
             {"B": 4, "S": 8, "T": 32, "W": 4, "dirty": "search"},
             {"B": 8, "S": 2, "T": 32, "W": 16, "dirty": "search"},
             {"B": 4, "S": 1, "T": 16, "W": 1, "dirty": "search"},
             {"B": 8, "S": 1, "T": 32, "W": 4, "dirty": "search"}]
    old, unfused, new = OldSpecSum(), Unfused(), ss.SpecSum()
    for name in mats:
        A = read_mtx(f".mats/{name}.mtx.gz", dtype="float64")
        configs = cusparse_configs()
        for p in specs:
            key = "W{W}T{T}B{B}S{S}".format(**p)
            configs += [(f"old:{key}", old, p), (f"unfused:{key}", unfused, p), (f"new:{key}", new, p)]
        measure(name, A, "float64", configs, repeats=100, max_duration=0.3)
        print_table(name, "float64")


def old_vs_new(mats, dtype, specs):
    """specsum's previous kernel (ccdab00) against the current one, at the same configs, same run."""
    old, new = OldSpecSum(), ss.SpecSum()
    for name, load in mats:
        if time.time() > DEADLINE:
            break
        configs = cusparse_configs()
        for p in specs:
            key = "W{W}T{T}B{B}S{S}".format(**p)
            configs += [(f"old:{key}", old, p), (f"new:{key}", new, p)]
        measure(name, load(), dtype, configs, repeats=50, max_duration=0.2)
        print_table(name, dtype)


def part_c():
    """Large matrices, old kernel vs new: no slowdown where the bunches take many waves."""
    specs = [{"B": 4, "S": 8, "T": 32, "W": 4, "dirty": "search"}, {"B": 2, "S": 2, "T": 32, "W": 8, "dirty": "search"},
             {"B": 8, "S": 1, "T": 32, "W": 4, "dirty": "search"}]
    mats = [("G3_circuit", lambda: read_mtx(".mats/G3_circuit.mtx.gz", dtype="float64"))]
    for sm in (SuiteMatrix("powerlaw", 2_000_000), SuiteMatrix("fewhuge", 4_000_000),
               SuiteMatrix("emptyrows", 6_000_000), SuiteMatrix("lp", 400_000)):
        mats.append((sm.name, lambda sm=sm: sm.build("float64")))
    old_vs_new(mats, "float64", specs)


def part_e():
    """The float32 large matrices whose tuned specsum ratio fell from 2026-11-22 to ec4898c, old kernel vs new
    at the configs the tuner chose there."""
    specs = [{"B": 4, "S": 8, "T": 32, "W": 4, "dirty": "search"}, {"B": 4, "S": 8, "T": 32, "W": 8, "dirty": "search"}]
    mats = [(sm.name, lambda sm=sm: sm.build("float32"))
            for sm in (SuiteMatrix("banded", 2_000_000), SuiteMatrix("poisson3d", 200),
                       SuiteMatrix("tallskinny", 20_000_000))]
    old_vs_new(mats, "float32", specs)


GRAPHS = (SuiteMatrix("powerlaw", 12_000_000),
          SuiteMatrix("powerlaw", 16_000_000, options=(("shape", 1.3), ("minimum", 2))))


def on_graphs(configs_of):
    """Measure cuSPARSE's algorithms and ``configs_of(dtype)`` on both graphs, float64 then float32."""
    for sm in GRAPHS:
        t0 = time.time()
        A64 = sm.build("float64")
        print(f"{sm.name}: built in {time.time() - t0:.0f} s, nnz {A64.nnz}, max row {np.diff(A64.indptr).max()}",
              flush=True)
        for dtype in ("float64", "float32"):
            if time.time() > DEADLINE:
                break
            A = A64 if dtype == "float64" else A64.astype(np.float32)
            measure(sm.name, A, dtype, cusparse_configs() + configs_of(dtype), rounds=3, repeats=20,
                    max_duration=0.2)
            print_table(sm.name, dtype)
            del A
        del A64


def paper_base(dtype):
    rp, ct = (2048, 4096) if dtype == "float64" else (4096, 8192)
    return {"rows_per_panel": rp, "cols_per_tile": ct, "threads": 1024}


def part_b():
    nut, spec, ipcsr = get_family("nut"), ss.SpecSum(), get_family("ipcsr")
    blocked = BlockedCuSparse()

    def configs(dtype):
        base = paper_base(dtype)
        out = [("nut:paper", nut, base)]
        for slabs, bands in ((2, 1), (4, 1), (8, 1), (4, 4), (4, 16), (8, 8), (8, 16)):
            out.append((f"nut:s{slabs}b{bands}", nut, {**base, "slabs": slabs, "bands": bands}))
        out.append(("nut:s4b4-512x2048", nut, {"rows_per_panel": 512, "cols_per_tile": 2048, "threads": 256,
                                                "slabs": 4, "bands": 4}))
        for bands, slabs in ((1, 2), (1, 4), (4, 4), (8, 8)):
            out.append((f"blocked:b{bands}s{slabs}", blocked, {"bands": bands, "slabs": slabs}))
        out.append(("specsum:W8S2B2", spec, {"B": 2, "S": 2, "T": 32, "W": 8, "dirty": "search"}))
        out.append(("ipcsr:8Mbest", ipcsr, {"long_chunks": 1, "nt": 256, "shared_size": 2048,
                                             "tree_t1": 2, "tree_t2": 32}))
        return out

    on_graphs(configs)


class PrevNut(Nut):
    """NuT's kernel of commit a32c713 (a thread's loads one entry at a time), on the same structure."""

    cu_file = "../.gpu/nut_prev.cu"


def part_d():
    new, prev = get_family("nut"), PrevNut()

    def configs(dtype):
        out = []
        for label, base in (("paper", paper_base(dtype)),
                            ("paper-512", {**paper_base(dtype), "threads": 512}),
                            ("1024x4096", {"rows_per_panel": 1024, "cols_per_tile": 4096, "threads": 512}),
                            ("8192x16384", {"rows_per_panel": 8192, "cols_per_tile": 16384, "threads": 1024})):
            for slabs, bands in ((1, 1), (2, 1), (4, 1), (4, 4)):
                if label == "paper" or (slabs, bands) in ((1, 1), (4, 1)):
                    params = {**base, "slabs": slabs, **({"bands": bands} if slabs > 1 else {})}
                    out += [(f"nut:{label}:s{slabs}b{bands}", new, params),
                            (f"prev:{label}:s{slabs}b{bands}", prev, params)]
        return out

    on_graphs(configs)


def print_table(matrix, dtype):
    print(f"== {matrix} {dtype}")
    for r in rows_out:
        if r["matrix"] == matrix and r["dtype"] == dtype:
            if "error" in r:
                print(f"   {r['label']:28s} ERROR {r['error'][:120]}")
            else:
                mr = f" mem {r['memory_ratio']:.2f}" if "memory_ratio" in r else ""
                print(f"   {r['label']:28s} {r['time_us']:10.1f} us  x{r['ratio']:.3f}  {r['gflops']:7.1f} GF/s"
                      f"  prep {r['prepare_spmvs']:.0f}{mr}", flush=True)


if __name__ == "__main__":
    if "A" in PART:
        part_a()
    if "C" in PART:
        part_c()
    if "B" in PART:
        part_b()
    if "D" in PART:
        part_d()
    if "E" in PART:
        part_e()
    _dump()
