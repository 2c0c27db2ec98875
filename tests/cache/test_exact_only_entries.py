"""Entries only the exact tier answers (cache_service/keys.py `exact_only`) through a real Redis: stored
without a vector, loaded back into an index by id only, never searched. No model."""

from __future__ import annotations

import uuid

import numpy as np

from cache_service.index import VectorIndex
from cache_service.keys import MAX_COMPARABLE_CHARS
from cache_service.store import IndexRecord, RedisStore, StoredAnswer
from cache_service.sync import IndexSync

ANSWER = StoredAnswer("an answer", "stop", 3, 2)


def record(query: str, vector: np.ndarray | None) -> IndexRecord:
    return IndexRecord(uuid.uuid4().hex, "part", "t-exact-only", query, vector)


async def test_an_entry_without_a_vector_is_loaded_by_id_only(redis_url: str) -> None:
    store = RedisStore(redis_url)
    try:
        exact = record("x" * 5000, None)
        searched = record("a question", np.ones(4, dtype=np.float32) / 2)
        # stored by a replica before exact-only entries had no vector: still too long to search
        older = record("y" * (MAX_COMPARABLE_CHARS + 1), np.ones(4, dtype=np.float32) / 2)
        for rec in (exact, searched, older):
            await store.put(rec, "m", ANSWER, ttl_seconds=60)
        loaded = await store.load(exact.entry_id)
        assert loaded is not None and loaded.vector is None and loaded.query == exact.query
        index = VectorIndex(dim=4)
        await IndexSync(store, index, "replica", interval_s=60).resync()
        assert {exact.entry_id, searched.entry_id, older.entry_id} <= index.entry_ids()
        found = index.search("part", np.ones(4, dtype=np.float32) / 2, k=4, min_similarity=-1.0)
        assert [c.entry_id for c in found] == [searched.entry_id]
        assert sorted(index.ids_in_scope("t-exact-only")) == sorted(index.entry_ids())
        await store.delete([exact.entry_id, searched.entry_id, older.entry_id])
    finally:
        await store.close()
