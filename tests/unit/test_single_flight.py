"""Identical cacheable requests in flight share one generation (gateway/single_flight.py)."""

from __future__ import annotations

import asyncio

from common.gen import cache_pb2
from gateway.cache_client import CacheHit
from gateway.single_flight import SingleFlight


def key(text: str, scope: str = "t") -> cache_pb2.CacheKey:
    k = cache_pb2.CacheKey(model="m", scope=scope, params_fingerprint="p")
    k.messages.append(cache_pb2.Message(role="user", content=text))
    return k


ANSWER = CacheHit("Paris.", 1.0, True, "stop", 7, 2)


def test_waiters_get_the_leaders_answer_and_other_keys_do_not() -> None:
    async def scenario() -> None:
        flights = SingleFlight(max_wait_s=5, grace_s=0.05)
        assert await flights.wait(key("q")) is None  # nothing in flight: generate
        ident = flights.lead(key("q"))
        assert ident is not None
        waiters = [asyncio.create_task(flights.wait(key("q"))) for _ in range(3)]
        other = asyncio.create_task(flights.wait(key("q", scope="someone else")))
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters) and other.done() and other.result() is None
        flights.finish(ident, ANSWER)
        assert await asyncio.gather(*waiters) == [ANSWER] * 3
        assert await flights.wait(key("q")) == ANSWER  # just finished: its store may not have landed yet
        await asyncio.sleep(0.1)
        assert len(flights) == 0 and await flights.wait(key("q")) is None

    asyncio.run(scenario())


def test_a_failed_leader_sends_waiters_to_generate_for_themselves() -> None:
    async def scenario() -> None:
        flights = SingleFlight(max_wait_s=5)
        ident = flights.lead(key("q"))
        assert ident is not None
        waiter = asyncio.create_task(flights.wait(key("q")))
        await asyncio.sleep(0.01)
        flights.finish(ident, None)  # the client left, the worker failed, the answer was cut short
        assert await waiter is None
        assert len(flights) == 0
        flights.finish(ident, ANSWER)  # a late finish of a flight already gone changes nothing
        assert len(flights) == 0 and flights.lead(key("q")) is not None

    asyncio.run(scenario())


def test_a_waiter_gives_up_after_max_wait_and_does_not_lead_a_second_flight() -> None:
    async def scenario() -> None:
        flights = SingleFlight(max_wait_s=0.05)
        ident = flights.lead(key("q"))
        assert ident is not None
        assert await flights.wait(key("q")) is None  # the leader is too slow
        assert flights.lead(key("q")) is None  # generates on its own, the first flight stays
        flights.finish(ident, ANSWER)
        assert await flights.wait(key("q")) == ANSWER

    asyncio.run(scenario())
