"""A fleet behind real gateways: several models, two gateways choosing alike, and workers that drain,
stop (SIGSTOP) or die mid-stream while requests keep being served by the others."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.gen import worker_pb2
from gateway.routing.key import routing_key
from gateway.routing.router import ranking
from scripts.launch import free_port, http_ok, start_gateway, start_together
from tests.observability.stack import Gateway, Worker, gateway_service, running, scrape, worker_service
from tests.support.net import wait_for

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
OTHER = "smol-other"  # the same weights served under another name: a second model, cheaply
ROUTED = "llmserve_gateway_routed_requests_total"


@pytest.fixture(scope="module")
def workers(worker_pair: tuple[Worker, Worker]) -> tuple[Worker, Worker]:
    return running(worker_pair)


@pytest.fixture(scope="module")
def other(log_dir: Path) -> Iterator[Worker]:
    c = worker_service(log_dir, "fleet_other", WORKER_SERVED_MODEL_NAME=OTHER, WORKER_MAX_MODEL_LEN="512")
    c.service.start()
    yield c
    c.service.stop()


def tenant_of(worker: Worker, workers: tuple[Worker, Worker], skip: int = 0) -> str:
    """A prompt (a tenant of its own) that cache-aware routing gives `worker` while both are idle."""
    addrs = [w.addr for w in workers]
    for i in range(1000):
        prompt = f"Tenant {worker.port}-{i} says: once upon a time"
        key = routing_key(worker_pb2.GenerateRequest(model=MODEL, text=prompt))
        if ranking(key, addrs)[0] == worker.addr:
            if skip == 0:
                return prompt
            skip -= 1
    raise AssertionError("no tenant found")


def complete(url: str, prompt: str, model: str = MODEL, max_tokens: int = 3) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def routed(gateway_url: str, worker: Worker) -> float:
    return scrape(f"{gateway_url}/metrics").value(ROUTED, worker=worker.addr)


def routable(gateway_url: str, worker: Worker) -> float:
    return scrape(f"{gateway_url}/metrics").value("llmserve_gateway_worker_routable", worker=worker.addr)


def stream_events(url: str, prompt: str, on_first: object, max_tokens: int = 400) -> list[dict]:
    """A streamed completion's events; `on_first()` runs once the first token is in."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    events: list[dict] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
                if len(events) == 1:
                    on_first()  # type: ignore[operator]
    return events


def test_two_models_behind_one_gateway(log_dir: Path, workers: tuple[Worker, Worker], other: Worker) -> None:
    a, _ = workers
    gateway = gateway_service(log_dir, f"{MODEL}={a.addr},{OTHER}={other.addr}", None, "gateway_models")
    gateway.service.start()
    try:
        models = httpx.get(f"{gateway.url}/v1/models", timeout=30).json()["data"]
        assert sorted(m["id"] for m in models) == sorted([MODEL, OTHER])
        assert {m["id"]: m["max_model_len"] for m in models}[OTHER] == 512
        for model, worker in ((MODEL, a), (OTHER, other)):
            before = routed(gateway.url, worker)
            assert complete(gateway.url, "Hello there", model).status_code == 200
            assert routed(gateway.url, worker) == before + 1
        missing = complete(gateway.url, "Hello", "no-such-model")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        tokenized = httpx.post(f"{gateway.url}/tokenize", json={"model": OTHER, "prompt": "Hi"}, timeout=30)
        assert tokenized.json()["max_model_len"] == 512
        for route, body in (("tokenize", {"prompt": "Hi"}), ("detokenize", {"tokens": [1, 2]})):
            # Whose tokenizer? Any worker's answer would be a count or text of some model, silently.
            unnamed = httpx.post(f"{gateway.url}/{route}", json=body, timeout=30)
            assert unnamed.status_code == 400 and unnamed.json()["error"]["param"] == "model"
            assert MODEL in unnamed.json()["error"]["message"] and OTHER in unnamed.json()["error"]["message"]
        assert httpx.get(f"{gateway.url}/ready", timeout=30).json()["models"] == [MODEL, OTHER]
    finally:
        gateway.service.stop()
    dead = f"127.0.0.1:{free_port()}"
    lacking = start_gateway("gateway_lacking", log_dir, f"{MODEL}={a.addr},absent-model={dead}")
    try:
        ready = httpx.get(f"{lacking.addr}/ready", timeout=30)
        assert ready.status_code == 503 and "absent-model" in ready.json()["error"]["message"]
        assert MODEL not in ready.json()["error"]["message"].split("(")[0]
    finally:
        lacking.stop()


