"""The micro-batcher alone, with a stand-in encoder that records its batches (no model, no network)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from cache_service.embedder import MicroBatcher, VectorMemo


class RecordingEncoder:
    """Slow enough that requests queue up behind a running batch."""

    def __init__(self, delay_s: float = 0.05, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def encode(self, texts: list[str]) -> np.ndarray:
        with self.lock:
            self.batches.append(list(texts))
        time.sleep(self.delay_s)
        if self.fail_on in texts:
            raise RuntimeError("boom")
        return np.asarray([[float(len(t)), 1.0] for t in texts], dtype=np.float32)


async def test_concurrent_requests_share_batches_and_get_their_own_vectors() -> None:
    enc = RecordingEncoder()
    sizes: list[int] = []
    batcher = MicroBatcher(enc, max_batch=8, on_batch=lambda n, _s: sizes.append(n))  # type: ignore[arg-type]
    batcher.start()
    try:
        texts = [f"q{'x' * i}" for i in range(12)]
        vectors = await asyncio.gather(*(batcher.embed(t) for t in texts))
    finally:
        await batcher.close()
    assert [v[0] for v in vectors] == [float(len(t)) for t in texts]
    assert sorted(t for b in enc.batches for t in b) == sorted(texts)
    assert len(enc.batches) < len(texts)  # batched, not one pass per request
    assert max(len(b) for b in enc.batches) <= 8
    assert sizes == [len(b) for b in enc.batches]


async def test_a_failed_batch_fails_its_callers_and_the_batcher_goes_on() -> None:
    enc = RecordingEncoder(delay_s=0.0, fail_on="bad")
    batcher = MicroBatcher(enc, max_batch=4)  # type: ignore[arg-type]
    batcher.start()
    try:
        with pytest.raises(RuntimeError):
            await batcher.embed("bad")
        assert (await batcher.embed("good"))[0] == 4.0
    finally:
        await batcher.close()


async def test_a_remembered_text_skips_the_model() -> None:
    """A store right after the lookup that missed embeds the same question: no second pass."""
    enc = RecordingEncoder(delay_s=0.0)
    memo_hits: list[int] = []
    batcher = MicroBatcher(
        enc,  # type: ignore[arg-type]
        max_batch=4,
        memo_entries=2,
        on_memo_hit=lambda: memo_hits.append(1),
    )
    batcher.start()
    try:
        first = await batcher.embed("store me")
        again = await batcher.embed("store me")
    finally:
        await batcher.close()
    assert np.array_equal(first, again) and len(memo_hits) == 1
    assert enc.batches == [["store me"]]


def test_the_memo_keeps_the_most_recent_texts() -> None:
    memo = VectorMemo(2)
    for text in ("a", "b"):
        memo.put(text, np.full(2, ord(text), dtype=np.float32))
    assert memo.get("a") is not None  # now the most recent
    memo.put("c", np.zeros(2, dtype=np.float32))  # pushes out the least recent: "b"
    assert memo.get("b") is None and memo.get("a") is not None and len(memo) == 2
    off = VectorMemo(0)
    off.put("a", np.zeros(2, dtype=np.float32))
    assert off.get("a") is None
