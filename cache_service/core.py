"""The cache's decisions, free of gRPC, in three tiers, each checked only when the ones before it missed:

1. exact: the same partition and the same normalized turns (a Redis key; a completion's prompt: the same
   text byte for byte). An exact-only key (cache_service/keys.py: a completion's prompt, a last question too
   long to compare) asks no other tier, and its entry is stored without a vector;
2. canonical: a stored question with a canonical key in common (cache_service/canonical.py) in the same
   searched partition (for a conversation: canonical-equal earlier turns), no embedding needed;
3. semantic: the nearest stored questions by cosine in that partition, at or above the threshold that
   CACHE_MAX_FALSE_HIT_RATE maps to (cache_service/calibration.py), or from TYPO_FLOOR up when the two
   differ only by a few mistyped letters or the message is the stored question with framing around it
   (cache_service/framing.py: then the vetoes judge the question's own run of the message).
Canonical and semantic candidates must pass the vetoes (cache_service/vetoes.py), and every hit is checked
to still exist in Redis. A request may narrow the tiers (`level`), never widen them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from cache_service.batcher import MicroBatcher
from cache_service.canonical import canonical_keys, near_typo
from cache_service.framing import framed_question
from cache_service.index import VectorIndex
from cache_service.keys import Conversation, NotCacheableError, ParsedKey
from cache_service.metrics import CacheMetrics
from cache_service.store import IndexRecord, RedisStore, StoredAnswer
from cache_service.vetoes import veto

TOP_K = 4  # candidates checked per lookup: the best one may be vetoed or have expired
LEVELS = ("exact", "canonical", "semantic")  # each allows the tiers up to itself
# A candidate that differs from the query only by a few mistyped letters (canonical.near_typo) is accepted
# from this cosine up (a typo moves the vector more than its meaning); calibrated with the rest.
TYPO_FLOOR = 0.25
# The one owner of what is worth storing: a complete answer or one cut at max_tokens (which is part of the
# key). Tool calls, aborts and errors are not; the gateway sends every answer and lets this decide.
STORABLE_FINISH_REASONS = ("stop", "length")
# What a Store may report: OpenAI's finish reasons and the worker's "abort". Another (or none) is the
# client's mistake (INVALID_ARGUMENT), not an answer that is merely not worth keeping (stored=false).
FINISH_REASONS = (*STORABLE_FINISH_REASONS, "tool_calls", "content_filter", "function_call", "abort")


@dataclass(frozen=True)
class Hit:
    entry_id: str
    answer: StoredAnswer
    similarity: float
    tier: str  # exact | canonical | semantic

    @property
    def exact(self) -> bool:
        return self.tier == "exact"


def level_of(level: str) -> str:
    """A request's level ("" = every tier), validated."""
    if level == "":
        return "semantic"
    if level not in LEVELS:
        raise NotCacheableError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
    return level


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
    ) -> None:
        self.store = store
        self.batcher = batcher
        self.index = index
        self.metrics = metrics
        self.replica_id = replica_id
        self.threshold = threshold  # the semantic tier's cosine (above 1: the tier is off)
        self.ttl_seconds = ttl_seconds
        self.counts = Counts()

    async def lookup(self, key: ParsedKey, threshold: float | None, level: str = "semantic") -> Hit | None:
        """`threshold` (a request's) and `level` may only narrow what the operator configured; a stricter
        threshold holds for every semantic hit (no near-typo acceptance below it). A request refused for its
        level is no lookup: every lookup counted ends as a hit or a miss (or a failure)."""
        level = level_of(level)
        started = time.perf_counter()
        self.counts.lookups += 1
        self.metrics.lookups.inc()
        strict = threshold is not None and threshold > self.threshold
        cosine = threshold if strict else self.threshold
        hit = await self._lookup(key, cosine, cosine if strict else min(cosine, TYPO_FLOOR), level)
        if hit is None:
            self.counts.misses += 1
            self.metrics.misses.inc()
        else:
            self.counts.hits += 1
            self.metrics.hits.labels(kind=hit.tier).inc()
        self.metrics.lookup_seconds.observe(time.perf_counter() - started)
        return hit

    async def _lookup(self, key: ParsedKey, threshold: float, floor: float, level: str) -> Hit | None:
        """`floor`: the least cosine a candidate may have (below `threshold` for a near typo)."""
        answer = await self.store.fetch_hit(key.entry_id)
        if answer is not None:
            return Hit(key.entry_id, answer, 1.0, "exact")
        if level == "exact" or key.exact_only:
            return None
        partition = key.search_partition
        if not self.index.has_partition(partition):
            return None  # nothing comparable stored: no need to embed
        question = key.query
        for entry_id, stored in self.index.canonical_matches(partition, canonical_keys(question)):
            if veto(question, stored):
                self.metrics.veto_rejections.inc()
                continue
            hit = await self._accept(entry_id, stored, 1.0, "canonical")
            if hit is not None:
                return hit
        if level == "canonical" or threshold > 1.0:
            return None
        vector = await self.batcher.embed(question)
        for cand in self.index.search(partition, vector, TOP_K, floor):
            stored = Conversation.decode(cand.query).question
            eligible = cand.similarity >= threshold or near_typo(question, stored)
            if not (eligible and not veto(question, stored)):
                # the stored question inside framing ("Hi, tired mum here, <question> Thanks, Raj")
                framed = framed_question(question, stored)
                if framed is None or veto(framed, stored):
                    if eligible or framed is not None:  # a candidate the vetoes refused, counted once
                        self.metrics.veto_rejections.inc()
                    continue
            hit = await self._accept(cand.entry_id, stored, cand.similarity, "semantic")
            if hit is not None:
                return hit
        return None

    async def _accept(self, entry_id: str, stored: str, similarity: float, tier: str) -> Hit | None:
        """The hit on `entry_id` if it still exists."""
        answer = await self.store.fetch_hit(entry_id)
        if answer is None:
            self.metrics.stale_candidates.inc()
            self.index.remove(entry_id)  # expired or removed elsewhere
            return None
        return Hit(entry_id, answer, similarity, tier)

    async def put(self, key: ParsedKey, answer: StoredAnswer, ttl: int | None) -> str | None:
        if answer.finish_reason not in STORABLE_FINISH_REASONS:
            return None
        # An exact-only entry is never searched: no vector (nor the cost of tokenizing a long text for one).
        vector = None if key.exact_only else await self.batcher.embed(key.query)
        record = IndexRecord(key.entry_id, key.search_partition, key.scope, key.stored_text, vector)
        await self.store.put(record, key.model, answer, ttl or self.ttl_seconds)
        if vector is None:
            self.index.add_exact(record.entry_id, record.scope)
        else:
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
