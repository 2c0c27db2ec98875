"""/v1/responses without a model: request translation into the chat request the worker runs, refusals, and
the event sequence, read back through the official SDK's own stream accumulator."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai._models import construct_type
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

from gateway.errors import APIError
from gateway.limits import RequestLimits
from gateway.protocol import validation_error
from gateway.responses_api.events import ResponseBuilder, usage
from gateway.responses_api.protocol import ResponsesRequest
from gateway.responses_api.serving import ResponsesServing, echoed_fields
from gateway.responses_api.store import ResponseStore
from gateway.responses_api.translate import chat_messages, to_chat_request
from gateway.settings import GatewaySettings
from gateway.tool_calls import plan_tools
from gateway.worker_request import chat_request

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def parse(**body: Any) -> ResponsesRequest:
    from pydantic import ValidationError

    try:
        return ResponsesRequest.model_validate_json(json.dumps({"model": "m", **body}), strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from None


def refused(**body: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        parse(**body)
    assert caught.value.status == 400
    return caught.value


def translate(req: ResponsesRequest, items: list[Any] | None = None) -> Any:
    return to_chat_request(req, req.input if items is None else items, RequestLimits(), 2048)


def test_text_input_and_instructions_become_system_and_user_messages() -> None:
    chat = translate(
        parse(input="Hi there", instructions="Answer briefly.", max_output_tokens=7, temperature=0)
    )
    assert [(m.role, m.text()) for m in chat.messages] == [
        ("system", "Answer briefly."),
        ("user", "Hi there"),
    ]
    assert chat.completion_limit() == 7 and chat.temperature == 0
    generate = chat_request(chat, "resp_1", "m", plan_tools(chat))
    assert generate.params.max_tokens == 7
    assert [m.role for m in generate.chat.messages] == ["system", "user"]


def test_function_calls_join_the_assistant_turn_and_outputs_become_tool_messages() -> None:
    req = parse(
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "call_2",
                "name": "get_weather",
                "arguments": '{"city":"Rome"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "20C"},
            {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "25C"}],
            },
        ],
        tools=[WEATHER],
    )
    messages = chat_messages(req.input, None)
    assert messages[0] == {"role": "user", "content": "Weather in Paris?"}
    assert messages[1]["role"] == "assistant" and messages[1]["content"] == "Checking."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "20C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
    ]
    generate = chat_request(translate(req), "r", "m", plan_tools(translate(req)))
    assert [c.name for c in generate.chat.messages[1].tool_calls] == ["get_weather", "get_weather"]
    assert json.loads(generate.chat.tools_json)[0]["function"]["name"] == "get_weather"


def test_tool_choice_and_text_format_map_to_the_constrained_decoding() -> None:
    named = translate(
        parse(input="x", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    )
    plan = plan_tools(named)
    assert plan.mode == "named" and plan.schema == WEATHER["parameters"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    generate = chat_request(translate(parse(input="x", text=fmt)), "r", "m")
    assert json.loads(generate.params.structured_output.json_schema) == schema
    generate = chat_request(translate(parse(input="x", text={"format": {"type": "json_object"}})), "r", "m")
    assert generate.params.structured_output.json_object


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"reasoning": {"effort": "high"}}, "reasoning", "reasoning"),
        ({"background": True}, "background", "background"),
        ({"tools": [{"type": "web_search"}]}, "tools", "web_search"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "reasoning"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
            "input_image",
        ),
        ({"include": ["message.output_text.logprobs"]}, "include", "include"),
        ({"truncation": "auto"}, "truncation", "auto"),
        ({"tool_choice": "required"}, "tool_choice", "requires tools"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text", "schema"),
        ({"temperature": 3}, "temperature", "less than or equal"),
    ],
)
def test_unsupported_or_invalid_fields_are_refused_by_name(body: dict, param: str, words: str) -> None:
    error = refused(**({"input": "hi"} | body))
    assert error.param == param and words in error.message, error.message


def test_fields_that_change_nothing_are_accepted() -> None:
    req = parse(
        input="hi",
        store=False,
        metadata={"k": "v"},
        user="u",
        service_tier="auto",
        prompt_cache_key="k",
        safety_identifier="s",
        truncation="disabled",
        include=[],
        reasoning=None,
        background=False,
        text={"format": {"type": "text"}, "verbosity": "low"},
    )
    assert req.store is False and req.metadata == {"k": "v"}


def test_echoed_defaults_are_openais() -> None:
    """tool_choice `auto` with or without tools; a text or json_object format without json_schema's name."""
    fields = echoed_fields(parse(input="hi"), stored=True)
    assert (fields["tool_choice"], fields["text"]) == ("auto", {"format": {"type": "text"}})
    assert echoed_fields(parse(input="hi", tools=[WEATHER]), stored=True)["tool_choice"] == "auto"
    json_object = parse(input="hi", text={"format": {"type": "json_object"}})
    assert echoed_fields(json_object, stored=True)["text"] == {"format": {"type": "json_object"}}
    schema = {"type": "json_schema", "name": "thing", "schema": {"type": "object"}}
    assert echoed_fields(parse(input="hi", text={"format": schema}), stored=True)["text"]["format"] == schema


