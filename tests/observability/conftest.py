"""Real processes for the live observability tests: started once per session (or module) and stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.launch import redis_service, start_together
from tests.observability.stack import (
    Cache,
    Gateway,
    Worker,
    cache_service,
    gateway_service,
    worker_service,
)

PRICE_PER_HOUR_USD = 3.6  # 0.001 USD a second: cost per 1k tokens is then 1 / tokens-per-second


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("observability-logs")


@pytest.fixture(scope="session")
def redis_url(log_dir: Path) -> Iterator[str]:
    service, url = redis_service(log_dir)
    service.start()
    try:
        yield url
    finally:
        service.stop()


@pytest.fixture(scope="session")
def cache(log_dir: Path, redis_url: str) -> Iterator[Cache]:
    cache = cache_service(log_dir, redis_url)
    cache.service.start()
    try:
        yield cache
    finally:
        cache.service.stop()


@pytest.fixture(scope="session")
def priced_worker(log_dir: Path) -> Iterator[Worker]:
    worker = worker_service(log_dir, "priced_worker", WORKER_PRICE_PER_HOUR_USD=str(PRICE_PER_HOUR_USD))
    worker.service.start()
    try:
        yield worker
    finally:
        worker.service.stop()


@pytest.fixture(scope="session")
def gateway(log_dir: Path, priced_worker: Worker, cache: Cache) -> Iterator[Gateway]:
    gateway = gateway_service(log_dir, priced_worker.addr, cache.addr)
    gateway.service.start()
    try:
        yield gateway
    finally:
        gateway.service.stop()


@pytest.fixture(scope="session")
def worker_pair(log_dir: Path) -> Iterator[tuple[Worker, Worker]]:
    """Two default workers the fleet and scale-out modules share (a worker start costs seconds)."""
    a, b = worker_service(log_dir, "pair_a"), worker_service(log_dir, "pair_b")
    start_together([a.service, b.service])
    try:
        yield a, b
    finally:
        b.service.stop()
        a.service.stop()
