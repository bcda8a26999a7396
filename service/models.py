"""Request and response models, one group per resource (``...Create`` in, ``...Public`` out)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from tuner.matrix.features import FEATURE_NAMES
from tuner.matrix.io import INDEX_MAX

Dtype = Literal["float64", "float32"]
Source = Literal["tuned", "raced", "predicted", "default"]
ParamValue = int | float | str
REQUIRED_FEATURES = ("rows", "cols", "nnz")
FINGERPRINT_MAX = 128

# -- recommend ------------------------------------------------------------------------------------


def _whole(value: float) -> int:
    if not value.is_integer():
        raise ValueError("must be a whole number")
    return int(value)


# JSON numbers only (no strings, no booleans; strict floats take JSON integers), finite and non-negative.
Feature = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Size = Annotated[
    float,
    Field(strict=True, ge=0, le=INDEX_MAX, allow_inf_nan=False, description="a whole number (32-bit indices)"),
    AfterValidator(_whole),
]


class _FeatureVectorBase(BaseModel):
    """rows, cols and nnz are required; every other name of FEATURE_NAMES is optional; nothing else."""

    model_config = ConfigDict(extra="forbid")

    fingerprint: str | None = Field(
        None,
        min_length=1,
        max_length=FINGERPRINT_MAX,
        description="the matrix's structural fingerprint, when known (a stored one gives its tuned config)",
    )
    rows: Size
    cols: Size
    nnz: Size

    @model_validator(mode="after")
    def _consistent(self) -> _FeatureVectorBase:
        if self.nnz > self.rows * self.cols:
            raise ValueError(f"nnz ({self.nnz}) exceeds rows × cols ({self.rows} × {self.cols})")
        return self

    def features(self) -> dict[str, float]:
        """The features given, by name (floats), without the fingerprint."""
        return {name: float(v) for name in FEATURE_NAMES if (v := getattr(self, name)) is not None}


FeatureVector = create_model(  # type: ignore[call-overload]
    "FeatureVector",
    __base__=_FeatureVectorBase,
    __doc__="A feature vector as tuner.matrix.features.extract_features returns it, optionally with a fingerprint.",
    **{name: (Feature | None, None) for name in FEATURE_NAMES if name not in REQUIRED_FEATURES},
)


def feature_vector_problems(exc: ValidationError) -> str:
    """One sentence saying what is wrong with a feature vector: missing and unknown names first."""
    missing = [str(e["loc"][0]) for e in exc.errors() if e["type"] == "missing" and e["loc"]]
    unknown = [str(e["loc"][0]) for e in exc.errors() if e["type"] == "extra_forbidden" and e["loc"]]
    others = [e for e in exc.errors() if e["type"] not in ("missing", "extra_forbidden")]
    parts = []
    if missing:
        parts.append(f"missing required feature(s): {', '.join(missing)}")
    if unknown:
        parts.append(
            f"unknown feature(s): {', '.join(unknown)} (known: fingerprint, {', '.join(FEATURE_NAMES)})"
        )
    for e in others:
        where = ".".join(str(p) for p in e["loc"]) or "body"
        parts.append(f"{where}: {e['msg']}")
    return "invalid feature vector: " + "; ".join(parts)


class RecommendQuery(BaseModel):
    """The query of ``POST /recommend`` (unknown names are ignored, as FastAPI ignores them)."""

    device: str | None = Field(None, min_length=1, max_length=200, description="device id (default: the server's)")
    dtype: Dtype = Field("float64", description="value type")
    race: bool = Field(False, description="race the selector's shortlist and cuSPARSE on the server's GPU "
                                          "(an uploaded file and the token needed; the result is stored)")


class RecommendationPublic(BaseModel):
    kernel: str = Field(description="the kernel family to run")
    params: dict[str, ParamValue] = Field(description="its parameters")
    source: Source = Field(description="'tuned' or 'raced' (measured for this fingerprint by tuning or by a race), "
                                       "'predicted' (the selector, unmeasured), 'default' (cuSPARSE)")
    expected_gflops: float | None = Field(description="GFLOP/s measured (tuned) or predicted; null when unknown")
    confidence: float | None = Field(None, ge=0, le=1, description="for a predicted config: the share of the "
                                     "selector's trees that rank it first; null otherwise")
    ratio_to_cusparse: float | None = Field(description="cuSPARSE time / this config's time, when measured")
    device: str = Field(description="the device the answer applies to")
    device_kind: str = Field(description="'gpu', or 'cpu-reference' (CPU references: not GPU figures)")
    dtype: Dtype
    fingerprint: str | None = Field(description="the matrix's fingerprint (computed for an upload)")
    rows: int
    cols: int
    nnz: int
    race: list[str] | None = Field(None, description="the race run for this answer, a line a config, fastest "
                                                     "first (* marks the winner); null when none ran")


# -- kernels --------------------------------------------------------------------------------------


class KernelParamPublic(BaseModel):
    name: str
    values: list[ParamValue]
    default: ParamValue
    doc: str
    when: dict[str, list[ParamValue]] = Field(description="active only when these params take these values")


class KernelPublic(BaseModel):
    name: str
    summary: str
    source: str
    params: list[KernelParamPublic]


class KernelsPublic(BaseModel):
    data: list[KernelPublic]
    count: int


# -- matrices and trials --------------------------------------------------------------------------


class MatrixPublic(BaseModel):
    fingerprint: str
    name: str
    rows: int
    cols: int
    nnz: int
    created_at: str


class MatricesPublic(BaseModel):
    data: list[MatrixPublic]
    count: int = Field(description="matrices in the store (all pages)")


class BestPublic(BaseModel):
    device: str
    dtype: str
    kernel: str
    params: dict[str, ParamValue]
    time_s: float
    gflops: float | None
    gbps: float | None
    trial_id: int
    cusparse_time_s: float | None
    ratio_to_cusparse: float | None
    updated_at: str


class MatrixDetailPublic(MatrixPublic):
    features: dict[str, float]
    best: list[BestPublic]
    trial_count: int


class TrialPublic(BaseModel):
    id: int
    device: str
    dtype: str
    kernel: str
    params: dict[str, ParamValue]
    study: str | None
    trial_number: int | None
    state: str
    time_s: float | None
    time_p10_s: float | None
    time_p90_s: float | None
    prepare_s: float | None
    gflops: float | None
    gbps: float | None
    verified: bool
    rel_error: float | None
    error_kind: str | None
    error: str | None
    created_at: str
    trial_uid: str | None = Field(None, description="the optuna trial's unique id, when the tuner gave one")


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int = Field(description="trials matching the filters (all pages)")


def ratio(cusparse_time_s: float | None, time_s: float | None) -> float | None:
    """cuSPARSE's time over a config's time, or None when either is unknown."""
    if not cusparse_time_s or not time_s or not math.isfinite(cusparse_time_s / time_s):
        return None
    return cusparse_time_s / time_s


# -- tuning jobs ----------------------------------------------------------------------------------

JobState = Literal["queued", "running", "done", "failed"]


class TuneOptions(BaseModel):
    """Options of a tuning job (JSON fields, or form fields beside an upload)."""

    model_config = ConfigDict(extra="forbid")

    trials: int | None = Field(None, ge=1, description="trials to run (default: the server's default)")
    dtype: Dtype = "float64"
    kernels: list[str] | None = Field(None, min_length=1, max_length=64, description="families (default: all)")
    name: str | None = Field(None, max_length=200, description="a name for the matrix")


class TuneCreate(TuneOptions):
    """Tune a matrix the server already holds, by fingerprint."""

    fingerprint: str = Field(min_length=1, max_length=FINGERPRINT_MAX)


class JobProgress(BaseModel):
    done: int = Field(description="trials finished (measured or found already measured)")
    total: int


class FamilyResultPublic(BaseModel):
    kernel: str
    params: dict[str, ParamValue]
    time_s: float
    gflops: float
    gbps: float
    ratio_to_cusparse: float | None


class JobResultPublic(BaseModel):
    best: FamilyResultPublic | None
    summary: list[FamilyResultPublic]
    trials_ok: int
    trials_failed: int
    trials_cached: int
    study: str


class JobPublic(BaseModel):
    id: str
    state: JobState
    fingerprint: str
    name: str
    device: str
    dtype: Dtype
    trials: int
    kernels: list[str] | None
    progress: JobProgress
    queue_position: int | None = Field(description="jobs ahead of this one in this server's queue")
    created_at: str
    started_at: str | None
    finished_at: str | None
    result: JobResultPublic | None
    error: str | None
    restarts: int = Field(0, description="times the job was taken over after its server process stopped or died")


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


# -- health and errors ----------------------------------------------------------------------------


class StoreHealth(BaseModel):
    reachable: bool
    matrices: int | None
    error: str | None = None


class DeviceHealth(BaseModel):
    id: str
    kind: str
    gpu_present: bool


class ModelHealth(BaseModel):
    loaded: bool
    detail: str


class JobsHealth(BaseModel):
    queued: int
    running: int


class HealthPublic(BaseModel):
    status: Literal["ok", "unavailable"]
    store: StoreHealth
    device: DeviceHealth
    model: ModelHealth
    jobs: JobsHealth


class ErrorPublic(BaseModel):
    detail: str = Field(description="what is wrong, in one sentence")
    errors: list[dict[str, Any]] | None = Field(None, description="each validation error: loc, msg, type")


def error_responses(descriptions: Mapping[int, str]) -> dict[int | str, dict[str, Any]]:
    """A route's OpenAPI ``responses``: each error status with its description and the ErrorPublic body."""
    return {code: {"model": ErrorPublic, "description": what} for code, what in descriptions.items()}


__all__ = [name for name in dir() if name.endswith(("Public", "Create", "Options", "Query"))
           or name in ("FeatureVector", "error_responses")]
