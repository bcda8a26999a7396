"""The FastAPI app: ``create_app(settings)`` builds it; uvicorn serves it (``tuner serve``).

The lifespan opens the store on the event loop's thread, forks the upload
parse processes, and starts the tuning worker (which takes over the jobs of
server processes that are gone); the exception handlers make every error a
JSON body with a ``detail`` that says what is wrong: 4xx for bad input, 503
when the store cannot be read, and 500 only for a bug.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.errors import StoreError, TunerError
from kernels._cuda import gpu_available
from service.bodies import BodyValidationError
from service.deps import ServiceState, ThreadStores
from service.jobs import JobQueue
from service.metrics import Metrics, MetricsMiddleware
from service.parsing import Parser
from service.routers import health, jobs, kernels, matrices, recommend, tune
from service.settings import Settings
from service.uploads import MatrixTooLargeError
from tuner.measure.backend import get_backend
from tuner.search.storage import default_storage

log = logging.getLogger("service")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServiceState = app.state.service
    settings = state.settings
    state.stores = ThreadStores(settings.db_path)
    state.stores.get()  # open the loop thread's Store now: a store that cannot be opened stops the start
    state.parser = Parser(slots=settings.parse_slots, queue=settings.max_waiting_parses,
                          timeout_s=settings.parse_timeout_s)
    await anyio.to_thread.run_sync(state.parser.start)
    state.jobs = JobQueue(
        backend=app.state.backend,
        db_path=settings.db_path,
        storage=settings.storage or default_storage(settings.db_path),
        jobs_dir=settings.service_dir / "jobs",
        matrices_dir=settings.service_dir / "matrices",
        max_queued=settings.max_queued_jobs,
        max_restarts=settings.max_job_restarts,
    )
    state.jobs.start()
    try:
        yield
    finally:
        await anyio.to_thread.run_sync(state.jobs.stop)
        await anyio.to_thread.run_sync(state.parser.stop)
        state.stores.close()
        state.stores = None


def _error(status_code: int, detail: str, **extra: object) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status_code)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    extra = {"errors": exc.errors} if isinstance(exc, BodyValidationError) else {}
    response = _error(exc.status_code, str(exc.detail), **extra)
    response.headers.update(exc.headers or {})
    return response


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
    detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
    return _error(status.HTTP_422_UNPROCESSABLE_CONTENT, detail or "invalid request", errors=errors)


async def _store_error(request: Request, exc: StoreError) -> JSONResponse:
    return _error(status.HTTP_503_SERVICE_UNAVAILABLE, f"the store cannot be read: {exc}")


async def _tuner_error(request: Request, exc: TunerError) -> JSONResponse:
    return _error(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc))


async def _matrix_too_large(request: Request, exc: MatrixTooLargeError) -> JSONResponse:
    return _error(status.HTTP_413_CONTENT_TOO_LARGE, str(exc))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error(status.HTTP_500_INTERNAL_SERVER_ERROR, "internal error (a bug: see the server's log)")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app for ``settings`` (default: from ``SPMV_TUNER_*`` environment variables).

    Raises NoDeviceError when ``device='gpu'`` and there is no usable GPU.
    """
    settings = settings or Settings()
    backend = get_backend(settings.device)
    app = FastAPI(
        title="spmv-tuner",
        summary="SpMV kernel recommendations and tuning jobs for NVIDIA GPUs",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.backend = backend
    app.state.service = ServiceState(
        settings=settings,
        device=backend.info,
        gpu_present=backend.info.kind == "gpu" or gpu_available(),
        metrics=Metrics(),
    )
    for router in (recommend.router, kernels.router, matrices.router, tune.router, jobs.router, health.router):
        app.include_router(router)
    app.add_middleware(MetricsMiddleware, metrics=app.state.service.metrics)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StoreError, _store_error)
    app.add_exception_handler(TunerError, _tuner_error)
    app.add_exception_handler(MatrixTooLargeError, _matrix_too_large)
    app.add_exception_handler(Exception, _internal_error)
    return app