def test_two_gateways_send_each_tenant_to_the_same_worker(
    log_dir: Path, workers: tuple[Worker, Worker]
) -> None:
    addr = ",".join(w.addr for w in workers)
    one, two = (gateway_service(log_dir, addr, None, f"gateway_{n}") for n in ("one", "two"))
    start_together([one.service, two.service])
    try:
        for worker in workers:
            for skip in range(3):
                prompt = tenant_of(worker, workers, skip)
                for gateway in (one, two):
                    before = routed(gateway.url, worker)
                    assert complete(gateway.url, prompt).status_code == 200
                    assert routed(gateway.url, worker) == before + 1, (gateway.url, prompt)
    finally:
        one.service.stop()
        two.service.stop()


@pytest.fixture
def fleet_gateway(log_dir: Path, workers: tuple[Worker, Worker]) -> Iterator[Gateway]:
    addr = ",".join(w.addr for w in workers)
    gateway = gateway_service(log_dir, addr, None, "gateway_faults", GATEWAY_STREAM_STALL_S="4")
    gateway.service.start()
    for worker in workers:
        wait_for(lambda w=worker: routable(gateway.url, w) == 1, timeout_s=30, what="both workers to report")
    yield gateway
    gateway.service.stop()


@pytest.mark.scenario
def test_a_stopped_worker_leaves_routing_and_its_stream_ends_with_an_error(
    fleet_gateway: Gateway, workers: tuple[Worker, Worker]
) -> None:
    a, b = workers
    assert b.service.proc is not None
    pid = b.service.proc.pid
    try:
        events = stream_events(fleet_gateway.url, tenant_of(b, workers), lambda: os.kill(pid, signal.SIGSTOP))
        assert "error" in events[-1] and events[-1]["error"]["code"] == "worker_stalled"
        wait_for(lambda: routable(fleet_gateway.url, b) == 0, timeout_s=5, what="the stopped worker to leave")
        before = routed(fleet_gateway.url, a)
        assert complete(fleet_gateway.url, tenant_of(b, workers, 1)).status_code == 200
        assert routed(fleet_gateway.url, a) == before + 1
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: routable(fleet_gateway.url, b) == 1, timeout_s=30, what="the worker to come back")
    before = routed(fleet_gateway.url, b)
    assert complete(fleet_gateway.url, tenant_of(b, workers, 2)).status_code == 200
    assert routed(fleet_gateway.url, b) == before + 1


@pytest.mark.scenario
def test_a_draining_worker_gets_no_new_request(
    fleet_gateway: Gateway, workers: tuple[Worker, Worker]
) -> None:
    """SIGTERM while a stream runs there: the stream finishes, new requests for its tenants go to the other
    worker straight away (none is refused first), then the worker exits and is restarted for the next test."""
    a, b = workers
    assert b.service.proc is not None
    proc = b.service.proc
    errors = scrape(f"{fleet_gateway.url}/metrics").value("llmserve_gateway_worker_errors_total")
    before = routed(fleet_gateway.url, a)

    def drain_and_ask() -> None:
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: routable(fleet_gateway.url, b) == 0, timeout_s=5, what="the drain to be reported")
        for skip in range(3):
            assert complete(fleet_gateway.url, tenant_of(b, workers, skip)).status_code == 200

    events = stream_events(fleet_gateway.url, tenant_of(b, workers, 3), drain_and_ask, max_tokens=60)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert routed(fleet_gateway.url, a) == before + 3
    assert scrape(f"{fleet_gateway.url}/metrics").value("llmserve_gateway_worker_errors_total") == errors
    proc.wait(timeout=60)
    b.service.start()


@pytest.mark.scenario
def test_a_killed_workers_stream_ends_with_an_error_and_new_requests_go_on(
    fleet_gateway: Gateway, workers: tuple[Worker, Worker]
) -> None:
    a, b = workers
    events = stream_events(fleet_gateway.url, tenant_of(b, workers), b.service.kill)
    # ended by the broken connection (service_unavailable), not by the stall timer (worker_stalled)
    assert "error" in events[-1] and events[-1]["error"]["code"] == "service_unavailable"
    before = routed(fleet_gateway.url, a)
    for skip in range(1, 4):
        assert complete(fleet_gateway.url, tenant_of(b, workers, skip)).status_code == 200
    assert routed(fleet_gateway.url, a) == before + 3
    assert http_ok(f"{fleet_gateway.url}/ready")
