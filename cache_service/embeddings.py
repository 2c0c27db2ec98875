"""Sentence embeddings for the gateway's /v1/embeddings (the `Embeddings` service of protos/cache.proto).

Served by the cache's own embedder and batcher (cache_service/batcher.py): an embeddings input and a lookup's
text waiting together run in the same forward pass, and the model is in memory once. Its vectors are
sentence-transformers' own (the embedder checks its path against SentenceTransformer.encode at load) as long
as the cache embeds in float32, the default. Where the operator chose a reduced type for the lookups
(CACHE_EMBEDDING_DTYPE=bfloat16 or bfloat16-weights), this route keeps a float32 copy of the model of its
own, loaded in the background at start, its passes on the lookups' thread (between theirs, never beside).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from cache_service.batcher import BatchStats, MicroBatcher
from cache_service.embedder import Embedder
from common.gen import cache_pb2, cache_pb2_grpc

log = logging.getLogger(__name__)


class EmbeddingInputError(ValueError):
    """An input the model cannot read as asked (too long, unknown token ids): INVALID_ARGUMENT."""


@dataclass
class InputReader:
    """Turns a request's inputs into the ids the model reads: special tokens added, cut or refused at the
    model's length."""

    tokenizer: Any
    max_tokens: int
    prefix: list[int]
    suffix: list[int]

    @classmethod
    def of(cls, embedder: Embedder) -> InputReader:
        prefix, suffix = special_tokens(embedder.tokenizer)
        return cls(embedder.tokenizer, embedder.max_tokens, prefix, suffix)

    @property
    def num_special(self) -> int:
        return len(self.prefix) + len(self.suffix)

    def without_special(self, ids: list[int]) -> list[int]:
        """Token ids as a client sent them, less the model's own special tokens at either end: ids from the
        tokenizer's default call (`tokenizer(text)["input_ids"]`, [CLS] ... [SEP] included) and ids without
        them read alike, and the model gets each exactly once."""
        if self.prefix and ids[: len(self.prefix)] == self.prefix:
            ids = ids[len(self.prefix) :]
        if self.suffix and ids[len(ids) - len(self.suffix) :] == self.suffix:
            ids = ids[: len(ids) - len(self.suffix)]
        return ids

    def token_ids(self, item: cache_pb2.EmbedInput, truncate: int | None) -> list[int]:
        """The ids the model reads for one input, special tokens included; cut to the last `truncate` tokens
        when asked, else refused when longer than the model reads."""
        if item.WhichOneof("input") == "token_ids":
            content = self.without_special(list(item.token_ids.ids))
            vocab = len(self.tokenizer)
            bad = next((t for t in content if not 0 <= t < vocab), None)
            if bad is not None:
                raise EmbeddingInputError(
                    f"token id {bad} is outside the embedding model's vocabulary (0..{vocab - 1})"
                )
        else:
            content = self.tokenizer(item.text, add_special_tokens=False, verbose=False)["input_ids"]
        limit = self.max_tokens if truncate is None else truncate
        if len(content) + self.num_special > limit:
            if truncate is None:
                raise EmbeddingInputError(
                    f"an input is {len(content) + self.num_special} tokens long; the embedding model reads "
                    f"at most {self.max_tokens} (set truncate_prompt_tokens to read only the last ones)"
                )
            content = content[len(content) - (limit - self.num_special) :]
        return [*self.prefix, *content, *self.suffix]


