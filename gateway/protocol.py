"""Typed OpenAI request bodies. Unknown fields are ignored; wrong types and ranges are refused (400)."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from common.sampling import INT32_MAX, bounds
from gateway.errors import APIError, invalid_request
from gateway.limits import RequestLimits, check_limits

Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]

log = logging.getLogger(__name__)

# Fields this server does not implement that would change the output: refused, naming the field.
UNSUPPORTED_FIELDS = {
    "functions": "use tools",
    "function_call": "use tool_choice",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
}
# vLLM's extensions this server does not implement: refused, naming the field, unless given their default
# value (vLLM's clients send some with defaults), so a vLLM client never gets output it did not ask for.
UNSUPPORTED_VLLM_FIELDS: dict[str, tuple[tuple[Any, ...], str]] = {
    "spaces_between_special_tokens": ((True,), "special tokens are left out of the text"),
    "chat_template": ((), "the model's own chat template is used (vLLM runs a request's only when trusted)"),
}
# Accepted and ignored (they do not change the output); each is logged once per process.
IGNORED_FIELDS = {
    "store",
    "metadata",
    "service_tier",
    "reasoning_effort",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
    "guided_decoding_backend",
}
_logged_ignored: set[str] = set()
DEFAULT_COMPLETION_MAX_TOKENS = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


ROLES_NEEDING_CONTENT = ("system", "developer", "user", "tool")  # only an assistant's may be null


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format: json_schema is required when type is 'json_schema'")
        return self


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant message that called tools
    tool_call_id: str | None = None  # a tool message: the call it answers

    @model_validator(mode="after")
    def _check_content(self) -> ChatMessage:
        """OpenAI's rules: content, unless an assistant's that calls tools; a tool message names its call."""
        if self.content is None and self.role in ROLES_NEEDING_CONTENT:
            raise ValueError(f"content is required for a {self.role!r} message")
        if self.content is None and not self.tool_calls:
            raise ValueError("content is required for an 'assistant' message without tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("tool_call_id is required for a 'tool' message")
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
    """Fields both endpoints share: OpenAI's sampling parameters and vLLM's extensions; the bounds are the
    sampling contract's (common/sampling.py), so the worker refuses the same values over gRPC."""

    model: str
    max_tokens: int | None = Field(default=None, **bounds("max_tokens").pydantic())
    temperature: float | None = Field(default=None, **bounds("temperature").pydantic())
    top_p: float | None = Field(default=None, **bounds("top_p").pydantic())
    n: int | None = Field(default=None, **bounds("n").pydantic())
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, **bounds("seed").pydantic())
    presence_penalty: float | None = Field(default=None, **bounds("presence_penalty").pydantic())
    frequency_penalty: float | None = Field(default=None, **bounds("frequency_penalty").pydantic())
    user: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    top_k: int | None = Field(default=None, **bounds("top_k").pydantic())  # -1 or 0: off (vLLM)
    min_p: float | None = Field(default=None, **bounds("min_p").pydantic())
    repetition_penalty: float | None = Field(default=None, **bounds("repetition_penalty").pydantic())
    min_tokens: int | None = Field(default=None, **bounds("min_tokens").pydantic())
    ignore_eos: bool | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # k > 0: the prompt's last k tokens only; -1: its last max_model_len (vLLM's left truncation)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    stop_token_ids: list[Int32] | None = None
    allowed_token_ids: list[Int32] | None = None  # vLLM's: the only tokens that may be sampled
    bad_words: list[str] | None = None  # vLLM's: words never generated
    logit_bias: dict[str, float] | None = None  # token id (as a JSON key) -> -100..100
    response_format: ResponseFormat | None = None
    # vLLM's structured output extensions
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_grammar: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _check_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, why in UNSUPPORTED_FIELDS.items():
                if data.get(name) is not None:
                    raise ValueError(f"{name}: {name} is not supported ({why})")
            for name, (defaults, why) in UNSUPPORTED_VLLM_FIELDS.items():
                if data.get(name) is not None and data[name] not in defaults:
                    raise ValueError(f"{name}: {name} is not supported ({why})")
            if data.get("modalities") not in (None, ["text"]):
                raise ValueError("modalities: only text output is supported")
            for name in IGNORED_FIELDS.intersection(data).difference(_logged_ignored):
                _logged_ignored.add(name)
                log.info("accepted and ignored request field %r (logged once)", name)
        return data

    @model_validator(mode="after")
    def _check_stream_options(self) -> _SamplingRequest:
        if self.stream_options is not None and not self.stream:  # OpenAI's and vLLM's 400, in their words
            raise ValueError("stream_options: Stream options can only be defined when `stream=True`.")
        return self

    @model_validator(mode="after")
    def _check_truncation(self) -> _SamplingRequest:
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens: must be -1 (the context length) or a positive number")
        return self

    @model_validator(mode="after")
    def _check_structured(self) -> _SamplingRequest:
        for token, bias in (self.logit_bias or {}).items():
            if not token.isdigit() or int(token) > INT32_MAX:
                raise ValueError(f"logit_bias: keys must be token ids, got {token!r}")
            if bias not in bounds("logit_bias"):
                raise ValueError(f"logit_bias: values must be in {bounds('logit_bias')}, got {bias}")
        formats = [self.guided_json, self.guided_regex, self.guided_choice, self.guided_grammar]
        if self.response_format is not None and self.response_format.type != "text":
            formats.append(self.response_format)
        if sum(f is not None for f in formats) > 1:
            raise ValueError("response_format: set at most one of response_format and guided_*")
        return self

    @property
    def structured_output_set(self) -> bool:
        rf = self.response_format
        guided = (self.guided_json, self.guided_regex, self.guided_choice, self.guided_grammar)
        return (rf is not None and rf.type != "text") or any(g is not None for g in guided)

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

    def num_prompt_logprobs(self) -> int | None:
        """None: no prompt logprobs; k: each prompt token's logprob and the top k (completions only)."""
        return None


