"""GET /health and GET /metrics."""

from __future__ import annotations

import sqlite3
from typing import Any

from fastapi import APIRouter, Response, status
from fastapi.responses import PlainTextResponse

from common.errors import StoreError
from service.deps import StateDep
from service.models import HealthPublic

router = APIRouter(tags=["health"])

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


@router.get("/health", response_model=HealthPublic,
            responses={503: {"model": HealthPublic, "description": "the store cannot be read"}})
async def health(state: StateDep, response: Response) -> dict[str, Any]:
    """Whether the store answers, which device jobs run on (and whether a GPU is present), model, jobs."""
    store: dict[str, Any] = {"reachable": False, "matrices": None}
    model: dict[str, Any] = {"loaded": False, "detail": "the store cannot be read"}
    try:
        if state.stores is None:
            raise StoreError("the store is not open")
        opened = state.stores.get()
        store = {"reachable": True, "matrices": opened.count_matrices()}
        models = list(opened.db["models"].rows_where("device = ?", [state.device.id], select="id, dtype"))
        model = {"loaded": bool(models), "detail": (
            f"selector models for {state.device.id}: " + ", ".join(f"{m['dtype']} (id {m['id']})" for m in models)
            if models else f"no selector trained for {state.device.id} (`tuner train`): answers are tuned or default"
        )}
    except (StoreError, sqlite3.Error) as exc:
        store["error"] = str(exc)
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    counts = state.jobs.counts() if state.jobs else {"queued": 0, "running": 0}
    return {
        "status": "ok" if store["reachable"] else "unavailable",
        "store": store,
        "device": {"id": state.device.id, "kind": state.device.kind, "gpu_present": state.gpu_present},
        "model": model,
        "jobs": {"queued": counts["queued"], "running": counts["running"]},
    }


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {PROMETHEUS_TEXT: {}}, "description": "Prometheus text format"}})
async def metrics(state: StateDep) -> PlainTextResponse:
    """Request counts and latency histograms per route and status, jobs by state, trials run."""
    gauges: list[tuple[str, str, str, dict[str, str], float]] = []
    if state.jobs is not None:
        for job_state, n in state.jobs.counts().items():
            gauges.append(("spmv_jobs", "gauge", "Jobs known to this process, by state.", {"state": job_state}, n))
        c = state.jobs.counters
        gauges += [
            ("spmv_jobs_submitted_total", "counter", "Tuning jobs accepted.", {}, c["submitted"]),
            ("spmv_jobs_finished_total", "counter", "Tuning jobs finished, by outcome.", {"state": "done"}, c["done"]),
            ("spmv_jobs_finished_total", "counter", "Tuning jobs finished, by outcome.", {"state": "failed"},
             c["failed"]),
            ("spmv_trials_total", "counter", "Trials measured by this process's jobs.", {}, c["trials"]),
            ("spmv_jobs_taken_over_total", "counter", "Jobs taken over from server processes that were gone.", {},
             c["taken_over"]),
        ]
    if state.parser is not None:
        for parse_state, n in (("running", state.parser.running), ("waiting", state.parser.waiting)):
            gauges.append(("spmv_parses", "gauge", "Uploads being parsed, and waiting for a parse, in this process.",
                           {"state": parse_state}, n))
    gauges.append(("spmv_gpu_present", "gauge", "1 when a CUDA GPU is usable.", {}, float(state.gpu_present)))
    return PlainTextResponse(state.metrics.render(gauges), media_type=PROMETHEUS_TEXT)
