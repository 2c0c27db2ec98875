"""WorkerMetrics fed with engine step and finished-request stats, read back from its registry."""

from __future__ import annotations

import math
import socket
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.engine.outputs import FinishedRequestStats, ModelInfo, StepStats
from worker.model.cpu_kind import cpu_info
from worker.server.metrics import WorkerMetrics, start_metrics_server
from worker.server.settings import WorkerSettings

MODEL = "test-model"
LABELS = {"model_name": MODEL}


def step(**overrides: object) -> StepStats:
    fields: dict[str, object] = dict(
        num_running=0,
        num_waiting=0,
        num_kv_blocks_used=0,
        num_kv_blocks_total=100,
        batch_size=0,
        num_batched_tokens=0,
        step_time_s=0.0,
        num_preemptions=0,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
        num_prompt_tokens=0,
        num_generation_tokens=0,
    )
    fields.update(overrides)
    return StepStats(**fields)  # type: ignore[arg-type]


def finished(**overrides: object) -> FinishedRequestStats:
    fields: dict[str, object] = dict(
        finish_reason="stop",
        prompt_tokens=10,
        generation_tokens=5,
        cached_tokens=0,
        queue_time_s=0.01,
        e2e_latency_s=0.5,
    )
    fields.update(overrides)
    return FinishedRequestStats(**fields)  # type: ignore[arg-type]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def value(metrics: WorkerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {**LABELS, **labels})


def test_every_documented_name_is_exported_before_any_traffic() -> None:
    metrics = WorkerMetrics(MODEL)
    names = {s.name for fam in metrics.registry.collect() for s in fam.samples}
    expected = {
        "llmserve:num_requests_running",
        "llmserve:num_requests_waiting",
        "llmserve:kv_cache_usage_perc",
        "llmserve:prefix_cache_queries_total",
        "llmserve:prefix_cache_hits_total",
        "llmserve:num_preemptions_total",
        "llmserve:kv_block_copies_total",
        "llmserve:prompt_tokens_total",
        "llmserve:generation_tokens_total",
        "llmserve:request_success_total",
        "llmserve:time_to_first_token_seconds_bucket",
        "llmserve:inter_token_latency_seconds_bucket",
        "llmserve:e2e_request_latency_seconds_bucket",
        "llmserve:request_queue_time_seconds_bucket",
        "llmserve:step_batch_size_bucket",
        "llmserve:step_time_seconds_bucket",
        "llmserve:cost_per_1k_generation_tokens_usd",
        "llmserve:avg_generation_throughput_toks_per_s",
        "llmserve:price_per_hour_usd",
    }
    assert expected <= names, expected - names
    for reason in ("stop", "length", "abort"):
        assert value(metrics, "llmserve:request_success_total", finished_reason=reason) == 0.0


def test_step_sets_gauges_and_accumulates_counters() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.on_step(
        step(
            num_running=3,
            num_waiting=2,
            num_kv_blocks_used=25,
            batch_size=3,
            num_batched_tokens=40,
            step_time_s=0.03,
            prefix_cache_queries=32,
            prefix_cache_hits=16,
            num_prompt_tokens=38,
            num_generation_tokens=2,
            num_preemptions=1,
            num_kv_block_copies=2,
            time_to_first_tokens_s=[0.2, 0.3],
        )
    )
    metrics.on_step(
        step(
            num_running=1,
            num_waiting=0,
            num_kv_blocks_used=10,
            batch_size=1,
            num_batched_tokens=1,
            step_time_s=0.01,
            num_generation_tokens=1,
            inter_token_latencies_s=[0.01],
        )
    )
    assert value(metrics, "llmserve:num_requests_running") == 1
    assert value(metrics, "llmserve:num_requests_waiting") == 0
    assert value(metrics, "llmserve:kv_cache_usage_perc") == pytest.approx(0.10)
    assert value(metrics, "llmserve:prefix_cache_queries_total") == 32
    assert value(metrics, "llmserve:prefix_cache_hits_total") == 16
    assert value(metrics, "llmserve:num_preemptions_total") == 1
    assert value(metrics, "llmserve:kv_block_copies_total") == 2
    assert value(metrics, "llmserve:prompt_tokens_total") == 38
    assert value(metrics, "llmserve:generation_tokens_total") == 3
    assert value(metrics, "llmserve:time_to_first_token_seconds_count") == 2
    assert value(metrics, "llmserve:time_to_first_token_seconds_sum") == pytest.approx(0.5)
    assert value(metrics, "llmserve:inter_token_latency_seconds_count") == 1
    assert value(metrics, "llmserve:step_batch_size_count") == 2
    # batch size 3 lands above the le=2 bound and within le=4; batch size 1 within le=1
    assert value(metrics, "llmserve:step_batch_size_bucket", le="1.0") == 1
    assert value(metrics, "llmserve:step_batch_size_bucket", le="2.0") == 1
    assert value(metrics, "llmserve:step_batch_size_bucket", le="4.0") == 2
    assert value(metrics, "llmserve:step_time_seconds_sum") == pytest.approx(0.04)
    assert value(metrics, "llmserve:step_batched_tokens_sum") == 41


