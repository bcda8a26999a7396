"""Plots and a page from benchmark result files: where we win and where we lose, at a glance.

- ``throughput.png``: GFLOP/s per matrix per kernel (like SURAA's Figure 7);
- ``ratio_vs_cv.png`` / ``ratio_vs_nnz.png``: speed-up over cuSPARSE against the
  coefficient of variation of nonzeros per row and against nnz (like its Figure 13);
- ``roofline.png``: fraction of the measured copy bandwidth against nnz;
- ``report.md`` and ``report.html``: the summary (geometric-mean ratio to cuSPARSE
  of the tuned best, overall and per suite; median roofline fraction) and the tables.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from common.errors import TunerError  # noqa: E402
from common.jsonfile import read_json  # noqa: E402
from tuner.benchmark.bench import PLAN_LABEL  # noqa: E402


@dataclass
class Report:
    """What :func:`render` wrote: figure paths with their number of series, the pages, the summary."""

    figures: dict[str, Path] = field(default_factory=dict)
    series: dict[str, int] = field(default_factory=dict)
    markdown: Path | None = None
    html: Path | None = None
    summary: dict[str, Any] = field(default_factory=dict)


def load(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Environments and rows of one or more result JSON files, plain or gzipped (folders: every *.json and
    *.json.gz inside)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted([*p.glob("*.json"), *p.glob("*.json.gz")]) if p.is_dir() else [p]
    if not files:
        raise TunerError(f"no result files found in {[str(p) for p in paths]}")
    envs, rows = [], []
    for f in files:
        try:
            data = read_json(f)
            envs.append(data["environment"])
            rows += data["rows"]
        except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
            raise TunerError(f"{f} is not a benchmark result file: {exc}") from exc
    return envs, rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per matrix the tuned best (fastest family); geometric means of its ratio to cuSPARSE."""
    best = best_rows(rows)
    by_suite: dict[str, list[float]] = defaultdict(list)
    roofline: dict[str, list[float]] = defaultdict(list)
    for r in best:
        by_suite[f"{r['suite']} {r['dtype']}"].append(r["ratio_to_cusparse"])
        roofline[f"{r['suite']} {r['dtype']}"].append(r["bandwidth_fraction"])
    ratios = [r["ratio_to_cusparse"] for r in best]
    return {
        "matrices": len({(r["matrix"], r["dtype"]) for r in rows}),
        "failed": sorted({r["matrix"] for r in rows if r.get("error")}),
        "geomean_ratio_best": _geomean(ratios),
        "geomean_ratio_best_per_suite": {k: _geomean(v) for k, v in sorted(by_suite.items())},
        "wins": sum(x > 1.0 for x in ratios),
        "losses": sum(x < 1.0 for x in ratios),
        "median_roofline_best": float(np.median([r["bandwidth_fraction"] for r in best])) if best else None,
        "median_roofline_best_per_suite": {k: float(np.median(v)) for k, v in sorted(roofline.items())},
    }


def best_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fastest tuned family per (matrix, dtype) (the untuned plan row is not a tuned result)."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r.get("error") or r["kernel"] == PLAN_LABEL or r.get("ratio_to_cusparse") is None:
            continue
        key = (r["matrix"], r["dtype"])
        if key not in best or r["time_s"] < best[key]["time_s"]:
            best[key] = r
    return list(best.values())


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return float(np.exp(np.mean(np.log(values)))) if values else None


