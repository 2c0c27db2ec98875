"""The gateway's semantic cache wiring against a real Redis and a real cache service."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.e2e.conftest import (
    MODEL_NAME,
    ROOT,
    Service,
    free_port,
    grpc_serving,
    start_gateway,
    start_service,
    wait_until,
)

QUESTION = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 8,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def redis_url(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    data_dir = tmp_path_factory.mktemp("redis")
    args = [
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    log_path = log_dir / "redis.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(ROOT / ".venv/bin/redis-server"), *args], stdout=log, stderr=subprocess.STDOUT
        )
    service = Service("redis", proc, log_path, f"127.0.0.1:{port}")
    wait_until(service, lambda: redis.Redis(host="127.0.0.1", port=port).ping(), timeout_s=30)
    yield f"redis://127.0.0.1:{port}/0"
    service.stop()


@pytest.fixture(scope="module")
def cache_service(redis_url: str, log_dir: Path) -> Iterator[Service]:
    port = free_port()
    env = {"CACHE_PORT": str(port), "CACHE_METRICS_PORT": str(free_port()), "REDIS_URL": redis_url}
    service = start_service("cache", "cache_service", env, f"127.0.0.1:{port}", log_dir)
    wait_until(service, lambda: grpc_serving(service.addr))
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
    response = httpx.post(f"{gateway.addr}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response


def test_miss_then_hit(cached_gateway: Service) -> None:
    first = ask(cached_gateway, QUESTION)
    assert first.headers["x-semantic-cache"] == "miss"
    deadline = time.monotonic() + 20  # the store runs in the background
    while (again := ask(cached_gateway, QUESTION)).headers["x-semantic-cache"] != "hit":
        assert time.monotonic() < deadline, "the answer was never stored"
        time.sleep(0.2)
    assert float(again.headers["x-semantic-cache-similarity"]) > 0.99
    body, cached = first.json(), again.json()
    assert cached["choices"][0]["message"] == body["choices"][0]["message"]
    assert cached["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"]
    assert cached["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]
    assert cached["object"] == "chat.completion" and cached["id"] != body["id"]

    with httpx.stream(
        "POST", f"{cached_gateway.addr}/v1/chat/completions", json=QUESTION | {"stream": True}, timeout=60
    ) as streamed:
        assert streamed.headers["x-semantic-cache"] == "hit"
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == body["choices"][0]["message"]["content"]


def test_bypass_cases(cached_gateway: Service) -> None:
    bypass = {"X-Semantic-Cache": "bypass"}
    assert ask(cached_gateway, QUESTION, bypass).headers["x-semantic-cache"] == "bypass"
    assert ask(cached_gateway, QUESTION | {"temperature": 1.0}).headers["x-semantic-cache"] == "bypass"
    assert ask(cached_gateway, QUESTION | {"n": 2}).headers["x-semantic-cache"] == "bypass"
    assert ask(cached_gateway, QUESTION | {"logprobs": True}).headers["x-semantic-cache"] == "bypass"


def test_answers_are_scoped_per_user(cached_gateway: Service) -> None:
    body = QUESTION | {"user": "someone-else"}
    assert ask(cached_gateway, body).headers["x-semantic-cache"] == "miss"


def test_gateway_serves_without_the_cache(cached_gateway: Service, cache_service: Service) -> None:
    cache_service.stop()
    response = ask(cached_gateway, QUESTION | {"user": "after-the-cache-died"})
    assert response.headers["x-semantic-cache"] == "miss"
    assert response.json()["choices"][0]["message"]["content"]
    metrics = httpx.get(f"{cached_gateway.addr}/metrics", timeout=30).text
    assert 'llmserve_gateway_semantic_cache_requests_total{result="error"}' in metrics
    assert 'llmserve_gateway_semantic_cache_requests_total{result="hit"}' in metrics
