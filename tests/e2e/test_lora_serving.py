"""LoRA over real processes: a worker started with WORKER_LORA_MODULES, a gateway with run-time loading on
(and an admin key); adapters named as `model` through the OpenAI SDK, /v1/models' cards, load and unload
over HTTP, a worker restart that loses a run-time adapter, the refusals, and the semantic cache keeping a name
loaded again from other weights apart from its old answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from common.gen import worker_pb2, worker_pb2_grpc
from scripts.launch import (
    Service,
    metrics_url,
    start_cache_service,
    start_gateway,
    start_redis,
    start_worker,
    worker_service,
)
from tests.support.lora_adapters import load_base, make_adapter

ADMIN_KEY = "lora-admin-key"
BASE = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("e2e-adapters")
    base = load_base()
    return {
        "sql": make_adapter(str(root / "sql"), 11, base=base, lora_alpha=32),
        "poet": make_adapter(
            str(root / "poet"), 12, ["q_proj", "v_proj", "down_proj"], base=base, lora_alpha=64
        ),
    }


@pytest.fixture(scope="module")
def lora_worker(log_dir: Path, adapters: dict[str, str]) -> Iterator[Service]:
    service = start_worker(
        "lora-worker",
        log_dir,
        WORKER_LORA_MODULES=f"sql={adapters['sql']}",
        WORKER_MAX_LORAS="2",
        WORKER_MAX_CPU_LORAS="2",
        WORKER_DTYPE="float32",
        WORKER_QUANTIZATION="none",
        WORKER_NUM_THREADS="1",
    )
    yield service
    service.stop()


@pytest.fixture(scope="module")
def lora_gateway(lora_worker: Service, log_dir: Path) -> Iterator[Service]:
    service = start_gateway(
        "lora-gateway",
        log_dir,
        lora_worker.addr,
        ready=True,
        GATEWAY_ALLOW_RUNTIME_LORA_UPDATING="true",
        GATEWAY_ADMIN_KEY=ADMIN_KEY,
        CACHE_ENABLED="false",
    )
    yield service
    service.stop()


@pytest.fixture(scope="module")
def cached_lora_gateway(lora_worker: Service, log_dir: Path) -> Iterator[Service]:
    """The LoRA worker behind a gateway with the semantic cache (and so Redis and the cache service) on."""
    redis, redis_url = start_redis(log_dir, "lora-redis")
    cache = start_cache_service("lora-cache", log_dir, redis_url)
    service = start_gateway(
        "lora-gateway-cached",
        log_dir,
        lora_worker.addr,
        ready=True,
        GATEWAY_ALLOW_RUNTIME_LORA_UPDATING="true",
        GATEWAY_ADMIN_KEY=ADMIN_KEY,
        CACHE_ENABLED="true",
        CACHE_ADDR=cache.addr,
        CACHE_TIMEOUT_MS="2000",
    )
    yield service
    service.stop()
    cache.stop()
    redis.stop()


def _chat(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=10, temperature=0)
    return reply.choices[0].message.content


def _admin(gateway: Service, route: str, body: dict, key: str | None = ADMIN_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gateway.addr}/v1/{route}", json=body, headers=headers, timeout=120)


def test_adapters_are_models_listed_with_their_parent_and_answer_differently(lora_gateway, adapters):
    client = openai.OpenAI(base_url=f"{lora_gateway.addr}/v1", api_key="none")
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {BASE, "sql"}
    assert cards["sql"].parent == BASE and cards["sql"].root == adapters["sql"]
    assert cards[BASE].parent is None
    base_text, sql_text = _chat(client, BASE), _chat(client, "sql")
    assert base_text != sql_text
    assert _chat(client, "sql") == sql_text  # greedy: the same again (and from the prefix cache)
    with pytest.raises(openai.NotFoundError):
        _chat(client, "poet")


def test_the_worker_exports_its_lora_state(lora_gateway, lora_worker):
    """vLLM's lora_requests_info (max_lora as WORKER_MAX_LORAS) and the loads from disk: the adapter of
    WORKER_LORA_MODULES at least."""
    _chat(openai.OpenAI(base_url=f"{lora_gateway.addr}/v1", api_key="none"), "sql")
    text = httpx.get(metrics_url(lora_worker, "WORKER_METRICS_PORT"), timeout=10).text
    info = [line for line in text.splitlines() if line.startswith("llmserve:lora_requests_info{")]
    assert len(info) == 1 and 'max_lora="2"' in info[0], info
    loads = [line for line in text.splitlines() if line.startswith("llmserve:lora_loads_total{")]
    assert len(loads) == 1 and float(loads[0].rsplit(" ", 1)[1]) >= 1, loads


def test_runtime_load_and_unload_over_http(lora_gateway, adapters):
    client = openai.OpenAI(base_url=f"{lora_gateway.addr}/v1", api_key="none")
    body = {"lora_name": "poet", "lora_path": adapters["poet"]}
    assert _admin(lora_gateway, "load_lora_adapter", body, key=None).status_code == 401
    assert _admin(lora_gateway, "load_lora_adapter", body, key="wrong").status_code == 401
    reply = _admin(lora_gateway, "load_lora_adapter", body)
    assert reply.status_code == 200, reply.text
    assert {m.id for m in client.models.list().data} == {BASE, "sql", "poet"}
    poet = _chat(client, "poet")
    assert poet not in (_chat(client, BASE), _chat(client, "sql"))
    again = _admin(lora_gateway, "load_lora_adapter", body)
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    bad = _admin(lora_gateway, "load_lora_adapter", {"lora_name": "x", "lora_path": "/nonexistent"})
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    assert _admin(lora_gateway, "load_lora_adapter", {"lora_name": "x"}).status_code == 400
    assert _admin(lora_gateway, "unload_lora_adapter", {"lora_name": "poet"}).status_code == 200
    assert {m.id for m in client.models.list().data} == {BASE, "sql"}
    with pytest.raises(openai.NotFoundError):
        _chat(client, "poet")
    assert _admin(lora_gateway, "unload_lora_adapter", {"lora_name": "poet"}).status_code == 404


def _routed(gateway: Service) -> dict[str, float]:
    """The gateway's routed-requests series, labels -> count."""
    prefix = "llmserve_gateway_routed_requests_total{"
    text = httpx.get(f"{gateway.addr}/metrics", timeout=10).text
    return {
        line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def test_adapters_loaded_and_unloaded_at_run_time_leave_no_metric_series(lora_gateway, adapters):
    """An operator cycling adapters for days (one per tenant, one per release) must not grow the gateway's
    series: requests for an adapter count under the base model they run on."""
    client = openai.OpenAI(base_url=f"{lora_gateway.addr}/v1", api_key="none")
    _chat(client, BASE)
    before = _routed(lora_gateway)
    names = [f"churn-{i}" for i in range(3)]
    for name in names:
        assert (
            _admin(
                lora_gateway, "load_lora_adapter", {"lora_name": name, "lora_path": adapters["poet"]}
            ).status_code
            == 200
        )
        _chat(client, name)
        assert _admin(lora_gateway, "unload_lora_adapter", {"lora_name": name}).status_code == 200
    _chat(client, "sql")  # an adapter loaded at start counts under its base model too
    after = _routed(lora_gateway)
    assert set(after) == set(before), after
    assert sum(after.values()) == sum(before.values()) + len(names) + 1


@pytest.mark.scenario
def test_a_restarted_worker_gets_the_runtime_adapters_again(log_dir, adapters):
    worker = worker_service("lora-restart-worker", log_dir, WORKER_ENABLE_LORA="true", WORKER_NUM_THREADS="1")
    worker.start()
    gateway = start_gateway(
        "lora-restart-gateway",
        log_dir,
        worker.addr,
        ready=True,
        GATEWAY_ALLOW_RUNTIME_LORA_UPDATING="true",
        CACHE_ENABLED="false",
    )
    try:
        client = openai.OpenAI(base_url=f"{gateway.addr}/v1", api_key="none")
        body = {"lora_name": "poet", "lora_path": adapters["poet"]}
        assert _admin(gateway, "load_lora_adapter", body, key=None).status_code == 200
        before = _chat(client, "poet")
        worker.stop()
        worker.start()  # same port, no adapters
        # The gateway's channel reconnects within its backoff (at most 2 s); a request sent before gets a 503.
        gateway.wait_until(lambda: httpx.get(f"{gateway.addr}/ready", timeout=30).status_code == 200, 30)
        assert _chat(client, "poet") == before  # the gateway loaded it again on the restarted worker
    finally:
        gateway.stop()
        worker.stop()


def test_runtime_routes_are_off_by_default(gateway):
    reply = httpx.post(f"{gateway.addr}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"})
    assert reply.status_code == 404
    assert "GATEWAY_ALLOW_RUNTIME_LORA_UPDATING" in reply.json()["error"]["message"]


