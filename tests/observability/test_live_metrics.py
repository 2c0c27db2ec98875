"""Scrape the real worker, cache service and gateway around real requests: the metrics move as they should."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import uuid

import grpc
import httpx
import pytest

from common.gen import worker_pb2, worker_pb2_grpc
from scripts.launch import ROOT
from tests.deploy.files import DASHBOARD
from tests.observability.conftest import PRICE_PER_HOUR_USD
from tests.observability.stack import Cache, Gateway, Scrape, Worker, scrape, wait_idle
from tests.support.net import wait_for

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
W = "llmserve:"


def generate(worker: Worker, prompt: str, max_tokens: int) -> list[worker_pb2.GenerateResponse]:
    params = worker_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    with grpc.insecure_channel(worker.addr) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        return list(stub.Generate(worker_pb2.GenerateRequest(text=prompt, params=params), timeout=120))


def delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def test_one_request_counts_its_tokens_and_observes_ttft_once(priced_worker: Worker) -> None:
    before = wait_idle(priced_worker)
    chunks = generate(priced_worker, f"Request {uuid.uuid4().hex}: tell me about the sea.", max_tokens=6)
    final = chunks[-1]
    assert final.finish_reason == "length"
    assert sum(len(c.token_ids) for c in chunks) == 6
    usage = final.usage

    wait_for(
        lambda: (
            delta(before, scrape(priced_worker.metrics_url), W + "e2e_request_latency_seconds_count") == 1
        ),
        what="the finished request to be recorded",
    )
    after = wait_idle(priced_worker)
    assert delta(before, after, W + "generation_tokens_total") == 6
    assert delta(before, after, W + "prompt_tokens_total") == usage.prompt_tokens - usage.cached_tokens
    assert delta(before, after, W + "time_to_first_token_seconds_count") == 1
    assert delta(before, after, W + "inter_token_latency_seconds_count") == 5
    assert delta(before, after, W + "request_success_total", finished_reason="length") == 1
    assert delta(before, after, W + "request_success_total", finished_reason="stop") == 0
    assert delta(before, after, W + "request_success_total", finished_reason="abort") == 0
    assert delta(before, after, W + "request_queue_time_seconds_count") == 1
    assert delta(before, after, W + "request_generation_tokens_sum") == 6
    assert delta(before, after, W + "request_prompt_tokens_sum") == usage.prompt_tokens
    assert delta(before, after, W + "step_batch_size_count") == 6  # one prefill step, five decode steps
    ttft = delta(before, after, W + "time_to_first_token_seconds_sum")
    e2e = delta(before, after, W + "e2e_request_latency_seconds_sum")
    assert 0 < ttft <= e2e
    assert after.value(W + "num_requests_running", model_name=MODEL) == 0


def test_repeated_prefix_is_counted_as_prefix_cache_hits(priced_worker: Worker) -> None:
    prompt = f"{uuid.uuid4().hex} " + " ".join(f"word{i}" for i in range(80))
    generate(priced_worker, prompt, max_tokens=2)
    before = wait_idle(priced_worker)
    final = generate(priced_worker, prompt, max_tokens=2)[-1]
    wait_for(
        lambda: delta(before, scrape(priced_worker.metrics_url), W + "request_success_total") == 1,
        what="the second request to be recorded",
    )
    after = wait_idle(priced_worker)
    hits = delta(before, after, W + "prefix_cache_hits_total")
    queries = delta(before, after, W + "prefix_cache_queries_total")
    assert final.usage.cached_tokens > 0
    assert hits == final.usage.cached_tokens
    assert queries >= hits
    assert delta(before, after, W + "prompt_tokens_total") == final.usage.prompt_tokens - hits


def test_client_abort_is_counted_and_frees_the_batch(priced_worker: Worker) -> None:
    before = wait_idle(priced_worker)
    params = worker_pb2.SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
    request = worker_pb2.GenerateRequest(text=f"{uuid.uuid4().hex} count slowly", params=params)
    with grpc.insecure_channel(priced_worker.addr) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).Generate(request, timeout=120)
        for _, _chunk in zip(range(3), call, strict=False):
            pass
        call.cancel()
    wait_for(
        lambda: (
            delta(
                before,
                scrape(priced_worker.metrics_url),
                W + "request_success_total",
                finished_reason="abort",
            )
            == 1
        ),
        what="the aborted request to be counted",
    )
    after = wait_idle(priced_worker)
    assert delta(before, after, W + "request_success_total", finished_reason="length") == 0


def test_cost_per_1k_tokens_follows_the_configured_price(priced_worker: Worker) -> None:
    generate(priced_worker, f"{uuid.uuid4().hex} Say something.", max_tokens=4)
    page = scrape(priced_worker.metrics_url)
    assert page.value(W + "price_per_hour_usd") == PRICE_PER_HOUR_USD
    throughput = page.value(W + "avg_generation_throughput_toks_per_s")
    cost = page.value(W + "cost_per_1k_generation_tokens_usd")
    assert throughput > 0 and math.isfinite(cost)
    # price per second * 1000 / tokens per second
    assert cost == pytest.approx(PRICE_PER_HOUR_USD / 3600 * 1000 / throughput, rel=1e-3)


def chat(gateway: Gateway, question: str) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 5,
        "temperature": 0,
    }
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=120)


def test_semantic_cache_hit_is_counted_as_a_hit(
    gateway: Gateway, cache: Cache, priced_worker: Worker
) -> None:
    gateway_metrics = f"{gateway.url}/metrics"
    question = f"What is the capital of country number {uuid.uuid4().int % 100000}?"
    g0, c0, w0 = scrape(gateway_metrics), scrape(cache.metrics_url), wait_idle(priced_worker)

    first = chat(gateway, question)
    assert first.status_code == 200, first.text
    assert first.headers["x-semantic-cache"] == "miss"
    wait_for(
        lambda: delta(c0, scrape(cache.metrics_url), "llmserve_cache_stores_total") == 1,
        what="the answer to be stored in the cache",
    )
    second = chat(gateway, question)
    assert second.status_code == 200, second.text
    assert second.headers["x-semantic-cache"] == "hit"
    assert (
        second.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    )

    g1, c1, w1 = scrape(gateway_metrics), scrape(cache.metrics_url), wait_idle(priced_worker)
    cache_requests = "llmserve_gateway_semantic_cache_requests_total"
    assert delta(g0, g1, cache_requests, result="miss") == 1
    assert delta(g0, g1, cache_requests, result="hit") == 1
    assert delta(g0, g1, cache_requests, result="bypass") == 0
    http = "llmserve_gateway_http_requests_total"
    assert delta(g0, g1, http, route="/v1/chat/completions", method="POST", status="200") == 2
    assert delta(g0, g1, "llmserve_gateway_request_duration_seconds_count", route="/v1/chat/completions") == 2
    assert delta(c0, c1, "llmserve_cache_lookups_total") == 2
    assert delta(c0, c1, "llmserve_cache_hits_total") == 1
    assert delta(c0, c1, "llmserve_cache_misses_total") == 1
    # Only the miss reached the model.
    assert delta(w0, w1, W + "request_success_total") == 1


def test_streams_are_counted_open_and_a_client_leaving_is_counted(gateway: Gateway) -> None:
    gateway_metrics = f"{gateway.url}/metrics"
    body = {
        "model": MODEL,
        "prompt": f"{uuid.uuid4().hex} Count from one to one hundred:",
        "max_tokens": 400,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    before = scrape(gateway_metrics)
    headers = {"X-Semantic-Cache": "bypass"}
    with httpx.stream(
        "POST", f"{gateway.url}/v1/completions", json=body, headers=headers, timeout=120
    ) as resp:
        assert resp.status_code == 200
        events = 0
        for line in resp.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                assert scrape(gateway_metrics).value("llmserve_gateway_open_streams") == 1
                break
    wait_for(
        lambda: delta(before, scrape(gateway_metrics), "llmserve_gateway_client_disconnects_total") == 1,
        what="the gateway to count the client that left",
    )
    after = scrape(gateway_metrics)
    assert after.value("llmserve_gateway_open_streams") == 0
    assert delta(before, after, "llmserve_gateway_semantic_cache_requests_total", result="bypass") == 1


def test_a_client_leaving_a_non_streamed_request_is_counted_once(gateway: Gateway) -> None:
    """Answered 499 inside the gateway (gateway/http_io.py until_disconnect): one disconnect, one 499."""
    gateway_metrics = f"{gateway.url}/metrics"
    body = {
        "model": MODEL,
        "prompt": f"{uuid.uuid4().hex} Count from one to one thousand:",
        "max_tokens": 900,  # seconds of decoding here, within the stack's 1024-token context
        "ignore_eos": True,
        "temperature": 0,
    }
    before = scrape(gateway_metrics)
    headers = {"X-Semantic-Cache": "bypass"}
    with pytest.raises(httpx.ReadTimeout):
        url = f"{gateway.url}/v1/completions"
        httpx.post(url, json=body, headers=headers, timeout=httpx.Timeout(120, read=1.0))
    labels = {"route": "/v1/completions", "method": "POST", "status": "499"}
    wait_for(
        lambda: delta(before, scrape(gateway_metrics), "llmserve_gateway_http_requests_total", **labels) == 1,
        what="the gateway to answer the request that lost its client",
    )
    assert delta(before, scrape(gateway_metrics), "llmserve_gateway_client_disconnects_total") == 1


def test_every_dashboard_metric_is_served_by_the_running_stack(
    gateway: Gateway, cache: Cache, priced_worker: Worker
) -> None:
    names = {
        name
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\bllmserve[a-zA-Z0-9_:]*", target["expr"])
    }
    served: set[str] = set()
    for url in (priced_worker.metrics_url, cache.metrics_url, f"{gateway.url}/metrics"):
        served |= scrape(url).declared
    assert not names - served, f"dashboard metrics no running service serves: {sorted(names - served)}"


@pytest.mark.parametrize("kind", ["worker", "cache_service", "gateway"])
def test_compose_healthcheck_command_passes_against_the_real_service(
    kind: str, gateway: Gateway, cache: Cache, priced_worker: Worker
) -> None:
    target = {
        "worker": ["grpc", priced_worker.addr],
        "cache_service": ["grpc", cache.addr],
        "gateway": ["http", f"{gateway.url}/health"],
    }[kind]
    cmd = [sys.executable, "-m", "common.healthcheck", *target]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
