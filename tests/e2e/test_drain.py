"""Time and shutdown on real processes: a hung engine turns readiness off and back on, SIGTERM drains
each service with streams in flight and exits 0, and a worker killed mid-stream ends every stream
with an OpenAI error event and [DONE] (a non-streaming request runs again on another worker, within its
deadline, or gets a 503 when there is none).

Streams are held in flight on purpose with the worker's test hook WORKER_DEBUG_STALL_FILE: while that
file exists the engine loop does not step.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest

from common.gen import worker_pb2 as pb
from common.gen import worker_pb2_grpc
from scripts.launch import MODEL_NAME, Service, grpc_serving, start_gateway, start_worker
from tests.e2e.conftest import wait_for_idle
from tests.e2e.test_deadlines import reason_of
from tests.support.net import wait_for

pytestmark = pytest.mark.scenario  # SIGTERM drains, kills and hangs: `make test-scenarios`

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Tell me a story."}]}
EXIT_TIMEOUT_S = 30
WORKER_DRAIN_TIMEOUT_S = 6  # the held worker's: short streams finish within it, a long one is cut


def stream_chat(url: str, max_tokens: int, started: threading.Event) -> list[str]:
    """An SSE chat stream read to its end; returns the data payloads."""
    body = CHAT | {"stream": True, "max_tokens": max_tokens, "ignore_eos": True}
    events = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                started.set()
    return events


def finish_reasons(events: list[str]) -> list[str]:
    reasons = []
    for event in events:
        if event != "[DONE]":
            reasons += [c.get("finish_reason") for c in json.loads(event).get("choices", [])]
    return [r for r in reasons if r]


def stream_response(url: str, started: threading.Event) -> list[dict]:
    """A /v1/responses event stream read to its end (long: its worker is killed or stalled first); returns
    the events. The Responses API has no ignore_eos, so the prompt is one whose greedy answer runs past 400
    tokens in float32, int8 and w8a8 alike; sampled at the default temperature, "Count from one to a
    thousand." had ended after 4-178 tokens, sometimes before the test's other requests began."""
    body = {
        "model": MODEL_NAME,
        "input": "Write the numbers from 1 to 1000, separated by commas.",
        "temperature": 0,
        "stream": True,
        "max_output_tokens": 1500,
    }
    events = []
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
                if events[-1]["type"] == "response.output_text.delta":
                    started.set()
    return events


def start_response_streams(pool: ThreadPoolExecutor, url: str, count: int) -> list[Future]:
    started = [threading.Event() for _ in range(count)]
    futures = [pool.submit(stream_response, url, event) for event in started]
    for event in started:
        assert event.wait(60), "a response stream never started"
    return futures


@pytest.fixture(scope="module")
def stall_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("stall") / "stall"
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def held_worker(log_dir: Path, stall_file: Path) -> Iterator[Service]:
    env = {
        "WORKER_STALL_TIMEOUT_S": "2",
        "WORKER_DEBUG_STALL_FILE": str(stall_file),
        "WORKER_STREAM_INTERVAL": "1",
        "WORKER_DRAIN_TIMEOUT_S": str(WORKER_DRAIN_TIMEOUT_S),
    }
    service = start_worker("worker-held", log_dir, **env)
    yield service
    stall_file.unlink(missing_ok=True)
    service.stop()


@pytest.fixture(scope="module")
def draining_gateway(held_worker: Service, log_dir: Path) -> Iterator[Service]:
    service = start_gateway("gateway-drain", log_dir, held_worker.addr, ready=True)
    yield service
    service.stop()


def start_streams(pool: ThreadPoolExecutor, url: str, count: int, max_tokens: int) -> list[Future]:
    started = [threading.Event() for _ in range(count)]
    futures = [pool.submit(stream_chat, url, max_tokens, event) for event in started]
    for event in started:
        assert event.wait(60), "a stream never started"
    return futures


