"""The REST service: the FastAPI app (``create_app``) served by uvicorn (``tuner serve``).

Imported lazily, so that ``tuner`` commands that register ``service.cli.serve``
do not pay for importing FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.app import create_app
    from service.settings import Settings

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from service.app import create_app

        return create_app
    if name == "Settings":
        from service.settings import Settings

        return Settings
    raise AttributeError(f"module 'service' has no attribute {name!r}")
