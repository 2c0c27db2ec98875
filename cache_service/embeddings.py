"""Sentence embeddings for the gateway's /v1/embeddings (the `Embeddings` service of protos/cache.proto).

The vectors come from the embedding model's own sentence-transformers pipeline in float32 (its pooling and
normalization), so they equal `SentenceTransformer.encode` whatever the lookups run on (ONNX, bfloat16): the
model is loaded a second time for this, in the background at start. Its forward passes run on the cache's
embedding thread (MicroBatcher.run), between lookup batches, so an embeddings request never competes with a
lookup for a core; inputs of concurrent requests waiting together run as one padded batch.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from cache_service.embedder import MicroBatcher
from common.gen import cache_pb2, cache_pb2_grpc

log = logging.getLogger(__name__)

MAX_BATCH_TOKENS = 16384  # padded tokens per forward pass


class EmbeddingInputError(ValueError):
    """An input the model cannot read as asked (too long, unknown token ids): INVALID_ARGUMENT."""


class SentenceModel:
    """The float32 sentence-transformers model: token ids in (special tokens added here), unit vectors out."""

    def __init__(self, path: str, name: str) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        self._torch = torch
        self.name = name
        self._model = SentenceTransformer(path, device="cpu").float().eval()
        self.tokenizer = self._model.tokenizer
        self.max_tokens = int(self._model.get_max_seq_length() or self.tokenizer.model_max_length)
        self.dimensions = int(self._model.get_embedding_dimension())
        self.prefix, self.suffix = special_tokens(self.tokenizer)
        self.num_special = len(self.prefix) + len(self.suffix)

    def token_ids(self, item: cache_pb2.EmbedInput, truncate: int | None) -> list[int]:
        """The ids the model reads for one input, special tokens included; cut to the last `truncate` tokens
        when asked, else refused when longer than the model reads."""
        if item.WhichOneof("input") == "token_ids":
            content = list(item.token_ids.ids)
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

    def encode_ids(self, batch: list[list[int]]) -> np.ndarray:
        """One padded forward pass through the model's own modules (pooling, normalization): float32."""
        torch = self._torch
        padded = self.tokenizer.pad({"input_ids": batch}, return_tensors="pt")
        features: dict[str, Any] = {
            "input_ids": padded["input_ids"],
            "attention_mask": padded["attention_mask"],
            "token_type_ids": torch.zeros_like(padded["input_ids"]),
            "modality": "text",
        }
        with torch.inference_mode():
            vectors = self._model.forward(features)["sentence_embedding"]
        return np.ascontiguousarray(vectors.float().numpy(), dtype=np.float32)


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


@dataclass
class _Pending:
    ids: list[int]
    future: asyncio.Future[np.ndarray]


class EmbeddingBatcher:
    """Inputs of concurrent requests, run together in batches on the cache's embedding thread."""

    def __init__(self, model: SentenceModel, runner: MicroBatcher, max_batch: int) -> None:
        self.model = model
        self._runner = runner
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().future.cancel()

    async def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        pending = [_Pending(ids, loop.create_future()) for ids in inputs]
        for item in pending:
            self._queue.put_nowait(item)
        try:
            return list(await asyncio.gather(*(p.future for p in pending)))
        finally:
            for item in pending:
                item.future.cancel()  # a caller that left: its inputs are skipped

    def _take(self, first: _Pending) -> list[_Pending]:
        """What is waiting, up to max_batch inputs and MAX_BATCH_TOKENS padded tokens."""
        batch, longest = [first], len(first.ids)
        while len(batch) < self._max_batch and not self._queue.empty():
            nxt = self._queue._queue[0]  # type: ignore[attr-defined]  # peek: deque of the asyncio.Queue
            if max(longest, len(nxt.ids)) * (len(batch) + 1) > MAX_BATCH_TOKENS:
                break
            batch.append(self._queue.get_nowait())
            longest = max(longest, len(nxt.ids))
        return [p for p in batch if not p.future.done()]

    async def _run(self) -> None:
        while True:
            batch = self._take(await self._queue.get())
            if not batch:
                continue
            try:
                vectors = await self._runner.run(self.model.encode_ids, [p.ids for p in batch])
            except Exception as exc:  # handed to every waiting caller
                log.exception("embedding batch failed")
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            for p, vector in zip(batch, vectors, strict=True):
                if not p.future.done():
                    p.future.set_result(vector)


def same_model(asked: str, served: str) -> bool:
    """`all-minilm-l6-v2`, `all-MiniLM-L6-v2` and `sentence-transformers/all-MiniLM-L6-v2` name one model."""
    return asked.lower().removeprefix("sentence-transformers/") == served.lower()


class EmbeddingsServicer(cache_pb2_grpc.EmbeddingsServicer):
    """gRPC adapter; the model loads in the background, calls wait for it (UNAVAILABLE if it failed)."""

    def __init__(self, loading: asyncio.Task[EmbeddingBatcher]) -> None:
        self._loading = loading

    async def _batcher(self, context: grpc.aio.ServicerContext) -> EmbeddingBatcher:
        try:
            return await asyncio.shield(self._loading)
        except Exception as exc:
            log.error("the embeddings model did not load: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the embedding model is not available")
            raise

    async def GetEmbeddingModel(
        self, request: cache_pb2.EmbeddingModelRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.EmbeddingModelInfo:
        model = (await self._batcher(context)).model
        return cache_pb2.EmbeddingModelInfo(
            model=model.name, dimensions=model.dimensions, max_input_tokens=model.max_tokens
        )

    async def Embed(
        self, request: cache_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> cache_pb2.EmbedResponse:
        batcher = await self._batcher(context)
        model = batcher.model
        if not same_model(request.model, model.name):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"this service embeds with `{model.name}`")
        truncate = request.truncate_prompt_tokens if request.HasField("truncate_prompt_tokens") else None
        try:
            if truncate == -1:
                truncate = model.max_tokens
            if truncate is not None and not model.num_special < truncate <= model.max_tokens:
                raise EmbeddingInputError(
                    "truncate_prompt_tokens must be -1 or between "
                    f"{model.num_special + 1} and {model.max_tokens}"
                )
            if not request.inputs:
                raise EmbeddingInputError("no input")
            ids = [model.token_ids(item, truncate) for item in request.inputs]
        except EmbeddingInputError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        vectors = await batcher.embed(ids)
        embeddings = [
            cache_pb2.Embedding(values=vector.tolist(), tokens=len(row))
            for vector, row in zip(vectors, ids, strict=True)
        ]
        return cache_pb2.EmbedResponse(model=model.name, embeddings=embeddings)


def start_embeddings(
    path: str, name: str, runner: MicroBatcher, max_batch: int
) -> asyncio.Task[EmbeddingBatcher]:
    """Load the float32 model in a thread (lookups are served meanwhile), then start its batcher."""

    async def load() -> EmbeddingBatcher:
        model = await asyncio.to_thread(SentenceModel, path, name)
        batcher = EmbeddingBatcher(model, runner, max_batch)
        batcher.start()
        log.info(
            "embeddings: %s, %d dimensions, up to %d tokens, float32",
            name,
            model.dimensions,
            model.max_tokens,
        )
        return batcher

    return asyncio.get_running_loop().create_task(load())


async def stop_embeddings(loading: asyncio.Task[EmbeddingBatcher]) -> None:
    if not loading.done():
        loading.cancel()
    outcome = (await asyncio.gather(loading, return_exceptions=True))[0]
    if isinstance(outcome, EmbeddingBatcher):
        await outcome.close()
