"""Request bodies that are either JSON or a multipart upload, read under size limits."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from fastapi import HTTPException, Request, status
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from service.uploads import FILE_FIELD

M = TypeVar("M", bound=BaseModel)


def body_kind(request: Request) -> Literal["json", "multipart"]:
    """'json' or 'multipart' from the Content-Type header; anything else is 415."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return "json"
    if media == "multipart/form-data":
        return "multipart"
    raise HTTPException(
        status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
        f"unsupported Content-Type {media or '(none)'!r}: send application/json, or multipart/form-data "
        f"with the Matrix Market file in field '{FILE_FIELD}'",
    )


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """loc, msg and type of each error (the input is not echoed back)."""
    return [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]


class BodyValidationError(HTTPException):
    """A 422 whose JSON body also lists the individual errors."""

    def __init__(self, detail: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)
        self.errors = errors


async def read_json(request: Request, model: type[M], *, limit: int, explain: Any = None) -> M:
    """The body validated as ``model``: 413 past ``limit`` bytes, 400 if not JSON, 422 if invalid."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"the JSON body is larger than {limit} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"the JSON body is larger than {limit} bytes")
    except ClientDisconnect:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "the client disconnected before the body ended") from None
    try:
        return model.model_validate_json(bytes(body))
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST, f"malformed JSON: {exc.errors()[0]['msg']}"
            ) from None
        detail = explain(exc) if explain else f"invalid {model.__name__}: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise BodyValidationError(detail, validation_errors(exc)) from None
