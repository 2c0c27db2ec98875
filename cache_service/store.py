"""Entries in Redis: the source of truth shared by every replica.

Layout (prefix `llmserve:cache:`):
- `e:<entry id>` hash with the query text (keys.py `Conversation.encode`), its embedding (empty for an
  entry only the exact tier answers), the response, model, scope, partition, created time and hit count;
  expires after the entry's TTL.
- `s:<scope digest>` set of entry ids of one tenant, for invalidating a whole scope (pruned on resync).
- channel `events`: JSON notices of stores and removals, so other replicas update their index at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import redis.asyncio as aioredis

from cache_service.keys import scope_digest

PREFIX = "llmserve:cache:"
EVENTS_CHANNEL = PREFIX + "events"

# Hit check and hit count in one round trip: an expired (or invalidated) entry is never served.
_FETCH_HIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'hits', 1)
  return redis.call('HMGET', KEYS[1], 'resp', 'fr', 'pt', 'ct')
end
return false
"""


def entry_key(entry_id: str) -> str:
    return f"{PREFIX}e:{entry_id}"


def scope_key(scope: str) -> str:
    return f"{PREFIX}s:{scope_digest(scope)}"


@dataclass(frozen=True)
class StoredAnswer:
    response: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class IndexRecord:
    """What a replica's vector index needs of one entry."""

    entry_id: str
    partition: str
    scope: str
    query: str
    vector: np.ndarray | None  # None: only the exact tier answers it (keys.py `exact_only`), never searched


class RedisStore:
    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        # Commands time out (a hung Redis becomes UNAVAILABLE, not a pile of stuck lookups); the subscriber
        # blocks on reads by design, so it has its own client without a read timeout.
        self._redis = aioredis.Redis.from_url(
            url, decode_responses=False, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._subscriber = aioredis.Redis.from_url(
            url, decode_responses=False, socket_connect_timeout=timeout_s, health_check_interval=15
        )
        self._fetch_hit = self._redis.register_script(_FETCH_HIT)

    @property
    def client(self) -> aioredis.Redis:
        return self._redis

    def pubsub(self) -> aioredis.client.PubSub:
        return self._subscriber.pubsub()

    async def close(self) -> None:
        await self._redis.aclose()
        await self._subscriber.aclose()

    async def ping(self) -> bool:
        return bool(await self._redis.ping())

    async def fetch_hit(self, entry_id: str) -> StoredAnswer | None:
        row = await self._fetch_hit(keys=[entry_key(entry_id)])
        if not row:
            return None
        resp, fr, pt, ct = row
        return StoredAnswer(resp.decode(), fr.decode(), int(pt), int(ct))

    async def put(self, record: IndexRecord, model: str, answer: StoredAnswer, ttl_seconds: int) -> None:
        key = entry_key(record.entry_id)
        fields = {
            "q": record.query,
            "emb": b"" if record.vector is None else record.vector.astype(np.float32).tobytes(),
            "resp": answer.response,
            "fr": answer.finish_reason,
            "pt": answer.prompt_tokens,
            "ct": answer.completion_tokens,
            "model": model,
            "scope": record.scope,
            "part": record.partition,
            "created": f"{time.time():.3f}",
            "hits": 0,
        }
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=fields)
            pipe.expire(key, ttl_seconds)
            pipe.sadd(scope_key(record.scope), record.entry_id)
            await pipe.execute()

    async def delete(self, entry_ids: list[str]) -> int:
        if not entry_ids:
            return 0
        return int(await self._redis.delete(*(entry_key(i) for i in entry_ids)))

    async def scope_members(self, scope: str) -> list[str]:
        return [m.decode() for m in await self._redis.smembers(scope_key(scope))]

    async def drop_scope_set(self, scope: str) -> None:
        await self._redis.delete(scope_key(scope))

    async def load(self, entry_id: str) -> IndexRecord | None:
        row = await self._redis.hmget(entry_key(entry_id), *_RECORD_FIELDS)
        return _record(entry_id, *row)

    async def scan_ids(self, batch: int = 1000) -> AsyncIterator[list[str]]:
        """Ids of every live entry, in batches (SCAN: never blocks Redis, returns every key that exists
        for the whole scan)."""
        cursor: int = 0
        start = len(PREFIX) + 2
        while True:
            cursor, keys = await self._redis.scan(cursor=cursor, match=f"{PREFIX}e:*", count=batch)
            if keys:
                yield [k.decode()[start:] for k in keys]
            if cursor == 0:
                return

    async def load_many(self, ids: list[str]) -> list[IndexRecord]:
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.hmget(entry_key(entry_id), *_RECORD_FIELDS)
            rows = await pipe.execute()
        records = (_record(i, *row) for i, row in zip(ids, rows, strict=True))
        return [rec for rec in records if rec is not None]

    async def prune_scope_sets(self, batch: int = 1000) -> None:
        """Drop ids of expired entries from the per-scope sets (they would otherwise only grow)."""
        async for key in self._redis.scan_iter(match=f"{PREFIX}s:*", count=500):
            cursor: int = 0
            while True:
                cursor, members = await self._redis.sscan(key, cursor=cursor, count=batch)
                if members:
                    async with self._redis.pipeline(transaction=False) as pipe:
                        for m in members:
                            pipe.exists(entry_key(m.decode()))
                        alive = await pipe.execute()
                    dead = [m for m, a in zip(members, alive, strict=True) if not a]
                    if dead:
                        await self._redis.srem(key, *dead)
                if cursor == 0:
                    break

    async def publish(self, event: dict[str, object]) -> None:
        await self._redis.publish(EVENTS_CHANNEL, json.dumps(event))


_RECORD_FIELDS = ("part", "scope", "q", "emb")


def _record(
    entry_id: str, part: bytes | None, scope: bytes | None, query: bytes | None, emb: bytes | None
) -> IndexRecord | None:
    """The index record of an entry's fields (_RECORD_FIELDS); None if the entry is gone."""
    if part is None or emb is None:
        return None
    vector = np.frombuffer(emb, dtype=np.float32) if emb else None
    return IndexRecord(entry_id, part.decode(), (scope or b"").decode(), (query or b"").decode(), vector)
