"""All three services export metrics as vLLM does: no `_created` series, and the label values dashboards
read present at 0 before the first event (common/prometheus.py)."""

from __future__ import annotations

import re

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cache_service.batcher import BatchStats
from cache_service.metrics import CacheMetrics
from gateway import observability
from gateway.app import create_app
from gateway.settings import GatewaySettings
from scripts.launch import free_port
from worker.server.metrics import FINISH_REASONS, WorkerMetrics


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(registry).decode()
    assert "_created" not in text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_gateway() -> None:
    got = samples(REGISTRY)
    for result in observability.CACHE_RESULTS:
        key = ("llmserve_gateway_semantic_cache_requests_total", frozenset({("result", result)}))
        assert key in got
    for kind in observability.CACHE_ERROR_KINDS:
        assert ("llmserve_gateway_semantic_cache_errors_total", frozenset({("kind", kind)})) in got
    for code in observability.WORKER_ERROR_CODES:
        assert ("llmserve_gateway_worker_errors_total", frozenset({("code", code)})) in got
    assert ("llmserve_gateway_shared_generations_total", frozenset()) in got


def test_gateway_routes_are_labelled_by_name() -> None:
    """Each served route has its own label; anything else (scanners) collapses to `other`."""
    for path in ("/v1/responses", "/v1/embeddings", "/tokenize", "/detokenize", "/v1/completions"):
        assert observability.route_label(path) == path
    for stored in ("/v1/responses/resp_1", "/v1/responses/resp_1/input_items"):
        assert observability.route_label(stored) == "/v1/responses/{response_id}"
    assert observability.route_label("/wp-login.php") == "other"


def test_every_route_the_gateway_serves_has_a_label_of_its_own() -> None:
    """Only paths the gateway does not serve (scanners) may fall into `other`."""
    app = create_app(GatewaySettings(worker_addr=f"127.0.0.1:{free_port()}", cache_enabled=False))
    paths = {re.sub(r"\{[^}]*\}", "x", route.path) for route in app.routes if hasattr(route, "path")}
    assert "/v1/load_lora_adapter" in paths
    assert {path for path in paths if observability.route_label(path) == "other"} == set()


def test_cache_service() -> None:
    got = samples(CacheMetrics().registry)
    assert got[("llmserve_cache_hits_total", frozenset({("kind", "semantic")}))] == 0
    assert got[("llmserve_cache_hits_total", frozenset({("kind", "exact")}))] == 0
    for method in ("Lookup", "Store", "Invalidate"):
        assert got[("llmserve_cache_errors_total", frozenset({("method", method)}))] == 0


def test_worker() -> None:
    metrics = WorkerMetrics("m")
    got = samples(metrics.registry)
    for reason in FINISH_REASONS:
        labels = frozenset({("model_name", "m"), ("finished_reason", reason)})
        assert got[("llmserve:request_success_total", labels)] == 0


def highest_finite_bucket(registry: CollectorRegistry, name: str) -> float:
    bounds = [
        float(le)
        for (n, labels), _ in samples(registry).items()
        if n == name
        for k, le in labels
        if k == "le"
    ]
    return max(b for b in bounds if b != float("inf"))


def test_request_durations_are_bucketed_up_to_the_request_deadline() -> None:
    """A request may wait, and last, until GATEWAY_REQUEST_TIMEOUT_S (600 s by default): past the highest
    finite bucket, histogram_quantile answers that bucket's bound, so a p99 would stop there unseen."""
    deadline = GatewaySettings.model_fields["gateway_request_timeout_s"].default
    worker = WorkerMetrics("m").registry
    for name in (
        "llmserve:time_to_first_token_seconds_bucket",
        "llmserve:request_queue_time_seconds_bucket",
        "llmserve:e2e_request_latency_seconds_bucket",
    ):
        assert highest_finite_bucket(worker, name) >= deadline, name
    observability.REQUEST_LATENCY.labels("/v1/chat/completions")
    gateway_bucket = highest_finite_bucket(REGISTRY, "llmserve_gateway_request_duration_seconds_bucket")
    assert gateway_bucket >= deadline


def test_a_full_embedding_pass_on_a_cpu_lands_in_a_finite_bucket() -> None:
    """A pass of the batcher's largest batch (32 inputs near the model's 256 tokens) took 8 s here (MiniLM on
    onnxruntime, one thread, 2 shared cores); a lookup queued behind it waits as long."""
    metrics = CacheMetrics()
    metrics.on_embedding_batch(BatchStats(lookups=0, embeddings=32, rows=32, padded_tokens=8192, seconds=8.0))
    metrics.lookup_seconds.observe(8.0)
    for name in ("llmserve_cache_embedding_seconds_bucket", "llmserve_cache_lookup_seconds_bucket"):
        assert highest_finite_bucket(metrics.registry, name) >= 8.0, name
