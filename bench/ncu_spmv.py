"""Why a tuned best runs at the bandwidth it does: its hardware counters and cuSPARSE's, for Nsight Compute (issue #21).

For each row of one or more ``bench/convergence.py`` result files (a matrix of a suite, a dtype, the
search's best config): the best and cuSPARSE's two algorithms, each run once to warm up and then once inside
an NVTX range ``spmv-<i>`` of its own, so Nsight Compute profiles that product alone and its counters name
the config. Three steps, on a GPU:

    F=bench/results/<a convergence run>.json
    ncu --nvtx $(python bench/ncu_spmv.py ranges $F) --clock-control none --csv --log-file ncu.csv \\
        --metrics $(python bench/ncu_spmv.py metrics) python bench/ncu_spmv.py run $F --labels labels.json
    python bench/ncu_spmv.py summary ncu.csv labels.json --out counters.json

``--only a,b`` (to ``ranges`` and ``run`` alike) profiles those matrices alone: a GPU takes 4-6 minutes for the
60 products of the large suite in both dtypes.

The summary adds the kernels of each product up: its time, DRAM bytes, the L2 sectors its loads read
(each a 32-byte sector: a gathered 4- or 8-byte x value costs a whole one), the throughputs of the L2 and
DRAM as a share of their peaks, the active warps, and the bytes moved over the compulsory ones
(:func:`tuner.measure.metrics.effective_bytes`), and the compulsory bandwidth it would reach with the L2 at
its peak throughput and the same traffic (``compulsory_gbs_at_l2_peak``: a ceiling where the L2 bounds it).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common.jsonfile import read_json  # noqa: E402
from kernels import BASELINE_CONFIGS, canonical  # noqa: E402
from tuner.measure.metrics import effective_bytes  # noqa: E402

METRICS = (
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sector_op_read_hit_rate.pct", "l1tex__t_sector_hit_rate.pct",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
)
SUMMED = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
          "lts__t_sectors_srcunit_tex_op_read.sum")
"""Counts added over the kernels of one product; the other metrics are averaged, weighted by each kernel's time."""


