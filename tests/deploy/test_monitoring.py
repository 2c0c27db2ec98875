"""Prometheus config and Grafana provisioning: promtool accepts them, the dashboard asks for real metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import gateway.observability  # noqa: F401  (registers the gateway's metrics on the default registry)
from cache_service.metrics import CacheMetrics
from tests.deploy.files import DASHBOARD, GRAFANA, PROMETHEUS, load_compose, promtool, run
from worker.server.metrics import WorkerMetrics

METRIC = re.compile(r"\bllmserve[a-zA-Z0-9_:]*")
GRAFANA_VARIABLE = re.compile(r"\$__rate_interval|\$__interval|\$__range")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    return {name for expr in exprs(dashboard) for name in METRIC.findall(expr)}


def exported_sample_names() -> set[str]:
    """Every sample name the three services' metric definitions produce."""
    names: set[str] = set()
    for registry in (WorkerMetrics("m").registry, CacheMetrics().registry, REGISTRY):
        for family in registry.collect():
            names.update(sample.name for sample in family.samples)
            # Counters and histograms with no sample yet (labelled, unseen) still expose these suffixes.
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + s for s in ("_bucket", "_count", "_sum"))
            if family.type == "gauge":  # a labelled gauge (an info gauge) has no sample before it is set
                names.add(family.name)
    return names


def test_promtool_accepts_the_prometheus_config() -> None:
    result = run([promtool(), "check", "config", str(PROMETHEUS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_parses_every_dashboard_query(dashboard: dict[str, Any], tmp_path: Path) -> None:
    rules = [
        {"record": f"llmserve_dashboard:query_{i}", "expr": GRAFANA_VARIABLE.sub("1m", expr)}
        for i, expr in enumerate(exprs(dashboard))
    ]
    assert len(rules) >= 20
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run([promtool(), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_covers_the_issue_topics(dashboard: dict[str, Any]) -> None:
    names = dashboard_metric_names(dashboard)
    for required in (
        "llmserve:generation_tokens_total",
        "llmserve:time_to_first_token_seconds_bucket",
        "llmserve:inter_token_latency_seconds_bucket",
        "llmserve:num_requests_running",
        "llmserve:num_requests_waiting",
        "llmserve:kv_cache_usage_perc",
        "llmserve:prefix_cache_hits_total",
        "llmserve:prefix_cache_queries_total",
        "llmserve_gateway_semantic_cache_requests_total",
        "llmserve_cache_hits_total",
        "llmserve:num_preemptions_total",
        "llmserve:cost_per_1k_generation_tokens_usd",
    ):
        assert required in names, required


def test_dashboard_asks_only_for_metrics_the_services_define(dashboard: dict[str, Any]) -> None:
    missing = dashboard_metric_names(dashboard) - exported_sample_names()
    assert not missing, f"the dashboard queries metrics no service defines: {sorted(missing)}"


def test_dashboard_uses_the_provisioned_datasource(dashboard: dict[str, Any]) -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = provisioned["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]


def test_dashboard_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, panel["title"]
        taken |= cells
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_loads_the_dashboard_from_where_compose_mounts_it() -> None:
    grafana = load_compose()["services"]["grafana"]
    mounts = dict(v.rsplit(":", 2)[:2] for v in grafana["volumes"] if v.startswith("./"))
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "llmserve.yml").read_text())
    (entry,) = provider["providers"]
    dashboards_dir = entry["options"]["path"]
    assert mounts["./deploy/grafana/dashboards"] == dashboards_dir
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards_dir}/{DASHBOARD.name}"
