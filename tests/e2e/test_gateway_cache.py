"""The gateway's semantic cache end to end: gateway + worker + cache service + Redis as real processes.
Hit and miss headers, exact and reworded hits (plain and streamed), who never shares an answer (another
tenant, a different question, hot sampling, n, logprobs, the bypass header), and the gateway serving from
the worker while the cache service is down."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.single_flight import MAX_WAIT_S
from scripts.launch import (
    MODEL_NAME,
    Service,
    metrics_url,
    start_cache_service,
    start_gateway,
    start_redis,
)

QUESTION = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 8,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def redis_url(log_dir: Path) -> Iterator[str]:
    service, url = start_redis(log_dir)
    yield url
    service.stop()


@pytest.fixture(scope="module")
def cache_service(redis_url: str, log_dir: Path) -> Iterator[Service]:
    service = start_cache_service("cache", log_dir, redis_url)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def cached_gateway(worker: Service, cache_service: Service, log_dir: Path) -> Iterator[Service]:
    service = start_gateway(
        "gateway-cached",
        log_dir,
        worker.addr,
        CACHE_ENABLED="true",
        CACHE_ADDR=cache_service.addr,
        CACHE_TIMEOUT_MS="500",
    )
    yield service
    service.stop()


def ask(gateway: Service, body: dict, headers: dict | None = None) -> httpx.Response:
    response = httpx.post(f"{gateway.addr}/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response


def question(text: str, **fields: object) -> dict:
    return QUESTION | {"messages": [{"role": "user", "content": text}]} | fields


def first_hit(gateway: Service, body: dict) -> httpx.Response:
    """The store after a miss runs in the background: ask again (bounded) until it has landed."""
    deadline = time.monotonic() + 20
    while (again := ask(gateway, body)).headers["x-semantic-cache"] != "hit":
        assert time.monotonic() < deadline, "the answer was never stored"
        time.sleep(0.2)
    return again


def streamed_text(gateway: Service, body: dict) -> str:
    with httpx.stream("POST", f"{gateway.addr}/v1/chat/completions", json=body, timeout=60) as streamed:
        assert streamed.headers["x-semantic-cache"] == "hit"
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    return "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])


def test_miss_then_exact_reworded_and_streamed_hits(cached_gateway: Service) -> None:
    first = ask(cached_gateway, QUESTION)
    assert first.headers["x-semantic-cache"] == "miss"
    again = first_hit(cached_gateway, QUESTION)
    assert float(again.headers["x-semantic-cache-similarity"]) > 0.99
    body, cached = first.json(), again.json()
    assert cached["choices"][0]["message"] == body["choices"][0]["message"]
    assert cached["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"]
    assert cached["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]
    assert cached["object"] == "chat.completion" and cached["id"] != body["id"]
    text = body["choices"][0]["message"]["content"]

    reworded = ask(cached_gateway, question("Tell me the capital of France."))
    assert reworded.headers["x-semantic-cache"] == "hit"
    assert 0 < float(reworded.headers["x-semantic-cache-similarity"]) < 1
    assert reworded.json()["choices"][0]["message"]["content"] == text

    assert streamed_text(cached_gateway, QUESTION | {"stream": True}) == text


def test_bypass_cases(cached_gateway: Service) -> None:
    bypass = {"X-Semantic-Cache": "bypass"}
    assert ask(cached_gateway, QUESTION, bypass).headers["x-semantic-cache"] == "bypass"
    assert ask(cached_gateway, QUESTION | {"temperature": 1.0}).headers["x-semantic-cache"] == "bypass"
    assert ask(cached_gateway, QUESTION | {"temperature": 0.8}).headers["x-semantic-cache"] == "bypass"
    assert ask(cached_gateway, QUESTION | {"n": 2}).headers["x-semantic-cache"] == "bypass"
    assert ask(cached_gateway, QUESTION | {"logprobs": True}).headers["x-semantic-cache"] == "bypass"


def test_hard_negative_and_other_tenants_go_to_the_worker(cached_gateway: Service) -> None:
    dark_on = question("How do I turn on dark mode?", user="tester")
    ask(cached_gateway, dark_on)
    first_hit(cached_gateway, dark_on)
    off = question("How do I turn off dark mode?", user="tester")
    assert ask(cached_gateway, off).headers["x-semantic-cache"] == "miss"
    assert ask(cached_gateway, dark_on | {"user": "someone-else"}).headers["x-semantic-cache"] == "miss"
    assert ask(cached_gateway, QUESTION | {"user": "someone-else"}).headers["x-semantic-cache"] == "miss"


def called(city: str) -> list[dict]:
    """A conversation whose history holds a tool call (rendered into the prompt without `tools` too)."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "weather", "arguments": f'{{"city": "{city}"}}'},
    }
    return [
        {"role": "user", "content": "What's the weather like?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "Which city did you look up?"},
    ]


def test_a_history_with_tool_calls_never_shares_an_answer(cached_gateway: Service) -> None:
    """The cache keys text turns only: a call's arguments would not be in the key, so "London" got the
    answer of "Paris" as an exact hit. Such a conversation bypasses the cache, like a request with tools."""
    paris = ask(cached_gateway, QUESTION | {"messages": called("Paris"), "user": "tool-history"})
    time.sleep(1.0)  # room for a background store to land
    london = ask(cached_gateway, QUESTION | {"messages": called("London"), "user": "tool-history"})
    assert paris.headers["x-semantic-cache"] == london.headers["x-semantic-cache"] == "bypass"


def worker_requests(worker: Service) -> float:
    """Requests the worker finished (every finish reason): how many generations it ran."""
    text = httpx.get(metrics_url(worker, "WORKER_METRICS_PORT"), timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "llmserve:request_success_total"
    )


def test_identical_requests_in_flight_share_one_generation(cached_gateway: Service, worker: Service) -> None:
    """Asked three times at once, a question no cache entry answers yet is generated once: the first asker
    generates, the others wait for its answer (X-Semantic-Cache: hit), streamed or not."""
    body = question(
        "Write one sentence about the history of the bicycle.", max_tokens=48, ignore_eos=True, user="burst"
    )
    before, shared_before = worker_requests(worker), gateway_counter(cached_gateway, "shared_generations")
    with ThreadPoolExecutor(3) as pool:
        plain = [pool.submit(ask, cached_gateway, body) for _ in range(2)]
        streamed = pool.submit(streamed_body, cached_gateway, body | {"stream": True})
        responses = [f.result() for f in plain]
        stream_status, stream_text = streamed.result()
    statuses = sorted([r.headers["x-semantic-cache"] for r in responses] + [stream_status])
    assert statuses == ["hit", "hit", "miss"]
    texts = {r.json()["choices"][0]["message"]["content"] for r in responses} | {stream_text}
    assert len(texts) == 1 and texts != {""}
    assert worker_requests(worker) - before == 1
    assert gateway_counter(cached_gateway, "shared_generations") - shared_before == 2


def test_a_waiter_generates_itself_when_the_first_asker_leaves(
    cached_gateway: Service, worker: Service
) -> None:
    body = question(
        "Write one sentence about the history of the telescope.",
        max_tokens=96,
        ignore_eos=True,
        user="leaver",
    )
    with ThreadPoolExecutor(1) as pool:
        with httpx.stream(
            "POST", f"{cached_gateway.addr}/v1/chat/completions", json=body | {"stream": True}, timeout=60
        ) as leaving:
            assert leaving.headers["x-semantic-cache"] == "miss"
            waiting = pool.submit(ask, cached_gateway, body)
            time.sleep(0.3)  # the second request is waiting on the first's generation
            left = time.monotonic()
        # the first client left before its answer was complete: the second generates its own, at once
        # rather than after giving up on the first (MAX_WAIT_S)
        response = waiting.result()
    assert time.monotonic() - left < MAX_WAIT_S / 2
    assert response.headers["x-semantic-cache"] == "miss"
    assert response.json()["choices"][0]["message"]["content"]


def streamed_body(gateway: Service, body: dict) -> tuple[str, str]:
    with httpx.stream("POST", f"{gateway.addr}/v1/chat/completions", json=body, timeout=120) as streamed:
        status = streamed.headers["x-semantic-cache"]
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    return status, "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])


def test_gateway_serves_without_the_cache(cached_gateway: Service, cache_service: Service) -> None:
    first_hit(cached_gateway, QUESTION)  # a hit while the cache is up
    cache_service.stop()
    started = time.monotonic()
    response = ask(cached_gateway, QUESTION | {"user": "after-the-cache-died"})
    assert response.headers["x-semantic-cache"] == "miss"
    assert response.json()["choices"][0]["message"]["content"]
    assert time.monotonic() - started < 60
    again = ask(cached_gateway, QUESTION)  # a hit before: now answered by the worker
    assert again.headers["x-semantic-cache"] != "hit"
    assert cache_requests(cached_gateway, "error") >= 1
    assert cache_requests(cached_gateway, "hit") >= 1


def gateway_counter(gateway: Service, name: str) -> float:
    """One of the gateway's unlabelled counters, llmserve_gateway_<name>_total."""
    text = httpx.get(f"{gateway.addr}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"llmserve_gateway_{name}_total":
                return sample.value
    raise AssertionError(f"no llmserve_gateway_{name}_total")


def cache_requests(gateway: Service, result: str) -> float:
    """The gateway's llmserve_gateway_semantic_cache_requests_total for one result (exported from 0)."""
    text = httpx.get(f"{gateway.addr}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "llmserve_gateway_semantic_cache_requests_total":
                if sample.labels.get("result") == result:
                    return sample.value
    raise AssertionError(f"no semantic cache series for result={result!r}")
