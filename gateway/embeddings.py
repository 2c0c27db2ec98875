"""/v1/embeddings, served by the cache service's embedding model (the `Embeddings` gRPC service of
protos/cache.proto, cache_service/embeddings.py): the gateway validates and shapes, the service tokenizes
and embeds in float32."""

from __future__ import annotations

import base64
import logging
from array import array
from typing import Annotated, Any, Literal

import grpc
from pydantic import Field, ValidationError, model_validator

from common.gen import cache_pb2, cache_pb2_grpc
from gateway.errors import APIError, invalid_request, unavailable
from gateway.protocol import INT32_MAX, _Strict, validation_error

log = logging.getLogger(__name__)

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
MODEL_INFO_TIMEOUT_S = 0.5
CHANNEL_OPTIONS = [
    # 2,048 inputs of a 768-dimension model are ~6 MB of float32: past gRPC's default 4 MB.
    ("grpc.max_receive_message_length", 64 << 20),
    # Back within a second or two of the cache service's return (gRPC's default backoff grows to minutes).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class EmbeddingRequest(_Strict):
    model: str
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1, le=INT32_MAX)  # vLLM's

    @model_validator(mode="after")
    def _check(self) -> EmbeddingRequest:
        if self.dimensions is not None:
            raise ValueError(
                f"dimensions: this model's embeddings have a fixed size; dimensions is not supported "
                f"(got {self.dimensions})"
            )
        inputs = self.inputs()
        if not inputs or any(len(item) == 0 for item in inputs):
            raise ValueError("input: input must not be empty, nor contain an empty string or token list")
        if len(inputs) > MAX_INPUTS:
            raise ValueError(f"input: at most {MAX_INPUTS} inputs are allowed, got {len(inputs)}")
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens: must be -1 (the model's limit) or a positive number")
        return self

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text or one token list (a flat list of ids is one input)."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [value]  # type: ignore[list-item]
        return list(value)  # type: ignore[arg-type]


INPUT_EXPECTED = {
    "input": "a string, a list of strings, a list of token ids (integers from 0 to 2**31 - 1), or a list "
    "of such lists"
}


def parse_embedding_request(body: bytes) -> EmbeddingRequest:
    try:
        return EmbeddingRequest.model_validate_json(body, strict=True)
    except ValidationError as exc:
        raise validation_error(exc, INPUT_EXPECTED) from None


def embed_request(req: EmbeddingRequest) -> cache_pb2.EmbedRequest:
    out = cache_pb2.EmbedRequest(model=req.model)
    for item in req.inputs():
        if isinstance(item, str):
            out.inputs.append(cache_pb2.EmbedInput(text=item))
        else:
            out.inputs.append(cache_pb2.EmbedInput(token_ids=cache_pb2.TokenIds(ids=item)))
    if req.truncate_prompt_tokens is not None:
        out.truncate_prompt_tokens = req.truncate_prompt_tokens
    return out


def embeddings_body(reply: cache_pb2.EmbedResponse, encoding_format: str) -> dict[str, Any]:
    """OpenAI's shape; base64 is the little-endian float32 bytes, as OpenAI sends them."""
    data = []
    for index, embedding in enumerate(reply.embeddings):
        vector: Any = list(embedding.values)
        if encoding_format == "base64":
            values = array("f", embedding.values)
            if values.itemsize != 4 or array("H", [1]).tobytes() != b"\x01\x00":
                raise RuntimeError("base64 embeddings need little-endian float32")
            vector = base64.b64encode(values.tobytes()).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(e.tokens for e in reply.embeddings)
    return {
        "object": "list",
        "data": data,
        "model": reply.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _from_grpc(error: grpc.aio.AioRpcError) -> APIError:
    code, message = error.code(), error.details() or error.code().name
    if code == grpc.StatusCode.INVALID_ARGUMENT:  # the input, or a truncation the model cannot read
        param = "truncate_prompt_tokens" if message.startswith("truncate_prompt_tokens") else "input"
        return invalid_request(message, param)
    if code == grpc.StatusCode.NOT_FOUND:
        return APIError(
            404, f"The model does not exist: {message}", "invalid_request_error", "model", "model_not_found"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(504, "The embeddings request timed out", "timeout_error", None, "request_timeout")
    # gRPC's own text (addresses, socket errors) goes to the log, not to the client
    log.warning("embeddings call failed: %s: %s", code.name, message)
    if code == grpc.StatusCode.UNAVAILABLE:
        return unavailable("The embedding service (the cache service) is unavailable; retry shortly")
    return APIError(500, "The embedding service failed", "server_error", None, "embedding_error")


class EmbeddingsClient:
    """The cache service's Embeddings RPCs; None without a cache service (CACHE_ENABLED=false)."""

    def __init__(self, addr: str, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
        self._stub = cache_pb2_grpc.EmbeddingsStub(self._channel)

    async def embed(self, req: EmbeddingRequest) -> dict[str, Any]:
        try:
            reply = await self._stub.Embed(embed_request(req), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _from_grpc(exc) from None
        return embeddings_body(reply, req.encoding_format)

    async def model_card(self, created: int) -> dict[str, Any] | None:
        """The embedding model for /v1/models, or None while the cache service does not answer."""
        try:
            info = await self._stub.GetEmbeddingModel(
                cache_pb2.EmbeddingModelRequest(), timeout=MODEL_INFO_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            log.debug("embedding model unknown: %s", exc.code().name)
            return None
        return {
            "id": info.model,
            "object": "model",
            "created": created,
            "owned_by": "llmserve",
            "max_model_len": info.max_input_tokens,
            "dimensions": info.dimensions,
        }

    async def close(self) -> None:
        await self._channel.close()


def disabled() -> APIError:
    return unavailable("Embeddings are served by the cache service, which is off (CACHE_ENABLED=false)")
