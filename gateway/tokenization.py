"""/tokenize and /detokenize in vLLM's shapes, so clients can budget the context before they ask.

A chat body is rendered with the model's template exactly as /v1/chat/completions would render it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, model_validator

from common.gen import worker_pb2
from gateway.errors import invalid_request
from gateway.protocol import (
    INT32_MAX,
    ChatMessage,
    Tool,
    _Strict,
    check_template_options,
    validation_error,
)
from gateway.worker_pool import WorkerPool
from gateway.worker_request import chat_prompt


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False
    add_generation_prompt: bool = True  # chat: as /v1/chat/completions takes them
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt: send exactly one of prompt and messages")
        if self.messages is not None:
            check_template_options(self.messages, self.add_generation_prompt, self.continue_final_message)
        return self


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(max_length=1 << 20)

    @model_validator(mode="after")
    def _ids(self) -> DetokenizeRequest:
        if any(not 0 <= t <= INT32_MAX for t in self.tokens):
            raise ValueError("tokens: token ids must be non-negative")
        return self


def parse(model: type[_Strict], body: bytes) -> _Strict:
    try:
        return model.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from None


async def tokenize(pool: WorkerPool, body: bytes) -> dict:
    req = parse(TokenizeRequest, body)
    assert isinstance(req, TokenizeRequest)
    if req.messages is not None:
        tools_json = "[" + ",".join(t.model_dump_json(exclude_none=True) for t in req.tools or []) + "]"
        call = worker_pb2.TokenizeRequest(chat=chat_prompt(req, tools_json if req.tools else ""))
    else:
        call = worker_pb2.TokenizeRequest(text=req.prompt, add_special_tokens=req.add_special_tokens)
    reply = await pool.tokenize(call, await _named_model(pool, req.model))
    return {
        "count": len(reply.token_ids),
        "max_model_len": reply.max_model_len,
        "tokens": list(reply.token_ids),
        "token_strs": list(reply.tokens) if req.return_token_strs else None,
    }


async def detokenize(pool: WorkerPool, body: bytes) -> dict:
    req = parse(DetokenizeRequest, body)
    assert isinstance(req, DetokenizeRequest)
    model = await _named_model(pool, req.model)
    return {"prompt": await pool.detokenize(req.tokens, model, param="tokens")}


async def _named_model(pool: WorkerPool, model: str | None) -> str | None:
    """The model whose tokenizer answers: the one named, else the only one served. With several models an
    unnamed request is refused (as vLLM's, `model` is optional): any worker's answer would be some model's
    count or text, whichever answered."""
    if model is not None:
        await pool.check_model(model)
        return model
    await pool.start()
    served = pool.served_models()
    if len(served) > 1:
        message = f"model: this gateway serves several models ({', '.join(served)}); name the one to use"
        raise invalid_request(message, param="model")
    return None
