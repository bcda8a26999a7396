"""Where a prediction's time goes, step by step, on the host and on the GPU: plan()'s timeline (issue #18's cost).

``plan(effort="predict")`` on unseen matrices (``bench/unseen.py``'s generators), each plan on a fresh store holding
the warm-up matrix, as the benchmark runs it. At the end of each host step (the functions of :data:`STEPS`, wrapped
while the probe runs) the host's clock is read and a CUDA event recorded: the host's time of the step's end and the
GPU's time of finishing the work queued by then, both from the plan's start. Where the GPU's time runs past the
host's (``lag`` > 0) the GPU is behind and its work is on the path; where not, the host is. Medians over the probed
plans; unprobed plans alternate with them, for the wall time that the probe's events (5-40 us each) do not touch,
and the features alone are timed as ``bench/unseen.py`` times them (back to back, and alike: after a fresh store).
Stop 63's findings with it: ``bench/results/2026-11-28_predict-kept-63.txt``.

    python bench/plan_timeline.py --only road,knn3d --dtype float32 > timeline.txt
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from unseen import features_alone, one_plan  # noqa: E402
from unseen_matrices import MATRICES, rgg  # noqa: E402

STEPS = (
    ("tuner.matrix.readback", "ReadBack.__init__", "read-back"),
    ("tuner.matrix.fingerprint", "queue_structure_pass", "structure pass"),
    ("db.store", "Store.shaped_and_newest_model", "store"),
    ("tuner.matrix.fingerprint", "queue_features", "features queued"),
    ("tuner.execute.plan", "selector_for", "selector"),
    ("tuner.execute.plan", "queue_ranking", "ranking queued"),
    ("tuner.matrix.readback", "ReadBack.queue_copy", "copy queued"),
    ("kernels._narrow", "queue_encode", "row columns queued"),
    ("tuner.matrix.fingerprint", "kept_on_device", "matrix kept"),
    ("tuner.matrix.fingerprint", "_name", "named"),
    ("tuner.execute.choice", "QueuedRanking.__call__", "ranking read"),
    ("tuner.execute.plan", "ranked_choice", "choice"),
    ("tuner.execute.plan", "Executor", "prepared"),
)
"""The steps marked, in the order a prediction of a matrix new to the store runs them: (module, attribute in it
(``Class.method`` for a method), label). Each is looked up where plan() calls it; the structure pass's read (the
function it returns) is marked too."""


def resolve(module: str, attribute: str) -> tuple[Any, str]:
    """The object holding ``attribute`` (the module, or its class for ``Class.method``) and the name in it."""
    owner: Any = importlib.import_module(module)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    getattr(owner, name)  # AttributeError where the code no longer has it
    return owner, name


class Timeline:
    """The marks of the plan being probed: (label, host seconds, CUDA event), while :attr:`on`."""

    def __init__(self, cupy: Any, events: int = 64) -> None:
        self._events = [cupy.cuda.Event() for _ in range(events + 1)]
        self.start_event = self._events[-1]
        self.marks: list[tuple[str, float, Any]] = []
        self.on = False
        self.started = 0.0

    def start(self, on: bool) -> None:
        """A plan begins: its marks from now (where ``on``), timed from here on the host and on the GPU."""
        self.marks.clear()
        self.on = on
        self.started = time.perf_counter()
        self.start_event.record()

    def mark(self, label: str) -> None:
        if self.on and len(self.marks) < len(self._events) - 1:
            event = self._events[len(self.marks)]
            event.record()
            self.marks.append((label, time.perf_counter(), event))

    def wrap(self, owner: Any, name: str, label: str, result_too: bool = False) -> None:
        """Mark ``label`` each time ``owner.name`` returns (and ``label + ' read'`` when what it returned is called,
        with ``result_too``)."""
        real = getattr(owner, name)

        @functools.wraps(real)
        def marked(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            self.mark(label)
            if result_too and callable(result):
                def read(*a: Any, **k: Any) -> Any:
                    found = result(*a, **k)
                    self.mark(label + " read")
                    return found
                return read
            return result

        setattr(owner, name, marked)


def probe(timeline: Timeline, cupy: Any, backend: Any, A0: Any, warm_up: dict[str, Any], plans: int
          ) -> tuple[dict[str, list[tuple[float, float]]], list[float], list[float], Any]:
    """``plans`` probed plans alternated with as many unprobed (after two of each to warm up), each run as
    ``bench/unseen.py`` runs a plan (:func:`unseen.one_plan`): each mark's host and GPU microseconds from the plan's
    start, the probed and the unprobed wall seconds, the last executor."""
    marks: dict[str, list[tuple[float, float]]] = {}
    probed, unprobed, ex = [], [], None
    for i in range(2 * plans + 4):
        probing = i % 2 == 0
        seconds, ex, _ = one_plan(backend, A0, "predict", 0, warm_up, at_start=lambda on=probing: timeline.start(on))
        timeline.on = False
        if i < 4:
            continue
        (probed if probing else unprobed).append(seconds)
        for k, (label, at, event) in enumerate(timeline.marks if probing else []):
            gpu_us = cupy.cuda.get_elapsed_time(timeline.start_event, event) * 1e3
            marks.setdefault(f"{k:02d} {label}", []).append(((at - timeline.started) * 1e6, gpu_us))
    return marks, probed, unprobed, ex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="road,knn3d", help="comma-separated matrix names of bench/unseen.py")
    ap.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float64"])
    ap.add_argument("--plans", type=int, default=7, help="probed plans a matrix (as many unprobed between them)")
    ap.add_argument("--scale", type=float, default=1.0, help="the matrices' size, as bench/unseen.py's --scale")
    args = ap.parse_args()
    names = args.only.split(",")
    if unknown := sorted(set(names) - {m.name for m in MATRICES}):
        raise SystemExit(f"unknown matrices {unknown}: bench/unseen.py has {[m.name for m in MATRICES]}")

    import cupy
    import cupyx.scipy.sparse as cusp

    from tuner.matrix.features import extract_features
    from tuner.matrix.io import as_csr
    from tuner.measure.backend import GpuBackend

    timeline = Timeline(cupy)
    for module, attribute, label in STEPS:
        try:
            owner, name = resolve(module, attribute)
        except AttributeError:
            warnings.warn(f"{module}.{attribute} is gone: {label!r} is not marked", stacklevel=1)
            continue
        timeline.wrap(owner, name, label, result_too=attribute == "queue_structure_pass")
    warm = as_csr(rgg(20_000, np.random.default_rng(0)), dtype="float64")
    warm_up = {"rows": warm.shape[0], "cols": warm.shape[1], "nnz": warm.nnz, "features": extract_features(warm)}
    backend = GpuBackend()
    for matrix in (m for m in MATRICES if m.name in names):
        host = matrix.make(args.scale)
        for dtype in args.dtype:
            A0 = cusp.csr_matrix(host.astype(dtype))
            x = cupy.ones(A0.shape[1], dtype=dtype)
            spmv = backend.time(lambda A0=A0, x=x: A0.dot(x), repeats=20).median_s * 1e6  # CuPy's own product
            marks, probed, unprobed, ex = probe(timeline, cupy, backend, A0, warm_up, args.plans)
            back_to_back = features_alone(backend, A0, runs=5)
            alike = features_alone(backend, A0, runs=5, warm_up=warm_up)
            wall = statistics.median(unprobed)
            print(f"== {matrix.name} {dtype} {A0.shape} nnz {A0.nnz}: picks {ex.kernel}; SpMV {spmv:.0f} us; plan "
                  f"{wall * 1e6:.0f} us (probed {statistics.median(probed) * 1e6:.0f}); features back to back "
                  f"{back_to_back * 1e6:.0f}, alike {alike * 1e6:.0f}; beyond them "
                  f"{(wall - back_to_back) * 1e6 / spmv:.2f} ({(wall - alike) * 1e6 / spmv:.2f}) SpMVs", flush=True)
            previous = 0.0
            for key, values in sorted(marks.items()):
                host_us = statistics.median(h for h, _ in values)
                gpu_us = statistics.median(g for _, g in values)
                print(f"   {key[3:]:20s} ends at {host_us:6.0f} us (step {host_us - previous:5.0f}); GPU done with "
                      f"its work at {gpu_us:6.0f} (lag {gpu_us - host_us:5.0f})", flush=True)
                previous = host_us


if __name__ == "__main__":
    main()
