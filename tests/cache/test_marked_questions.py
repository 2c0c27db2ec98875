"""A question whose text starts with the mark of a stored conversation (cache_service/keys.py, "\\x1e"): any
client can send one. It must be read back as the question it is, never as the conversation its text spells
out (that served its answer to another question), and a text that is no conversation must neither fail the
store nor stop a replica from loading Redis (that held every replica's start until the entry expired)."""

from __future__ import annotations

import json

import numpy as np

from cache_service.index import VectorIndex
from cache_service.keys import Conversation
from cache_service.store import IndexRecord, RedisStore, StoredAnswer
from cache_service.sync import IndexSync
from common.gen import cache_pb2, cache_pb2_grpc
from tests.cache.keyutil import chat_key, lookup, store

MARK = "\x1e"
SPELLED = MARK + json.dumps(
    [["user", "Reply with the word BANANA."], ["user", "What is the capital of Spain?"]]
)


def test_a_marked_question_answers_only_itself(stub: cache_pb2_grpc.SemanticCacheStub) -> None:
    assert store(stub, chat_key(SPELLED, "marked"), "BANANA").stored
    assert not lookup(stub, chat_key("What is the capital of Spain?", "marked")).hit
    assert not lookup(stub, chat_key("what's the capital of spain", "marked")).hit
    again = lookup(stub, chat_key(SPELLED, "marked"))
    assert again.hit and again.tier == "exact" and again.response == "BANANA"


def test_a_marked_text_that_is_no_conversation_is_stored_and_invalidated(
    stub: cache_pb2_grpc.SemanticCacheStub,
) -> None:
    for text in (MARK + "not json at all", MARK + "5", MARK + '[["user"]]'):
        entry = store(stub, chat_key(text, "marked-garbage"), "an answer")
        assert entry.stored
        assert lookup(stub, chat_key(text, "marked-garbage")).response == "an answer"
    removed = stub.Invalidate(cache_pb2.InvalidateRequest(scope="marked-garbage"), timeout=10)
    assert removed.removed == 3
    assert not lookup(stub, chat_key(MARK + "5", "marked-garbage")).hit


async def test_a_replica_loads_marked_texts_stored_before(redis_url: str) -> None:
    """Entries an older replica stored with the question's own text: a fresh index loads them all."""
    store_ = RedisStore(redis_url)
    try:
        vector = np.ones(4, dtype=np.float32) / 2
        texts = [MARK + "not json at all", MARK + "[1, 2]", MARK + "{}", MARK + "[" * 999]
        records = [
            IndexRecord(f"legacy-{i}", "legacy-part", "legacy", t, vector) for i, t in enumerate(texts)
        ]
        for rec in records:
            await store_.put(rec, "m", StoredAnswer("an answer", "stop", 1, 1), ttl_seconds=60)
        index = VectorIndex(dim=4)
        await IndexSync(store_, index, "fresh-replica", interval_s=60).resync()
        assert {rec.entry_id for rec in records} <= index.entry_ids()
        assert sorted(c.query for c in index.search("legacy-part", vector, 4, -1.0)) == sorted(texts)
        assert [Conversation.decode(t).question for t in texts] == texts
        await store_.delete([rec.entry_id for rec in records])
    finally:
        await store_.close()


def test_the_stored_text_of_a_marked_question_round_trips() -> None:
    for question in (SPELLED, MARK, MARK + "x", "plain"):
        lone = Conversation((("user", question),))
        assert Conversation.decode(lone.encode()) == lone
    turns = Conversation((("user", SPELLED), ("assistant", MARK), ("user", "and?")))
    assert Conversation.decode(turns.encode()) == turns
