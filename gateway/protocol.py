"""Typed OpenAI request bodies. Unknown fields are ignored; wrong types and ranges are refused (400)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.errors import APIError, invalid_request
from gateway.limits import RequestLimits, check_limits

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_TOP_LOGPROBS = 20
MAX_N = 128

Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


ROLES_NEEDING_CONTENT = ("system", "developer", "user", "tool")  # only an assistant's may be null


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _check_content(self) -> ChatMessage:
        if self.content is None and self.role in ROLES_NEEDING_CONTENT:
            raise ValueError(f"content is required for a {self.role!r} message")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: bool | None = None


class _SamplingRequest(_Strict):
    """Fields both endpoints share: OpenAI's sampling parameters and vLLM's extensions."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-INT64_MAX - 1, le=INT64_MAX)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    user: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX)  # -1 or 0: off (vLLM)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    min_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)
    ignore_eos: bool | None = None

    @model_validator(mode="after")
    def _check_stop(self) -> _SamplingRequest:
        if any(not s for s in self.stop_list):
            raise ValueError("stop: stop strings must not be empty")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def completion_limit(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: top_logprobs requires logprobs to be true")
        return self

    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        """None: no logprobs; k: the sampled token's logprob and the top k alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[Int32] | list[list[Int32]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_supported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo: echo is not supported")
        if self.suffix:
            raise ValueError("suffix: suffix is not supported")
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise ValueError("prompt: prompt must not be empty")
            if isinstance(self.prompt[0], str | list) and len(self.prompt) > 1:
                raise ValueError("prompt: batched prompts are not supported; send one prompt per request")
        return self

    def single_prompt(self) -> str | list[int]:
        """The one prompt, as text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            return prompt[0]  # type: ignore[return-value]
        return prompt  # type: ignore[return-value]

    def num_logprobs(self) -> int | None:
        return self.logprobs


RequestT = TypeVar("RequestT", ChatCompletionRequest, CompletionRequest)


def parse_request(
    model: type[RequestT], body: bytes, limits: RequestLimits | None = None, max_model_len: int | None = None
) -> RequestT:
    """Validate a JSON body, then its size limits; every failure becomes a 400 naming the parameter."""
    try:
        req = model.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from None
    check_limits(req, limits or RequestLimits(), max_model_len)
    return req


UNION_EXPECTED = {
    "prompt": "a string, a list of token ids, or a one-element list of either",
    "stop": "a string or a list of strings",
    "content": "a string or a list of text parts",
}


def validation_error(exc: ValidationError) -> APIError:
    """The first problem, as `param: message`; union members' noise is replaced by what was expected."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return invalid_request(f"The request body is not valid JSON: {first['msg']}")
    message = first["msg"].removeprefix("Value error, ")
    loc = [str(part) for part in first["loc"]]
    if not loc:
        param, sep, text = message.partition(": ")
        return invalid_request(text, param=param) if sep and " " not in param else invalid_request(message)
    fields = [part for part in loc if part.isidentifier() and "[" not in part or part.isdigit()]
    union_field = next((part for part in fields if part in UNION_EXPECTED), None)
    if union_field and len(errors) > 1:
        where = ".".join(fields[: fields.index(union_field) + 1])
        return invalid_request(f"{where}: Input should be {UNION_EXPECTED[union_field]}", param=loc[0])
    return invalid_request(f"{'.'.join(fields)}: {message}", param=loc[0])
