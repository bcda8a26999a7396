"""Probe: where csr_vector's loads go (cache hints, rows to SMs), cold, against cuSPARSE's best, on unseen matrices.

Where x fits the L2 and the columns are random, csr_vector ran 0.82-0.95x cuSPARSE at stop 72 (perm27, citations,
cliques, smallworld, ...). ``--mode hints`` (the default) runs kernels/csr_vector.cu with its loads rewritten (GATHER
for x, STREAM for values and columns):

0. as it is (``__ldg``);
1. x with ``L1::no_allocate`` (a random gather leaves the L1 to the entries it batches);
2. x with an L2 ``evict_last`` policy (x stays in the L2 while the entries stream past);
3. the entries with an L2 ``evict_first`` policy;
4. 2 and 3;
5. 1 and 3.

    python bench/probe_gather.py perm27,citations,rgg
    python bench/probe_gather.py perm27,citations,rgg --mode sweep   # rows to SMs: block sizes, blocks sweeping tiles
    python bench/probe_gather.py perm27,citations,rgg --mode claim   # each block's tile claimed from its SM's share
    python bench/probe_gather.py rgg,kronrandom --mode blocks --picks bench/results/*_unseen-r73.json.gz  # predict's

Stop 73's findings, an H200, twelve unseen matrices, 4 and 8 threads a row (``bench/results/2026-11-29_probe_gather-
73.txt``, ``..._probe_gather-sweep-73.txt``, ``..._probe_gather-claim-73.txt``): what the L1 keeps of x matters most:
with ``no_allocate`` none of the 48 cells (matrix, dtype, threads a row) ran faster, 43 over 2 % slower, citations at
half speed (0.92 -> 0.46x cuSPARSE). x ``evict_last`` sped 16 cells up by over 2 % (erdos, x of 800 KB and 250 random
columns a row: 0.93 -> 1.39x, float64, 8 threads a row) and slowed 23 (rgg 1.54 -> 1.38x); the entries ``evict_first``
15 and 21. The block size moves csr_vector both ways, by up to 1.6x: blocks of 1024 threads against 128 ran kronrandom
0.76 -> 1.21x, sawtooth 0.90 -> 1.26x, colperm27 0.93 -> 1.14x, citations 0.82 -> 1.01x (float64, 4 threads a row),
erdos 1.08 -> 1.57x (float32), but rgg 1.50 -> 1.34x and reactdiff 1.45 -> 1.35x. Blocks of 128 sweeping 4, 16 or 64
tiles beat the better of blocks of 128 and 1024 in 5 of 48 cells, by 1-3 % but on erdos in float32 (1.10x); tiles
claimed from the SM's share (an atomic a block, the counters zeroed before each product) in none (rgg 1.50 -> 0.88x).
Predict's csr_vector at each block size (``--mode blocks``, ``..._probe_gather-blocks-73.txt``, the 102 cells where
predict ran csr_vector): its picks 1.195x cuSPARSE, each cell's best block 1.251x, 13 cells over 10 % better, all in
blocks of 1024; one block size for all 1.193-1.200x.
"""

import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from probing import against_cusparse, each_unseen  # noqa: E402

from kernels import get_family  # noqa: E402
from kernels._cuda import c_type  # noqa: E402
from tuner.measure.backend import GpuBackend  # noqa: E402

VARIANTS = {0: "as is", 1: "x no_allocate", 2: "x evict_last", 3: "entries evict_first",
            4: "x evict_last, entries evict_first", 5: "x no_allocate, entries evict_first"}
GATHER = {0: "ld_plain", 1: "ld_na", 2: "ld_last", 3: "ld_plain", 4: "ld_last", 5: "ld_na"}
STREAM = {0: "ld_plain", 1: "ld_plain", 2: "ld_plain", 3: "ld_first", 4: "ld_first", 5: "ld_first"}
TILES = (4, 16, 64)
"""The tiles of rows a block sweeps (``--mode sweep``)."""