def special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text's own ([CLS] ... [SEP] for BERT), read off a probe:
    token-id inputs get exactly what a text would."""
    probe = "probe text"
    inner = tokenizer(probe, add_special_tokens=False)["input_ids"]
    outer = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(outer) - len(inner) + 1):
        if outer[start : start + len(inner)] == inner:
            return outer[:start], outer[start + len(inner) :]
    raise ValueError("cannot tell the tokenizer's special tokens from a text's")


def same_model(asked: str, served: str) -> bool:
    """`all-minilm-l6-v2`, `all-MiniLM-L6-v2` and `sentence-transformers/all-MiniLM-L6-v2` name one model."""
    return asked.lower().removeprefix("sentence-transformers/") == served.lower()


@dataclass
class EmbeddingRoute:
    """What serves /v1/embeddings: the model's name and size, how inputs are read, and the batcher that runs
    them (the lookups' own, or with `separate`, one in front of a float32 copy of the model)."""

    name: str
    dimensions: int
    reader: InputReader
    batcher: MicroBatcher
    separate: bool = False


class EmbeddingsServicer(cache_pb2_grpc.EmbeddingsServicer):
    """gRPC adapter; calls wait for the route (a float32 copy may still be loading: UNAVAILABLE if it
    failed)."""

    def __init__(self, loading: asyncio.Task[EmbeddingRoute]) -> None:
        self._loading = loading

    async def _route(self, context: grpc.aio.ServicerContext) -> EmbeddingRoute:
        try:
            return await asyncio.shield(self._loading)
        except Exception as exc:
            log.error("the embeddings model did not load: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the embedding model is not available")
            raise

    async def GetEmbeddingModel(
        self, request: cache_pb2.EmbeddingModelRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.EmbeddingModelInfo:
        route = await self._route(context)
        return cache_pb2.EmbeddingModelInfo(
            model=route.name, dimensions=route.dimensions, max_input_tokens=route.reader.max_tokens
        )

    async def Embed(
        self, request: cache_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.EmbedResponse:
        route = await self._route(context)
        reader = route.reader
        if not same_model(request.model, route.name):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"this service embeds with `{route.name}`")
        truncate = request.truncate_prompt_tokens if request.HasField("truncate_prompt_tokens") else None
        try:
            if truncate == -1:
                truncate = reader.max_tokens
            if truncate is not None and not reader.num_special < truncate <= reader.max_tokens:
                raise EmbeddingInputError(
                    "truncate_prompt_tokens must be -1 or between "
                    f"{reader.num_special + 1} and {reader.max_tokens}"
                )
            if not request.inputs:
                raise EmbeddingInputError("no input")
            unset = [i for i, item in enumerate(request.inputs) if item.WhichOneof("input") is None]
            if unset:
                raise EmbeddingInputError(f"input {unset[0]} is unset: set its text or token_ids")
            # On a thread: a long text takes ~1 s per MB to tokenize, and the lookups share this loop.
            ids = await asyncio.to_thread(lambda: [reader.token_ids(i, truncate) for i in request.inputs])
        except EmbeddingInputError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        vectors = await route.batcher.embed_ids(ids)
        embeddings = [
            cache_pb2.Embedding(values=vector.tolist(), tokens=len(row))
            for vector, row in zip(vectors, ids, strict=True)
        ]
        return cache_pb2.EmbedResponse(model=route.name, embeddings=embeddings)


def start_embeddings(
    embedder: Embedder,
    lookups: MicroBatcher,
    on_batch: Callable[[BatchStats], None] | None = None,
    onnx_dir: str | None = None,
) -> asyncio.Task[EmbeddingRoute]:
    """The route on the lookups' embedder and batcher when they run float32; else a float32 copy of the
    model loaded in a thread (lookups are served meanwhile), its batcher on the lookups' thread."""

    async def shared() -> EmbeddingRoute:
        return EmbeddingRoute(embedder.model, embedder.dim, InputReader.of(embedder), lookups)

    async def separate() -> EmbeddingRoute:
        float32 = await asyncio.to_thread(
            Embedder, embedder.path, embedder.num_threads, "float32", embedder.model, "auto", onnx_dir
        )
        batcher = MicroBatcher(
            float32, lookups.max_batch, memo_entries=0, on_batch=on_batch, executor=lookups.executor
        )
        batcher.start()
        log.info("embeddings: a float32 copy of %s (the lookups embed in %s)", embedder.model, embedder.dtype)
        return EmbeddingRoute(embedder.model, float32.dim, InputReader.of(float32), batcher, separate=True)

    load = shared() if embedder.dtype == "float32" else separate()
    return asyncio.get_running_loop().create_task(load)


async def stop_embeddings(loading: asyncio.Task[EmbeddingRoute]) -> None:
    if not loading.done():
        loading.cancel()
    outcome = (await asyncio.gather(loading, return_exceptions=True))[0]
    if isinstance(outcome, EmbeddingRoute) and outcome.separate:
        await outcome.batcher.close()
