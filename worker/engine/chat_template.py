"""Chat messages (tool calls and tool results included) and tool definitions -> the prompt text.

The model's own template renders them when it knows tools (`apply_chat_template(tools=...)` changes its
output). Templates that ignore tools, like SmolLM2's, get the Hermes convention instead, which is what the
tool parser (gateway/tool_calls.py) reads back:

    system: <the client's system prompt, or the default one>

            # Tools
            You may call one or more functions to assist with the user query.
            <tools>
            {"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}
            </tools>
            For each function call, return a json object with function name and arguments within
            <tool_call></tool_call> XML tags:
            <tool_call>
            {"name": <function-name>, "arguments": <args-json-object>}
            </tool_call>
    assistant (called tools): <content><tool_call>{"name": ..., "arguments": {...}}</tool_call>...
    tool:      <tool_response>{the result}</tool_response>
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_SYSTEM = "You are a helpful assistant."
# apply_chat_template's own parameters: not template variables a request may set
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "messages",
    }
)
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FORMAT = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


class TemplateOptionError(ValueError):
    """A template option the request set wrongly; `param` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def render_chat(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict] | None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
    documents: list[Any] | None = None,
) -> str:
    """The prompt text: the messages, then the assistant's turn opened (add_generation_prompt), or the last
    message, an assistant's, left open for the reply to continue (continue_final_message, vLLM's option).
    template_kwargs: more variables for the template, none of apply_chat_template's own parameters (vLLM's
    chat_template_kwargs, e.g. Llama 3.1's `date_string`); documents: the template's `documents`."""
    reserved = RESERVED_TEMPLATE_KWARGS.intersection(template_kwargs or {})
    if reserved:
        raise TemplateOptionError(
            f"chat_template_kwargs may not set {sorted(reserved)}", "chat_template_kwargs"
        )
    if continue_final_message and add_generation_prompt:
        raise TemplateOptionError(
            "continue_final_message and add_generation_prompt cannot both be true", "continue_final_message"
        )
    if continue_final_message and messages[-1]["role"] != "assistant":
        raise TemplateOptionError(
            "continue_final_message needs the last message to be the assistant's", "continue_final_message"
        )
    options = {
        **(template_kwargs or {}),
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
    }
    if documents:
        options["documents"] = documents
    if tools and _template_knows_tools(tokenizer, messages, tools):
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **options)
    plain = hermes_messages(messages, tools or [])
    return tokenizer.apply_chat_template(plain, tokenize=False, **options)


def _template_knows_tools(tokenizer, messages: list[dict[str, Any]], tools: list[dict]) -> bool:
    """Whether passing `tools` changes the template's output (templates that ignore them render the same)."""
    probe = [{"role": "user", "content": "?"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=tools, tokenize=False)
    except Exception:
        return False
    return with_tools != tokenizer.apply_chat_template(probe, tokenize=False)


def hermes_messages(messages: list[dict[str, Any]], tools: list[dict]) -> list[dict[str, str]]:
    """Plain role/content messages: tools in the system prompt, calls and results as tagged text."""
    out: list[dict[str, str]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if message.get("tool_calls"):
            calls = "".join(_tagged_call(call["function"]) for call in message["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        elif role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": "system" if role == "developer" else role, "content": content})
    if tools:
        definitions = "\n".join(json.dumps(tool) for tool in tools)
        block = TOOLS_PREAMBLE + definitions + TOOLS_FORMAT
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": f"{DEFAULT_SYSTEM}\n\n{block}"})
    return out


def _tagged_call(function: dict[str, Any]) -> str:
    call = {"name": function["name"], "arguments": function.get("arguments", {})}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