HINTED = r"""
__device__ __forceinline__ double NAME(const double* p) { double v;
  asm("{.reg .b64 q; createpolicy.fractional.L2::POLICY.b64 q, 1.0; ld.global.nc.L2::cache_hint.f64 %0, [%1], q;}"
      : "=d"(v) : "l"(p)); return v; }
__device__ __forceinline__ float NAME(const float* p) { float v;
  asm("{.reg .b64 q; createpolicy.fractional.L2::POLICY.b64 q, 1.0; ld.global.nc.L2::cache_hint.f32 %0, [%1], q;}"
      : "=f"(v) : "l"(p)); return v; }
__device__ __forceinline__ int NAME(const int* p) { int v;
  asm("{.reg .b64 q; createpolicy.fractional.L2::POLICY.b64 q, 1.0; ld.global.nc.L2::cache_hint.s32 %0, [%1], q;}"
      : "=r"(v) : "l"(p)); return v; }
__device__ __forceinline__ unsigned short NAME(const unsigned short* p) { unsigned short v;
  asm("{.reg .b64 q; createpolicy.fractional.L2::POLICY.b64 q, 1.0; ld.global.nc.L2::cache_hint.u16 %0, [%1], q;}"
      : "=h"(v) : "l"(p)); return v; }
"""

PRELUDE = r"""
template <typename T> __device__ __forceinline__ T ld_plain(const T* p) { return __ldg(p); }
__device__ __forceinline__ double ld_na(const double* p) { double v;
  asm("ld.global.nc.L1::no_allocate.f64 %0, [%1];" : "=d"(v) : "l"(p)); return v; }
__device__ __forceinline__ float ld_na(const float* p) { float v;
  asm("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(p)); return v; }
""" + HINTED.replace("NAME", "ld_last").replace("POLICY", "evict_last") \
    + HINTED.replace("NAME", "ld_first").replace("POLICY", "evict_first")


def sweep_source(tiles: int) -> str:
    """kernels/csr_vector.cu with each block summing ``tiles`` consecutive tiles of rows (a tile: blockDim / TPR
    rows), one after the other: the rows an SM's L1 serves come in order, not 132 blocks apart."""
    src = (REPO / "kernels" / "csr_vector.cu").read_text()
    old = """    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = tid / TPR;"""
    assert src.count(old) == 1 and src.endswith("    }\n}\n")
    loop = f"for (long long tile = (long long)blockIdx.x * {tiles}; tile < (blockIdx.x + 1LL) * {tiles}; ++tile)"
    src = src.replace(old, f"""  {loop} {{
    const long long tid = tile * blockDim.x + threadIdx.x;
    const long long row = tid / TPR;""")
    return src[: -len("}\n")] + "  }\n}\n"


CLAIM = r"""
__device__ __forceinline__ unsigned sm_id() { unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }

// The tile of rows this block sums: the next of its SM's share (``per`` tiles an SM, tile order), else the next
// of another SM's, tried in order from the one after its own; ``next`` (an SM's tiles given out) zero at launch.
// Every block takes one tile: there are as many tiles as blocks, and a share passed by is used up for good.
__device__ __forceinline__ long long claim(unsigned* next, const int sms, const long long per)
{
    __shared__ long long claimed;
    if (threadIdx.x == 0) {
        const long long tiles = gridDim.x;
        int v = sm_id() % sms;
        long long tile = -1;
        for (int k = 0; k < sms && tile < 0; ++k, v = v + 1 == sms ? 0 : v + 1) {
            const long long first = v * per;
            const long long count = min(per, tiles - first);
            if (count <= 0) continue;
            const unsigned t = atomicAdd(&next[v], 1u);
            if (t < count) tile = first + t;
        }
        claimed = tile;
    }
    __syncthreads();
    return claimed;
}
"""


def claim_source() -> str:
    """kernels/csr_vector.cu with each block's tile of rows claimed from its SM's share (:data:`CLAIM`): an SM's
    blocks sum consecutive tiles, in blocks of any size."""
    src = (REPO / "kernels" / "csr_vector.cu").read_text()
    for old, new in (("const int* __restrict__ rows)", "const int* __restrict__ rows, unsigned* next, const int sms, "
                                                       "const long long per)"),
                     ("const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
                      "const long long tid = claim(next, sms, per) * blockDim.x + threadIdx.x;")):
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    return CLAIM + src


