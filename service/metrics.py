"""Request counts and latencies in the Prometheus text format, kept by a pure ASGI middleware.

Everything runs on the event loop's thread, so the counters need no lock. The
route label is the route's template (``/matrices/{fingerprint}``), never the
raw path, and requests that match no route share the label ``unmatched``: a
scanner sending random paths cannot grow the label set. With ``--workers N``
each worker process keeps (and reports) its own counts.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the latency histogram's buckets; +Inf is implied."""

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


class _Series:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS) + 1)
        self.count = 0
        self.sum = 0.0


class Metrics:
    """Per (method, route, status): a request count and a latency histogram."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str, str], _Series] = {}
        self.started = time.time()

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, str(status))
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        series.buckets[bisect_left(BUCKETS, seconds)] += 1
        series.count += 1
        series.sum += seconds

    def render(self, gauges: Iterable[tuple[str, str, str, dict[str, str], float]] = ()) -> str:
        """The text exposition: the HTTP series, then ``(name, type, help, labels, value)`` extras."""
        out = [
            "# HELP spmv_http_requests_total HTTP requests served, by method, route template and status.",
            "# TYPE spmv_http_requests_total counter",
        ]
        items = sorted(self._series.items())
        for (method, route, status), s in items:
            out.append(f"spmv_http_requests_total{_labels(method=method, route=route, status=status)} {s.count}")
        out += [
            "# HELP spmv_http_request_duration_seconds Time from the request's start to the response's end.",
            "# TYPE spmv_http_request_duration_seconds histogram",
        ]
        merged: dict[tuple[str, str], _Series] = {}
        for (method, route, _), s in items:
            m = merged.setdefault((method, route), _Series())
            m.buckets = [a + b for a, b in zip(m.buckets, s.buckets, strict=True)]
            m.count += s.count
            m.sum += s.sum
        for (method, route), s in merged.items():
            cumulative = 0
            for bound, n in zip((*BUCKETS, float("inf")), s.buckets, strict=True):
                cumulative += n
                le = "+Inf" if bound == float("inf") else repr(bound)
                out.append(
                    f"spmv_http_request_duration_seconds_bucket{_labels(method=method, route=route, le=le)} "
                    f"{cumulative}"
                )
            out.append(f"spmv_http_request_duration_seconds_sum{_labels(method=method, route=route)} {s.sum!r}")
            out.append(f"spmv_http_request_duration_seconds_count{_labels(method=method, route=route)} {s.count}")
        seen: set[str] = set()
        for name, kind, doc, labels, value in gauges:
            if name not in seen:
                seen.add(name)
                out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
            out.append(f"{name}{_labels(**labels)} {float(value)!r}")
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


class MetricsMiddleware:
    """Times every HTTP request and counts it under its route template and final status."""

    def __init__(self, app: Callable[..., Any], *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            self.metrics.observe(
                scope["method"], getattr(route, "path", "unmatched"), status, time.perf_counter() - start
            )
