"""Redis going away and coming back: errors are UNAVAILABLE (a miss for the gateway), health follows Redis,
and the service recovers by itself."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.cache_client import SemanticCacheClient, build_cache_key
from tests.cache.keyutil import chat_key, lookup, store
from tests.cache.procs import CacheService, Proc
from tests.support.net import wait_for

pytestmark = pytest.mark.scenario  # restarts and outages: `make test-scenarios`


def _health(addr: str) -> int:
    with grpc.insecure_channel(addr) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2).status


async def test_redis_outage_and_recovery(
    stub, cache_service: CacheService, redis_server: tuple[Proc, str]
) -> None:
    redis_proc, _ = redis_server
    store(stub, chat_key("What is the capital of Peru?", "outage"), "Lima.")
    assert lookup(stub, chat_key("What is the capital of Peru?", "outage")).hit

    redis_proc.stop()
    with pytest.raises(grpc.RpcError) as err:
        lookup(stub, chat_key("What is the capital of Peru?", "outage"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    wait_for(
        lambda: _health(cache_service.addr) == health_pb2.HealthCheckResponse.NOT_SERVING,
        what="health to report NOT_SERVING",
    )
    errors: list[str] = []
    client = SemanticCacheClient(cache_service.addr, timeout_s=3.0, on_error=errors.append)
    key = build_cache_key(
        "m", "outage", messages=[{"role": "user", "content": "hi"}], params={"temperature": 0}
    )
    assert await client.lookup(key) is None
    assert errors == ["lookup"]
    await client.close()

    redis_proc.start()  # same port, empty (no persistence in tests)
    wait_for(
        lambda: _health(cache_service.addr) == health_pb2.HealthCheckResponse.SERVING,
        what="health to report SERVING again",
    )
    wait_for(
        lambda: not lookup(stub, chat_key("What is the capital of Peru?", "outage")).hit,
        what="lookups to work again",
    )
    store(stub, chat_key("What is the capital of Chile?", "outage"), "Santiago.")
    assert lookup(stub, chat_key("Tell me the capital of Chile.", "outage")).hit
