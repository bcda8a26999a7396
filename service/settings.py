"""The service's settings: command-line options of ``tuner serve`` or ``SPMV_TUNER_*`` environment variables.

``tuner serve`` writes its options into the environment, so every uvicorn
worker process builds the same :class:`Settings` (``SPMV_TUNER_DB``,
``SPMV_TUNER_DEVICE``, ``SPMV_TUNER_TOKEN``, ``SPMV_TUNER_MAX_UPLOAD_BYTES``, ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from db.store import default_path
from tuner.matrix.bounds import ReadLimits

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
    max_line_bytes: int = Field(4096, gt=0, description="longest line an uploaded file may hold (banner included)")
    max_header_bytes: int = Field(MiB, gt=0, description="longest header (banner, comments, size line) of an upload")
    max_bytes_per_entry: int = Field(
        64, gt=0, description="bytes an upload may hold, once decompressed, per entry its size line announces "
        "(at most max_matrix_size entries), besides its header"
    )
    body_timeout_s: float = Field(120.0, gt=0, description="time a client has to send a request's body; then 408")
    parse_timeout_s: float = Field(60.0, gt=0, description="time an upload's parse may take; then 413")
    workers: int = Field(1, gt=0, description="worker processes of the server (tuner serve sets it)")
    parse_concurrency: int | None = Field(
        None, gt=0, description="uploads parsed at once per worker process (default: its share of the CPUs)"
    )
    max_waiting_parses: int = Field(256, ge=0, description="uploads waiting for a parse per worker; more get 503")
    max_queued_jobs: int = Field(16, gt=0, description="tuning jobs waiting at most; more get 429")
    max_job_restarts: int = Field(
        2, ge=0, description="times a job is resumed after its server process died while it ran; then it fails"
    )
    max_trials: int = Field(1000, gt=0, description="largest trial count one job may ask for")
    default_trials: int = Field(40, gt=0, description="trials of a job that does not say")

    @field_validator("token")
    @classmethod
    def _empty_token_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value() else None

    @property
    def parse_slots(self) -> int:
        """Uploads parsed at once in one worker process."""
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return self.parse_concurrency or max(1, cpus // self.workers)

    @property
    def read_limits(self) -> ReadLimits:
        """The bounds an upload is read under (see tuner.matrix.bounds.ReadLimits)."""
        return ReadLimits(line_bytes=self.max_line_bytes, header_bytes=self.max_header_bytes,
                          entry_bytes=self.max_bytes_per_entry, max_entries=self.max_matrix_size)

    @property
    def db_path(self) -> Path:
        return self.db if self.db is not None else default_path()

    @property
    def service_dir(self) -> Path:
        return self.data_dir if self.data_dir is not None else self.db_path.parent / "service"
