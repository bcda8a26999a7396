"""Dependencies as ``Annotated`` aliases: the store, the settings, the jobs, the token check.

How the store is shared: an SQLite connection belongs to the thread that
opened it, so there is one :class:`~db.store.Store` per thread that asks
(:class:`ThreadStores`). The lifespan opens the event loop's, and every
handler and dependency here is ``async def``, so requests read the store on
the loop's thread: a lookup there takes tens of microseconds, less than the
hop to the threadpool that a plain ``def`` handler pays (and far less than
opening a Store per request). Slow work that needs no store (parsing an
upload) goes elsewhere; the tuning worker thread has its own Store;
any other thread that asks gets its own. SQLite's WAL mode lets these
connections read while a job writes. Uploads are parsed in child processes
(:class:`~service.parsing.Parser`).
"""

from __future__ import annotations

import hmac
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from db.store import Store
from service.jobs import JobQueue
from service.metrics import Metrics
from service.parsing import Parser
from service.settings import Settings
from tuner.measure.backend import DeviceInfo


class ThreadStores:
    """One Store per thread, opened on first use; ``close()`` closes the calling thread's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()

    def get(self) -> Store:
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = Store(self.path)
        return store

    def close(self) -> None:
        store = getattr(self._local, "store", None)
        if store is not None:
            self._local.store = None
            store.close()


@dataclass
class ServiceState:
    """What the lifespan opens and the handlers share (``app.state.service``)."""

    settings: Settings
    device: DeviceInfo
    gpu_present: bool
    metrics: Metrics
    stores: ThreadStores | None = None
    jobs: JobQueue | None = None
    parser: Parser | None = None


def service_state(request: Request) -> ServiceState:
    """The app's shared state. A plain function as well as :data:`StateDep`: ``POST /recommend``, the
    hot path, calls it directly, since every ``Depends`` costs FastAPI about 10 µs per request."""
    return request.app.state.service


def thread_store(state: ServiceState) -> Store:
    """The calling thread's Store (the event loop's, for ``async def`` handlers); 503 before the lifespan."""
    if state.stores is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the store is not open (the app is not started)")
    return state.stores.get()


def state_parser(state: ServiceState) -> Parser:
    """The worker's upload parser; 503 before the lifespan."""
    if state.parser is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "uploads cannot be parsed (the app is not started)")
    return state.parser


async def get_state(request: Request) -> ServiceState:
    """(Every dependency here is ``async def``: a plain ``def`` one would run in the threadpool.)"""
    return service_state(request)


StateDep = Annotated[ServiceState, Depends(get_state)]


async def get_store(request: Request) -> Store:
    return thread_store(service_state(request))


StoreDep = Annotated[Store, Depends(get_store)]


async def get_settings(request: Request) -> Settings:
    return service_state(request).settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_jobs(request: Request) -> JobQueue:
    jobs = service_state(request).jobs
    if jobs is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the job queue is not running")
    return jobs


JobsDep = Annotated[JobQueue, Depends(get_jobs)]

_bearer = HTTPBearer(auto_error=False, description="the token the server was started with (--token)")


async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """The state-changing endpoints need ``Authorization: Bearer <token>``, compared in constant time."""
    expected = service_state(request).settings.token
    if expected is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "no token is configured on this server, so it accepts no tuning jobs: "
            "start it with --token or SPMV_TUNER_TOKEN",
        )
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "this endpoint needs 'Authorization: Bearer <token>'", headers=challenge
        )
    if not hmac.compare_digest(credentials.credentials.encode(), expected.get_secret_value().encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "wrong token", headers=challenge)


TokenDep = Depends(require_token)