def test_empty_step_moves_gauges_but_not_step_histograms() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.on_step(step(num_running=2, num_kv_blocks_used=50, batch_size=2, num_batched_tokens=2))
    metrics.on_step(step(num_running=0, num_kv_blocks_used=0, num_kv_blocks_total=0))
    assert value(metrics, "llmserve:num_requests_running") == 0
    assert value(metrics, "llmserve:kv_cache_usage_perc") == 0
    assert value(metrics, "llmserve:step_batch_size_count") == 1


def test_finished_request_counts_its_reason_and_latencies() -> None:
    metrics = WorkerMetrics(MODEL)
    metrics.on_request_finished(finished(finish_reason="length", e2e_latency_s=1.5, queue_time_s=0.2))
    metrics.on_request_finished(finished(finish_reason="stop", e2e_latency_s=0.5, generation_tokens=7))
    assert value(metrics, "llmserve:request_success_total", finished_reason="length") == 1
    assert value(metrics, "llmserve:request_success_total", finished_reason="stop") == 1
    assert value(metrics, "llmserve:request_success_total", finished_reason="abort") == 0
    assert value(metrics, "llmserve:e2e_request_latency_seconds_count") == 2
    assert value(metrics, "llmserve:e2e_request_latency_seconds_sum") == pytest.approx(2.0)
    assert value(metrics, "llmserve:e2e_request_latency_seconds_bucket", le="1.0") == 1
    assert value(metrics, "llmserve:request_queue_time_seconds_sum") == pytest.approx(0.21)
    assert value(metrics, "llmserve:request_generation_tokens_sum") == 12


def test_cost_per_1k_tokens_follows_recent_throughput() -> None:
    clock = FakeClock()
    # 3.6 USD per hour is 0.001 USD per second.
    metrics = WorkerMetrics(MODEL, price_per_hour_usd=3.6, throughput_window_s=60.0, clock=clock)
    cost = "llmserve:cost_per_1k_generation_tokens_usd"
    throughput = "llmserve:avg_generation_throughput_toks_per_s"
    assert math.isnan(value(metrics, cost))  # type: ignore[arg-type]
    clock.now += 10
    metrics.on_step(step(num_generation_tokens=100, batch_size=1))
    clock.now += 10
    metrics.on_step(step(num_generation_tokens=100, batch_size=1))
    # 20 s since start, 200 tokens: 10 tokens/s, 0.02 USD spent, 0.1 USD per 1000 tokens.
    assert value(metrics, "llmserve:price_per_hour_usd") == 3.6
    assert value(metrics, throughput) == pytest.approx(10.0)
    assert value(metrics, cost) == pytest.approx(0.1)
    clock.now += 55
    # The window is the last 60 s: only the second step's 100 tokens remain.
    assert value(metrics, throughput) == pytest.approx(100 / 60)
    assert value(metrics, cost) == pytest.approx(0.001 * 60 / 100 * 1000)
    clock.now += 10
    assert value(metrics, throughput) == 0.0
    assert math.isnan(value(metrics, cost))  # type: ignore[arg-type]


def test_free_machine_costs_nothing_per_token() -> None:
    clock = FakeClock()
    metrics = WorkerMetrics(MODEL, price_per_hour_usd=0.0, clock=clock)
    clock.now += 1
    metrics.on_step(step(num_generation_tokens=5, batch_size=1))
    assert value(metrics, "llmserve:cost_per_1k_generation_tokens_usd") == 0.0


@pytest.mark.parametrize("kwargs", [{"price_per_hour_usd": -1.0}, {"throughput_window_s": 0.0}])
def test_bad_configuration_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        WorkerMetrics(MODEL, **kwargs)


