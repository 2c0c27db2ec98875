"""Two real workers behind one gateway: distinct tenants reach both, a tenant stays on its worker, and
losing one worker loses no new request."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.gen import worker_pb2
from gateway.routing.config import RoutingConfig
from gateway.routing.key import routing_key
from gateway.routing.router import ranking
from gateway.worker_pool import WorkerPool
from tests.observability.stack import Gateway, Worker, gateway_service, running, scrape, wait_idle
from tests.support.net import wait_for

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
SUCCESS = "llmserve:request_success_total"
NUM_REQUESTS = 6


@pytest.fixture(scope="module")
def workers(worker_pair: tuple[Worker, Worker]) -> tuple[Worker, Worker]:
    return running(worker_pair)


@pytest.fixture(scope="module")
def pool_gateway(log_dir: Path, workers: tuple[Worker, Worker]) -> Iterator[Gateway]:
    a, b = workers
    gateway = gateway_service(log_dir, f"{a.addr},{b.addr}", cache_addr=None)
    gateway.service.start()
    try:
        yield gateway
    finally:
        gateway.service.stop()


def complete(gateway: Gateway, prompt: str | None = None) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": prompt or f"{uuid.uuid4().hex} Once upon a time",
        "max_tokens": 3,
        "temperature": 0,
    }
    return httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=120)


def owner(prompt: str, workers: tuple[Worker, Worker]) -> str:
    """The worker cache-aware routing gives this prompt while both are idle: its key's rendezvous owner."""
    key = routing_key(worker_pb2.GenerateRequest(model=MODEL, text=prompt))
    return ranking(key, [w.addr for w in workers])[0]


def tenants_of_each(workers: tuple[Worker, Worker], per_worker: int) -> list[str]:
    """Distinct tenants' prompts, `per_worker` owned by each worker."""
    chosen: dict[str, list[str]] = {w.addr: [] for w in workers}
    for i in range(1000):
        prompt = f"Tenant {i} asks: once upon a time"
        mine = chosen[owner(prompt, workers)]
        if len(mine) < per_worker:
            mine.append(prompt)
    return [p for prompts in chosen.values() for p in prompts]


def served(worker: Worker) -> float:
    return scrape(worker.metrics_url).value(SUCCESS)


def routed(gateway: Gateway, workers: tuple[Worker, ...]) -> list[float]:
    """The calls this gateway started on each worker (a retried request counts where it ran)."""
    page = scrape(f"{gateway.url}/metrics")
    return [page.value("llmserve_gateway_routed_requests_total", worker=w.addr) for w in workers]


def retries(gateway: Gateway) -> float:
    return scrape(f"{gateway.url}/metrics").value("llmserve_gateway_routing_retries_total")


def gateway_warnings(gateway: Gateway) -> str:
    lines = gateway.service.log_tail(20_000).splitlines()
    return "\n".join(line for line in lines if " WARNING " in line or " ERROR " in line)[-3000:]


