"""Identical cacheable requests in flight share one generation.

The semantic cache learns an answer only once it is complete, so until then the same question asked again
misses and is generated again: a burst of identical requests (a popular prompt, a client retrying, a page
load fanned out) costs one generation each. A request the cache may answer (deterministic sampling, one
choice, no logprobs: gateway/semantic.py) whose exact key is already being generated waits for that answer
instead and gets it as a cache hit. If the first request fails, is cut short or its client leaves, each
waiter generates for itself, as it would have without this. Only exact keys are shared (same tenant, same
conversation, same output parameters), never a merely similar question.

A finished answer stays here for STORE_GRACE_S, the time the background store into the cache service takes
to land, so a request arriving in between is not generated again either.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.cache_client import CacheHit

# Complete answers only (a request cut short must not hand its part to others); the cache service keeps the
# same ones (cache_service/core.py STORABLE_FINISH_REASONS).
SHAREABLE_FINISH_REASONS = frozenset({"stop", "length"})
MAX_WAIT_S = 120.0  # a waiter gives up on a generation this long and runs its own
STORE_GRACE_S = 2.0


def flight_id(key: Any) -> bytes:
    """A cache key's identity: its deterministic protobuf serialization."""
    return key.SerializeToString(deterministic=True)


class SingleFlight:
    """The generations in flight, by key; used from the event loop only."""

    def __init__(self, max_wait_s: float = MAX_WAIT_S, grace_s: float = STORE_GRACE_S) -> None:
        self.max_wait_s = max_wait_s
        self.grace_s = grace_s
        self._flights: dict[bytes, asyncio.Future[CacheHit | None]] = {}

    def __len__(self) -> int:
        return len(self._flights)

    async def wait(self, key: Any) -> CacheHit | None:
        """The answer of the identical request in flight (at once if it has just finished), or None when
        there is none, it failed, or it took longer than max_wait_s."""
        flight = self._flights.get(flight_id(key))
        if flight is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(flight), self.max_wait_s)
        except TimeoutError:
            return None

    def lead(self, key: Any) -> bytes | None:
        """Register a generation for `key`; None when one is already registered (its answer was not
        shareable, and this request generates on its own)."""
        ident = flight_id(key)
        flight = self._flights.get(ident)
        if flight is not None and not flight.done():
            return None
        self._flights[ident] = asyncio.get_running_loop().create_future()
        return ident

    def finish(self, ident: bytes, hit: CacheHit | None) -> None:
        """Hand the leader's answer (None: nothing to share) to its waiters; idempotent."""
        flight = self._flights.get(ident)
        if flight is None or flight.done():
            return
        flight.set_result(hit)
        if hit is None:
            del self._flights[ident]
        else:
            asyncio.get_running_loop().call_later(self.grace_s, self._forget, ident, flight)

    def _forget(self, ident: bytes, flight: asyncio.Future[CacheHit | None]) -> None:
        if self._flights.get(ident) is flight:
            del self._flights[ident]
