"""Real processes for the cache tests: redis-server and `python -m cache_service` on free loopback ports."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scripts import launch
from scripts.launch import Service as Proc


def start_redis(log_dir: Path) -> tuple[Proc, str]:
    return launch.start_redis(log_dir)


@dataclass
class CacheService:
    proc: Proc
    addr: str
    metrics_url: str


def start_cache_service(log_dir: Path, redis_url: str, name: str = "cache", **env: str) -> CacheService:
    port = env.pop("CACHE_PORT", None) or str(launch.free_port())
    proc = launch.start_cache_service(f"{name}-{port}", log_dir, redis_url, CACHE_PORT=port, **env)
    return CacheService(proc, proc.addr, launch.metrics_url(proc, "CACHE_METRICS_PORT"))