def render(paths: Sequence[str | Path], out_dir: str | Path) -> Report:
    """Write the figures and the pages for the result files ``paths`` into ``out_dir``."""
    envs, rows = load(paths)
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        raise TunerError("the result files hold no successful measurement to plot")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(summary=summarize(rows))
    kernels = sorted({r["kernel"] for r in ok})
    matrices = list(dict.fromkeys(f"{r['matrix']} ({r['dtype']})" for r in ok))
    cpu = any(e.get("device_kind") != "gpu" for e in envs)
    note = " — CPU reference timings, not GPU figures" if cpu else ""
    device = ", ".join(sorted({e["device"] for e in envs}))

    fig, ax = plt.subplots(figsize=(min(40, max(8, 0.6 * len(matrices) * len(kernels) / 3)), 5))
    width = 0.8 / len(kernels)
    for i, k in enumerate(kernels):
        vals = {f"{r['matrix']} ({r['dtype']})": r["gflops"] for r in ok if r["kernel"] == k}
        ax.bar(np.arange(len(matrices)) + i * width, [vals.get(m, 0) for m in matrices], width, label=k)
    ax.set_xticks(np.arange(len(matrices)) + 0.4 - width / 2, matrices, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GFLOP/s (cold L2)")
    ax.set_title(f"SpMV throughput per matrix and kernel on {device}{note}", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    _save(report, "throughput", fig, ax, out)

    for name, x_key, x_label, xscale in (
        ("ratio_vs_cv", "npr_cv", "coefficient of variation of nonzeros per row", "symlog"),
        ("ratio_vs_nnz", "nnz", "nonzeros", "log"),
        ("roofline", "nnz", "nonzeros", "log"),
    ):
        y_key = "bandwidth_fraction" if name == "roofline" else "ratio_to_cusparse"
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for k in kernels:
            pts = [(r[x_key], r[y_key]) for r in ok if r["kernel"] == k and r.get(y_key) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, label=k, s=18, alpha=0.8)
        ax.set_xscale(xscale, **({"linthresh": 1.0} if xscale == "symlog" else {}))
        if y_key == "ratio_to_cusparse":
            ax.set_yscale("log")
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.set_ylabel("speed-up over cuSPARSE (>1: faster)")
        else:
            ax.set_ylabel("fraction of measured copy bandwidth")
        ax.set_xlabel(x_label)
        ax.set_title(f"{name.replace('_', ' ')} on {device}{note}", fontsize=9)
        ax.legend(fontsize=7)
        _save(report, name, fig, ax, out)

    report.markdown = out / "report.md"
    report.markdown.write_text(_markdown(report, envs, ok, note))
    report.html = out / "report.html"
    report.html.write_text(_html(report, envs, ok, note))
    return report


def _save(report: Report, name: str, fig: Any, ax: Any, out: Path) -> None:
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    report.figures[name] = path
    report.series[name] = len(ax.get_legend_handles_labels()[1])


def _table(ok: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    head = ["matrix", "dtype", "nnz", "npr CV", "kernel", "time (µs)", "GFLOP/s", "of copy BW", "vs cuSPARSE",
            "warm vs cuSPARSE", "prepare (SpMVs)"]
    body = [
        [r["matrix"], r["dtype"], str(r["nnz"]), f"{r['npr_cv']:.2f}", r["kernel"], f"{r['time_s'] * 1e6:.1f}",
         f"{r['gflops']:.1f}", f"{r['bandwidth_fraction']:.0%}", _ratio(r["ratio_to_cusparse"]),
         _ratio(r["warm_ratio_to_cusparse"]), f"{r['prepare_spmvs']:.0f}"]
        for r in ok
    ]
    return head, body


def _ratio(x: float | None) -> str:
    return f"{x:.2f}x" if x else "-"


def _summary_lines(report: Report, envs: list[dict[str, Any]], note: str) -> list[str]:
    s = report.summary
    lines = [f"- device: {', '.join(sorted({e['device'] for e in envs}))}{note}",
             f"- commit: {', '.join(sorted({e.get('git_commit', '?')[:12] for e in envs}))}",
             f"- matrices: {s['matrices']}, failed: {', '.join(s['failed']) or 'none'}",
             f"- tuned best vs cuSPARSE, geometric mean: {_ratio(s['geomean_ratio_best'])} "
             f"({s['wins']} faster, {s['losses']} slower)",
             f"- median fraction of copy bandwidth (tuned best): {s['median_roofline_best'] or 0:.0%}"]
    lines += [f"- {k}: tuned best vs cuSPARSE {_ratio(v)} (geometric mean), median fraction of copy bandwidth "
              f"{s['median_roofline_best_per_suite'][k]:.0%}" for k, v in s["geomean_ratio_best_per_suite"].items()]
    return lines


def _markdown(report: Report, envs: list[dict[str, Any]], ok: list[dict[str, Any]], note: str) -> str:
    head, body = _table(ok)
    lines = ["# SpMV benchmark", "", *_summary_lines(report, envs, note), ""]
    lines += [f"![{name}]({path.name})" for name, path in report.figures.items()]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def _html(report: Report, envs: list[dict[str, Any]], ok: list[dict[str, Any]], note: str) -> str:
    head, body = _table(ok)
    items = "".join(f"<li>{html.escape(line[2:])}</li>" for line in _summary_lines(report, envs, note))
    imgs = "".join(f'<img src="{p.name}" alt="{n}" style="max-width:100%">' for n, p in report.figures.items())
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return (f"<!doctype html><meta charset='utf-8'><title>SpMV benchmark</title><h1>SpMV benchmark</h1>"
            f"<ul>{items}</ul>{imgs}<table border=1 cellspacing=0><tr>{th}</tr>{rows}</table>\n")