async def test_a_missing_previous_response_names_previous_response_id() -> None:
    serving = ResponsesServing(GatewaySettings(), None, ResponseStore("", 60))  # type: ignore[arg-type]
    with pytest.raises(APIError) as caught:
        await serving._conversation(parse(input="x", previous_response_id="resp_gone"), "anonymous")
    assert (caught.value.status, caught.value.param) == (404, "previous_response_id")
    with pytest.raises(APIError) as caught:
        await serving.store.get("anonymous", "resp_gone")  # GET /v1/responses/{response_id}
    assert caught.value.param == "response_id"


def test_limits_name_this_routes_parameters() -> None:
    req = parse(input=[{"role": "user", "content": "x"}] * 3)
    with pytest.raises(APIError) as caught:
        to_chat_request(req, req.input, RequestLimits(max_messages=2), 2048)
    assert caught.value.param == "input" and caught.value.message.startswith("input:")


FIELDS = {
    "model": "m",
    "instructions": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "tools": [],
    "tool_choice": "auto",
    "text": {"format": {"type": "text"}},
    "store": True,
    "temperature": None,
    "top_p": None,
    "previous_response_id": None,
    "max_output_tokens": None,
    "user": None,
}


def replay(events: list[dict], text_format: Any = omit) -> tuple[list[str], Any]:
    """The events as the SDK's responses.stream reads them; its final (parsed) response."""
    state = ResponseStreamState(input_tools=omit, text_format=text_format)
    kinds = []
    for event in events:
        for fired in state.handle_event(construct_type(type_=ResponseStreamEvent, value=event)):
            kinds.append(fired.type)
    return kinds, state._completed_response


def test_text_events_follow_the_sdk_sequence_and_build_the_snapshot() -> None:
    builder = ResponseBuilder("resp_1", FIELDS)
    events = builder.begin() + builder.text("Hello") + builder.text("") + builder.text(", world")
    events += builder.finish("stop", usage(5, 2, 0))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds, final = replay(events)
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.output_text == "Hello, world" and final.status == "completed"
    snapshot = Response.model_validate(
        builder.snapshot()
    )  # the non-streaming body, validated by the SDK's type
    assert snapshot.output_text == "Hello, world"
    assert snapshot.usage.input_tokens == 5 and snapshot.usage.total_tokens == 7


def test_function_call_events_and_incomplete_end() -> None:
    builder = ResponseBuilder("resp_2", FIELDS)
    events = builder.begin() + builder.text("Let me check.")
    events += builder.function_call("get_weather", '{"city":"Paris"}', "call_9")
    events += builder.finish("stop", usage(5, 9, 0))
    kinds, final = replay(events)
    assert kinds[-6:] == [
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    call = final.output[1]
    assert (call.type, call.name, call.arguments, call.call_id) == (
        "function_call",
        "get_weather",
        '{"city":"Paris"}',
        "call_9",
    )
    cut = ResponseBuilder("resp_3", FIELDS)
    events = cut.begin() + cut.text("abc") + cut.finish("length", usage(1, 3, 0))
    assert events[-1]["type"] == "response.incomplete"
    snapshot = Response.model_validate(cut.snapshot())
    assert snapshot.status == "incomplete" and snapshot.incomplete_details.reason == "max_output_tokens"
    assert snapshot.output[0].status == "incomplete"


def test_an_empty_answer_is_one_empty_message_and_a_failure_ends_failed() -> None:
    empty = ResponseBuilder("resp_4", FIELDS)
    kinds, final = replay(empty.begin() + empty.finish("stop", usage(1, 0, 0)))
    assert final.output_text == "" and len(final.output) == 1
    failing = ResponseBuilder("resp_5", FIELDS)
    events = failing.begin() + failing.text("par") + failing.fail("The worker failed")
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "The worker failed"}
    kinds, _ = replay(events)
    assert kinds[-1] == "response.failed"


class Capital(BaseModel):
    city: str


def test_json_text_is_parsed_by_the_sdk_with_a_pydantic_model() -> None:
    builder = ResponseBuilder("resp_6", FIELDS)
    events = builder.begin() + builder.text('{"city": ') + builder.text('"Paris"}')
    events += builder.finish("stop", usage(1, 2, 0))
    _, final = replay(events, text_format=Capital)
    assert final.output_parsed == Capital(city="Paris")


def test_input_items_pages_in_the_sdk_shape() -> None:
    from openai.types.responses import ResponseItemList

    from gateway.responses_api.input_items import page

    req = parse(
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "20C"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "It is 20C."}]},
        ]
    )
    conversation = [item.model_dump(by_alias=True, exclude_none=True) for item in req.input]
    newest = ResponseItemList.model_validate(page("resp_abc", conversation, {"limit": "3"}))
    assert [item.type for item in newest.data] == ["message", "function_call_output", "function_call"]
    assert (
        newest.has_more and newest.first_id == "msg_abc_3" and newest.data[0].content[0].text == "It is 20C."
    )
    rest = ResponseItemList.model_validate(page("resp_abc", conversation, {"after": newest.last_id}))
    assert [item.id for item in rest.data] == ["msg_abc_0"] and not rest.has_more
    assert rest.data[0].content[0].type == "input_text"
    oldest = page("resp_abc", conversation, {"order": "asc", "limit": "1"})
    assert oldest["data"][0]["id"] == "msg_abc_0"
    with pytest.raises(APIError):
        page("resp_abc", conversation, {"limit": "0"})
