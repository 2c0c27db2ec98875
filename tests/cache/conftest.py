"""Fixtures of the cache tests: one Redis server and one cache service per module, real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from common.gen import cache_pb2_grpc
from tests.cache.procs import CacheService, Proc, start_cache_service, start_redis


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache-logs")


@pytest.fixture(scope="module")
def redis_server(log_dir: Path) -> Iterator[tuple[Proc, str]]:
    proc, url = start_redis(log_dir)
    yield proc, url
    proc.stop()


@pytest.fixture(scope="module")
def redis_url(redis_server: tuple[Proc, str]) -> str:
    return redis_server[1]


@pytest.fixture(scope="module")
def cache_service(log_dir: Path, redis_url: str) -> Iterator[CacheService]:
    service = start_cache_service(log_dir, redis_url)
    yield service
    service.proc.stop()


@pytest.fixture(scope="module")
def stub(cache_service: CacheService) -> Iterator[cache_pb2_grpc.SemanticCacheStub]:
    with grpc.insecure_channel(cache_service.addr) as channel:
        yield cache_pb2_grpc.SemanticCacheStub(channel)
