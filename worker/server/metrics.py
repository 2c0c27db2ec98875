"""Prometheus metrics of one worker, named as vLLM names them with `llmserve:` in place of `vllm:`.

The engine calls `on_step` and `on_request_finished` on its own thread after each step; the HTTP server
that serves /metrics runs on another thread, so the little state kept here (the recent-throughput
window behind the cost gauge) is guarded by a lock. Keeping vLLM's names lets dashboards and alerts
written for vLLM work against this worker with a prefix change.

/metrics always answers in the classic text format. prometheus_client's own HTTP server would answer
Prometheus (which asks for OpenMetrics first) with its OpenMetrics encoder, and in prometheus_client 0.26
that encoder turns the ':' of sample names into '_' (but not in the TYPE lines): Prometheus would store
`llmserve_generation_tokens_total` and every `llmserve:` query would come back empty.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from common.prometheus import init_labels  # also: no _created series
from worker.engine.outputs import FinishedRequestStats, ModelInfo, StepStats
from worker.model.cpu_kind import CpuInfo, cpu_info

PREFIX = "llmserve:"
FINISH_REASONS = ("stop", "length", "abort")

# Bucket bounds (seconds or counts), chosen for a small model on CPU up to a large one on a GPU. Waits and
# whole requests reach 600 s, the gateway's default deadline (GATEWAY_REQUEST_TIMEOUT_S): past the highest
# finite bound, histogram_quantile answers that bound, and a p99 would stop there unseen.
TTFT_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0),
    *(120.0, 300.0, 600.0),
)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    *(120.0, 300.0, 600.0),
)
STEP_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_COUNT_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class _Engine(Protocol):
    def add_step_listener(self, listener: Callable[[StepStats], None]) -> None: ...

    def add_finished_listener(self, listener: Callable[[FinishedRequestStats], None]) -> None: ...

    @property
    def model_info(self) -> ModelInfo: ...


class _Settings(Protocol):
    host: str
    metrics_port: int
    served_model_name: str
    price_per_hour_usd: float
    enable_lora: bool
    lora_modules: str
    max_loras: int


class WorkerMetrics:
    """The worker's metrics on a registry of their own (so tests can build as many as they like)."""

    def __init__(
        self,
        model_name: str,
        price_per_hour_usd: float = 0.0,
        throughput_window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        quantization: str = "none",
        cpu: CpuInfo | None = None,
        max_loras: int = 0,
    ) -> None:
        if price_per_hour_usd < 0:
            raise ValueError("price_per_hour_usd must be non-negative")
        if throughput_window_s <= 0:
            raise ValueError("throughput_window_s must be positive")
        self.registry = CollectorRegistry()
        self.price_per_hour_usd = price_per_hour_usd
        self._window_s = throughput_window_s
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, int]] = deque()
        self._server: WSGIServer | None = None
        self._server_thread: threading.Thread | None = None

        reg = self.registry
        name = ["model_name"]

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(PREFIX + metric, doc, name, registry=reg)

        def counter(metric: str, doc: str) -> Counter:
            return Counter(PREFIX + metric, doc, name, registry=reg)

        def histogram(metric: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + metric, doc, name, buckets=buckets, registry=reg)

        Gauge(
            PREFIX + "model_quantization_info",
            "1 for the weight quantization the model runs with (none | int8 | int4 | w8a8 | w4a8).",
            ["model_name", "quantization"],
            registry=reg,
        ).labels(model_name, quantization).set(1)
        cpu = cpu or cpu_info()
        Gauge(
            PREFIX + "cpu_info",
            "1 for the CPU the worker runs on: its kind (amx | avx512_bf16 | avx512 | avx2 | other | "
            "unknown; WORKER_DTYPE/WORKER_QUANTIZATION=auto choose by it) and model name.",
            ["model_name", "cpu_kind", "cpu_model"],
            registry=reg,
        ).labels(model_name, cpu.kind, cpu.model).set(1)
        self.num_requests_running = gauge("num_requests_running", "Requests in the running batch.").labels(
            model_name
        )
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.").labels(
            model_name
        )
        self.kv_cache_usage_perc = gauge(
            "kv_cache_usage_perc", "Fraction (0..1) of KV-cache blocks held by live requests."
        ).labels(model_name)
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        ).labels(model_name)
        self.prefix_cache_hits = counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache."
        ).labels(model_name)
        self.num_preemptions = counter("num_preemptions", "Requests preempted to free KV blocks.").labels(
            model_name
        )
        self.kv_block_copies = counter(
            "kv_block_copies",
            "Cached KV blocks moved into the LRU victim to keep a sequence's blocks side by side.",
        ).labels(model_name)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens computed (prefill).").labels(model_name)
        self.generation_tokens = counter("generation_tokens", "Tokens generated.").labels(model_name)
        self._request_success = Counter(
            PREFIX + "request_success",
            "Finished requests (choices), by finish reason.",
            ["model_name", "finished_reason"],
            registry=reg,
        )
        self._model_name = model_name
        init_labels(self._request_success, [(model_name, reason) for reason in FINISH_REASONS])

        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "Arrival to first generated token.", TTFT_BUCKETS
        ).labels(model_name)
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Time between two generated tokens of a request.", ITL_BUCKETS
        ).labels(model_name)
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Arrival to finish of a request.", E2E_BUCKETS
        ).labels(model_name)
        self.request_queue_time = histogram(
            "request_queue_time_seconds", "Arrival to first scheduled.", QUEUE_BUCKETS
        ).labels(model_name)
        self.request_prompt_tokens = histogram(
            "request_prompt_tokens", "Prompt length of finished requests.", TOKEN_COUNT_BUCKETS
        ).labels(model_name)
        self.request_generation_tokens = histogram(
            "request_generation_tokens", "Generated length of finished requests.", TOKEN_COUNT_BUCKETS
        ).labels(model_name)
        self.step_batch_size = histogram(
            "step_batch_size", "Sequences in one engine step.", BATCH_SIZE_BUCKETS
        ).labels(model_name)
        self.step_batched_tokens = histogram(
            "step_batched_tokens", "Tokens computed in one step (prefill and decode).", TOKEN_COUNT_BUCKETS
        ).labels(model_name)
        self.step_time = histogram(
            "step_time_seconds", "Wall time of one engine step.", STEP_TIME_BUCKETS
        ).labels(model_name)

        # LoRA (only where adapters are served): vLLM's info gauge, one series at a time whose labels name the
        # adapters of the running and the waiting requests (its value: when they last changed, as vLLM's),
        # and the loads from disk, which climb with eviction reloads when WORKER_MAX_CPU_LORAS is too small.
        self._max_loras = max_loras
        self._lora_adapters: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        if max_loras:
            self.lora_requests_info = Gauge(
                PREFIX + "lora_requests_info",
                "Adapters of the running and the waiting requests (comma-separated names; value: when they "
                "last changed, Unix seconds), and WORKER_MAX_LORAS.",
                ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                registry=reg,
            )
            self.lora_loads = counter(
                "lora_loads", "LoRA adapters read from disk, reloads after eviction included."
            ).labels(model_name)
            self._set_lora_adapters((), ())

        gauge("price_per_hour_usd", "Configured machine price (WORKER_PRICE_PER_HOUR_USD).").labels(
            model_name
        ).set(price_per_hour_usd)
        gauge(
            "avg_generation_throughput_toks_per_s",
            f"Generated tokens per second over the last {throughput_window_s:g} s.",
        ).labels(model_name).set_function(self.generation_throughput)
        gauge(
            "cost_per_1k_generation_tokens_usd",
            "Machine price per hour (WORKER_PRICE_PER_HOUR_USD) spread over the recent generation "
            "throughput, per 1000 generated tokens; NaN while nothing was generated in the window.",
        ).labels(model_name).set_function(self.cost_per_1k_generation_tokens)

    def request_success(self, finished_reason: str) -> Counter:
        """The request_success child for one finish reason."""
        return self._request_success.labels(self._model_name, finished_reason)

    def on_step(self, stats: StepStats) -> None:
        """Engine step listener: gauges take the step's state, counters and histograms its deltas."""
        self.num_requests_running.set(stats.num_running)
        self.num_requests_waiting.set(stats.num_waiting)
        total = stats.num_kv_blocks_total
        self.kv_cache_usage_perc.set(stats.num_kv_blocks_used / total if total else 0.0)
        self.prefix_cache_queries.inc(stats.prefix_cache_queries)
        self.prefix_cache_hits.inc(stats.prefix_cache_hits)
        self.num_preemptions.inc(stats.num_preemptions)
        self.kv_block_copies.inc(stats.num_kv_block_copies)
        self.prompt_tokens.inc(stats.num_prompt_tokens)
        self.generation_tokens.inc(stats.num_generation_tokens)
        for ttft in stats.time_to_first_tokens_s:
            self.time_to_first_token.observe(ttft)
        for itl in stats.inter_token_latencies_s:
            self.inter_token_latency.observe(itl)
        if stats.batch_size > 0:
            self.step_batch_size.observe(stats.batch_size)
            self.step_batched_tokens.observe(stats.num_batched_tokens)
            self.step_time.observe(stats.step_time_s)
        if self._max_loras:
            self._set_lora_adapters(stats.running_lora_adapters, stats.waiting_lora_adapters)
            self.lora_loads.inc(stats.num_lora_loads)
        if stats.num_generation_tokens > 0:
            with self._lock:
                self._recent.append((self._clock(), stats.num_generation_tokens))
                self._prune(self._clock())

    def _set_lora_adapters(self, running: tuple[str, ...], waiting: tuple[str, ...]) -> None:
        if (running, waiting) == self._lora_adapters:
            return
        self._lora_adapters = (running, waiting)
        self.lora_requests_info.clear()  # one series: the adapters in use now
        labels = (str(self._max_loras), ",".join(running), ",".join(waiting))
        self.lora_requests_info.labels(*labels).set(time.time())

    def on_request_finished(self, stats: FinishedRequestStats) -> None:
        """Engine finished-request listener."""
        self.request_success(stats.finish_reason).inc()
        self.e2e_request_latency.observe(stats.e2e_latency_s)
        self.request_queue_time.observe(stats.queue_time_s)
        self.request_prompt_tokens.observe(stats.prompt_tokens)
        self.request_generation_tokens.observe(stats.generation_tokens)

    def _prune(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self._window_s:
            self._recent.popleft()

    def _window(self) -> tuple[int, float]:
        """Tokens generated in the window and the window's length (shorter just after start)."""
        now = self._clock()
        with self._lock:
            self._prune(now)
            tokens = sum(n for _, n in self._recent)
        return tokens, min(self._window_s, now - self._started)

    def generation_throughput(self) -> float:
        tokens, span = self._window()
        return tokens / span if span > 0 else 0.0

    def cost_per_1k_generation_tokens(self) -> float:
        """What the machine cost during the window, divided by the thousands of tokens it generated."""
        tokens, span = self._window()
        if tokens == 0 or span <= 0:
            return math.nan
        return self.price_per_hour_usd * span / 3600.0 / tokens * 1000.0

    def serve(self, port: int, host: str) -> int:
        """Serve /metrics over HTTP on a daemon thread; returns the bound port (useful with port 0)."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsServer", (_ThreadingWSGIServer,), {"address_family": family})
        self._server = make_server(host, port, self._wsgi_app, server_class, handler_class=_QuietHandler)
        self._server_thread = threading.Thread(
            target=self._server.serve_forever, name="worker-metrics-http", daemon=True
        )
        self._server_thread.start()
        return int(self._server.server_address[1])

    def _wsgi_app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: metrics are at /metrics\n"]
        body = generate_latest(self.registry)
        start_response(
            "200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Content-Length", str(len(body)))]
        )
        return [body]

    def close(self) -> None:
        """Stop the HTTP server, if serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._server_thread is not None:
            self._server_thread.join(timeout=5)
            self._server_thread = None


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # (the base class's name)
        """Scrapes every few seconds would flood the worker's log."""


def start_metrics_server(engine: _Engine, settings: _Settings) -> WorkerMetrics:
    """Attach the metrics to the engine's listeners and serve them on settings.metrics_port."""
    max_loras = settings.max_loras if settings.enable_lora or settings.lora_modules.strip() else 0
    metrics = WorkerMetrics(
        settings.served_model_name,
        settings.price_per_hour_usd,
        quantization=engine.model_info.quantization,
        max_loras=max_loras,
    )
    engine.add_step_listener(metrics.on_step)
    engine.add_finished_listener(metrics.on_request_finished)
    metrics.serve(settings.metrics_port, settings.host)
    return metrics
