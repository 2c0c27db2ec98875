"""One queue in front of the embedding model for all its work: the texts lookups and stores embed, and the
inputs of /v1/embeddings, both as token ids.

Whatever waits when a forward pass ends goes into the next one (up to max_batch inputs and max_batch_tokens
padded tokens), so a lone request pays no waiting time, a burst pays one pass, and a lookup and an embeddings
request arriving together share a pass instead of taking turns for the core. One worker thread runs the
passes. The vectors of recently embedded texts are remembered (a store right after the lookup that missed
embeds the same question: no second pass).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

LOOKUP = "lookup"  # a text a lookup or a store embeds
EMBEDDING = "embedding"  # an input of /v1/embeddings
KINDS = (LOOKUP, EMBEDDING)
MAX_BATCH_TOKENS = 16384  # padded tokens per forward pass (inputs x the longest of them)
# Texts whose vectors are remembered: ~6 MB of MiniLM vectors (384 float32), ~12 MB of mpnet's.
MEMO_ENTRIES = 4096


class IdEncoder(Protocol):
    """What the batcher needs of a model (cache_service/embedder.py's Embedder)."""

    def tokenize(self, texts: list[str]) -> list[list[int]]: ...

    def encode_ids(self, rows: list[list[int]]) -> np.ndarray: ...


@dataclass(frozen=True)
class BatchStats:
    """What one forward pass served: inputs per kind (duplicates included), the distinct rows it ran."""

    lookups: int
    embeddings: int
    rows: int
    padded_tokens: int
    seconds: float

    @property
    def mix(self) -> str:
        """lookup, embedding, or mixed (both kinds in one pass)."""
        if self.lookups and self.embeddings:
            return "mixed"
        return LOOKUP if self.lookups else EMBEDDING


@dataclass
class _Input:
    ids: tuple[int, ...]
    kind: str
    future: asyncio.Future[np.ndarray]


class VectorMemo:
    """The vectors of the last `capacity` texts embedded, least recently used out first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._vectors)

    def get(self, text: str) -> np.ndarray | None:
        vector = self._vectors.get(text)
        if vector is not None:
            self._vectors.move_to_end(text)
        return vector

    def put(self, text: str, vector: np.ndarray) -> None:
        if self.capacity <= 0:
            return
        self._vectors[text] = vector.copy()  # not a view that would keep its whole batch alive
        self._vectors.move_to_end(text)
        while len(self._vectors) > self.capacity:
            self._vectors.popitem(last=False)


class MicroBatcher:
    """Async front of an IdEncoder. `executor`: run on another batcher's thread (its passes and this one's
    then never compete for a core); by default a thread of its own."""

    def __init__(
        self,
        encoder: IdEncoder,
        max_batch: int = 32,
        *,
        max_batch_tokens: int = MAX_BATCH_TOKENS,
        memo_entries: int = MEMO_ENTRIES,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_memo_hit: Callable[[], None] | None = None,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.encoder = encoder
        self.max_batch = max_batch
        self._max_batch_tokens = max_batch_tokens
        self._memo = VectorMemo(memo_entries)
        self._on_batch = on_batch
        self._on_memo_hit = on_memo_hit
        self._queue: asyncio.Queue[_Input] = asyncio.Queue()
        self._owns_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().future.cancel()
        if self._owns_executor:
            self.executor.shutdown(wait=False, cancel_futures=True)

    async def embed(self, text: str) -> np.ndarray:
        """The vector of a lookup's (or a store's) text, cut at the model's length as sentence-transformers
        cuts it."""
        vector = self._memo.get(text)
        if vector is not None:
            if self._on_memo_hit is not None:
                self._on_memo_hit()
            return vector
        ids = self.encoder.tokenize([text])[0]
        vector = (await self._submit([ids], LOOKUP))[0]
        self._memo.put(text, vector)
        return vector

    async def embed_ids(self, rows: list[list[int]]) -> list[np.ndarray]:
        """The vectors of /v1/embeddings inputs, as token ids with the special tokens."""
        return await self._submit(rows, EMBEDDING)

    async def _submit(self, rows: list[list[int]], kind: str) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        inputs = [_Input(tuple(ids), kind, loop.create_future()) for ids in rows]
        for item in inputs:
            self._queue.put_nowait(item)
        try:
            return list(await asyncio.gather(*(item.future for item in inputs)))
        finally:
            for item in inputs:
                item.future.cancel()  # a caller that left: its inputs are skipped

    def _take(self, first: _Input) -> list[_Input]:
        """What is waiting, up to max_batch inputs and max_batch_tokens padded tokens (the first input is
        taken whatever its length); inputs whose callers left are dropped."""
        batch, longest = [first], len(first.ids)
        while len(batch) < self.max_batch and not self._queue.empty():
            nxt = self._queue._queue[0]  # type: ignore[attr-defined]  # peek: the asyncio.Queue's deque
            if max(longest, len(nxt.ids)) * (len(batch) + 1) > self._max_batch_tokens:
                break
            batch.append(self._queue.get_nowait())
            longest = max(longest, len(nxt.ids))
        return [item for item in batch if not item.future.done()]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = self._take(await self._queue.get())
            if not batch:
                continue
            rows = list(dict.fromkeys(item.ids for item in batch))  # an input asked twice runs once
            started = time.perf_counter()
            try:
                vectors = await loop.run_in_executor(
                    self.executor, self.encoder.encode_ids, [list(r) for r in rows]
                )
            except Exception as exc:  # handed to every waiting caller
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                continue
            if self._on_batch is not None:
                lookups = sum(item.kind == LOOKUP for item in batch)
                padded = len(rows) * max(len(r) for r in rows)
                seconds = time.perf_counter() - started
                self._on_batch(BatchStats(lookups, len(batch) - lookups, len(rows), padded, seconds))
            by_ids = dict(zip(rows, vectors, strict=True))
            for item in batch:
                if not item.future.done():
                    item.future.set_result(by_ids[item.ids])
