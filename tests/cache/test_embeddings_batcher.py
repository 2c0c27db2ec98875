"""The embeddings batcher alone: inputs of concurrent requests share forward passes on the cache's embedding
thread (the MicroBatcher's, between lookup batches); a stand-in model records its batches (no model)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from cache_service.embedder import MicroBatcher
from cache_service.embeddings import EmbeddingBatcher, same_model


class RecordingModel:
    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []
        self.threads: set[str] = set()

    def encode_ids(self, batch: list[list[int]]) -> np.ndarray:
        self.batches.append([list(ids) for ids in batch])
        self.threads.add(threading.current_thread().name)
        time.sleep(0.05)
        return np.asarray([[float(len(ids)), float(ids[0])] for ids in batch], dtype=np.float32)


class NoEncoder:
    def encode(self, texts: list[str]) -> np.ndarray:
        return np.zeros((len(texts), 2), dtype=np.float32)


async def test_concurrent_requests_share_batches_on_the_lookup_thread() -> None:
    runner = MicroBatcher(NoEncoder(), max_batch=8)
    runner.start()
    model = RecordingModel()
    batcher = EmbeddingBatcher(model, runner, max_batch=8)  # type: ignore[arg-type]
    batcher.start()
    try:
        requests = [[[i, 1, 2][: 1 + i % 3] for i in range(start, start + 3)] for start in range(0, 12, 3)]
        replies = await asyncio.gather(*(batcher.embed(r) for r in requests))
    finally:
        await batcher.close()
        await runner.close()
    for request, vectors in zip(requests, replies, strict=True):
        assert [(v[0], v[1]) for v in vectors] == [(len(ids), ids[0]) for ids in request], (
            "each its own vector"
        )
    assert len(model.batches) < len(requests), "requests waiting together ran together"
    assert max(len(b) for b in model.batches) <= 8
    assert model.threads and all(name.startswith("embed") for name in model.threads)


def test_model_names() -> None:
    assert same_model("sentence-transformers/all-MiniLM-L6-v2", "all-minilm-l6-v2")
    assert same_model("all-minilm-l6-v2", "all-minilm-l6-v2")
    assert not same_model("all-mpnet-base-v2", "all-minilm-l6-v2")
