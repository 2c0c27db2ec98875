"""Real service processes on free loopback ports, and a Prometheus text scraper, for the live tests."""

from __future__ import annotations

import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import redis
from prometheus_client.parser import text_string_to_metric_families

from services.healthcheck import check_grpc, check_http
from tests.support.net import free_port
from tests.support.processes import Service, redis_argv


def redis_service(log_dir: Path) -> tuple[Service, str]:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    ready = lambda: bool(redis.Redis.from_url(url).ping())  # noqa: E731
    service = Service("redis", redis_argv(port, log_dir), {}, log_dir / "redis.log", ready)
    return service, url


@dataclass
class Worker:
    service: Service
    port: int
    metrics_port: int

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def worker_service(log_dir: Path, name: str = "worker", **extra_env: str) -> Worker:
    port, metrics_port = free_port(), free_port()
    env = {
        "WORKER_HOST": "127.0.0.1",
        "WORKER_PORT": str(port),
        "WORKER_METRICS_PORT": str(metrics_port),
        "WORKER_KV_CACHE_GB": "0.25",
        "WORKER_MAX_MODEL_LEN": "1024",
        "WORKER_NUM_THREADS": "1",
        **extra_env,
    }
    addr = f"127.0.0.1:{port}"
    service = Service(
        name,
        [sys.executable, "-m", "worker"],
        env,
        log_dir / f"{name}.log",
        lambda: (
            check_grpc(addr, "", 1.0)[0] and check_http(f"http://127.0.0.1:{metrics_port}/metrics", 1.0)[0]
        ),
    )
    return Worker(service, port, metrics_port)


@dataclass
class Cache:
    service: Service
    port: int
    metrics_port: int

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def cache_service(log_dir: Path, redis_url: str) -> Cache:
    port, metrics_port = free_port(), free_port()
    env = {
        "CACHE_HOST": "127.0.0.1",
        "CACHE_PORT": str(port),
        "CACHE_METRICS_PORT": str(metrics_port),
        "REDIS_URL": redis_url,
    }
    addr = f"127.0.0.1:{port}"
    service = Service(
        "cache_service",
        [sys.executable, "-m", "cache_service"],
        env,
        log_dir / "cache_service.log",
        lambda: check_grpc(addr, "", 1.0)[0],
    )
    return Cache(service, port, metrics_port)


@dataclass
class Gateway:
    service: Service
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def gateway_service(log_dir: Path, worker_addr: str, cache_addr: str | None) -> Gateway:
    port = free_port()
    env = {
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(port),
        "WORKER_ADDR": worker_addr,
        "CACHE_ENABLED": "true" if cache_addr else "false",
        "CACHE_TIMEOUT_MS": "2000",
    }
    if cache_addr:
        env["CACHE_ADDR"] = cache_addr
    service = Service(
        "gateway",
        [sys.executable, "-m", "gateway"],
        env,
        log_dir / "gateway.log",
        lambda: check_http(f"http://127.0.0.1:{port}/ready", 1.0)[0],
    )
    return Gateway(service, port)


@dataclass
class Scrape:
    """One /metrics page: sample values, and the sample names its families declare (even unseen ones)."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    declared: set[str]

    def value(self, name: str, **labels: str) -> float:
        """Sum over the samples of `name` whose labels include `labels` (0 when none)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    declared: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            declared.add(family.name + "_total")
        elif family.type == "histogram":
            declared.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
        else:
            declared.add(family.name)
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
            declared.add(sample.name)
    return Scrape(samples, declared)