class ListenerRecorder:
    """Stands in for the engine's listener registry: the real engine is exercised in the live tests."""

    def __init__(self) -> None:
        self.step_listeners: list[Callable[[StepStats], None]] = []
        self.finished_listeners: list[Callable[[FinishedRequestStats], None]] = []
        # What the engine resolved (WORKER_QUANTIZATION=auto becomes int8 or none): the metric reports it.
        self.model_info = ModelInfo(MODEL, 2048, 16, 64, "float32", "cpu", 16, 49152, quantization="int8")

    def add_step_listener(self, listener: Callable[[StepStats], None]) -> None:
        self.step_listeners.append(listener)

    def add_finished_listener(self, listener: Callable[[FinishedRequestStats], None]) -> None:
        self.finished_listeners.append(listener)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_start_metrics_server_attaches_listeners_and_serves_http() -> None:
    engine = ListenerRecorder()
    port = free_port()
    settings = WorkerSettings(host="127.0.0.1", metrics_port=port, served_model_name=MODEL)
    metrics = start_metrics_server(engine, settings)
    try:
        assert len(engine.step_listeners) == 1 and len(engine.finished_listeners) == 1
        engine.step_listeners[0](step(num_running=4, num_generation_tokens=9, batch_size=4))
        engine.finished_listeners[0](finished(finish_reason="abort"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body)
            for s in fam.samples
        }
        assert samples[("llmserve:num_requests_running", (("model_name", MODEL),))] == 4
        assert samples[("llmserve:generation_tokens_total", (("model_name", MODEL),))] == 9
        key = ("llmserve:request_success_total", (("finished_reason", "abort"), ("model_name", MODEL)))
        assert samples[key] == 1
        info_key = ("llmserve:model_quantization_info", (("model_name", MODEL), ("quantization", "int8")))
        assert samples[info_key] == 1
        cpu = cpu_info()
        cpu_labels = (("cpu_kind", cpu.kind), ("cpu_model", cpu.model), ("model_name", MODEL))
        cpu_key = ("llmserve:cpu_info", cpu_labels)
        assert samples[cpu_key] == 1
    finally:
        metrics.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def test_served_names_keep_their_colons_whatever_the_scraper_asks_for() -> None:
    metrics = WorkerMetrics(MODEL)
    port = metrics.serve(0, "127.0.0.1")
    try:
        metrics.on_step(step(num_generation_tokens=2, batch_size=1))
        for accept in (PROMETHEUS_ACCEPT, "*/*", "text/plain;version=1.0.0;escaping=underscores"):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
            with urllib.request.urlopen(request, timeout=5) as resp:
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                body = resp.read().decode()
            samples = [line for line in body.splitlines() if line and not line.startswith("#")]
            assert 'llmserve:generation_tokens_total{model_name="test-model"} 2.0' in samples, accept
            assert not [line for line in samples if line.startswith("llmserve_")], accept
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
        assert err.value.code == 404
    finally:
        metrics.close()


def lora_series(metrics: WorkerMetrics) -> list[dict[str, str]]:
    return [
        dict(s.labels)
        for fam in metrics.registry.collect()
        if fam.name == "llmserve:lora_requests_info"
        for s in fam.samples
    ]


def test_lora_metrics_name_the_adapters_in_use_one_series_at_a_time() -> None:
    """vLLM's lora_requests_info: which adapters run and wait now (old label sets are dropped, so the series
    do not pile up with every combination); loads from disk count eviction reloads too."""
    metrics = WorkerMetrics(MODEL, max_loras=2)
    assert lora_series(metrics) == [
        {"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    ]
    metrics.on_step(step(running_lora_adapters=("a", "b"), waiting_lora_adapters=("c",), num_lora_loads=3))
    metrics.on_step(step(running_lora_adapters=("a",), waiting_lora_adapters=(), num_lora_loads=1))
    assert lora_series(metrics) == [
        {"max_lora": "2", "running_lora_adapters": "a", "waiting_lora_adapters": ""}
    ]
    assert value(metrics, "llmserve:lora_loads_total") == 4
    off = WorkerMetrics(MODEL)  # no adapters served: no LoRA series at all
    off.on_step(step(running_lora_adapters=("a",)))
    assert lora_series(off) == [] and value(off, "llmserve:lora_loads_total") is None