def test_worker_without_lora_refuses_loads_and_unknown_models(worker_stub):
    with pytest.raises(grpc.RpcError) as refused:
        worker_stub.LoadLoraAdapter(worker_pb2.LoadLoraAdapterRequest(lora_name="a", lora_path="/x"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # fine request, wrong worker
    assert "WORKER_ENABLE_LORA" in refused.value.details()
    assert not worker_stub.ListLoraAdapters(worker_pb2.ListLoraAdaptersRequest()).enabled
    request = worker_pb2.GenerateRequest(
        text="hi", model="nope", params=worker_pb2.SamplingParams(max_tokens=1)
    )
    with pytest.raises(grpc.RpcError) as missing:
        list(worker_stub.Generate(request))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_lora_worker_lists_its_adapters_over_grpc(lora_worker, adapters):
    with grpc.insecure_channel(lora_worker.addr) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        listing = stub.ListLoraAdapters(worker_pb2.ListLoraAdaptersRequest())
    assert listing.enabled and listing.max_loras == 2 and listing.max_lora_rank == 16
    assert [(a.name, a.path) for a in listing.adapters if a.name == "sql"] == [("sql", adapters["sql"])]


def _cached_chat(gateway: Service, model: str, cache: str | None = None) -> tuple[str, str]:
    """(answer, X-Semantic-Cache) of the module's question; `cache`: the request's X-Semantic-Cache."""
    body = {"model": model, "messages": QUESTION, "max_tokens": 10, "temperature": 0}
    headers = {"X-Semantic-Cache": cache} if cache else {}
    reply = httpx.post(f"{gateway.addr}/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"], reply.headers["x-semantic-cache"]


def test_a_name_loaded_again_from_other_weights_never_gets_the_old_answers(cached_lora_gateway, adapters):
    gateway = cached_lora_gateway
    load_a = {"lora_name": "ad-c", "lora_path": adapters["sql"]}
    assert _admin(gateway, "load_lora_adapter", load_a).status_code == 200
    try:
        answer_a, status = _cached_chat(gateway, "ad-c")
        assert status == "miss"
        assert _cached_chat(gateway, "ad-c") == (answer_a, "hit")
        assert _admin(gateway, "unload_lora_adapter", {"lora_name": "ad-c"}).status_code == 200
        load_b = {"lora_name": "ad-c", "lora_path": adapters["poet"]}
        assert _admin(gateway, "load_lora_adapter", load_b).status_code == 200
        answer_b, status = _cached_chat(gateway, "ad-c")
        assert status == "miss"
        assert (answer_b, "bypass") == _cached_chat(gateway, "ad-c", cache="bypass")
        assert answer_b != answer_a
        assert _cached_chat(gateway, "ad-c") == (answer_b, "hit")  # B's answers are cached in turn
    finally:
        _admin(gateway, "unload_lora_adapter", {"lora_name": "ad-c"})


def test_an_adapter_may_not_take_a_served_models_name(cached_lora_gateway, adapters):
    client = openai.OpenAI(base_url=f"{cached_lora_gateway.addr}/v1", api_key="none")
    not_adapters = [m.id for m in client.models.list().data if getattr(m, "parent", None) is None]
    assert BASE in not_adapters and len(not_adapters) == 2  # the base model and the embedding model
    embedding_model = next(name for name in not_adapters if name != BASE)  # only the gateway knows it
    for name in (embedding_model, BASE):
        reply = _admin(
            cached_lora_gateway, "load_lora_adapter", {"lora_name": name, "lora_path": adapters["sql"]}
        )
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "lora_name" and "served model" in error["message"]
    assert sorted(m.id for m in client.models.list().data) == sorted([*not_adapters, "sql"])
