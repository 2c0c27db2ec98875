"""Keeps a replica's vector index in step with Redis: full load at start, pub/sub events from other
replicas, and a periodic diff against Redis (catches missed events and drops expired entries)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from cache_service.index import VectorIndex
from cache_service.keys import Conversation
from cache_service.store import EVENTS_CHANNEL, IndexRecord, RedisStore

log = logging.getLogger(__name__)
PRUNE_EVERY = 10  # resync rounds between prunings of the per-scope id sets


class IndexSync:
    def __init__(
        self,
        store: RedisStore,
        index: VectorIndex,
        replica_id: str,
        interval_s: float,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._index = index
        self._replica_id = replica_id
        self._interval_s = interval_s
        self._on_change = on_change or (lambda: None)
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribed = asyncio.Event()

    async def start(self) -> None:
        """Subscribe first, then load, so no store made in between is missed."""
        self._tasks.append(asyncio.create_task(self._listen()))
        await asyncio.wait_for(self._subscribed.wait(), timeout=10)
        await self.resync()
        self._tasks.append(asyncio.create_task(self._periodic()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def resync(self) -> None:
        """Diff against Redis: load entries the index lacks, drop those Redis no longer has.

        Only ids are scanned for entries already indexed, and the loop is yielded between batches, so a
        resync of a large index doesn't stall lookups. An entry stored during the scan is not in the
        snapshot, so it can't be mistaken for a removed one."""
        snapshot = self._index.entry_ids()
        live: set[str] = set()
        async for ids in self._store.scan_ids():
            live.update(ids)
            missing = [i for i in ids if i not in self._index]
            if missing:
                for rec in await self._store.load_many(missing):
                    self._add(rec)
            await asyncio.sleep(0)
        for entry_id in snapshot - live:
            self._index.remove(entry_id)
        self._on_change()

    def _add(self, rec: IndexRecord) -> None:
        # An entry only the exact tier answers has no vector; one too long to compare that an older replica
        # stored with a vector is never searched either (nor canonicalized on the event loop).
        if rec.vector is None or Conversation.decode(rec.query).too_long:
            self._index.add_exact(rec.entry_id, rec.scope)
            return
        if rec.vector.shape != (self._index.dim,):
            log.warning("entry %s has an embedding of shape %s; skipped", rec.entry_id, rec.vector.shape)
            return
        self._index.add(rec.entry_id, rec.partition, rec.scope, rec.vector, rec.query)

    async def _periodic(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(self._interval_s)
            rounds += 1
            try:
                await self.resync()
                if rounds % PRUNE_EVERY == 0:
                    await self._store.prune_scope_sets()
            except Exception:  # noqa: BLE001 - Redis may be briefly away; the next round retries
                log.exception("index resync failed")

    async def _listen(self) -> None:
        backoff = 0.1
        while True:
            pubsub = self._store.pubsub()
            try:
                await pubsub.subscribe(EVENTS_CHANNEL)
                if self._subscribed.is_set():
                    await self.resync()  # events may have been missed while disconnected
                self._subscribed.set()
                backoff = 0.1
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        await self._apply(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - reconnect with backoff
                log.warning("cache event subscription lost; reconnecting", exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                await pubsub.aclose()

    async def _apply(self, data: bytes) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            return
        if event.get("origin") == self._replica_id:
            return
        if event.get("op") == "store":
            rec = await self._store.load(str(event.get("id")))
            if rec is not None:
                self._add(rec)
        elif event.get("op") == "del":
            for entry_id in event.get("ids", []):
                self._index.remove(str(entry_id))
        self._on_change()
