"""Gateway metrics (prefix llmserve_gateway_) and the pure-ASGI middleware that records HTTP ones."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import Message, Receive, Scope, Send

from common.prometheus import init_labels
from gateway.http_io import HttpMiddleware

ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/models",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/tokenize",
        "/detokenize",
        "/health",
        "/ready",
        "/metrics",
        "/openapi.json",
    }
)
# Up to GATEWAY_REQUEST_TIMEOUT_S's default (600 s): a longer request's duration past the last finite bound
# would read as that bound in histogram_quantile.
LATENCY_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
    *(300.0, 600.0),
)

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
STALLED = "STALLED"  # a stream the gateway ended: no token for GATEWAY_STREAM_STALL_S, its worker quiet
WORKER_ERRORS = Counter(
    "llmserve_gateway_worker_errors_total",
    "Worker calls that failed, by gRPC status code (STALLED: a stream the gateway ended, its worker quiet).",
    ["code"],
)
SHARED_GENERATIONS = Counter(
    "llmserve_gateway_shared_generations_total",
    "Cacheable requests answered by an identical request's generation in flight (counted as cache hits too).",
)
CLIENT_DISCONNECTS = Counter(
    "llmserve_gateway_client_disconnects_total",
    "Requests whose client went away before the answer was complete (streamed, or answered 499).",
)

# Label values the dashboard reads, exported at 0 before the first event (common/prometheus.py).
CACHE_RESULTS = ("hit", "miss", "bypass", "error")
CACHE_ERROR_KINDS = ("lookup", "timeout", "store")
WORKER_ERROR_CODES = (
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "INVALID_ARGUMENT",
    "INTERNAL",
    STALLED,
)
init_labels(SEMANTIC_CACHE, CACHE_RESULTS)
init_labels(SEMANTIC_CACHE_ERRORS, CACHE_ERROR_KINDS)
init_labels(WORKER_ERRORS, WORKER_ERROR_CODES)
init_labels(HTTP_REQUESTS, [(route, "POST", "200") for route in ("/v1/chat/completions", "/v1/completions")])


def route_label(path: str) -> str:
    """Known routes by name; anything else collapses to one label so scanners can't explode cardinality."""
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    if path.startswith("/v1/responses/"):  # GET and DELETE of a stored response, its input_items
        return "/v1/responses/{response_id}"
    return "other"


class MetricsMiddleware(HttpMiddleware):
    """Counts every HTTP response by route and status and times it to its last byte."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        status = 500

        def note_status(message: Message) -> None:
            nonlocal status
            status = message["status"]

        try:
            await self.call_app(scope, receive, send, note_status)
        finally:
            route = route_label(scope["path"])
            HTTP_REQUESTS.labels(route, scope["method"], str(status)).inc()
            REQUEST_LATENCY.labels(route).observe(time.perf_counter() - start)
