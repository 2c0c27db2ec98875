"""Real service processes on free loopback ports (started through scripts/launch.py), and a Prometheus
text scraper, for the live tests."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from scripts.launch import Service, free_port, grpc_serving, http_ok, python_service
from tests.support.net import wait_for


@dataclass
class GrpcService:
    """A worker or cache service: its gRPC port and its metrics port."""

    service: Service
    port: int
    metrics_port: int

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


class Worker(GrpcService):
    pass


class Cache(GrpcService):
    pass


def _grpc_service(
    kind: type[GrpcService], name: str, module: str, log_dir: Path, env: dict[str, str]
) -> GrpcService:
    """`python -m module` with PREFIX_HOST/PORT/METRICS_PORT on free ports; ready once both ports answer."""
    port, metrics_port = free_port(), free_port()
    prefix = "WORKER_" if kind is Worker else "CACHE_"
    ports = {"HOST": "127.0.0.1", "PORT": str(port), "METRICS_PORT": str(metrics_port)}
    full = {prefix + k: v for k, v in ports.items()} | env
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    def ready() -> bool:
        return grpc_serving(f"127.0.0.1:{port}") and http_ok(metrics_url)

    return kind(python_service(name, module, full, log_dir, ready, f"127.0.0.1:{port}"), port, metrics_port)


def worker_service(log_dir: Path, name: str = "worker", **extra_env: str) -> Worker:
    env = {"WORKER_KV_CACHE_GB": "0.25", "WORKER_MAX_MODEL_LEN": "1024", "WORKER_NUM_THREADS": "1"}
    return _grpc_service(Worker, name, "worker", log_dir, env | extra_env)  # type: ignore[return-value]


def cache_service(log_dir: Path, redis_url: str) -> Cache:
    env = {"REDIS_URL": redis_url}
    return _grpc_service(Cache, "cache_service", "cache_service", log_dir, env)  # type: ignore[return-value]


@dataclass
class Gateway:
    service: Service
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def gateway_service(
    log_dir: Path, worker_addr: str, cache_addr: str | None, name: str = "gateway", **extra_env: str
) -> Gateway:
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
    url = f"http://127.0.0.1:{port}"
    env |= extra_env
    service = python_service(name, "gateway", env, log_dir, lambda: http_ok(f"{url}/ready"), url)
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


def wait_idle(worker: Worker) -> Scrape:
    """The worker's page once it reports no running request and no KV block held (the engine thread
    publishes metrics just after a request's last chunk leaves, and a cancelled call is counted when the
    engine sees it go)."""

    def idle() -> bool:
        page = scrape(worker.metrics_url)
        return (
            page.value("llmserve:num_requests_running") == 0
            and page.value("llmserve:kv_cache_usage_perc") == 0
        )

    wait_for(idle, what="the worker to report no running request and no KV block held")
    return scrape(worker.metrics_url)


def running(pair: tuple[Worker, Worker]) -> tuple[Worker, Worker]:
    """The pair, a worker an earlier module killed started again on its port."""
    for worker in pair:
        if not worker.service.alive:
            worker.service.start()
    return pair