def test_a_hung_engine_turns_readiness_off_and_back_on(
    held_worker: Service, draining_gateway: Service, stall_file: Path
) -> None:
    ready_url = f"{draining_gateway.addr}/ready"
    with ThreadPoolExecutor(2) as pool:
        (stream,) = start_streams(pool, draining_gateway.addr, 1, 8)
        stall_file.touch()
        wait_for(lambda: not grpc_serving(held_worker.addr), 20, "the worker's health to turn NOT_SERVING")
        wait_for(lambda: httpx.get(ready_url, timeout=30).status_code == 503, 10, "/ready to turn 503")
        refused = httpx.post(
            f"{draining_gateway.addr}/v1/chat/completions", json=CHAT | {"max_tokens": 2}, timeout=30
        )
        assert refused.status_code == 503, refused.text
        stall_file.unlink()
        wait_for(lambda: grpc_serving(held_worker.addr), 20, "the worker's health to turn SERVING again")
        wait_for(lambda: httpx.get(ready_url, timeout=30).status_code == 200, 10, "/ready to turn 200 again")
        events = stream.result(timeout=120)
    assert events[-1] == "[DONE]" and finish_reasons(events) == ["length"]


def test_a_gateway_timeout_mid_stream_ends_it_with_an_error_event(
    held_worker: Service, log_dir: Path, stall_file: Path
) -> None:
    gateway = start_gateway(
        "gateway-timeout-stream", log_dir, held_worker.addr, GATEWAY_REQUEST_TIMEOUT_S="6"
    )
    try:
        with ThreadPoolExecutor(1) as pool:
            (stream,) = start_streams(pool, gateway.addr, 1, 64)
            stall_file.touch()  # the stream is held mid-way until its deadline passes
            events = stream.result(timeout=30)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "request_timeout"
        stall_file.unlink()
        with grpc.insecure_channel(held_worker.addr) as channel:
            stats = wait_for_idle(worker_pb2_grpc.WorkerStub(channel), timeout_s=30)
        assert stats.num_kv_blocks_used == 0  # the worker aborted it and freed its blocks
    finally:
        stall_file.unlink(missing_ok=True)
        gateway.stop()


def test_a_stalled_engine_ends_a_response_stream_with_response_failed(
    held_worker: Service, log_dir: Path, stall_file: Path
) -> None:
    """The stall timer's error reaches a /v1/responses stream as its last event, response.failed, not as a
    connection cut mid-stream."""
    gateway = start_gateway("gateway-stall-responses", log_dir, held_worker.addr, GATEWAY_STREAM_STALL_S="3")
    try:
        with ThreadPoolExecutor(1) as pool:
            (stream,) = start_response_streams(pool, gateway.addr, 1)
            stall_file.touch()  # the engine stops stepping; the worker reports it stalled
            events = stream.result(timeout=60)
        failed = events[-1]
        assert failed["type"] == "response.failed", failed
        assert "stopped answering" in failed["response"]["error"]["message"]
        stalled = 'llmserve_gateway_worker_errors_total{code="STALLED"}'
        assert _gateway_metric(gateway, stalled) == 1  # an error for alerts, though the stream began 200
    finally:
        stall_file.unlink(missing_ok=True)
        gateway.stop()
    with grpc.insecure_channel(held_worker.addr) as channel:
        assert wait_for_idle(worker_pb2_grpc.WorkerStub(channel), timeout_s=30).num_kv_blocks_used == 0