def test_distinct_tenants_reach_both_workers(pool_gateway: Gateway, workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    a0, b0 = served(a), served(b)
    for prompt in tenants_of_each(workers, NUM_REQUESTS // 2):
        response = complete(pool_gateway, prompt)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["finish_reason"] == "length"
    wait_for(lambda: served(a) - a0 + served(b) - b0 == NUM_REQUESTS, what="every request to be counted")
    assert (served(a) - a0, served(b) - b0) == (NUM_REQUESTS // 2, NUM_REQUESTS // 2)


def test_one_tenant_stays_on_one_worker(pool_gateway: Gateway, workers: tuple[Worker, Worker]) -> None:
    """A long shared start (a tenant's instructions) keys the request, whatever follows it."""
    shared = "You answer questions about the billing rules of tenant 42. " * 20
    home = next(w for w in workers if w.addr == owner(shared[:1024], workers))
    before = [served(w) for w in workers]
    routed_before, retries_before = routed(pool_gateway, workers), retries(pool_gateway)
    for question in ("When is the invoice due?", "Can I pay by card?", "What is a credit note?"):
        assert complete(pool_gateway, f"{shared}\nQ: {question}\nA:").status_code == 200
    # where the gateway sent each call, and whether one was moved (a refusal, a worker that looked stopped):
    # a routing decision and a retry fail alike below, but say which it was
    sent = [now - then for now, then in zip(routed(pool_gateway, workers), routed_before, strict=True)]
    moved = retries(pool_gateway) - retries_before
    why = f"retries {moved:.0f}; gateway log:\n{gateway_warnings(pool_gateway)}"
    assert sent == [3 if w is home else 0 for w in workers], why
    wait_for(lambda: sum(served(w) for w in workers) - sum(before) == 3, what="every request to be counted")
    counts = [served(w) - b for w, b in zip(workers, before, strict=True)]
    assert counts == [3 if w is home else 0 for w in workers], why


async def test_a_comma_list_and_a_dns_name_become_one_replica_per_address(
    workers: tuple[Worker, Worker],
) -> None:
    """WORKER_ADDR as gRPC's ipv4: list or as a name (localhost here, a headless Service in Kubernetes):
    the gateway resolves it itself, one channel per worker address, so routing sees every replica."""
    a, b = workers
    pool = WorkerPool([f"ipv4:{a.addr},{b.addr}", f"dns:///localhost:{a.port}"])
    try:
        await pool.start()
        assert sorted(r.addr for r in pool.replicas) == sorted([a.addr, b.addr])
        params = worker_pb2.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        for prompt in tenants_of_each(workers, 1):
            request = worker_pb2.GenerateRequest(model=MODEL, text=prompt, params=params)
            stream = await pool.generate(request, "prompt")
            assert stream.addr == owner(prompt, workers)
            finishes = [chunk.finish_reason async for chunk in stream.chunks()]
            assert finishes[-1] == "length"
    finally:
        await pool.close()


async def test_a_hot_tenant_spills_and_its_open_calls_are_counted_until_they_end(
    workers: tuple[Worker, Worker],
) -> None:
    """Two streams of one tenant open on its owner: the third goes to the other worker (a hot key gets no
    slack), while another tenant of the same owner still goes there (the slack holds it); once the
    streams end, whether read to the end or cancelled, no open call of any key is left counted."""
    routing = RoutingConfig(slack=4, hot_key_requests=2)
    pool = WorkerPool(",".join(w.addr for w in workers), routing=routing)
    params = worker_pb2.SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    hot, cold = tenants_of_each(workers, 2)[:2]  # two tenants with the same owner
    home = owner(hot, workers)
    assert owner(cold, workers) == home
    try:
        await pool.start()
        for _ in range(200):  # both load watchers reporting: both workers take new requests
            if all(r.tier() == 0 for r in pool.replicas):
                break
            await asyncio.sleep(0.05)
        streams = []
        for prompt in (hot, hot, hot, cold):
            request = worker_pb2.GenerateRequest(model=MODEL, text=prompt, params=params)
            streams.append(await pool.generate(request, "prompt"))
        assert [s.addr == home for s in streams] == [True, True, False, True]
        assert len(pool.key_calls) == 2 and sorted(pool.key_calls.values()) == [1, 3]
        finishes = [chunk.finish_reason async for chunk in streams[0].chunks()]
        assert finishes[-1] == "length"
        for stream in streams[1:]:
            stream.cancel()
        assert not pool.key_calls
    finally:
        await pool.close()


def test_killing_one_worker_loses_no_new_request(
    pool_gateway: Gateway, workers: tuple[Worker, Worker]
) -> None:
    a, b = workers
    b.service.kill()
    assert not b.service.alive
    a0 = wait_idle(a).value(SUCCESS)  # the calls an earlier test cancelled are counted once they end
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
