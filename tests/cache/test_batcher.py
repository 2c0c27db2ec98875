"""The micro-batcher alone, with a stand-in encoder that records its batches (no model, no network)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from cache_service.batcher import BatchStats, MicroBatcher, VectorMemo


class RecordingEncoder:
    """A text's ids are its characters' code points; a vector is (number of ids, first id). Slow enough that
    requests queue up behind a running batch."""

    def __init__(self, delay_s: float = 0.05, fail_on: str | None = None) -> None:
        self.batches: list[list[list[int]]] = []
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self.fail_on = [ord(c) for c in fail_on] if fail_on else None
        self.lock = threading.Lock()

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [[ord(c) for c in t] for t in texts]

    def encode_ids(self, rows: list[list[int]]) -> np.ndarray:
        with self.lock:
            self.batches.append([list(r) for r in rows])
            self.threads.add(threading.current_thread().name)
        time.sleep(self.delay_s)
        if self.fail_on in rows:
            raise RuntimeError("boom")
        return np.asarray([[float(len(r)), float(r[0])] for r in rows], dtype=np.float32)


async def test_concurrent_requests_share_batches_and_get_their_own_vectors() -> None:
    enc = RecordingEncoder()
    stats: list[BatchStats] = []
    batcher = MicroBatcher(enc, max_batch=8, on_batch=stats.append)
    batcher.start()
    try:
        texts = [f"q{'x' * i}" for i in range(12)]
        vectors = await asyncio.gather(*(batcher.embed(t) for t in texts))
    finally:
        await batcher.close()
    assert [v[0] for v in vectors] == [float(len(t)) for t in texts]
    assert sorted(len(r) for b in enc.batches for r in b) == sorted(len(t) for t in texts)
    assert len(enc.batches) < len(texts)  # batched, not one pass per request
    assert max(len(b) for b in enc.batches) <= 8
    assert [s.rows for s in stats] == [len(b) for b in enc.batches]
    assert all(s.mix == "lookup" and s.embeddings == 0 for s in stats)
    assert enc.threads and all(name.startswith("embed") for name in enc.threads)


async def test_token_ids_and_texts_share_a_pass_within_the_padded_token_bound() -> None:
    """Both kinds in one queue; a pass holds at most max_batch_tokens padded tokens (inputs x longest)."""
    enc = RecordingEncoder()
    stats: list[BatchStats] = []
    batcher = MicroBatcher(enc, max_batch=32, max_batch_tokens=40, on_batch=stats.append)
    batcher.start()
    try:
        first = asyncio.ensure_future(batcher.embed("warm"))  # runs alone; the rest queue behind it
        await asyncio.sleep(0.01)
        lookup = batcher.embed("abcde")
        rows = [[7] * 5, [8] * 5, [9] * 10, [6] * 20]
        vector, vectors, _ = await asyncio.gather(lookup, batcher.embed_ids(rows), first)
    finally:
        await batcher.close()
    assert vector[0] == 5.0 and [v[0] for v in vectors] == [5.0, 5.0, 10.0, 20.0]
    assert [(v[0], v[1]) for v in vectors] == [(len(r), r[0]) for r in rows]
    # behind the warm-up: the lookup with the first three ids rows (4 x 10 = 40 tokens), then the long row
    assert [len(b) for b in enc.batches] == [1, 4, 1]
    assert stats[1].mix == "mixed" and (stats[1].lookups, stats[1].embeddings) == (1, 3)
    assert stats[1].padded_tokens == 40 and stats[2].mix == "embedding"
    assert all(s.padded_tokens <= 40 for s in stats)


async def test_an_input_asked_twice_runs_once() -> None:
    enc = RecordingEncoder(delay_s=0.0)
    batcher = MicroBatcher(enc, max_batch=8)
    batcher.start()
    try:
        a, b = await asyncio.gather(batcher.embed_ids([[5, 6], [5, 6]]), batcher.embed("xy"))
    finally:
        await batcher.close()
    assert enc.batches == [[[5, 6], [ord("x"), ord("y")]]]
    assert a[0][1] == a[1][1] == 5.0 and b[1] == float(ord("x"))


async def test_a_remembered_text_skips_the_model() -> None:
    enc = RecordingEncoder(delay_s=0.0)
    memo_hits: list[int] = []
    batcher = MicroBatcher(enc, max_batch=8, memo_entries=2, on_memo_hit=lambda: memo_hits.append(1))
    batcher.start()
    try:
        first = await batcher.embed("store me")
        again = await batcher.embed("store me")  # a store right after the lookup that missed
        await batcher.embed_ids([[ord(c) for c in "store me"]])  # /v1/embeddings inputs always run
    finally:
        await batcher.close()
    assert np.array_equal(first, again) and len(memo_hits) == 1
    assert len(enc.batches) == 2


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


async def test_a_failed_batch_fails_its_callers_and_the_batcher_goes_on() -> None:
    enc = RecordingEncoder(delay_s=0.0, fail_on="bad")
    batcher = MicroBatcher(enc, max_batch=4)
    batcher.start()
    try:
        with pytest.raises(RuntimeError):
            await batcher.embed("bad")
        assert (await batcher.embed("good"))[0] == 4.0
    finally:
        await batcher.close()


async def test_a_batcher_can_run_on_another_batchers_thread() -> None:
    """The float32 copy for /v1/embeddings (when lookups embed in a reduced type) runs on the lookups' thread;
    closing it leaves that thread to its owner."""
    lookups_enc, other_enc = RecordingEncoder(delay_s=0.0), RecordingEncoder(delay_s=0.0)
    lookups = MicroBatcher(lookups_enc)
    lookups.start()
    other = MicroBatcher(other_enc, executor=lookups.executor)
    other.start()
    try:
        await other.embed_ids([[1, 2]])
        await other.close()
        assert (await lookups.embed("still here"))[0] == 10.0
    finally:
        await lookups.close()
    assert lookups_enc.threads == other_enc.threads
