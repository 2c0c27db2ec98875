"""Tool calling: what the worker is asked for (tools to render, a constraint); its text read back as calls.

- `none` (or no tools): plain chat; the tools are not rendered.
- `auto`: the tools are rendered; the model may answer in text or with Hermes-style calls
  (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the format
  worker/engine/chat_template.py teaches), which are parsed out of the text. Text that does not parse
  stays content.
- `required`: the output is constrained to a JSON list of calls to the given tools (at least one; exactly
  one when `parallel_tool_calls` is false), so the calls always parse and match the parameter schemas;
  when max_tokens cuts the list, its complete calls are returned.
- a named function: the output is constrained to that function's arguments.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol import ChatCompletionRequest, NamedToolChoice, Tool

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class ToolPlan:
    mode: str  # none | auto | required | named
    tools_json: str = ""  # rendered into the prompt; "" for none
    schema: dict[str, Any] | None = None  # the constraint of required / named
    function_name: str = ""  # named


def plan_tools(req: ChatCompletionRequest) -> ToolPlan:
    choice = req.tool_choice or ("auto" if req.tools else "none")
    if not req.tools or choice == "none":
        return ToolPlan("none")
    tools_json = json.dumps([t.model_dump(exclude_none=True, by_alias=True) for t in req.tools])
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in req.tools if t.function.name == choice.function.name)
        return ToolPlan("named", tools_json, _parameters(tool), tool.function.name)
    if choice == "required":
        schema = _calls_schema(req.tools, req.parallel_tool_calls is not False)
        return ToolPlan("required", tools_json, schema)
    return ToolPlan("auto", tools_json)


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or ANY_OBJECT


def _calls_schema(tools: list[Tool], parallel: bool) -> dict[str, Any]:
    """A JSON list of {"name", "arguments"} objects, one alternative per tool."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    schema: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def new_call(name: str, arguments: Any) -> dict[str, Any]:
    """One entry of `tool_calls` in the OpenAI shape (arguments as a JSON text)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    function = {"name": name, "arguments": text}
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}


@dataclass
class ToolCallParser:
    """Reads one choice's text as it streams: `feed` returns the content that can go out now (text that
    cannot be the start of a call); `finish` returns the remaining content and the calls."""

    plan: ToolPlan
    held: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)

    def feed(self, text: str) -> str:
        if self.plan.mode != "auto":
            self.held += text  # forced calls: the whole output is the call
            return ""
        self.held += text
        start = self.held.find(CALL_START)
        if start >= 0:
            content, self.held = self.held[:start], self.held[start:]
            return content
        keep = _partial_prefix(self.held, CALL_START)  # "<tool" may still become "<tool_call>"
        content, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return content

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        text, self.held = self.held, ""
        if self.plan.mode == "named":
            return "", [new_call(self.plan.function_name, text.strip() or "{}")]
        if self.plan.mode == "required":
            return "", _whole_calls(text)
        return _parse_hermes(text)


def _whole_calls(text: str) -> list[dict[str, Any]]:
    """The complete calls of the constrained JSON list: max_tokens may cut it, and a cut call is left out
    (no arguments are invented; vLLM's own parse returns no calls at all then), never dumped as content."""
    decoder, calls, at = json.JSONDecoder(), [], text.find("[") + 1
    while at > 0:
        at += len(text[at:]) - len(text[at:].lstrip(", \n"))
        try:
            call, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        calls.append(new_call(call["name"], call["arguments"]))
    return calls


def _partial_prefix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _parse_hermes(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Calls between <tool_call> tags (an unclosed last one too); anything unparsable stays content."""
    calls: list[dict[str, Any]] = []
    content_parts: list[str] = []
    rest = text
    while (start := rest.find(CALL_START)) >= 0:
        content_parts.append(rest[:start])
        end = rest.find(CALL_END, start)
        body = rest[start + len(CALL_START) : end if end >= 0 else len(rest)]
        call = _call_from_json(body)
        if call is None:
            content_parts.append(rest[start:])
            rest = ""
            break
        calls.append(call)
        rest = rest[end + len(CALL_END) :] if end >= 0 else ""
    content_parts.append(rest)
    content = "".join(content_parts)
    return (content.strip() if calls else content), calls


def _call_from_json(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    return new_call(obj["name"], obj.get("arguments", obj.get("parameters", {})))
