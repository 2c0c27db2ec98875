"""Two real workers behind one gateway: requests reach both, and losing one loses no new request."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.gen import worker_pb2
from gateway.worker_pool import WorkerPool
from tests.observability.stack import Gateway, Worker, gateway_service, scrape, worker_service
from tests.support.net import wait_for

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
SUCCESS = "llmserve:request_success_total"
NUM_REQUESTS = 6


@pytest.fixture(scope="module")
def workers(log_dir: Path) -> Iterator[tuple[Worker, Worker]]:
    a = worker_service(log_dir, "worker_a")
    b = worker_service(log_dir, "worker_b")
    a.service.start()
    try:
        b.service.start()
        try:
            yield a, b
        finally:
            b.service.stop()
    finally:
        a.service.stop()


@pytest.fixture(scope="module")
def pool_gateway(log_dir: Path, workers: tuple[Worker, Worker]) -> Iterator[Gateway]:
    a, b = workers
    gateway = gateway_service(log_dir, f"{a.addr},{b.addr}", cache_addr=None)
    gateway.service.start()
    try:
        yield gateway
    finally:
        gateway.service.stop()


def complete(gateway: Gateway) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": f"{uuid.uuid4().hex} Once upon a time",
        "max_tokens": 3,
        "temperature": 0,
    }
    return httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=120)


def served(worker: Worker) -> float:
    return scrape(worker.metrics_url).value(SUCCESS)


def test_requests_reach_both_workers(pool_gateway: Gateway, workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    a0, b0 = served(a), served(b)
    for _ in range(NUM_REQUESTS):
        response = complete(pool_gateway)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["finish_reason"] == "length"
    wait_for(lambda: served(a) - a0 + served(b) - b0 == NUM_REQUESTS, what="every request to be counted")
    assert served(a) - a0 >= 1 and served(b) - b0 >= 1, (served(a) - a0, served(b) - b0)


async def test_one_target_naming_several_workers_spreads_calls(workers: tuple[Worker, Worker]) -> None:
    """What compose's WORKER_ADDR=dns:///worker:50051 becomes with --scale worker=N: one gRPC target that
    resolves to every replica. (An ipv4: target lists the two local addresses, as DNS would answer.)
    gRPC connects to the addresses in the background, so up to 20 calls are given to reach both."""
    a, b = workers
    pool = WorkerPool([f"ipv4:{a.addr},{b.addr}"])
    a0, b0 = served(a), served(b)
    params = worker_pb2.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    calls = 0
    try:
        while calls < 20 and not (served(a) > a0 and served(b) > b0):
            request = worker_pb2.GenerateRequest(text=f"{uuid.uuid4().hex} hello", params=params)
            stream = await pool.generate(request, "prompt")
            finishes = [chunk.finish_reason async for chunk in stream.chunks()]
            assert finishes[-1] == "length"
            calls += 1
            wait_for(lambda n=calls: served(a) - a0 + served(b) - b0 == n, what="the call to be counted")
    finally:
        await pool.close()
    assert served(a) > a0 and served(b) > b0, (
        f"{calls} calls: {served(a) - a0} to one, {served(b) - b0} to the other"
    )


def test_killing_one_worker_loses_no_new_request(
    pool_gateway: Gateway, workers: tuple[Worker, Worker]
) -> None:
    a, b = workers
    b.service.kill()
    assert not b.service.alive
    a0 = served(a)
    for _ in range(NUM_REQUESTS):
        response = complete(pool_gateway)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 3
    wait_for(lambda: served(a) - a0 == NUM_REQUESTS, what="the surviving worker to serve every request")
    assert httpx.get(f"{pool_gateway.url}/ready", timeout=10).status_code == 200


def test_gateway_accepts_the_compose_dns_target(log_dir: Path, workers: tuple[Worker, Worker]) -> None:
    """docker-compose.yml gives WORKER_ADDR=dns:///worker:50051; here the same form names one local worker."""
    a, _ = workers
    gateway = gateway_service(log_dir, f"dns:///127.0.0.1:{a.port}", cache_addr=None)
    gateway.service.start()
    try:
        a0 = served(a)
        response = complete(gateway)
        assert response.status_code == 200, response.text
        wait_for(lambda: served(a) - a0 == 1, what="the request to reach the worker")
    finally:
        gateway.service.stop()
