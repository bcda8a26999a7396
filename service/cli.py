"""``tuner serve``: the REST service under uvicorn (registered in tuner.cli with ``app.command()(serve)``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

_ENV = "SPMV_TUNER_"
_MiB = 1 << 20


def serve(
    host: Annotated[str, typer.Option(help="address to listen on (127.0.0.1: this machine only)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port")] = 8000,
    db: Annotated[Path | None, typer.Option("--db", help="SQLite store (default: $SPMV_TUNER_DB or per-user)")] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="worker processes; connections are spread over them by the kernel (SO_REUSEPORT)")
    ] = 1,
    device: Annotated[
        str, typer.Option(help="where tuning jobs run: gpu, or cpu-reference (CPU references; not GPU figures)")
    ] = "gpu",
    token: Annotated[
        str | None,
        typer.Option(
            envvar="SPMV_TUNER_TOKEN",
            show_default=False,
            help="bearer token of POST /tune (prefer the env var SPMV_TUNER_TOKEN: a command line is visible "
            "to other users); without one, POST /tune answers 403",
        ),
    ] = None,
    storage: Annotated[
        str | None, typer.Option(help="optuna storage: URL, journal:PATH or PATH.log (default: journal beside --db)")
    ] = None,
    max_upload_mb: Annotated[int, typer.Option(min=1, help="largest upload accepted, in MiB")] = 256,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level")] = "info",
    access_log: Annotated[bool, typer.Option(help="log every request (one line each: costs CPU under load)")] = True,
) -> None:
    """Serve recommendations and tuning jobs over HTTP (FastAPI under uvicorn); docs at /docs."""
    from rich.console import Console
    from rich.markup import escape

    from common.errors import TunerError
    from db.store import Store
    from service import workers as serving
    from service.settings import Settings
    from tuner.measure.backend import get_backend

    options = {"db": db, "device": device, "token": token, "storage": storage,
               "max_upload_bytes": max_upload_mb * _MiB, "workers": workers}
    given = {key: value for key, value in options.items() if value is not None}
    try:
        get_backend(device)  # an unknown device, or no GPU: one line now rather than a traceback per worker
        settings = Settings(**given)
        Store(settings.db_path).close()  # create or migrate the store once, before the workers start
    except (TunerError, ValueError) as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    # Every worker process builds its Settings from the environment (uvicorn needs an import string).
    os.environ.update({_ENV + key.upper(): str(value) for key, value in given.items()})
    serving.run("service.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, access_log=access_log, proxy_headers=False, server_header=False)
