"""Proto -> engine inputs for what the OpenAI tools and structured output features send."""

from __future__ import annotations

import json
from typing import Any

from common.gen import worker_pb2
from worker.engine.errors import InvalidRequestError
from worker.engine.outputs import PromptInput
from worker.engine.sampling_params import GrammarSpec


def chat_prompt(chat: worker_pb2.ChatPrompt) -> PromptInput:
    """Messages in transformers' chat-template convention (tool calls as `function` objects)."""
    tools = _json_field(chat.tools_json, "tools", list)
    return PromptInput(
        messages=[_message(m) for m in chat.messages],
        tools=tools or None,
        template_kwargs=_json_field(chat.template_kwargs_json, "chat_template_kwargs", dict),
        documents=_json_field(chat.documents_json, "documents", list),
        add_generation_prompt=chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True,
        continue_final_message=chat.continue_final_message,
    )


def _json_field(text: str, param: str, kind: type) -> Any:
    """A JSON-encoded field of the chat prompt ("" for unset), of the given kind."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{param}: not valid JSON: {exc}", param=param) from None
    if not isinstance(value, kind):
        raise InvalidRequestError(f"{param}: must be a JSON {kind.__name__}", param=param)
    return value


def _message(m: worker_pb2.ChatMessage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name:
        message["name"] = m.name
    if m.tool_call_id:
        message["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        message["tool_calls"] = [_call(c) for c in m.tool_calls]
    return message


def _call(c: worker_pb2.ToolCall) -> dict[str, Any]:
    function = {"name": c.name, "arguments": _arguments(c.arguments)}
    return {"id": c.id, "type": "function", "function": function}


def _arguments(text: str) -> Any:
    """Templates expect the arguments as an object; they travel as JSON text (kept as text if not JSON)."""
    try:
        return json.loads(text or "{}")
    except json.JSONDecodeError:
        return text


def grammar_spec(proto: worker_pb2.StructuredOutput) -> GrammarSpec | None:
    kind = proto.WhichOneof("kind")
    if kind is None or (kind == "json_object" and not proto.json_object):
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", "")
    if kind == "choice":
        if not proto.choice.choices:
            raise InvalidRequestError("the choice list must not be empty", param="response_format")
        return GrammarSpec("choice", json.dumps(list(proto.choice.choices)))
    return GrammarSpec(kind, getattr(proto, kind))
