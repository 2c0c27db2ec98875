"""Tool plans and the Hermes tool-call parser, streamed and whole."""

from __future__ import annotations

import json

from gateway.protocol import ChatCompletionRequest, parse_request
from gateway.tool_calls import ToolCallParser, ToolPlan, plan_tools

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def chat(**fields: object) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} | fields
    return parse_request(ChatCompletionRequest, json.dumps(body).encode())


def feed_all(plan: ToolPlan, pieces: list[str]) -> tuple[str, list[dict]]:
    parser = ToolCallParser(plan)
    streamed = "".join(parser.feed(piece) for piece in pieces)
    rest, calls = parser.finish()
    return streamed + rest, calls


def test_plans() -> None:
    assert plan_tools(chat()).mode == "none"
    assert plan_tools(chat(tools=[TOOL], tool_choice="none")).tools_json == ""
    auto = plan_tools(chat(tools=[TOOL]))
    assert auto.mode == "auto" and auto.schema is None and "get_weather" in auto.tools_json
    required = plan_tools(chat(tools=[TOOL], tool_choice="required", parallel_tool_calls=False))
    assert required.schema["maxItems"] == 1
    assert required.schema["items"]["anyOf"][0]["properties"]["name"] == {"const": "get_weather"}
    named = plan_tools(
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    )
    assert named.mode == "named" and named.schema == TOOL["function"]["parameters"]


def test_auto_streams_content_and_holds_a_call() -> None:
    plan = plan_tools(chat(tools=[TOOL]))
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    parser = ToolCallParser(plan)
    streamed = "".join(parser.feed(piece) for piece in pieces)
    assert streamed == "Let me check."  # nothing of the tag leaks, even split across pieces
    content, calls = parser.finish()
    assert content == "" and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"


def test_auto_falls_back_to_text() -> None:
    plan = plan_tools(chat(tools=[TOOL]))
    assert feed_all(plan, ["a <tool", " b"]) == ("a <tool b", [])
    assert feed_all(plan, ["<tool_call>not json</tool_call>"]) == ("<tool_call>not json</tool_call>", [])
    two = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"}'  # last one unclosed
    assert [c["function"]["name"] for c in feed_all(plan, [two])[1]] == ["a", "b"]


def test_forced_calls() -> None:
    named = plan_tools(
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    )
    content, calls = feed_all(named, ['{"city": ', '"Rome"}'])
    assert content == "" and calls[0]["function"]["arguments"] == '{"city": "Rome"}'
    required = plan_tools(chat(tools=[TOOL], tool_choice="required"))
    content, calls = feed_all(required, ['[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'])
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert feed_all(required, ['[{"name": "get_we']) == ("", [])  # cut off: no call invented, no JSON content
    # cut by max_tokens after the first call: that one is whole and returned, the cut one left out
    cut = '[{"name":"get_weather","arguments":{"city":"Oslo"}}, {"name":"get_weather","arguments":{"ci'
    content, calls = feed_all(required, [cut[:30], cut[30:]])
    assert content == "" and [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Oslo"}]
    two = '[{"name":"get_weather","arguments":{"city":"Oslo"}},{"name":"get_weather","arguments":{}}]'
    assert len(feed_all(required, [two])[1]) == 2
