"""Gateway + worker + cache service + Redis as real processes: hit/miss headers end to end, and the gateway
serving from the worker while the cache service is down."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.cache.procs import CacheService, Proc, start_cache_service
from tests.support.net import free_port, grpc_serving

MODEL = "SmolLM2-135M-Instruct"


@dataclass
class Stack:
    cache: CacheService
    worker: Proc
    gateway: Proc
    base: str


def _http_ready(url: str) -> bool:
    return httpx.get(url, timeout=1.0).status_code == 200


@pytest.fixture(scope="module")
def stack(log_dir: Path, redis_url: str) -> Iterator[Stack]:
    cache = start_cache_service(log_dir, redis_url, name="gw-cache")
    wport, gport = free_port(), free_port()
    worker = Proc(
        "worker",
        [sys.executable, "-m", "worker"],
        {
            "WORKER_PORT": str(wport),
            "WORKER_METRICS_PORT": str(free_port()),
            "WORKER_KV_CACHE_GB": "0.25",
            "WORKER_MAX_NUM_SEQS": "8",
        },
        log_dir / "worker.log",
        lambda: grpc_serving(f"127.0.0.1:{wport}"),
    )
    base = f"http://127.0.0.1:{gport}"
    gateway = Proc(
        "gateway",
        [sys.executable, "-m", "gateway"],
        {
            "GATEWAY_PORT": str(gport),
            "WORKER_ADDR": f"127.0.0.1:{wport}",
            "CACHE_ADDR": cache.addr,
            "CACHE_TIMEOUT_MS": "500",
        },
        log_dir / "gateway.log",
        lambda: _http_ready(f"{base}/ready"),
    )
    try:
        worker.start()
        gateway.start()
        yield Stack(cache, worker, gateway, base)
    finally:
        gateway.stop()
        worker.stop()
        cache.proc.stop()


def chat(base: str, question: str, user: str = "tester", **extra: object) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 12,
        "user": user,
    } | extra
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)


def first_hit(base: str, question: str, **kw: object) -> httpx.Response:
    """The store after a miss runs in the background: poll (bounded) until it has landed."""
    deadline = time.monotonic() + 15
    while True:
        resp = chat(base, question, **kw)
        if resp.headers.get("x-semantic-cache") == "hit" or time.monotonic() > deadline:
            return resp
        time.sleep(0.2)


def test_miss_then_hit_with_same_answer(stack: Stack) -> None:
    miss = chat(stack.base, "What is the capital of France?")
    assert miss.status_code == 200
    assert miss.headers["x-semantic-cache"] == "miss"
    text = miss.json()["choices"][0]["message"]["content"]
    hit = first_hit(stack.base, "What is the capital of France?")
    assert hit.headers["x-semantic-cache"] == "hit"
    body = hit.json()
    assert body["choices"][0]["message"]["content"] == text
    assert body["choices"][0]["finish_reason"] == miss.json()["choices"][0]["finish_reason"]

    para = chat(stack.base, "Which city is the capital of France?")
    assert para.headers["x-semantic-cache"] == "hit"
    assert 0 < float(para.headers["x-semantic-cache-similarity"]) < 1
    assert para.json()["choices"][0]["message"]["content"] == text


def test_hard_negative_other_tenant_and_hot_sampling_go_to_the_worker(stack: Stack) -> None:
    chat(stack.base, "How do I turn on dark mode?")
    assert first_hit(stack.base, "How do I turn on dark mode?").headers["x-semantic-cache"] == "hit"
    assert chat(stack.base, "How do I turn off dark mode?").headers["x-semantic-cache"] == "miss"
    assert (
        chat(stack.base, "How do I turn on dark mode?", user="someone-else").headers["x-semantic-cache"]
        == "miss"
    )
    hot = chat(stack.base, "How do I turn on dark mode?", temperature=0.8)
    assert hot.status_code == 200 and hot.headers["x-semantic-cache"] == "bypass"


def test_streamed_hit(stack: Stack) -> None:
    miss = chat(stack.base, "Name a primary color.")
    text = miss.json()["choices"][0]["message"]["content"]
    first_hit(stack.base, "Name a primary color.")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a primary color."}],
        "temperature": 0,
        "max_tokens": 12,
        "user": "tester",
        "stream": True,
    }
    with httpx.stream("POST", f"{stack.base}/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.headers["x-semantic-cache"] == "hit"
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    streamed = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in json.loads(e)["choices"])
    assert streamed == text


def test_gateway_serves_while_cache_service_is_down(stack: Stack) -> None:
    stack.cache.proc.stop()
    started = time.monotonic()
    resp = chat(stack.base, "What is the capital of Spain?")
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"]
    assert resp.headers["x-semantic-cache"] in ("miss", "error")
    assert time.monotonic() - started < 60
    again = chat(stack.base, "What is the capital of France?")  # was a hit before: now served by the worker
    assert again.status_code == 200 and again.headers["x-semantic-cache"] != "hit"
    metrics = httpx.get(f"{stack.base}/metrics", timeout=5).text
    assert "llmserve_gateway_semantic_cache_requests_total" in metrics
