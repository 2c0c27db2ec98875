"""Real processes for the cache tests: redis-server and `python -m cache_service` on free loopback ports."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.net import free_port, grpc_serving
from tests.support.processes import Service as Proc
from tests.support.processes import redis_argv


def start_redis(log_dir: Path) -> tuple[Proc, str]:
    import redis

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = Proc(
        f"redis-{port}",
        redis_argv(port, log_dir),
        {},
        log_dir / f"redis-{port}.log",
        lambda: bool(redis.Redis.from_url(url, socket_timeout=1).ping()),
    )
    return proc.start(), url


@dataclass
class CacheService:
    proc: Proc
    addr: str
    metrics_url: str


def start_cache_service(log_dir: Path, redis_url: str, name: str = "cache", **env: str) -> CacheService:
    port, metrics_port = free_port(), free_port()
    addr = f"127.0.0.1:{port}"
    full_env = {
        "CACHE_PORT": str(port),
        "CACHE_METRICS_PORT": str(metrics_port),
        "REDIS_URL": redis_url,
    } | env
    proc = Proc(
        name,
        [sys.executable, "-m", "cache_service"],
        full_env,
        log_dir / f"{name}-{port}.log",
        lambda: grpc_serving(addr),
    )
    proc.start()
    return CacheService(proc, addr, f"http://127.0.0.1:{metrics_port}/metrics")
