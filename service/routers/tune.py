"""POST /tune: start a tuning job on the server's device (needs the token)."""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response, status
from pydantic import ValidationError

from kernels import REGISTRY
from service.bodies import BodyValidationError, body_kind, read_json, validation_errors
from service.deps import JobsDep, StateDep, StoreDep, TokenDep, state_parser
from service.jobs import QueueFullError, ShuttingDownError
from service.models import JobPublic, TuneCreate, TuneOptions, error_responses
from service.parsing import ParseTask
from service.settings import Settings
from service.uploads import FILE_FIELD, receive_upload
from tuner.matrix.io import matrix_name

router = APIRouter(prefix="/tune", tags=["jobs"], dependencies=[TokenDep])

_HEX = re.compile(r"[0-9a-f]{6,128}")
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": TuneCreate.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        FILE_FIELD: {"type": "string", "format": "binary"},
                        "trials": {"type": "integer", "minimum": 1},
                        "dtype": {"type": "string", "enum": ["float64", "float32"]},
                        "kernels": {"type": "string", "description": "comma-separated families"},
                        "name": {"type": "string"},
                    },
                    "required": [FILE_FIELD],
                }
            },
        },
    }
}
_ERRORS = error_responses({
    400: "malformed JSON or multipart body",
    401: "missing or wrong token",
    403: "no token configured on the server",
    404: "unknown fingerprint",
    409: "the store knows the fingerprint but the server holds no copy of the matrix",
    408: "the body did not arrive within body_timeout_s",
    413: "body or matrix larger than the server accepts, or parsed for longer than parse_timeout_s",
    415: "neither JSON nor multipart",
    422: "invalid options or unreadable matrix file (a line too long among them)",
    429: "too many jobs waiting",
    503: "too many uploads waiting to be parsed (Retry-After), or the server is stopping",
})


def _queue_full(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, detail, headers={"Retry-After": "60"})


def _options_from_form(fields: dict[str, str]) -> TuneOptions:
    data: dict[str, Any] = dict(fields)
    if "kernels" in data:
        data["kernels"] = [k.strip() for k in data["kernels"].split(",") if k.strip()] or None
    try:
        return TuneOptions.model_validate(data)
    except ValidationError as exc:
        detail = "invalid tuning options: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'form'}: {e['msg']}" for e in exc.errors()
        )
        raise BodyValidationError(detail, validation_errors(exc)) from None


def _check(options: TuneOptions, settings: Settings) -> tuple[int, list[str] | None]:
    """The trial count and the families, or 422."""
    trials = options.trials or settings.default_trials
    if trials > settings.max_trials:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"trials={trials} is more than this server allows ({settings.max_trials})",
        )
    if options.kernels and (unknown := sorted(set(options.kernels) - set(REGISTRY))):
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"unknown kernel(s) {', '.join(unknown)}; known kernels: {', '.join(sorted(REGISTRY))}",
        )
    return trials, sorted(set(options.kernels)) if options.kernels else None


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=JobPublic, responses=_ERRORS,
             openapi_extra=_BODY)
async def create_tune_job(
    request: Request, response: Response, state: StateDep, store: StoreDep, jobs: JobsDep
) -> dict[str, Any]:
    """Queue a tuning job on the server's device; poll ``GET /jobs/{id}`` (the Location header) for progress.

    Body: a Matrix Market file in the multipart field ``file`` (with optional
    fields ``trials``, ``dtype``, ``kernels``, ``name``), or JSON
    ``{"fingerprint": ..., "trials": ...}`` for a matrix this server was sent before.
    The matrix is read and checked before the job is accepted.
    """
    settings = state.settings
    if jobs.full:  # before reading anything
        raise _queue_full(f"{jobs.max_queued} jobs are already waiting; try again later")
    if body_kind(request) == "json":
        options: TuneOptions = await read_json(request, TuneCreate, limit=settings.max_json_bytes)
        fingerprint = options.fingerprint  # type: ignore[attr-defined]
        trials, kernels = _check(options, settings)
        stored = store.matrix(fingerprint)
        if not _HEX.fullmatch(fingerprint) or not jobs.matrix_path(fingerprint).exists():
            if stored is None:
                raise HTTPException(status.HTTP_404_NOT_FOUND, f"no matrix with fingerprint {fingerprint!r} is known")
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"the store knows matrix {fingerprint!r} but this server holds no copy of it: "
                f"upload the .mtx file in the multipart field '{FILE_FIELD}'",
            )
        name = options.name or (stored or {}).get("name") or ""
    else:
        parser = state_parser(state)
        async with receive_upload(request, settings) as upload:
            options = _options_from_form(upload.fields)
            trials, kernels = _check(options, settings)
            parsed = await parser.parse(ParseTask.of(upload, settings, dtype=options.dtype,
                                                     keep_dir=jobs.matrices_dir))
        fingerprint = parsed.fingerprint
        name = options.name or matrix_name(upload.filename)
    try:
        job = jobs.submit(fingerprint=fingerprint, name=name, dtype=options.dtype, trials=trials, kernels=kernels)
    except QueueFullError as exc:
        raise _queue_full(str(exc)) from None
    except ShuttingDownError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from None
    response.headers["Location"] = f"/jobs/{job['id']}"
    return job
