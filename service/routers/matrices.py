"""GET /matrices, /matrices/{fingerprint}, /matrices/{fingerprint}/trials: what the store knows, paginated."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, status

from db.store import Store
from service.deps import StoreDep
from service.models import (
    FINGERPRINT_MAX,
    Dtype,
    MatricesPublic,
    MatrixDetailPublic,
    TrialsPublic,
    error_responses,
    ratio,
)

router = APIRouter(prefix="/matrices", tags=["matrices"])

Skip = Annotated[int, Query(ge=0, le=2**62, description="rows to skip")]
Limit = Annotated[int, Query(ge=1, le=1000, description="rows to return")]
Fingerprint = Annotated[str, Path(min_length=1, max_length=FINGERPRINT_MAX, description="a stored fingerprint")]
_NOT_FOUND = error_responses({404: "unknown fingerprint"})


def _matrix_or_404(store: Store, fingerprint: str) -> dict[str, Any]:
    row = store.matrix(fingerprint)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no matrix with fingerprint {fingerprint!r} is stored")
    return row


@router.get("", response_model=MatricesPublic)
async def list_matrices(store: StoreDep, skip: Skip = 0, limit: Limit = 100) -> dict[str, Any]:
    """One page of the stored matrices, oldest first (pages stay stable while matrices are added)."""
    return {"data": store.matrices(limit=limit, offset=skip), "count": store.count_matrices()}


@router.get("/{fingerprint}", response_model=MatrixDetailPublic, responses=_NOT_FOUND)
async def read_matrix(store: StoreDep, fingerprint: Fingerprint) -> dict[str, Any]:
    """A matrix: shape, features, its best config on every device and dtype, and its trial count."""
    row = _matrix_or_404(store, fingerprint)
    best = [
        {**b, "ratio_to_cusparse": ratio(b.get("cusparse_time_s"), b.get("time_s"))} for b in store.bests(fingerprint)
    ]
    count = store.db["trials"].count_where("fingerprint = ?", [fingerprint])
    return {**row, "best": best, "trial_count": count}


@router.get("/{fingerprint}/trials", response_model=TrialsPublic, responses=_NOT_FOUND)
async def list_trials(
    store: StoreDep,
    fingerprint: Fingerprint,
    skip: Skip = 0,
    limit: Limit = 100,
    device: Annotated[str | None, Query(max_length=200)] = None,
    dtype: Annotated[Dtype | None, Query()] = None,
    kernel: Annotated[str | None, Query(max_length=100)] = None,
) -> dict[str, Any]:
    """One page of a matrix's trials in the order they were recorded, optionally filtered."""
    _matrix_or_404(store, fingerprint)
    rows = store.trials(fingerprint, device=device, dtype=dtype, kernel=kernel, limit=limit, offset=skip)
    filters = {"fingerprint": fingerprint, "device": device, "dtype": dtype, "kernel": kernel}
    used = {k: v for k, v in filters.items() if v is not None}
    count = store.db["trials"].count_where(" and ".join(f"{k} = :{k}" for k in used), used)
    return {"data": [{**r, "verified": bool(r["verified"])} for r in rows], "count": count}