def variant_source(v: int) -> str:
    """kernels/csr_vector.cu with variant ``v``'s loads."""
    src = (REPO / "kernels" / "csr_vector.cu").read_text()
    for old, new in (("__ldg(&x[c[u]])", "GATHER(&x[c[u]])"), ("values[k] : T(0)", "STREAM(&values[k]) : T(0)"),
                     ("__ldg(&row_offsets[k])", "STREAM(&row_offsets[k])"),
                     ("__ldg(&row_indices[k])", "STREAM(&row_indices[k])")):
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    return PRELUDE + f"#define GATHER {GATHER[v]}\n#define STREAM {STREAM[v]}\n" + src


def _compiled(modules: dict[tuple[Any, str], Any], key: Any, source: Any, fam: Any, A: Any, prepared: Any) -> Any:
    """``prepared``'s instantiation of csr_vector (its values, threads a row and columns, narrow where they were
    attached) out of the rewritten source ``source()``, compiled once a key and dtype."""
    import cupy

    if (key, str(A.dtype)) not in modules:
        modules[key, str(A.dtype)] = cupy.RawModule(code=source(), options=("-std=c++17",),
                                                    name_expressions=fam.name_expressions(A.dtype))
    narrow = "true" if "base" in prepared.extra else "false"
    tpr = prepared.params["threads_per_row"]
    return modules[key, str(A.dtype)].get_function(f"csr_vector<{c_type(A.dtype)}, {tpr}, {narrow}>")


def _as_is(fam: Any, A: Any, x: Any, params: dict[str, Any], blocks: tuple[int, ...],
           notes: dict[int, str] | None = None) -> list[tuple[str, Any]]:
    """csr_vector with ``params`` in each of ``blocks``, the library's own kernel (``notes``: added to a block's
    label): what the rewritten ones are held to."""
    runs = []
    for block in blocks:
        prepared = fam.prepare(A, {**params, "block_size": block})
        label = f"tpr {params['threads_per_row']} block {block}{(notes or {}).get(block, '')}"
        runs.append((label, lambda p=prepared: fam.run(p, x)))
    return runs


def _by_hand(kernel: Any, prepared: Any, A: Any, x: Any, blocks: int, block: int, extra: tuple = (),
             before: Any = None) -> Any:
    """A product of ``kernel`` launched by hand, ``blocks`` blocks of ``block`` threads, with csr_vector's arguments
    for ``prepared`` (then ``extra``) into a y of its own; ``before`` called ahead of each launch."""
    import cupy

    from kernels._narrow import launch_columns

    assert "listed" not in prepared.extra  # every row, not a list of the nonempty ones
    out = cupy.empty(A.shape[0], dtype=A.dtype)
    args = (np.int32(A.shape[0]), A.indptr, A.indices, *launch_columns(prepared.extra, A.indices), A.data, x, out,
            None, *extra)

    def run() -> Any:
        if before is not None:
            before()
        kernel((blocks,), (block,), args)
        return out

    return run


def hinted_runs(fam: Any, A: Any, x: Any, modules: dict[tuple[Any, str], Any]) -> list[tuple[str, Any]]:
    """csr_vector, 4 and 8 threads a row in blocks of 128, under each variant of :data:`VARIANTS`."""
    runs = []
    for tpr in (4, 8):
        for v, label in VARIANTS.items():
            prepared = fam.prepare(A, {"threads_per_row": tpr, "block_size": 128, "indices": "narrow"})
            prepared.extra["kernel"] = _compiled(modules, v, lambda v=v: variant_source(v), fam, A, prepared)
            runs.append((f"tpr {tpr} {label}", lambda p=prepared: fam.run(p, x)))
    return runs