def check_template_options(
    messages: list[ChatMessage], add_generation_prompt: bool, continue_final_message: bool
) -> None:
    """vLLM's rules for its two chat template options (400 naming the field)."""
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message: continue_final_message needs add_generation_prompt set to false"
        )
    if continue_final_message and messages[-1].role != "assistant":
        raise ValueError("continue_final_message: the last message must be the assistant's to continue it")


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, **bounds("max_tokens").pydantic())
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, **bounds("logprobs").pydantic())
    tools: list[Tool] | None = Field(default=None, min_length=1)  # OpenAI refuses an empty list
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's chat template options (worker/engine/chat_template.py): the assistant's turn opened after the
    # messages, or the last message, an assistant's, continued instead
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the template (the worker checks)
    documents: list[dict[str, Any]] | None = None  # the template's `documents`

    @model_validator(mode="after")
    def _check_template_options(self) -> ChatCompletionRequest:
        check_template_options(self.messages, self.add_generation_prompt, self.continue_final_message)
        return self

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        forced = self.tool_choice not in (None, "none", "auto")
        if forced and not self.tools:
            raise ValueError("tool_choice: tool_choice requires tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice: no tool named {self.tool_choice.function.name!r} in tools")
        if forced and self.structured_output_set:
            raise ValueError("tool_choice: a forced tool call cannot be combined with response_format")
        return self

    @model_validator(mode="before")
    @classmethod
    def _check_prompt_logprobs(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in ("prompt_logprobs", "echo"):  # echo: vLLM's, the last message before the reply
                if data.get(name) not in (None, False):
                    raise ValueError(f"{name}: {name} is only supported on /v1/completions")
        return data

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: top_logprobs requires logprobs to be true")
        return self

    @model_validator(mode="after")
    def _check_max_tokens(self) -> ChatCompletionRequest:
        """0 is the contract's for scoring a prompt, which chat does not do (nor vLLM's or OpenAI's)."""
        if self.completion_limit() == 0:
            name = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
            raise ValueError(f"{name}: {name} must be at least 1")
        return self

    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        """None: no logprobs; k: the sampled token's logprob and the top k alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[Int32] | list[list[Int32]]
    # OpenAI's and vLLM's default for legacy completions (an explicit null: up to the context limit)
    max_tokens: int | None = Field(default=DEFAULT_COMPLETION_MAX_TOKENS, **bounds("max_tokens").pydantic())
    logprobs: int | None = Field(default=None, **bounds("logprobs").pydantic())
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)
    prompt_logprobs: int | None = Field(default=None, **bounds("prompt_logprobs").pydantic())  # vLLM's

    @model_validator(mode="after")
    def _check_supported(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix: suffix is not supported")
        # best_of = n (OpenAI's default) changes nothing; more would return the n best of best_of samples,
        # which this server does not rank (as vLLM's V1 engine): refused rather than quietly sampling n.
        if self.best_of is not None and self.best_of < self.num_choices:
            raise ValueError("best_of: best_of must be at least n")
        if self.best_of is not None and self.best_of > self.num_choices:
            raise ValueError(
                "best_of: best_of above n is not supported (ask for n choices with logprobs and rank them)"
            )
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise ValueError("prompt: prompt must not be empty")
        if self.max_tokens == 0 and not self.echo:  # OpenAI's legacy API scores a prompt this way only
            raise ValueError("max_tokens: max_tokens 0 generates nothing: it needs echo, to score the prompt")
        return self

    def prompts(self) -> list[str | list[int]]:
        """Every prompt of the request (a list of prompts runs them all, choices numbered in order)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            return list(prompt)  # type: ignore[arg-type]
        return [prompt]  # type: ignore[list-item]

    def single_prompt(self) -> str | list[int]:
        """The one prompt, as text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            return prompt[0]  # type: ignore[return-value]
        return prompt  # type: ignore[return-value]

    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def echo_logprobs(self) -> bool:
        """echo with logprobs: the prompt's tokens lead the legacy logprobs, as in OpenAI's API."""
        return bool(self.echo) and self.logprobs is not None

    def num_prompt_logprobs(self) -> int | None:
        """What the worker computes: enough for both `prompt_logprobs` and echo's logprobs; with max_tokens 0
        at least 0 (the worker's prompt-only run, which the contract allows only with prompt logprobs)."""
        wanted = [
            self.prompt_logprobs,
            self.logprobs if self.echo_logprobs else None,
            0 if self.max_tokens == 0 else None,
        ]
        return max((k for k in wanted if k is not None), default=None)


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
    "prompt": "a string, a list of token ids, or a list of either",
    "stop": "a string or a list of strings",
    "content": "a string or a list of text parts",
}


def validation_error(exc: ValidationError, unions: dict[str, str] = UNION_EXPECTED) -> APIError:
    """The first problem, as `param: message`; union members' noise is replaced by what was expected
    (`unions`: field -> the shapes it takes, in words)."""
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
    union_field = next((part for part in fields if part in unions), None)
    if union_field and len(errors) > 1:
        where = ".".join(fields[: fields.index(union_field) + 1])
        return invalid_request(f"{where}: Input should be {unions[union_field]}", param=loc[0])
    return invalid_request(f"{'.'.join(fields)}: {message}", param=loc[0])
