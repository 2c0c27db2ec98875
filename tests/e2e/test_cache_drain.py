"""The cache service on SIGTERM: lookups in flight finish, later ones are refused (UNAVAILABLE, or
CANCELLED for a call that raced the shutdown on an open connection; the gateway treats every error
as a miss), and the process exits 0. Real Redis, real service, real gRPC."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import pytest

from common.gen import cache_pb2 as pb
from common.gen import cache_pb2_grpc
from tests.cache.procs import start_cache_service, start_redis

pytestmark = pytest.mark.scenario  # restarts and outages: `make test-scenarios`

REFUSED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def hammer(addr: str, stop: threading.Event, outcomes: list[str]) -> None:
    """Lookups one after another until told to stop; records each outcome."""
    key = pb.CacheKey(model="m", scope="s", prompt="What is the capital of France?", params_fingerprint="f")
    with grpc.insecure_channel(addr) as channel:
        stub = cache_pb2_grpc.SemanticCacheStub(channel)
        while not stop.is_set():
            try:
                stub.Lookup(pb.LookupRequest(key=key), timeout=10)
                outcomes.append("ok")
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)
                if exc.code() in REFUSED:
                    return


def test_sigterm_lets_lookups_finish_and_exits_0(tmp_path: Path) -> None:
    redis_proc, redis_url = start_redis(tmp_path)
    cache = start_cache_service(tmp_path, redis_url, name="cache-drain", CACHE_DRAIN_TIMEOUT_S="30")
    try:
        stop = threading.Event()
        outcomes: list[list[str]] = [[] for _ in range(4)]
        threads = [threading.Thread(target=hammer, args=(cache.addr, stop, o)) for o in outcomes]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sum(len(o) for o in outcomes) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cache.proc.proc is not None
        cache.proc.proc.send_signal(signal.SIGTERM)
        assert cache.proc.proc.wait(timeout=30) == 0, cache.proc.log_tail()
        stop.set()
        for thread in threads:
            thread.join(15)
        seen = {outcome for o in outcomes for outcome in o}
        assert "ok" in seen
        assert seen <= {"ok", *(code.name for code in REFUSED)}, seen
    finally:
        cache.proc.stop()
        redis_proc.stop()
