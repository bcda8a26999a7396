"""GET /jobs, /jobs/{id}: tuning jobs' progress and results (read-only: no token)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, status

from service.deps import JobsDep
from service.models import JobPublic, JobsPublic, error_responses

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("", response_model=JobsPublic)
async def list_jobs(
    jobs: JobsDep,
    skip: Annotated[int, Query(ge=0, le=2**31)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """This server process's recent jobs, newest first."""
    data, count = jobs.recent(skip=skip, limit=limit)
    return {"data": data, "count": count}


@router.get("/{job_id}", response_model=JobPublic,
            responses=error_responses({404: "unknown job"}))
async def read_job(jobs: JobsDep, job_id: Annotated[str, Path(max_length=64)]) -> dict[str, Any]:
    """A job's state (queued, running, done, failed), its progress in trials and, when done, its result."""
    job = jobs.get(job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
    return job