def test_gateway_sigterm_drains_streams_in_flight_then_exits_0(
    held_worker: Service, draining_gateway: Service, stall_file: Path
) -> None:
    with ThreadPoolExecutor(2) as pool:
        streams = start_streams(pool, draining_gateway.addr, 2, 8)
        stall_file.touch()  # hold both streams mid-way
        draining_gateway.proc.send_signal(signal.SIGTERM)
        ready_url = f"{draining_gateway.addr}/ready"
        wait_for(lambda: httpx.get(ready_url, timeout=30).status_code == 503, 10, "/ready to turn 503")
        refused = httpx.post(
            f"{draining_gateway.addr}/v1/chat/completions", json=CHAT | {"max_tokens": 2}, timeout=30
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "service_unavailable"
        assert draining_gateway.proc.poll() is None  # still draining
        stall_file.unlink()
        for stream in streams:
            events = stream.result(timeout=120)
            assert events[-1] == "[DONE]" and finish_reasons(events) == ["length"]
    assert draining_gateway.proc.wait(timeout=EXIT_TIMEOUT_S) == 0, draining_gateway.log_tail()


def test_gateway_drain_timeout_ends_what_is_still_open_then_exits_0(
    held_worker: Service, log_dir: Path, stall_file: Path
) -> None:
    """Past GATEWAY_DRAIN_TIMEOUT_S a stream ends with an error event and [DONE] and a request with no
    answer yet gets a 503 (not a cut connection); their worker calls are cancelled; the gateway exits 0."""
    gateway = start_gateway("gateway-drain-timeout", log_dir, held_worker.addr, GATEWAY_DRAIN_TIMEOUT_S="1")
    try:
        with ThreadPoolExecutor(2) as pool, grpc.insecure_channel(held_worker.addr) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            (stream,) = start_streams(pool, gateway.addr, 1, 1500)
            body = CHAT | {"max_tokens": 1500, "ignore_eos": True}
            plain = pool.submit(httpx.post, f"{gateway.addr}/v1/chat/completions", json=body, timeout=60)
            wait_for(lambda: stub.GetStats(pb.StatsRequest()).num_running == 2, 30, "both requests to run")
            stall_file.touch()  # neither can finish now
            gateway.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            events = stream.result(timeout=30)
            response = plain.result(timeout=30)
            assert gateway.proc.wait(timeout=EXIT_TIMEOUT_S) == 0, gateway.log_tail()
            assert time.monotonic() - signalled < 10  # 1 s of drain, then the requests are ended at once
            assert events[-1] == "[DONE]", events[-3:]
            error = json.loads(events[-2])["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "service_unavailable" and "drain timeout" in error["message"]
            assert response.status_code == 503, response.text
            assert "drain timeout" in response.json()["error"]["message"]
            stall_file.unlink()
            stats = wait_for_idle(stub, timeout_s=30)
        assert (stats.num_running, stats.num_kv_blocks_used) == (0, 0)  # both calls were cancelled
    finally:
        stall_file.unlink(missing_ok=True)
        gateway.stop()


def generate_to_end(
    stub: worker_pb2_grpc.WorkerStub, request_id: str, started: threading.Event, max_tokens: int = 8
) -> str:
    """The finish reason, or the status code name the call ended with."""
    params = pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    finish = ""
    try:
        for chunk in stub.Generate(
            pb.GenerateRequest(request_id=request_id, text="Count to ten.", params=params)
        ):
            started.set()
            finish = chunk.finish_reason or finish
    except grpc.RpcError as exc:
        return exc.code().name
    return finish


def test_worker_sigterm_drains_streams_in_flight_then_exits_0(held_worker: Service, stall_file: Path) -> None:
    """Short streams finish within WORKER_DRAIN_TIMEOUT_S; a long one is ended at it with UNAVAILABLE."""
    with grpc.insecure_channel(held_worker.addr) as channel, ThreadPoolExecutor(3) as pool:
        stub = worker_pb2_grpc.WorkerStub(channel)
        started = [threading.Event() for _ in range(3)]
        lengths = [3, 3, 1500]  # two steps left once the stall is lifted; 1500 take far longer than 6 s
        calls = [
            pool.submit(generate_to_end, stub, f"drain-{i}", event, n)
            for i, (event, n) in enumerate(zip(started, lengths, strict=True))
        ]
        assert all(e.wait(60) for e in started)
        stall_file.touch()
        held_worker.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        wait_for(lambda: not grpc_serving(held_worker.addr), 10, "health to turn NOT_SERVING")
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(pb.GenerateRequest(text="hi"), timeout=10))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert reason_of(refused.value)[0] == "ERROR_REASON_DRAINING"
        time.sleep(0.5)
        assert held_worker.proc.poll() is None  # still draining
        stall_file.unlink()
        assert [call.result(timeout=60) for call in calls] == ["length", "length", "UNAVAILABLE"]
        assert time.monotonic() - signalled >= WORKER_DRAIN_TIMEOUT_S - 0.5  # the long one ran to the timeout
    assert held_worker.proc.wait(timeout=EXIT_TIMEOUT_S) == 0, held_worker.log_tail()


@pytest.fixture(scope="module")
def doomed_worker(log_dir: Path) -> Iterator[Service]:
    service = start_worker("worker-doomed", log_dir, WORKER_STREAM_INTERVAL="1")
    yield service
    service.stop()


def test_a_worker_killed_mid_stream_ends_every_request_promptly(
    doomed_worker: Service, log_dir: Path
) -> None:
    gateway = start_gateway("gateway-crash", log_dir, doomed_worker.addr)
    try:
        with ThreadPoolExecutor(3) as pool:
            (stream,) = start_streams(pool, gateway.addr, 1, 1500)
            (response_stream,) = start_response_streams(pool, gateway.addr, 1)
            body = CHAT | {"max_tokens": 1500, "ignore_eos": True}
            plain = pool.submit(httpx.post, f"{gateway.addr}/v1/chat/completions", json=body, timeout=120)
            with grpc.insecure_channel(doomed_worker.addr) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                wait_for(
                    lambda: stub.GetStats(pb.StatsRequest()).num_running == 3, 30, "all three requests to run"
                )
            doomed_worker.proc.kill()  # no goodbye, as a crash or the OOM killer
            killed_at = time.monotonic()
            events = stream.result(timeout=30)
            response_events = response_stream.result(timeout=30)
            response = plain.result(timeout=30)
            assert time.monotonic() - killed_at < 10
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "service_unavailable"
        assert "went away" in error["message"]
        failed = response_events[-1]
        assert failed["type"] == "response.failed" and "went away" in failed["response"]["error"]["message"]
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "service_unavailable"
    finally:
        gateway.stop()


def _gateway_metric(gateway: Service, prefix: str) -> float:
    metrics = httpx.get(f"{gateway.addr}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix))


PLAIN_ROUTES = {  # a route, a request held to 150 tokens, and the output tokens its answer reports
    "chat": ("/v1/chat/completions", CHAT | {"max_tokens": 150, "ignore_eos": True}),
    "responses": (
        "/v1/responses",
        {"model": MODEL_NAME, "input": "Tell me a long story.", "max_output_tokens": 150},
    ),
}


def _output_tokens(route: str, answer: dict) -> int:
    if route == "responses":
        assert answer["status"] in ("completed", "incomplete") and answer["error"] is None, answer
        return answer["usage"]["output_tokens"]
    return answer["usage"]["completion_tokens"]


def _victim_beside(worker: Service, log_dir: Path, name: str, **env: str) -> tuple[Service, Service]:
    """A worker to kill and a round-robin gateway over it and `worker`, once the gateway has its load."""
    victim = start_worker(f"worker-victim-{name}", log_dir)
    gateway = start_gateway(
        f"gateway-{name}",
        log_dir,
        f"{victim.addr},{worker.addr}",
        ready=True,
        GATEWAY_ROUTING="round_robin",
        **env,
    )
    reported = f'llmserve_gateway_worker_running{{model="{MODEL_NAME}",worker="{victim.addr}"}}'
    try:
        wait_for(
            lambda: reported in httpx.get(f"{gateway.addr}/metrics").text, 30, "the victim's load reports"
        )
    except BaseException:
        gateway.stop()
        victim.stop()
        raise
    return victim, gateway


@pytest.mark.parametrize("route", PLAIN_ROUTES)
def test_a_plain_request_whose_worker_dies_runs_again_on_another(
    worker: Service, log_dir: Path, route: str
) -> None:
    """Nothing of a non-streamed answer has reached the client when its worker dies, so the gateway runs
    the request again on the worker left: the client gets the whole answer, not a 503."""
    victim, gateway = _victim_beside(worker, log_dir, f"retry-{route}")
    try:
        retries = _gateway_metric(gateway, "llmserve_gateway_routing_retries_total")
        path, body = PLAIN_ROUTES[route]
        with ThreadPoolExecutor(2) as pool, grpc.insecure_channel(victim.addr) as channel:
            calls = [pool.submit(httpx.post, gateway.addr + path, json=body, timeout=120) for _ in range(2)]
            stub = worker_pb2_grpc.WorkerStub(channel)  # round-robin: one request on each worker
            wait_for(lambda: stub.GetStats(pb.StatsRequest()).num_running == 1, 30, "a request on the victim")
            victim.proc.kill()
            responses = [call.result(timeout=120) for call in calls]
        for response in responses:
            assert response.status_code == 200, response.text
            tokens = _output_tokens(route, response.json())
            assert tokens == 150 if route == "chat" else 0 < tokens <= 150
        assert _gateway_metric(gateway, "llmserve_gateway_routing_retries_total") >= retries + 1
    finally:
        gateway.stop()
        victim.stop()


# A story no shorter than 10,000 characters: the grammar keeps a response going up to max_output_tokens.
LONG_STORY = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 10000}},
    "required": ["story"],
}
LONG_ROUTES = {  # a route and a request far longer than the gateway's deadline below
    "chat": ("/v1/chat/completions", CHAT | {"max_tokens": 1500, "ignore_eos": True}),
    "responses": (
        "/v1/responses",
        {
            "model": MODEL_NAME,
            "input": "Tell me a long story.",
            "max_output_tokens": 1500,
            "text": {"format": {"type": "json_schema", "name": "story", "schema": LONG_STORY}},
        },
    ),
}
REQUEST_TIMEOUT_S = 8.0


