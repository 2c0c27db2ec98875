"""Entries live in Redis: they survive a restart of the service and are shared by several replicas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from common.gen import cache_pb2, cache_pb2_grpc
from tests.cache.keyutil import chat_key, lookup, store
from tests.cache.procs import CacheService, start_cache_service
from tests.support.net import wait_for

pytestmark = pytest.mark.scenario  # restarts and outages: `make test-scenarios`


@pytest.fixture(scope="module")
def replicas(log_dir: Path, redis_url: str) -> Iterator[tuple[CacheService, CacheService]]:
    a = start_cache_service(log_dir, redis_url, name="replica-a")
    b = start_cache_service(log_dir, redis_url, name="replica-b", CACHE_RESYNC_SECONDS="3600")
    yield a, b
    a.proc.stop()
    b.proc.stop()


def _stub(service: CacheService) -> tuple[grpc.Channel, cache_pb2_grpc.SemanticCacheStub]:
    channel = grpc.insecure_channel(service.addr)
    return channel, cache_pb2_grpc.SemanticCacheStub(channel)


def test_replicas_see_each_others_entries(replicas: tuple[CacheService, CacheService]) -> None:
    a, b = replicas
    ch_a, stub_a = _stub(a)
    ch_b, stub_b = _stub(b)
    with ch_a, ch_b:
        cache_question = chat_key("How do I clear my browser cache?", "shared")
        entry = store(stub_a, cache_question, "Settings > Privacy > Clear data.")
        # B learns of it by pub/sub (its periodic resync is an hour away); a paraphrase needs its index.
        paraphrase = chat_key("What is the way to clear my browser cache?", "shared")
        wait_for(lambda: lookup(stub_b, paraphrase).hit, what="replica B to index A's entry")
        assert lookup(stub_b, paraphrase).response == "Settings > Privacy > Clear data."

        removed = stub_b.Invalidate(cache_pb2.InvalidateRequest(entry_id=entry.entry_id), timeout=10)
        assert removed.removed == 1
        assert not lookup(stub_a, chat_key("How do I clear my browser cache?", "shared")).hit
        assert not lookup(stub_a, paraphrase).hit
        wait_for(
            lambda: (
                stub_a.GetStats(cache_pb2.CacheStatsRequest()).entries
                == stub_b.GetStats(cache_pb2.CacheStatsRequest()).entries
            ),
            what="both indexes to agree",
        )


def test_entries_survive_a_restart(log_dir: Path, redis_url: str) -> None:
    first = start_cache_service(log_dir, redis_url, name="restart-1")
    try:
        ch, stub = _stub(first)
        with ch:
            store(stub, chat_key("Who painted the Mona Lisa?", "restart"), "Leonardo da Vinci.")
    finally:
        first.proc.stop()
    assert first.proc.proc is not None and first.proc.proc.returncode == 0  # clean shutdown on SIGTERM
    second = start_cache_service(log_dir, redis_url, name="restart-2")
    try:
        ch, stub = _stub(second)
        with ch:
            hit = lookup(stub, chat_key("The Mona Lisa was painted by whom?", "restart"))
            assert hit.hit and not hit.exact  # a similarity hit: the index was rebuilt from Redis
            assert hit.response == "Leonardo da Vinci."
    finally:
        second.proc.stop()


def test_resync_drops_expired_entries(log_dir: Path, redis_url: str) -> None:
    service = start_cache_service(log_dir, redis_url, name="resync", CACHE_RESYNC_SECONDS="1")
    try:
        ch, stub = _stub(service)
        with ch:
            before = stub.GetStats(cache_pb2.CacheStatsRequest(), timeout=5).entries
            store(stub, chat_key("How many legs does a spider have?", "resync"), "Eight.", ttl=1)
            assert stub.GetStats(cache_pb2.CacheStatsRequest(), timeout=5).entries == before + 1
            wait_for(
                lambda: stub.GetStats(cache_pb2.CacheStatsRequest(), timeout=5).entries == before,
                timeout_s=10,
                what="the expired entry to leave the index",
            )
    finally:
        service.proc.stop()
