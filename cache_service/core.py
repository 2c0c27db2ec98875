"""The cache's decisions, free of gRPC: exact match first, then similarity within a partition, then the
verifier (cheap checks and a learned classifier, conversation turn by turn), then a check that the entry
still exists in Redis."""

from __future__ import annotations

import time
from dataclasses import dataclass

from cache_service.embedder import MicroBatcher
from cache_service.index import Candidate, VectorIndex
from cache_service.keys import Conversation, ParsedKey
from cache_service.metrics import CacheMetrics
from cache_service.store import IndexRecord, RedisStore, StoredAnswer
from cache_service.verifier import MAX_COMPARABLE_CHARS, PairVerifier, Thresholds, verifier_texts

TOP_K = 4  # candidates checked per lookup: the best one may be refused by the verifier or have expired
# The one owner of what is worth storing: a complete answer or one cut at max_tokens (which is part of the
# key). Tool calls, aborts and errors are not; the gateway sends every answer and lets this decide.
STORABLE_FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Hit:
    entry_id: str
    answer: StoredAnswer
    similarity: float
    exact: bool


def acceptable(
    verifier: PairVerifier | None, query: Conversation, candidates: list[Candidate], thresholds: Thresholds
) -> list[Candidate]:
    """Candidates (already above the similarity floor, best first) that may answer `query`; all of them when
    there is no verifier (measurement only)."""
    if verifier is None or not candidates:
        return candidates
    verdicts = verifier.judge(query, [Conversation.decode(c.query) for c in candidates], thresholds)
    return [c for c, v in zip(candidates, verdicts, strict=True) if v.ok]


@dataclass
class Counts:
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    stores: int = 0


class SemanticCache:
    def __init__(
        self,
        store: RedisStore,
        batcher: MicroBatcher,
        index: VectorIndex,
        metrics: CacheMetrics,
        *,
        replica_id: str,
        threshold: float,
        ttl_seconds: int,
        verifier: PairVerifier | None,
        verifier_thresholds: Thresholds,
    ) -> None:
        self.store = store
        self.batcher = batcher
        self.index = index
        self.metrics = metrics
        self.replica_id = replica_id
        self.threshold = threshold
        self.ttl_seconds = ttl_seconds
        self.verifier = verifier  # None: similarity alone (measurement only)
        self.verifier_thresholds = verifier_thresholds
        self.counts = Counts()

    async def lookup(self, key: ParsedKey, threshold: float | None) -> Hit | None:
        started = time.perf_counter()
        self.counts.lookups += 1
        self.metrics.lookups.inc()
        hit = await self._lookup(key, self.threshold if threshold is None else threshold)
        if hit is None:
            self.counts.misses += 1
            self.metrics.misses.inc()
        else:
            self.counts.hits += 1
            self.metrics.hits.labels(kind="exact" if hit.exact else "semantic").inc()
        self.metrics.lookup_seconds.observe(time.perf_counter() - started)
        return hit

    async def _lookup(self, key: ParsedKey, threshold: float) -> Hit | None:
        answer = await self.store.fetch_hit(key.entry_id)
        if answer is not None:
            return Hit(key.entry_id, answer, 1.0, True)
        if len(key.query) > MAX_COMPARABLE_CHARS or not self.index.has_partition(key.partition):
            return None  # nothing comparable stored (or too long to compare): no need to embed
        vector = await self.batcher.embed(key.query, also=verifier_texts(key.conversation))
        candidates = self.index.search(key.partition, vector, TOP_K, threshold)
        accepted = await self.batcher.run(
            acceptable, self.verifier, key.conversation, candidates, self.verifier_thresholds
        )
        self.metrics.verifier_rejections.inc(len(candidates) - len(accepted))
        for cand in accepted:
            answer = await self.store.fetch_hit(cand.entry_id)
            if answer is not None:
                return Hit(cand.entry_id, answer, cand.similarity, False)
            self.metrics.stale_candidates.inc()
            self.index.remove(cand.entry_id)  # expired or removed elsewhere
        return None

    async def put(self, key: ParsedKey, answer: StoredAnswer, ttl: int | None) -> str | None:
        if answer.finish_reason not in STORABLE_FINISH_REASONS:
            return None
        # The states the verifier will read when this entry is a candidate, computed now rather than then.
        vector = await self.batcher.embed(key.query, also=verifier_texts(key.conversation))
        record = IndexRecord(key.entry_id, key.partition, key.scope, key.stored_text, vector)
        await self.store.put(record, key.model, answer, ttl or self.ttl_seconds)
        self.index.add(record.entry_id, record.partition, record.scope, vector, record.query)
        await self.store.publish({"op": "store", "id": record.entry_id, "origin": self.replica_id})
        self.counts.stores += 1
        self.metrics.stores.inc()
        self.metrics.entries.set(len(self.index))
        return record.entry_id

    async def invalidate_entry(self, entry_id: str) -> int:
        return await self._remove([entry_id])

    async def invalidate_scope(self, scope: str) -> int:
        ids = set(await self.store.scope_members(scope)) | set(self.index.ids_in_scope(scope))
        removed = await self._remove(sorted(ids))
        await self.store.drop_scope_set(scope)
        return removed

    async def _remove(self, ids: list[str]) -> int:
        removed = await self.store.delete(ids)
        for entry_id in ids:
            self.index.remove(entry_id)
        if ids:
            await self.store.publish({"op": "del", "ids": ids, "origin": self.replica_id})
        self.metrics.entries.set(len(self.index))
        return removed
