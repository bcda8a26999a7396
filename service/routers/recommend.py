"""POST /recommend: a kernel config for a matrix given by its feature vector or as an uploaded file."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, HTTPException, Query, Request, status

from db.store import Store
from service.bodies import body_kind, read_json
from service.deps import ServiceState, StateDep, StoreDep
from service.models import Dtype, ErrorPublic, FeatureVector, RecommendationPublic, feature_vector_problems, ratio
from service.uploads import FILE_FIELD, read_upload, receive_upload
from tuner.executor import choose

router = APIRouter(prefix="/recommend", tags=["recommend"])

_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": FeatureVector.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {FILE_FIELD: {"type": "string", "format": "binary"}},
                    "required": [FILE_FIELD],
                }
            },
        },
    }
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorPublic, "description": what}
    for code, what in {
        400: "malformed JSON or multipart body",
        413: "body or matrix larger than the server accepts",
        415: "neither JSON nor multipart",
        422: "invalid feature vector, unreadable matrix file or unknown device",
    }.items()
}


def device_kind(store: Store, state: ServiceState, device: str) -> str:
    """'gpu' or 'cpu-reference' for the server's device or one the store knows; 422 otherwise."""
    if device == state.device.id:
        return state.device.kind
    row = store.device(device)
    if row is None:
        known = sorted({state.device.id, *(d["id"] for d in store.devices())})
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"unknown device {device!r}: known devices are {', '.join(map(repr, known))}",
        )
    return row["kind"]


def recommendation(
    store: Store,
    *,
    fingerprint: str | None,
    features: dict[str, float],
    device: str,
    device_kind: str,
    dtype: str,
) -> RecommendationPublic:
    """Ask :func:`tuner.executor.choose` (the one place that decides a config) and add what is known of it.

    ``features`` go to the selector model behind ``choose`` (used when the vector is complete, the
    store holds a model for the device and dtype, and nothing is tuned for the fingerprint).
    """
    if fingerprint:
        known = store.db.execute("select rows, cols, nnz from matrices where fingerprint = ?", [fingerprint])
        stored = known.fetchone()
        given = tuple(int(features[k]) for k in ("rows", "cols", "nnz"))
        if stored is not None and given != tuple(stored):
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                f"fingerprint {fingerprint!r} belongs to a {stored[0]} x {stored[1]} matrix with {stored[2]} "
                f"nonzeros, but the feature vector says {given[0]} x {given[1]} with {given[2]}",
            )
    choice = choose(fingerprint or "", store=store, device=device, dtype=dtype, features=features)
    measured = None
    if choice.source == "tuned":  # what choose() does not say: how the tuned config compared with cuSPARSE
        measured = store.db.execute(
            "select cusparse_time_s, time_s from best where fingerprint = ? and device = ? and dtype = ?",
            [fingerprint, device, dtype],
        ).fetchone()
    return RecommendationPublic(
        kernel=choice.kernel,
        params=choice.params,
        source=choice.source,
        expected_gflops=choice.expected_gflops,
        ratio_to_cusparse=ratio(*measured) if measured else None,
        device=device,
        device_kind=device_kind,
        dtype=dtype,
        fingerprint=fingerprint,
        rows=int(features["rows"]),
        cols=int(features["cols"]),
        nnz=int(features["nnz"]),
    )


@router.post("", response_model=RecommendationPublic, responses=_ERRORS, openapi_extra=_BODY)
async def recommend(
    request: Request,
    state: StateDep,
    store: StoreDep,
    device: Annotated[
        str | None, Query(min_length=1, max_length=200, description="device id (default: the server's)")
    ] = None,
    dtype: Annotated[Dtype, Query(description="value type")] = "float64",
) -> RecommendationPublic:
    """The kernel and parameters to use for a matrix, where they come from and how fast they are.

    Body: a feature vector as JSON (``rows``, ``cols``, ``nnz`` required, the
    other names of ``tuner.features.FEATURE_NAMES`` optional, plus an optional
    ``fingerprint``), or a Matrix Market file (``.mtx`` or ``.mtx.gz``) in the
    multipart field ``file``, whose fingerprint and features are computed here.
    """
    settings = state.settings
    device_id = device or state.device.id
    kind = device_kind(store, state, device_id)
    if body_kind(request) == "json":
        vector = await read_json(request, FeatureVector, limit=settings.max_json_bytes, explain=feature_vector_problems)
        fp, features = vector.fingerprint, vector.features()
    else:
        async with receive_upload(
            request, spool_dir=settings.service_dir / "spool", max_bytes=settings.max_upload_bytes
        ) as upload:
            parsed = await anyio.to_thread.run_sync(
                lambda: read_upload(
                    upload.path, display_name=upload.filename, dtype=dtype, max_size=settings.max_matrix_size
                ),
                limiter=state.parse_limiter,
            )
        fp, features = parsed.fingerprint, parsed.features
    return recommendation(store, fingerprint=fp, features=features, device=device_id, device_kind=kind, dtype=dtype)