@pytest.mark.parametrize("route", LONG_ROUTES)
def test_a_request_run_again_keeps_its_deadline(worker: Service, log_dir: Path, route: str) -> None:
    """GATEWAY_REQUEST_TIMEOUT_S bounds the whole request, over every try: a non-streamed request whose
    worker dies halfway through its deadline runs again with what is left of it, not with a new one."""
    victim, gateway = _victim_beside(
        worker, log_dir, f"deadline-{route}", GATEWAY_REQUEST_TIMEOUT_S=str(REQUEST_TIMEOUT_S)
    )
    try:
        path, body = LONG_ROUTES[route]
        with ThreadPoolExecutor(2) as pool, grpc.insecure_channel(victim.addr) as channel:
            sent_at = time.monotonic()
            calls = [pool.submit(httpx.post, gateway.addr + path, json=body, timeout=60) for _ in range(2)]
            stub = worker_pb2_grpc.WorkerStub(channel)  # round-robin: one request on each worker
            wait_for(lambda: stub.GetStats(pb.StatsRequest()).num_running == 1, 30, "a request on the victim")
            time.sleep(max(0.0, sent_at + REQUEST_TIMEOUT_S / 2 - time.monotonic()))
            victim.proc.kill()
            responses = [call.result(timeout=60) for call in calls]
            elapsed = time.monotonic() - sent_at
        for response in responses:
            assert response.status_code == 504, response.text
            assert response.json()["error"]["code"] == "request_timeout"
        assert elapsed < REQUEST_TIMEOUT_S + 2.5, f"the rerun took a deadline of its own: {elapsed:.1f} s"
    finally:
        gateway.stop()
        victim.stop()
