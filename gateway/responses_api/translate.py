"""A Responses request (with the stored conversation it continues) as the chat request the worker runs.

instructions                      -> a system message first (never carried over from a previous response)
message items                     -> chat messages of the same role
function_call items               -> tool_calls of an assistant message (joined to the text just before)
function_call_output items        -> tool messages answering that call_id
tools / tool_choice / text.format -> tools / tool_choice / response_format
max_output_tokens                 -> max_completion_tokens
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gateway.errors import APIError, invalid_request
from gateway.limits import RequestLimits, check_limits
from gateway.protocol import ChatCompletionRequest, validation_error
from gateway.responses_api.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    MessageItem,
    ResponsesRequest,
)

Json = dict[str, Any]
# Chat parameter names in an error, as this route calls them.
PARAMS = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
}


def chat_messages(items: list[Any], instructions: str | None) -> list[Json]:
    """`items`: parsed input items (MessageItem, FunctionCallItem, FunctionCallOutputItem) in order."""
    messages: list[Json] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return messages


def chat_body(req: ResponsesRequest, items: list[Any]) -> Json:
    """The chat completion body equivalent to `req` over the whole conversation `items`."""
    body: Json = {"model": req.model, "messages": chat_messages(items, req.instructions)}
    for name, value in (
        ("max_completion_tokens", req.max_output_tokens),
        ("temperature", req.temperature),
        ("top_p", req.top_p),
        ("user", req.user),
        ("parallel_tool_calls", req.parallel_tool_calls),
    ):
        if value is not None:
            body[name] = value
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in req.tools
        ]
    if isinstance(req.tool_choice, FunctionChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    fmt = req.text_format
    if fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt.type == "json_schema":
        schema = fmt.as_json_schema().model_dump(by_alias=True, exclude_none=True)
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    return body


def to_chat_request(
    req: ResponsesRequest, items: list[Any], limits: RequestLimits, max_model_len: int | None
) -> ChatCompletionRequest:
    """Validated as the chat route validates its bodies; errors name this route's parameters."""
    try:
        chat = ChatCompletionRequest.model_validate(chat_body(req, items), strict=True)
        check_limits(chat, limits, max_model_len)
    except ValidationError as exc:
        raise _renamed(validation_error(exc)) from None
    except APIError as exc:
        raise _renamed(exc) from None
    return chat


def _renamed(error: APIError) -> APIError:
    param = PARAMS.get(error.param or "", error.param)
    message = error.message
    for chat_name, name in PARAMS.items():
        message = (
            message.replace(f"{chat_name}:", f"{name}:", 1) if message.startswith(chat_name) else message
        )
    if error.status == 400:
        return invalid_request(message, param, error.code)
    return error
