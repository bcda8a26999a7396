"""The service's settings: command-line options of ``tuner serve`` or ``SPMV_TUNER_*`` environment variables.

``tuner serve`` writes its options into the environment, so every uvicorn
worker process builds the same :class:`Settings` (``SPMV_TUNER_DB``,
``SPMV_TUNER_DEVICE``, ``SPMV_TUNER_TOKEN``, ``SPMV_TUNER_MAX_UPLOAD_BYTES``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from db.store import default_path

MiB = 1 << 20


class Settings(BaseSettings):
    """Everything the app needs to start; defaults suit one user on one machine."""

    model_config = SettingsConfigDict(env_prefix="SPMV_TUNER_", extra="ignore")

    db: Path | None = Field(None, description="SQLite store (default: $SPMV_TUNER_DB, else the per-user store)")
    device: Literal["gpu", "cpu-reference"] = Field("gpu", description="where tuning jobs run")
    token: SecretStr | None = Field(None, description="bearer token of the state-changing endpoints")
    storage: str | None = Field(None, description="optuna storage (default: the journal file beside the store)")
    data_dir: Path | None = Field(
        None, description="jobs, upload spool and kept matrices (default: 'service' beside the store)"
    )
    max_upload_bytes: int = Field(256 * MiB, gt=0, description="largest multipart body accepted")
    max_json_bytes: int = Field(64 * 1024, gt=0, description="largest JSON body accepted")
    max_matrix_size: int = Field(
        50_000_000, gt=0, description="largest row count, column count or nnz an uploaded matrix may declare"
    )
    parse_concurrency: int = Field(2, gt=0, description="uploads parsed at once (each in a worker thread)")
    max_queued_jobs: int = Field(16, gt=0, description="tuning jobs waiting at most; more get 429")
    max_trials: int = Field(1000, gt=0, description="largest trial count one job may ask for")
    default_trials: int = Field(40, gt=0, description="trials of a job that does not say")

    @field_validator("token")
    @classmethod
    def _empty_token_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value() else None

    @property
    def db_path(self) -> Path:
        return self.db if self.db is not None else default_path()

    @property
    def service_dir(self) -> Path:
        return self.data_dir if self.data_dir is not None else self.db_path.parent / "service"
