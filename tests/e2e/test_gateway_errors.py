"""Every gateway error case over real HTTP, plus replica failover and aborts when a client goes away."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from common.gen import worker_pb2 as pb
from common.gen import worker_pb2_grpc
from scripts.launch import MODEL_NAME, Service, start_gateway, start_worker
from tests.e2e.conftest import wait_for_idle

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
LONG = {"model": MODEL_NAME, "prompt": "Write a long story.", "max_tokens": 1500, "ignore_eos": True}


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"stop": 3}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"stream": "yes"}, "stream"),
        ({"seed": "1"}, "seed"),
        ({"model": None}, "model"),
        ({"echo": True}, "echo"),
        # vLLM's extensions that would change the output and are not implemented: refused, not ignored
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
        ({"skip_special_tokens": "no"}, "skip_special_tokens"),
        ({"continue_final_message": True}, "continue_final_message"),  # add_generation_prompt is true
        # the last message is the user's: nothing to continue
        ({"continue_final_message": True, "add_generation_prompt": False}, "continue_final_message"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),  # the worker's check
        ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),
        ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
        ({"allowed_token_ids": [10**9]}, "allowed_token_ids"),  # past the vocabulary: the worker's check
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
            "response_format",
        ),
        ({"bad_words": [""]}, "bad_words"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ],
)
def test_invalid_chat_params_are_400(http: httpx.Client, change: dict, param: str) -> None:
    assert_openai_error(http.post("/v1/chat/completions", json=CHAT | change), 400, param)


def test_invalid_completion_params_are_400(http: httpx.Client) -> None:
    base = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2}
    for change, param in [
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt": ["a", [1]]}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"suffix": "x"}, "suffix"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"best_of": 3}, "best_of"),  # the best of several samples: not ranked here
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"best_of": 0}, "best_of"),
        # the worker's refusals name the field too
        ({"prompt": ""}, "prompt"),
        ({"prompt": [10**6]}, "prompt"),  # past the vocabulary
        ({"prompt": [[1], [10**6]]}, "prompt"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
            "response_format",
        ),
    ]:
        assert_openai_error(http.post("/v1/completions", json=base | change), 400, param)
    assert_openai_error(http.post("/detokenize", json={"tokens": [10**6]}), 400, "tokens")
    equal = http.post("/v1/completions", json=base | {"best_of": 2, "n": 2})  # best_of = n: plain sampling
    assert equal.status_code == 200 and len(equal.json()["choices"]) == 2


def test_unknown_fields_are_ignored(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=CHAT | {"frobnicate": 1, "logit_bias": {}})
    assert response.status_code == 200


def test_vllm_extensions_at_their_defaults_are_accepted(http: httpx.Client) -> None:
    defaults = {
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
        "add_generation_prompt": True,
        "continue_final_message": False,
        "chat_template_kwargs": {"date_string": "1 Dec 2026"},  # a template variable SmolLM2's ignores
        "documents": [{"title": "t", "text": "x"}],
        "echo": False,
    }
    assert http.post("/v1/chat/completions", json=CHAT | defaults).status_code == 200


def test_malformed_bodies_are_400_not_422(http: httpx.Client) -> None:
    assert_openai_error(http.post("/v1/chat/completions", content=b"{not json"), 400)
    assert_openai_error(http.post("/v1/chat/completions", content=b"[1, 2]"), 400)
    assert_openai_error(http.post("/v1/completions", data={"model": MODEL_NAME, "prompt": "x"}), 400)


def test_prompt_too_long_says_how_many_tokens(http: httpx.Client) -> None:
    messages = [{"role": "user", "content": "word " * 3000}]
    error = assert_openai_error(http.post("/v1/chat/completions", json=CHAT | {"messages": messages}), 400)
    assert "maximum context length is 2048 tokens" in error["message"]
    assert "in the messages" in error["message"] and "in the completion" in error["message"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    error = assert_openai_error(
        http.post("/v1/completions", json={**LONG, "max_tokens": 5000}), 400, "prompt"
    )
    assert "you requested 5005 tokens (5 in the messages, 5000 in the completion)" in error["message"]


def test_unknown_model_and_route_are_404(http: httpx.Client) -> None:
    error = assert_openai_error(
        http.post("/v1/chat/completions", json=CHAT | {"model": "gpt-4o"}), 404, "model"
    )
    assert error["code"] == "model_not_found"
    assert_openai_error(http.get("/v1/models/gpt-4o"), 404, "model")
    assert_openai_error(http.get("/v1/nothing-here"), 404)
    assert_openai_error(http.get("/v1/chat/completions"), 405)


def test_oversized_body_is_413(worker: Service, log_dir: Path) -> None:
    small = start_gateway("gateway-small-body", log_dir, worker.addr, GATEWAY_MAX_BODY_BYTES="4096")
    try:
        body = CHAT | {"messages": [{"role": "user", "content": "x" * 5000}]}
        assert_openai_error(httpx.post(f"{small.addr}/v1/chat/completions", json=body, timeout=30), 413)

        def chunked() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
            yield json.dumps(body).encode()

        response = httpx.post(f"{small.addr}/v1/chat/completions", content=chunked(), timeout=30)
        assert_openai_error(response, 413)
        assert httpx.post(f"{small.addr}/v1/chat/completions", json=CHAT, timeout=60).status_code == 200
    finally:
        small.stop()


def test_api_key(worker: Service, log_dir: Path) -> None:
    keyed = start_gateway("gateway-keyed", log_dir, worker.addr, API_KEY="s3cret")
    try:
        url = f"{keyed.addr}/v1/chat/completions"
        error = assert_openai_error(httpx.post(url, json=CHAT, timeout=30), 401)
        assert error["code"] == "invalid_api_key"
        wrong = {"Authorization": "Bearer nope"}
        assert_openai_error(httpx.post(url, json=CHAT, headers=wrong, timeout=30), 401)
        assert_openai_error(httpx.get(f"{keyed.addr}/v1/models", timeout=30), 401)
        right = {"Authorization": "Bearer s3cret"}
        assert httpx.post(url, json=CHAT, headers=right, timeout=60).status_code == 200
        assert httpx.get(f"{keyed.addr}/health", timeout=30).status_code == 200
    finally:
        keyed.stop()


def test_no_worker_is_503_with_retry_after(dead_addr: str, log_dir: Path) -> None:
    lonely = start_gateway("gateway-no-worker", log_dir, dead_addr)
    try:
        response = httpx.post(f"{lonely.addr}/v1/chat/completions", json=CHAT, timeout=30)
        assert_openai_error(response, 503)
        assert response.headers["retry-after"] == "1"
        assert httpx.get(f"{lonely.addr}/ready", timeout=30).status_code == 503
        assert httpx.get(f"{lonely.addr}/health", timeout=30).status_code == 200
        assert_openai_error(httpx.get(f"{lonely.addr}/v1/models", timeout=30), 503)
    finally:
        lonely.stop()


def _unavailable_errors(gateway: Service) -> float:
    metrics = httpx.get(f"{gateway.addr}/metrics", timeout=30).text
    prefix = 'llmserve_gateway_worker_errors_total{code="UNAVAILABLE"} '
    return sum(float(line.removeprefix(prefix)) for line in metrics.splitlines() if line.startswith(prefix))


def _routed(gateway: Service, worker_addr: str) -> float:
    metrics = httpx.get(f"{gateway.addr}/metrics", timeout=30).text
    prefix = f'llmserve_gateway_routed_requests_total{{model="{MODEL_NAME}",worker="{worker_addr}"}} '
    return sum(float(line.removeprefix(prefix)) for line in metrics.splitlines() if line.startswith(prefix))


def test_dead_replica_is_skipped(worker: Service, dead_addr: str, log_dir: Path) -> None:
    """A dead and a live replica: the dead one sends no load reports, so routing sends every request to
    the live one without trying the dead one first (no refused call), streamed or not."""
    pair = start_gateway("gateway-two-replicas", log_dir, f"{dead_addr},{worker.addr}", ready=True)
    try:
        before, routed = _unavailable_errors(pair), _routed(pair, worker.addr)
        for i, stream in enumerate((False, True, False, True)):
            body = CHAT | {"stream": stream, "messages": [{"role": "user", "content": f"Hi {i}"}]}
            response = httpx.post(f"{pair.addr}/v1/chat/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
        assert _unavailable_errors(pair) == before, "no request went to the dead replica"
        assert _routed(pair, worker.addr) == routed + 4
    finally:
        pair.stop()


async def test_full_queue_is_503(log_dir: Path) -> None:
    """One sequence at a time and one waiting: a third request is refused with 503, not queued."""
    env = {"WORKER_MAX_NUM_SEQS": "1", "WORKER_MAX_WAITING": "1", "WORKER_KV_CACHE_GB": "0.1"}
    busy = start_worker("worker-overload", log_dir, **env)
    front = start_gateway("gateway-overload", log_dir, busy.addr)
    body = LONG | {"max_tokens": 1000}
    try:
        with grpc.insecure_channel(busy.addr) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            async with httpx.AsyncClient(base_url=front.addr, timeout=60) as client:
                async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as running:
                    assert running.status_code == 200
                    queued = asyncio.create_task(client.post("/v1/completions", json=body))
                    deadline = time.monotonic() + 30
                    while stub.GetStats(pb.StatsRequest()).num_waiting < 1:
                        assert time.monotonic() < deadline, "the second request never queued"
                        await asyncio.sleep(0.05)
                    refused = await client.post("/v1/completions", json=body)
                    error = assert_openai_error(refused, 503)
                    assert refused.headers["retry-after"] == "1"
                    assert "queue is full" in error["message"]
                    queued.cancel()
                    await asyncio.gather(queued, return_exceptions=True)
            assert wait_for_idle(stub).num_kv_blocks_used == 0
    finally:
        front.stop()
        busy.stop()


def _open_stream_then_leave(url: str, body: dict) -> None:
    with httpx.Client(timeout=60) as client, client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)


def test_stream_disconnect_aborts_the_request(
    gateway: Service, worker_stub: worker_pb2_grpc.WorkerStub, http: httpx.Client
) -> None:
    _open_stream_then_leave(f"{gateway.addr}/v1/completions", LONG | {"stream": True})
    stats = wait_for_idle(worker_stub)
    assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_used) == (0, 0, 0)
    metrics = http.get("/metrics").text
    assert "llmserve_gateway_open_streams 0.0" in metrics


def test_non_streaming_disconnect_aborts_the_request(
    gateway: Service, worker_stub: worker_pb2_grpc.WorkerStub
) -> None:
    host, port = gateway.addr.removeprefix("http://").split(":")
    body = json.dumps(LONG).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 30
        while worker_stub.GetStats(pb.StatsRequest()).num_running == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    stats = wait_for_idle(worker_stub)
    assert (stats.num_running, stats.num_kv_blocks_used) == (0, 0)


def test_health_ready_metrics(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/ready").json() == {"status": "ready", "model": MODEL_NAME, "models": [MODEL_NAME]}
    metrics = http.get("/metrics").text
    for name in (
        "llmserve_gateway_http_requests_total",
        "llmserve_gateway_request_duration_seconds_bucket",
        "llmserve_gateway_open_streams",
        "llmserve_gateway_semantic_cache_requests_total",
        "llmserve_gateway_worker_errors_total",
    ):
        assert name in metrics
    assert 'route="/v1/chat/completions",status="400"' in metrics


def thread_cpus(pid: int) -> set[int]:
    """The CPUs any thread of the process may run on (a thread that ends meanwhile is skipped)."""
    cpus: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpus |= os.sched_getaffinity(int(task.name))
        except ProcessLookupError:
            pass
    return cpus


@pytest.mark.scenario
def test_gateway_recovers_when_the_worker_comes_back(log_dir: Path) -> None:
    """503 while the only worker is away; answers again once a worker listens on that address."""
    first = start_worker("worker-restart-1", log_dir)
    front = start_gateway("gateway-restart", log_dir, first.addr)
    port = first.addr.rsplit(":", 1)[1]
    try:
        url = f"{front.addr}/v1/chat/completions"
        assert httpx.post(url, json=CHAT, timeout=60).status_code == 200
        first.stop()
        down = httpx.post(url, json=CHAT, timeout=60)
        assert_openai_error(down, 503)
        assert httpx.get(f"{front.addr}/ready", timeout=30).status_code == 503
        # the new worker on one CPU (as `make run` gives each of several workers its own): it and every
        # thread it started keep to it
        cpu = max(os.sched_getaffinity(0))
        second = start_worker("worker-restart-2", log_dir, WORKER_PORT=port, WORKER_CPUS=str(cpu))
        try:
            assert second.proc is not None
            assert thread_cpus(second.proc.pid) == {cpu}
            deadline = time.monotonic() + 30  # the gateway's reconnect backoff is capped at 2 s
            while httpx.get(f"{front.addr}/ready", timeout=30).status_code != 200:
                assert time.monotonic() < deadline, "the gateway never reconnected"
                time.sleep(0.2)
            assert httpx.post(url, json=CHAT, timeout=60).status_code == 200
            assert thread_cpus(second.proc.pid) == {cpu}  # the model's threads too, started since
        finally:
            second.stop()
    finally:
        front.stop()
        first.stop()
