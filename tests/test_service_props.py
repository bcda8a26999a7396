"""Property-based: no generated request gets a 500.

schemathesis generates requests from the app's own OpenAPI schema (valid and
invalid ones: wrong types, missing fields, odd strings, multipart bodies) for
every operation; hypothesis throws arbitrary JSON documents and raw bytes at
``POST /recommend``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import create_app
from tests.test_service import AUTH, make_settings, seed_store
from tuner.matrix.features import FEATURE_NAMES

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

schemathesis = pytest.importorskip("schemathesis")

_TMP = Path(__import__("tempfile").mkdtemp(prefix="spmv-props-"))
APP = create_app(make_settings(_TMP, max_queued_jobs=2, max_trials=2))
seed_store(_TMP / "tuner.db")
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def _stop_app() -> Iterator[None]:
    yield
    from schemathesis.python.asgi import shutdown_lifespans

    shutdown_lifespans()  # stops the job worker and closes the store


@SCHEMA.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_generated_request_is_a_500(case):
    headers = AUTH if case.path == "/tune" and case.operation.method.upper() == "POST" else None
    response = case.call(headers=headers)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
    if response.status_code >= 400:
        assert isinstance(response.json()["detail"], str)


SIZES = st.one_of(st.integers(-5, 2**40), st.floats(allow_nan=False), st.text(max_size=3), st.booleans(), st.none())
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
VECTORS = st.dictionaries(
    st.sampled_from([*FEATURE_NAMES, "fingerprint", "colour", ""]), st.one_of(SIZES, JSON_VALUES), max_size=8
)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(_TMP / "hyp"))) as c:
        yield c


def _valid(vector: dict) -> bool:
    """Whether a vector must be accepted: known names, finite non-negative numbers, whole sizes, nnz <= rows*cols."""
    if not {"rows", "cols", "nnz"} <= set(vector) or set(vector) - {*FEATURE_NAMES, "fingerprint"}:
        return False
    for name, value in vector.items():
        if name == "fingerprint":
            if value is not None and not (isinstance(value, str) and 1 <= len(value) <= 128):
                return False
            continue
        if value is None and name not in ("rows", "cols", "nnz"):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            return False
        if name in ("rows", "cols", "nnz") and (value != int(value) or value > 2**31 - 1):
            return False
    return vector["nnz"] <= vector["rows"] * vector["cols"]


@given(vector=VECTORS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_recommend_any_json_object(client, vector):
    r = client.post("/recommend", content=json.dumps(vector), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, r.text
    assert r.status_code == (200 if _valid(vector) else 422), (vector, r.text)


@given(body=st.binary(max_size=300) | JSON_VALUES.map(lambda v: json.dumps(v).encode()))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_recommend_any_bytes(client, body):
    for kind in ("application/json", "multipart/form-data; boundary=XyZ"):
        r = client.post("/recommend", content=body, headers={"Content-Type": kind})
        assert r.status_code < 500, r.text
        if r.status_code != 200:
            assert isinstance(r.json()["detail"], str)



BANNERS = st.sampled_from([
    b"%%MatrixMarket matrix coordinate real general\n", b"%%MatrixMarket matrix coordinate pattern symmetric\n",
    b"%%MatrixMarket matrix coordinate integer skew-symmetric\n", b"%%MatrixMarket matrix array real general\n",
    b"%%MatrixMarket matrix coordinate complex hermitian\n", b"%%MatrixMarket vector coordinate real general\n", b"",
])
TOKENS = st.one_of(st.integers(-3, 12).map(str), st.sampled_from(["1e3", "nan", "inf", "-0", "x", "", "1.5", "%"]))
LINES = st.lists(st.lists(TOKENS, max_size=4).map(" ".join), max_size=8).map(lambda ls: "\n".join(ls).encode())


@given(banner=BANNERS, body=LINES, compress=st.booleans())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_recommend_any_matrix_file(client, banner, body, compress):
    content = banner + body
    if compress:
        import gzip

        content = gzip.compress(content)
    r = client.post("/recommend", files={"file": ("m.mtx", content)})
    assert r.status_code in (200, 413, 422), r.text
    if r.status_code != 200:
        assert "m.mtx" in r.json()["detail"]
