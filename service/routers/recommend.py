"""POST /recommend: a kernel config for a matrix given by its feature vector or as an uploaded file."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError

from db.store import Store
from service.bodies import body_kind, read_json
from service.deps import ServiceState, get_jobs, require_token, service_state, state_parser, thread_store
from service.models import (
    FeatureVector,
    RecommendationPublic,
    RecommendQuery,
    error_responses,
    feature_vector_problems,
    ratio,
)
from service.parsing import ParseTask
from service.uploads import FILE_FIELD, receive_upload
from tuner.execute.choice import Choice, choose

router = APIRouter(prefix="/recommend", tags=["recommend"])

_OPENAPI = {
    "parameters": [  # as FastAPI lists query parameters; read_query() validates them
        {"name": name, "in": "query", "required": False, "schema": schema, "description": schema["description"]}
        for name, schema in RecommendQuery.model_json_schema()["properties"].items()
    ],
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
_ERRORS = error_responses({
    400: "malformed JSON or multipart body",
    408: "the body did not arrive within body_timeout_s",
    401: "race=true without the right token",
    403: "race=true on a server without a token",
    413: "body or matrix larger than the server accepts, or parsed for longer than parse_timeout_s",
    415: "neither JSON nor multipart",
    422: "invalid feature vector, unreadable matrix file (a line too long among them), unknown device, or race=true "
         "without an uploaded file or for another device",
    503: "too many uploads waiting to be parsed (Retry-After says when to try again)",
})


def read_query(request: Request) -> RecommendQuery:
    """The query, validated by hand: FastAPI's query parameters cost about 20 µs a request, this 2 µs.
    Errors are FastAPI's (a 422 listing ``["query", name]``)."""
    try:
        return RecommendQuery.model_validate(request.query_params)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("query", *e["loc"])} for e in exc.errors()]) from None


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
    """Ask :func:`tuner.execute.choice.choose` (the one place that decides a config) and add what is known of it.

    ``features`` go to the selector model behind ``choose`` (used when the vector is complete, the
    store holds a model for the device and dtype, and nothing is tuned for the fingerprint).
    """
    stored = None
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
    # Only a matrix the store holds can have a tuned config (``best`` rows reference ``matrices``): for any
    # other, choose() need not look one up.
    choice = choose(fingerprint or "", store=store, device=device, dtype=dtype, features=features,
                    use_tuned=stored is not None)
    return answer_of(choice, fingerprint=fingerprint, features=features, device=device, device_kind=device_kind,
                     dtype=dtype)


def answer_of(choice: Choice, *, fingerprint: str | None, features: dict[str, float], device: str,
              device_kind: str, dtype: str, race: list[str] | None = None) -> RecommendationPublic:
    """The public answer for a choice."""
    return RecommendationPublic(
        kernel=choice.kernel,
        params=choice.params,
        source=choice.source,
        expected_gflops=choice.expected_gflops,
        confidence=choice.confidence,
        ratio_to_cusparse=ratio(choice.cusparse_time_s, choice.time_s),
        device=device,
        device_kind=device_kind,
        dtype=dtype,
        fingerprint=fingerprint,
        rows=int(features["rows"]),
        cols=int(features["cols"]),
        nnz=int(features["nnz"]),
        race=race,
    )


@router.post("", response_model=RecommendationPublic, responses=_ERRORS, openapi_extra=_OPENAPI)
async def recommend(request: Request) -> Response:
    """The kernel and parameters to use for a matrix, where they come from and how fast they are.

    Body: a feature vector as JSON (``rows``, ``cols``, ``nnz`` required, the
    other names of ``tuner.matrix.features.FEATURE_NAMES`` optional, plus an optional
    ``fingerprint``), or a Matrix Market file (``.mtx`` or ``.mtx.gz``) in the
    multipart field ``file``, whose fingerprint and features are computed here. Query: ``device`` (default:
    the server's) and ``dtype`` (``float64`` or ``float32``). With ``race=true`` (an uploaded file, the
    token): the selector's shortlist and cuSPARSE are raced on the server's device, the fastest is the answer
    (``source`` 'raced'), and every lap is stored, so the next request for the matrix answers from the store.
    """
    # The hot path of the service: the query, state and store without FastAPI's parameters and Depends, and
    # the answer (validated when it is built) serialized once, straight to JSON, not validated again.
    query = read_query(request)
    dtype = query.dtype
    state = service_state(request)
    store = thread_store(state)
    settings = state.settings
    device_id = query.device or state.device.id
    kind = device_kind(store, state, device_id)
    if query.race:
        return await _race(request, state, query, kind)
    if body_kind(request) == "json":
        vector = await read_json(request, FeatureVector, limit=settings.max_json_bytes, explain=feature_vector_problems)
        fp, features = vector.fingerprint, vector.features()
    else:
        parser = state_parser(state)
        async with receive_upload(request, settings) as upload:
            parsed = await parser.parse(ParseTask.of(upload, settings, dtype=dtype))
        fp, features = parsed.fingerprint, parsed.features
    answer = recommendation(store, fingerprint=fp, features=features, device=device_id, device_kind=kind, dtype=dtype)
    return Response(answer.model_dump_json(), media_type="application/json")


async def _race(request: Request, state: ServiceState, query: RecommendQuery, kind: str) -> Response:
    """``race=true``: the token, an uploaded file kept like a tuning job's, and the race on the server's device."""
    scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
    await require_token(request, None if scheme.lower() != "bearer" or not token else _Bearer(token))
    device = query.device or state.device.id
    if device != state.device.id:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"race=true runs on this server's device ({state.device.id!r}), not {device!r}")
    if body_kind(request) == "json":
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"race=true needs the matrix: upload the .mtx file in the multipart field '{FILE_FIELD}'")
    jobs = await get_jobs(request)
    async with receive_upload(request, state.settings) as upload:
        parsed = await state_parser(state).parse(ParseTask.of(upload, state.settings, dtype=query.dtype,
                                                              keep_dir=jobs.matrices_dir))
    choice, race = await run_in_threadpool(jobs.race, parsed.fingerprint, dtype=query.dtype)
    answer = answer_of(choice, fingerprint=parsed.fingerprint, features=parsed.features, device=device,
                       device_kind=kind, dtype=query.dtype, race=race.table() if race is not None else None)
    return Response(answer.model_dump_json(), media_type="application/json")


class _Bearer:
    """The credentials :func:`service.deps.require_token` checks, read from the header by hand (this route
    takes no FastAPI dependencies: it is the service's hot path)."""

    def __init__(self, token: str) -> None:
        self.credentials = token
