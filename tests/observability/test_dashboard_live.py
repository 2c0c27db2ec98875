"""A real Prometheus scrapes the real services with deploy/prometheus.yml's jobs; every dashboard panel
then shows data (a wrong label or metric name gives an empty panel, which a name check alone misses)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml

from common.gen import worker_pb2, worker_pb2_grpc
from scripts.launch import Service, free_port
from tests.deploy.files import DASHBOARD, PROMETHEUS, prometheus_tool
from tests.observability.stack import Cache, Gateway, Worker
from tests.support.net import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.scenario]

MODEL = "SmolLM2-135M-Instruct"
GRAFANA_RATE = re.compile(r"\$__rate_interval")


def local_config(worker: Worker, cache: Cache, gateway: Gateway) -> dict[str, Any]:
    """deploy/prometheus.yml with its job names and paths, pointed at this test's loopback ports."""
    config = yaml.safe_load(PROMETHEUS.read_text())
    config["global"]["scrape_interval"] = "1s"
    local = {
        "worker": f"127.0.0.1:{worker.metrics_port}",
        "cache_service": f"127.0.0.1:{cache.metrics_port}",
        "gateway": f"127.0.0.1:{gateway.port}",
    }
    for job in config["scrape_configs"]:
        job.pop("dns_sd_configs", None)
        target = local.get(job["job_name"])
        job["static_configs"] = [{"targets": [target]}] if target else []
    assert {job["job_name"] for job in config["scrape_configs"]} >= set(local)
    return config


@pytest.fixture(scope="module")
def prometheus_url(
    log_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    priced_worker: Worker,
    cache: Cache,
    gateway: Gateway,
) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prometheus")
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(local_config(priced_worker, cache, gateway)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        prometheus_tool("prometheus"),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]

    def ready() -> bool:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200

    service = Service("prometheus", argv, {}, log_dir / "prometheus.log", ready).start()
    try:
        yield url
    finally:
        service.stop()


def query(url: str, expr: str) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def make_traffic(gateway: Gateway, worker: Worker) -> None:
    """Direct generations, and through the gateway a cache miss then two hits.

    The second hit comes a few scrapes after the first: a labelled counter's series appears with its
    first increment, which rate() cannot see, so a single hit would leave the hit rate at zero.
    """
    params = worker_pb2.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    with grpc.insecure_channel(worker.addr) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        for _ in range(2):
            request = worker_pb2.GenerateRequest(text=f"{uuid.uuid4().hex} hello", params=params)
            list(stub.Generate(request, timeout=120))
    question = f"Which river is number {uuid.uuid4().int % 100000}?"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
    }
    for pause_after in (1.0, 3.0, 0.0):
        assert httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=120).status_code == 200
        time.sleep(pause_after)  # the first answer is stored in the background; then let scrapes happen


def panels_without_data(url: str) -> list[str]:
    empty = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        if panel["type"] == "row":
            continue
        if not any(query(url, GRAFANA_RATE.sub("1m", t["expr"])) for t in panel["targets"]):
            empty.append(panel["title"])
    return empty


@pytest.fixture(scope="module")
def traffic(prometheus_url: str, gateway: Gateway, priced_worker: Worker) -> None:
    wait_for(
        lambda: len(query(prometheus_url, "up == 1")) >= 3, timeout_s=30, what="every target to be scraped up"
    )
    make_traffic(gateway, priced_worker)


def test_every_dashboard_panel_has_data(prometheus_url: str, traffic: None) -> None:
    deadline = time.monotonic() + 30
    while (empty := panels_without_data(prometheus_url)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not empty, f"panels without data: {empty}"


def test_fleet_cost_and_hit_rates_are_numbers(prometheus_url: str, traffic: None) -> None:
    fleet_cost = (
        "sum(llmserve:price_per_hour_usd) / 3600 / sum(rate(llmserve:generation_tokens_total[5m])) * 1000"
    )
    hit_rate = (
        'sum(rate(llmserve_gateway_semantic_cache_requests_total{result="hit"}[5m])) / '
        'sum(rate(llmserve_gateway_semantic_cache_requests_total{result=~"hit|miss|error"}[5m]))'
    )

    def value(expr: str) -> float:
        result = query(prometheus_url, expr)
        return float(result[0]["value"][1]) if result else math.nan

    wait_for(lambda: 0 < value(fleet_cost) < math.inf, timeout_s=15, what="a finite fleet cost per 1k tokens")
    wait_for(lambda: 0 < value(hit_rate) <= 1, timeout_s=15, what="a semantic-cache hit rate above zero")


def test_promtool_reads_the_live_exposition(priced_worker: Worker, cache: Cache, gateway: Gateway) -> None:
    """The pages parse as Prometheus text format (lint warnings, e.g. for vLLM-style ':' names, aside)."""
    for url in (priced_worker.metrics_url, cache.metrics_url, f"{gateway.url}/metrics"):
        page = httpx.get(url, timeout=10).text
        result = subprocess.run(
            [prometheus_tool("promtool"), "check", "metrics"],
            input=page,
            capture_output=True,
            text=True,
            timeout=60,
        )
        problems = [line for line in (result.stdout + result.stderr).splitlines() if "error" in line.lower()]
        assert not problems, problems
