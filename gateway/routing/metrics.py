"""Routing metrics, per worker and model: requests routed there, and the load this gateway sees. The `model`
label is always a base model the fleet serves: a request for a LoRA adapter counts under the model it runs on,
so adapters loaded and unloaded at run time add no series (as vLLM's `model_name`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

if TYPE_CHECKING:
    from gateway.routing.replica import WorkerReplica

ROUTED = Counter(
    "llmserve_gateway_routed_requests_total",
    "Worker calls started, by model and worker address (a retried request counts where it ran).",
    ["model", "worker"],
)
RETRIES = Counter(
    "llmserve_gateway_routing_retries_total",
    "Requests moved to another worker: before their first token (the worker refused, died or stopped), "
    "or, not streamed, after it (the worker died or stalled: run again from the start).",
    ["model"],
)
WORKER_RUNNING = Gauge(
    "llmserve_gateway_worker_running",
    "Requests running on a worker, from its last load report.",
    ["model", "worker"],
)
WORKER_WAITING = Gauge(
    "llmserve_gateway_worker_waiting",
    "Requests waiting on a worker, from its last load report.",
    ["model", "worker"],
)
WORKER_KV_USAGE = Gauge(
    "llmserve_gateway_worker_kv_cache_usage",
    "Share of a worker's KV blocks held by live requests, from its last load report (0..1).",
    ["model", "worker"],
)
WORKER_ROUTABLE = Gauge(
    "llmserve_gateway_worker_routable",
    "1 while a worker takes new requests (fresh load reports, not draining), else 0.",
    ["model", "worker"],
)
WORKER_RECENT_TOKENS = Gauge(
    "llmserve_gateway_worker_recent_prompt_tokens",
    "Prompt tokens a worker looked up lately (fading, GATEWAY_ROUTING_HALF_LIFE_S), from its load reports: "
    "the load a hot key is spread by.",
    ["model", "worker"],
)


def model_label(replica: WorkerReplica, requested: str) -> str:
    """The base model `replica` serves (for an adapter's request too); the requested name only while the
    worker has not said which model it serves."""
    return replica.model or requested


_GAUGES = (WORKER_RUNNING, WORKER_WAITING, WORKER_KV_USAGE, WORKER_ROUTABLE, WORKER_RECENT_TOKENS)
_labels: dict[str, str] = {}  # worker -> the model label its gauges carry


def observe_load(replica: WorkerReplica) -> None:
    model = replica.model or ""
    if _labels.get(replica.addr, model) != model:
        forget_worker(replica.addr)
    _labels[replica.addr] = model
    report = replica.report
    WORKER_RUNNING.labels(model, replica.addr).set(report.num_running if report else 0)
    WORKER_WAITING.labels(model, replica.addr).set(report.num_waiting if report else 0)
    WORKER_KV_USAGE.labels(model, replica.addr).set(report.kv_cache_usage if report else 0.0)
    WORKER_ROUTABLE.labels(model, replica.addr).set(1 if replica.tier() == 0 else 0)
    WORKER_RECENT_TOKENS.labels(model, replica.addr).set(replica.recent_tokens.value())


def forget_worker(addr: str) -> None:
    """A worker that left membership: its gauges go away rather than freeze at their last value."""
    model = _labels.pop(addr, None)
    if model is None:
        return
    for gauge in _GAUGES:
        try:
            gauge.remove(model, addr)
        except KeyError:
            pass
