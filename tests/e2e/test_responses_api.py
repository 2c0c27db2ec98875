"""/v1/responses through the official openai SDK against real processes: a worker, Redis for the stored
responses, and a gateway in front (raw HTTP where the error body itself is checked)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from common.gen import worker_pb2, worker_pb2_grpc
from scripts.launch import MODEL_NAME, Service, start_gateway, start_redis
from tests.e2e.conftest import wait_for_idle
from tests.e2e.sample_schemas import RESPONSES_WEATHER_TOOL, Capital

QUESTION = "What is the capital of France?"
WEATHER = RESPONSES_WEATHER_TOOL


@pytest.fixture(scope="module")
def redis_url(log_dir: Path) -> Iterator[str]:
    service, url = start_redis(log_dir, "redis-responses")
    yield url
    service.stop()


@pytest.fixture(scope="module")
def responses_gateway(worker: Service, redis_url: str, log_dir: Path) -> Iterator[Service]:
    service = start_gateway("gateway-responses", log_dir, worker.addr, GATEWAY_REDIS_URL=redis_url)
    yield service
    service.stop()


def sdk(gateway: Service, api_key: str = "tenant-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.addr}/v1", api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(responses_gateway: Service) -> Iterator[openai.OpenAI]:
    with sdk(responses_gateway) as c:
        yield c


def test_create_then_get_and_delete(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model=MODEL_NAME,
        input=QUESTION,
        instructions="Answer in one sentence.",
        max_output_tokens=40,
        temperature=0,
        metadata={"case": "create"},
    )
    assert reply.status == "completed" and reply.object == "response"
    assert "Paris" in reply.output_text
    assert reply.output[0].type == "message" and reply.output[0].role == "assistant"
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0
    assert reply.metadata == {"case": "create"} and reply.instructions == "Answer in one sentence."
    stored = client.responses.retrieve(reply.id)
    assert stored.id == reply.id and stored.output_text == reply.output_text
    assert stored.usage == reply.usage
    client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(reply.id)


def test_another_tenant_sees_nothing(client: openai.OpenAI, responses_gateway: Service) -> None:
    reply = client.responses.create(model=MODEL_NAME, input=QUESTION, max_output_tokens=8, temperature=0)
    with sdk(responses_gateway, api_key="tenant-b") as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(reply.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.delete(reply.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.input_items.list(reply.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.create(model=MODEL_NAME, input="And Italy?", previous_response_id=reply.id)
    assert client.responses.retrieve(reply.id).id == reply.id, "the owner still has it"


def test_store_false_stores_nothing(client: openai.OpenAI) -> None:
    reply = client.responses.create(model=MODEL_NAME, input=QUESTION, max_output_tokens=8, store=False)
    assert reply.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL_NAME, input=QUESTION, max_output_tokens=20, temperature=0)
    second = client.responses.create(
        model=MODEL_NAME,
        input="And of Italy?",
        previous_response_id=first.id,
        max_output_tokens=20,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    # The whole first exchange was read again: more prompt than the first prompt and its answer together.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert "Rome" in second.output_text
    items = client.responses.input_items.list(second.id)  # newest first: what the second response read
    assert [i.type for i in items.data] == ["message"] * 3
    assert [i.role for i in items.data] == ["user", "assistant", "user"]
    assert items.data[0].content[0].text == "And of Italy?" and items.data[2].content[0].text == QUESTION
    assert items.data[1].content[0].text == first.output_text
    oldest = client.responses.input_items.list(second.id, order="asc", limit=1)
    assert oldest.data[0].id == items.data[2].id and oldest.has_more
    alone = client.responses.create(
        model=MODEL_NAME, input="And of Italy?", max_output_tokens=20, temperature=0
    )
    assert alone.usage.input_tokens < second.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL_NAME, input="x", previous_response_id="resp_doesnotexist")


def test_stream_events_and_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL_NAME, input=QUESTION, max_output_tokens=40, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and "Paris" in deltas
    assert client.responses.retrieve(final.id).output_text == deltas, "stored before the last event"


def test_stream_incomplete_at_max_output_tokens(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL_NAME, input="Write a long story about a dragon.", max_output_tokens=5, stream=True
    )
    events = list(stream)
    assert events[-1].type == "response.incomplete"
    response = events[-1].response
    assert response.incomplete_details.reason == "max_output_tokens" and response.usage.output_tokens == 5
    plain = client.responses.create(model=MODEL_NAME, input="Write a long story.", max_output_tokens=5)
    assert plain.status == "incomplete" and plain.output[0].status == "incomplete"


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    reply = client.responses.parse(
        model=MODEL_NAME, input=QUESTION, text_format=Capital, max_output_tokens=40, temperature=0
    )
    assert isinstance(reply.output_parsed, Capital)
    json_object = client.responses.create(
        model=MODEL_NAME,
        input="Describe Paris as JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=30,
        temperature=0,
    )
    if json_object.status == "completed":
        assert isinstance(json.loads(json_object.output_text), dict)


def test_function_tool_round_trip(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(
        model=MODEL_NAME,
        input=ask,
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "London", "Rome")
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature_c": 21}'}
    follow = client.responses.create(
        model=MODEL_NAME,
        input=[result],
        previous_response_id=first.id,
        tools=[WEATHER],
        max_output_tokens=40,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete") and follow.output[0].type in (
        "message",
        "function_call",
    )
    # The same turn without the store: the call and its output sent back as input items.
    replay = client.responses.create(
        model=MODEL_NAME,
        input=[*ask, calls[0].model_dump(exclude_none=True), result],
        tools=[WEATHER],
        max_output_tokens=40,
        temperature=0,
        store=False,
    )
    assert replay.usage.input_tokens == follow.usage.input_tokens


def test_streamed_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL_NAME,
        input="Weather in Rome?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert (
        "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    )
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(call.arguments)["city"] in ("Paris", "London", "Rome")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ],
)
def test_unsupported_fields_are_refused_by_name(responses_gateway: Service, extra: dict, param: str) -> None:
    body = {"model": MODEL_NAME, "input": "hi"} | extra
    reply = httpx.post(f"{responses_gateway.addr}/v1/responses", json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"]


def test_unknown_model_and_too_long_input(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL_NAME, input="word " * 5000, max_output_tokens=5)
    assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "input"


def test_redis_down(worker: Service, dead_addr: str, log_dir: Path) -> None:
    """The answer still goes out (unstored, logged); what needs the store is a 503 in the OpenAI shape."""
    service = start_gateway(
        "gateway-responses-no-redis", log_dir, worker.addr, GATEWAY_REDIS_URL=f"redis://{dead_addr}/0"
    )
    try:
        with sdk(service) as down:
            reply = down.responses.create(
                model=MODEL_NAME, input=QUESTION, max_output_tokens=8, temperature=0
            )
            assert reply.status in ("completed", "incomplete")
            for call in (
                lambda: down.responses.retrieve(reply.id),
                lambda: down.responses.create(model=MODEL_NAME, input="x", previous_response_id=reply.id),
            ):
                with pytest.raises(openai.InternalServerError) as caught:
                    call()
                assert caught.value.status_code == 503 and caught.value.body["type"] == "service_unavailable"
    finally:
        service.stop()
    assert "not stored" in service.log_tail()


def test_without_a_store_nothing_is_kept(gateway: Service) -> None:
    """GATEWAY_REDIS_URL empty (the shared test gateway): responses say store false and GET finds nothing."""
    with sdk(gateway) as plain:
        reply = plain.responses.create(model=MODEL_NAME, input=QUESTION, max_output_tokens=4)
        assert reply.store is False
        with pytest.raises(openai.NotFoundError):
            plain.responses.retrieve(reply.id)


def test_stream_disconnect_aborts_the_request(
    responses_gateway: Service, worker_stub: worker_pb2_grpc.WorkerStub
) -> None:
    body = {
        "model": MODEL_NAME,
        "input": "Write a very long story about a dragon.",
        "max_output_tokens": 1500,
        "temperature": 0,
        "stream": True,
    }
    url = f"{responses_gateway.addr}/v1/responses"
    before = wait_for_idle(worker_stub)  # the worker is shared: count from nothing running
    assert (before.num_running, before.num_waiting) == (0, 0), (
        f"an earlier test's request still runs: {before}"
    )
    with httpx.Client(timeout=60) as client, client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line == "event: response.output_text.delta":
                break
        # Still generating when we leave: the worker's stats are its engine loop's last round, so poll.
        deadline = time.monotonic() + 10
        # At least ours: a request another test left to the gateway (a retry) may start beside it.
        while (running := worker_stub.GetStats(worker_pb2.StatsRequest())).num_running < 1:
            if time.monotonic() > deadline:  # say what ended it (this failed once under a full suite's load)
                rest = [line for line in response.iter_lines() if line.startswith("event: ")]
                raise AssertionError(f"the request is not running when we leave: {running}; then {rest[-3:]}")
            time.sleep(0.02)
    stats = wait_for_idle(worker_stub)
    assert (stats.num_running, stats.num_waiting, stats.num_kv_blocks_used) == (0, 0, 0)
    metrics = httpx.get(f"{responses_gateway.addr}/metrics", timeout=10).text
    assert "llmserve_gateway_open_streams 0.0" in metrics
