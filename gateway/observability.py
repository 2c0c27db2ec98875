"""Gateway metrics (prefix llmserve_gateway_) and the pure-ASGI middleware that records HTTP ones."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready", "/metrics"})
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

HTTP_REQUESTS = Counter(
    "llmserve_gateway_http_requests_total",
    "HTTP requests by route, method and status.",
    ["route", "method", "status"],
)
REQUEST_LATENCY = Histogram(
    "llmserve_gateway_request_duration_seconds",
    "Time from request to the last byte of the response (streams included).",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
OPEN_STREAMS = Gauge("llmserve_gateway_open_streams", "SSE responses being streamed now.")
SEMANTIC_CACHE = Counter(
    "llmserve_gateway_semantic_cache_requests_total",
    "Semantic cache outcomes per request: hit, miss, bypass (not asked) or error.",
    ["result"],
)
SEMANTIC_CACHE_ERRORS = Counter(
    "llmserve_gateway_semantic_cache_errors_total",
    "Semantic cache calls that failed or timed out, by kind (lookup, timeout, store).",
    ["kind"],
)
WORKER_ERRORS = Counter(
    "llmserve_gateway_worker_errors_total", "Worker calls that failed, by gRPC status code.", ["code"]
)
CLIENT_DISCONNECTS = Counter(
    "llmserve_gateway_client_disconnects_total",
    "Requests whose client went away before the answer was complete.",
)


def route_label(path: str) -> str:
    """Known routes by name; anything else collapses to one label so scanners can't explode cardinality."""
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return "other"


class MetricsMiddleware:
    """Counts every HTTP response by route and status and times it to its last byte."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            route = route_label(scope["path"])
            HTTP_REQUESTS.labels(route, scope["method"], str(status)).inc()
            REQUEST_LATENCY.labels(route).observe(time.perf_counter() - start)