def swept_runs(fam: Any, A: Any, x: Any, modules: dict[tuple[Any, str], Any]) -> list[tuple[str, Any]]:
    """csr_vector, 4 and 8 threads a row, in blocks of 128, 512 and 1024 as it is, and in blocks of 128 each
    sweeping 4, 16 or 64 tiles of rows (:func:`sweep_source`)."""
    from kernels._cuda import grid

    runs = []
    for tpr in (4, 8):
        params = {"threads_per_row": tpr, "indices": "narrow"}
        runs += _as_is(fam, A, x, params, (128, 512, 1024))
        for tiles in TILES:
            prepared = fam.prepare(A, {**params, "block_size": 128})
            kernel = _compiled(modules, tiles, lambda t=tiles: sweep_source(t), fam, A, prepared)
            blocks = -(-grid(A.shape[0] * tpr, 128) // tiles)
            runs.append((f"tpr {tpr} block 128 sweep {tiles}", _by_hand(kernel, prepared, A, x, blocks, 128)))
    return runs


def claimed_runs(fam: Any, A: Any, x: Any, modules: dict[tuple[Any, str], Any]) -> list[tuple[str, Any]]:
    """csr_vector, 4 and 8 threads a row, in blocks of 128 and 1024 as it is, and in blocks of 128, 256 and 512
    claiming their tiles from their SM's share (:func:`claim_source`; the counters zeroed before each product)."""
    import cupy

    from kernels._cuda import grid

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    counters = cupy.zeros(sms, dtype=cupy.uint32)
    runs = []
    for tpr in (4, 8):
        params = {"threads_per_row": tpr, "indices": "narrow"}
        runs += _as_is(fam, A, x, params, (128, 1024))
        for block in (128, 256, 512):
            prepared = fam.prepare(A, {**params, "block_size": block})
            kernel = _compiled(modules, "claim", claim_source, fam, A, prepared)
            tiles = grid(A.shape[0] * tpr, block)
            extra = (counters, np.int32(sms), np.int64(-(-tiles // sms)))
            run = _by_hand(kernel, prepared, A, x, tiles, block, extra, before=lambda: counters.fill(0))
            runs.append((f"tpr {tpr} block {block} claimed", run))
    return runs


BLOCKS = (64, 128, 256, 512, 1024)
"""The block sizes ``--mode blocks`` times at predict's threads a row."""


def predicted_csr_vector(paths: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """(matrix, dtype) -> the csr_vector config ``plan(effort="predict")`` ran, from bench/unseen.py's result files."""
    import json

    from common.jsonfile import read_json

    return {(r["matrix"], r["dtype"]): json.loads(r["params"]) for path in paths for r in read_json(path)["rows"]
            if r["effort"] == "predict" and r["kernel"] == "csr_vector"}


def blocked_runs(fam: Any, A: Any, x: Any, picked: dict[str, Any]) -> list[tuple[str, Any]]:
    """csr_vector as predict picked it (``picked``), and its threads a row at each of :data:`BLOCKS`: how much a
    prediction leaves in the block size alone."""
    return _as_is(fam, A, x, picked, BLOCKS, notes={picked["block_size"]: " (predict's)"})


def sources() -> dict[str, str]:
    """Every kernel source the probe compiles, by name: what a CPU test compiles with nvcc (the text it rewrites
    in kernels/csr_vector.cu still there)."""
    return {**{f"hints {v}": variant_source(v) for v in VARIANTS}, **{f"sweep {t}": sweep_source(t) for t in TILES},
            "claim": claim_source()}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("matrices", help="bench/unseen.py's matrices, comma-separated")
    ap.add_argument("--mode", choices=("hints", "sweep", "claim", "blocks"), default="hints",
                    help="cache hints on the loads; rows to SMs by block size and blocks sweeping tiles; tiles claimed "
                         "from the SM's share; predict's csr_vector at each block size (--picks)")
    ap.add_argument("--picks", nargs="*", default=[],
                    help="bench/unseen.py result files: predict's picks (--mode blocks)")
    args = ap.parse_args()
    if args.mode == "blocks" and not args.picks:
        ap.error("--mode blocks times predict's picks: name bench/unseen.py result files with --picks")
    import cupy

    backend = GpuBackend()
    fam = get_family("csr_vector")
    modules: dict[tuple[Any, str], Any] = {}
    picks = predicted_csr_vector(args.picks)
    runs_of = {"hints": hinted_runs, "sweep": swept_runs, "claim": claimed_runs}.get(args.mode)
    for name, A, dtype in each_unseen(args.matrices):
        if args.mode == "blocks" and (name, dtype) not in picks:
            continue
        x = cupy.random.default_rng(0).random(A.shape[1]).astype(dtype)
        runs = blocked_runs(fam, A, x, picks[name, dtype]) if runs_of is None else runs_of(fam, A, x, modules)
        against_cusparse(backend, A, x, runs, f"{name} {dtype} ({A.shape[0]} x {A.shape[1]}, {A.nnz} nnz)")


if __name__ == "__main__":
    main()