def labels(paths: Iterable[Path], only: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Each product to profile, in the order ``run`` makes them: per result row (of the matrices ``only`` names,
    where it names any) its best, then cuSPARSE's two, each config as it runs; the rows of one matrix together
    (the files may split the dtypes), so each matrix is built once."""
    only = set(only)
    rows = [(data["suite"], data.get("scale", 1.0), row) for path in paths
            for data in [read_json(path)] for row in data["rows"]
            if not only or row["matrix"] in only]
    rows.sort(key=lambda r: (r[0], r[1], r[2]["matrix"]))
    out: list[dict[str, Any]] = []
    for suite_name, scale, row in rows:
        for kernel, params in ((row["best_kernel"], row["best_params"]), *BASELINE_CONFIGS):
            out.append({"range": f"spmv-{len(out)}", "suite": suite_name, "scale": scale,
                        "matrix": row["matrix"], "dtype": row["dtype"], "kernel": kernel,
                        "params": canonical(kernel, params),  # as it runs (a parameter added since: its default)
                        "rows": row["rows"], "cols": row["cols"], "nnz": row["nnz"],
                        "compulsory_bytes": effective_bytes(row["rows"], row["cols"], row["nnz"], row["dtype"])})
    return out


def run(products: list[dict[str, Any]]) -> None:
    """Build each matrix once (the suite's generator), then each product warm, then inside its range."""
    import numpy as np
    from convergence import makers

    from kernels import get_family
    from kernels._cuda import require_cupy

    cupy = require_cupy()
    import cupyx.scipy.sparse as cusp
    from cupy.cuda import nvtx

    host, built = None, None
    for p in products:
        if built != (p["suite"], p["matrix"], p["scale"]):
            host, built = None, (p["suite"], p["matrix"], p["scale"])  # one matrix in memory at a time
            host = makers(p["suite"], p["scale"])[p["matrix"]]()
        A = cusp.csr_matrix(host.astype(p["dtype"]))
        x = cupy.asarray(np.random.default_rng(1).uniform(-1, 1, host.shape[1]).astype(p["dtype"]))
        y = cupy.empty(host.shape[0], dtype=p["dtype"])
        family = get_family(p["kernel"])
        prepared = family.prepare(A, p["params"])
        family.run(prepared, x, y)
        cupy.cuda.Device().synchronize()
        nvtx.RangePush(p["range"])
        family.run(prepared, x, y)
        cupy.cuda.Device().synchronize()
        nvtx.RangePop()
        print(f"{p['range']}: {p['matrix']} {p['dtype']} {p['kernel']} {p['params']}", file=sys.stderr, flush=True)
        del prepared, A


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text.strip() not in ("", "n/a") else float("nan")


def summary(csv_path: Path, products: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Nsight Compute's CSV (lines before its header skipped) joined to the products by their ranges."""
    lines = Path(csv_path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    kernels: dict[tuple[str, str], dict[str, float]] = {}
    for rec in csv.DictReader(lines[start:]):
        stack = rec["thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"]
        name = next((p["range"] for p in products if f":{p['range']}:" in stack), None)
        if name is not None:
            kernels.setdefault((name, rec["ID"]), {})[rec["Metric Name"]] = _number(rec["Metric Value"])
    out = []
    for p in products:
        mine = [m for (name, _), m in kernels.items() if name == p["range"]]
        if not mine:
            continue
        total = {k: sum(m[k] for m in mine) for k in SUMMED}
        weights = [m["gpu__time_duration.sum"] for m in mine]
        mean = {k: sum(w * m[k] for w, m in zip(weights, mine, strict=True)) / sum(weights)
                for k in METRICS if k not in SUMMED}
        seconds = total["gpu__time_duration.sum"] * 1e-9
        dram = total["dram__bytes_read.sum"] + total["dram__bytes_write.sum"]
        sectors = total["lts__t_sectors_srcunit_tex_op_read.sum"]
        out.append({**{k: p[k] for k in ("matrix", "dtype", "kernel", "params", "nnz")}, "kernels": len(mine),
                    "time_s": seconds, "compulsory_gbs": p["compulsory_bytes"] / seconds / 1e9,
                    "dram_over_compulsory": dram / p["compulsory_bytes"],
                    "l2_read_over_compulsory": 32 * sectors / p["compulsory_bytes"],
                    "l2_sectors_per_nonzero": sectors / max(p["nnz"], 1),
                    "l2_throughput_pct": mean["lts__throughput.avg.pct_of_peak_sustained_elapsed"],
                    "compulsory_gbs_at_l2_peak": p["compulsory_bytes"] / seconds / 1e9
                    * 100 / mean["lts__throughput.avg.pct_of_peak_sustained_elapsed"],
                    "dram_throughput_pct": mean["dram__throughput.avg.pct_of_peak_sustained_elapsed"],
                    "l2_hit_pct": mean["lts__t_sector_op_read_hit_rate.pct"],
                    "l1_hit_pct": mean["l1tex__t_sector_hit_rate.pct"],
                    "warps_active_pct": mean["sm__warps_active.avg.pct_of_peak_sustained_active"]})
    return out


def _names(only: str) -> list[str]:
    return [name for name in only.split(",") if name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("metrics", help="the --metrics list for ncu")
    for step, what in (("ranges", "the --nvtx-include options for ncu"), ("run", "the products, to run under ncu")):
        one = sub.add_parser(step, help=what)
        one.add_argument("results", nargs="+", type=Path, help="bench/convergence.py result files")
        one.add_argument("--only", default="", help="comma-separated matrix names (the same for both steps)")
        if step == "run":
            one.add_argument("--labels", type=Path, required=True, help="where to write the products' labels")
    last = sub.add_parser("summary", help="the counters of each product, from ncu's CSV")
    last.add_argument("csv", type=Path)
    last.add_argument("labels", type=Path)
    last.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.step == "metrics":
        print(",".join(METRICS))
    elif args.step == "ranges":
        print(" ".join(f"--nvtx-include {p['range']}/" for p in labels(args.results, _names(args.only))))
    elif args.step == "run":
        products = labels(args.results, _names(args.only))
        args.labels.write_text(json.dumps(products, indent=1) + "\n")
        run(products)
    else:
        rows = summary(args.csv, json.loads(args.labels.read_text()))
        for r in rows:
            print(f"{r['matrix']:20s} {r['dtype']} {r['kernel']:9s} {r['time_s'] * 1e6:8.1f} us "
                  f"{r['compulsory_gbs']:6.0f} GB/s  L2 {r['l2_throughput_pct']:5.1f}% "
                  f"({r['l2_sectors_per_nonzero']:.2f} sectors/nz, hit {r['l2_hit_pct']:.0f}%)  "
                  f"DRAM {r['dram_throughput_pct']:5.1f}% ({r['dram_over_compulsory']:.2f}x)  "
                  f"warps {r['warps_active_pct']:.0f}%")
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
