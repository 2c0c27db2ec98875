"""Typed /v1/responses request bodies. Fields that would change the output and are not implemented are
refused with a 400 naming them; fields that change nothing are accepted, as on the chat route."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gateway.protocol import INT32_MAX, JsonSchemaFormat, _Strict

# Refused when set to anything but their "off" value, with why.
UNSUPPORTED = {
    "background": "background responses are not supported",
    "conversation": "conversations are not supported (use previous_response_id)",
    "prompt": "prompt templates are not supported",
    "reasoning": "reasoning options are not supported by this model",
    "include": "extra output (logprobs, sources, encrypted reasoning) is not supported",
    "top_logprobs": "logprobs are not supported on this route",
    "max_tool_calls": "max_tool_calls is not supported",
    "moderation": "moderation is not supported",
    "context_management": "context management is not supported",
    "image": "image options are not supported",
    "access_programs": "access programs are not supported",
}
OFF_VALUES: tuple[Any, ...] = (None, False, [], {}, 0)
SUPPORTED_ITEMS = ("message", "function_call", "function_call_output")
TEXT_PARTS = ("input_text", "output_text", "text")


class TextPart(_Strict):
    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str = ""
    refusal: str = ""

    def value(self) -> str:
        return self.refusal if self.type == "refusal" else self.text


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.value() for part in self.content)


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.value() for part in self.output)


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    """`text`, `json_object`, or `json_schema` with its fields beside `type` (the Responses layout)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _check_schema(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("text.format.schema: schema is required when type is 'json_schema'")
        return self

    def echoed(self) -> dict[str, Any]:
        """As the response repeats it: only json_schema has a name (OpenAI's `{"type": "text"}`)."""
        if self.type != "json_schema":
            return {"type": self.type}
        return self.model_dump(by_alias=True, exclude_none=True)

    def as_json_schema(self) -> JsonSchemaFormat:
        return JsonSchemaFormat(
            name=self.name, schema=self.schema_, strict=self.strict, description=self.description
        )


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: str | None = None  # accepted, changes nothing here


class ResponsesRequest(_Strict):
    model: str
    input: list[InputItem] = Field(default_factory=list)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    user: str | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    stream: bool | None = None
    truncation: Literal["disabled"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _normalize(cls, data: Any) -> Any:
        """Refuse unsupported fields and items by name; a text input is one user message."""
        if not isinstance(data, dict):
            return data
        for name, why in UNSUPPORTED.items():
            if name in data and data[name] not in OFF_VALUES:
                raise ValueError(f"{name}: {name} is not supported ({why})")
        if data.get("truncation") == "auto":
            raise ValueError("truncation: truncation 'auto' is not supported (the input is never cut)")
        data = dict(data)
        if isinstance(data.get("input"), str):
            data["input"] = [{"type": "message", "role": "user", "content": data["input"]}]
        elif isinstance(data.get("input"), list):
            data["input"] = [normalize_item(i, item) for i, item in enumerate(data["input"])]
        for i, tool in enumerate(data.get("tools") or []):
            if isinstance(tool, dict) and tool.get("type") != "function":
                raise ValueError(
                    f"tools: tools[{i}] of type {tool.get('type')!r} is not supported (function tools only)"
                )
        choice = data.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") != "function":
            raise ValueError(f"tool_choice: tool_choice of type {choice.get('type')!r} is not supported")
        return data

    @model_validator(mode="after")
    def _check_tools(self) -> ResponsesRequest:
        forced = self.tool_choice not in (None, "none", "auto")
        if forced and not self.tools:
            raise ValueError("tool_choice: tool_choice requires tools")
        if isinstance(self.tool_choice, FunctionChoice):
            if self.tool_choice.name not in [t.name for t in self.tools]:
                raise ValueError(f"tool_choice: no tool named {self.tool_choice.name!r} in tools")
        if not self.input and self.previous_response_id is None:
            raise ValueError("input: input is required")
        return self

    @property
    def text_format(self) -> TextFormat:
        if self.text is None or self.text.format is None:
            return TextFormat(type="text")
        return self.text.format


def normalize_item(index: int, item: Any) -> Any:
    """An input item with its type made explicit (a message may leave it out); unsupported types refused."""
    if not isinstance(item, dict):
        return item
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "item_reference":
        raise ValueError(f"input: input[{index}]: item references are not supported (send the item itself)")
    if kind not in SUPPORTED_ITEMS:
        raise ValueError(f"input: input[{index}]: items of type {kind!r} are not supported")
    if kind == "message" and isinstance(item.get("content"), list):
        for j, part in enumerate(item["content"]):
            if isinstance(part, dict) and part.get("type") not in (*TEXT_PARTS, "refusal"):
                raise ValueError(
                    f"input: input[{index}].content[{j}]: content of type {part.get('type')!r} "
                    "is not supported"
                )
    return {**item, "type": kind}
