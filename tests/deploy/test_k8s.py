"""deploy/k8s: valid against the Kubernetes schema, and wired to the same ports, settings and probes as
the services read (no cluster needed: the manifests are rendered here and checked offline)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic_settings import BaseSettings

from cache_service.settings import CacheSettings
from gateway.settings import GatewaySettings
from tests.deploy.dockerfile_parser import parse
from tests.deploy.files import (
    DOCKERFILE,
    PROMETHEUS,
    ROOT,
    SIDE_DOCKERFILES,
    promtool,
    run,
    settings_env_fields,
)
from tests.deploy.kustomize import load_kustomization, render
from worker.server.settings import WorkerSettings

K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes still commonly run and the newest the schema package knows.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
SETTINGS: dict[str, type[BaseSettings]] = {
    "worker": WorkerSettings,
    "cache-service": CacheSettings,
    "gateway": GatewaySettings,
}
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render(K8S)


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(docs: list[Doc], deployment: str) -> Doc:
    (main,) = find(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return main


def env_of(c: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def port_of(c: Doc, name: str) -> int:
    (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == name]
    return int(port)


def test_every_manifest_is_in_the_kustomization() -> None:
    listed = set(load_kustomization(K8S)["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


@pytest.mark.parametrize("version", VERSIONS)
def test_every_resource_follows_the_kubernetes_schema(docs: list[Doc], version: str) -> None:
    """Strict: an unknown or misspelt field is an error, as `kubectl apply --validate=strict` makes it."""
    assert {d["kind"] for d in docs} >= {"Namespace", "Deployment", "Service", "PersistentVolumeClaim"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_misspelt_field(docs: list[Doc]) -> None:
    bad = copy.deepcopy(find(docs, "Deployment", "worker"))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessProbes"):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def test_the_small_renderer_matches_kubectl_kustomize(docs: list[Doc]) -> None:
    tool = shutil.which("kustomize") or shutil.which("kubectl")
    if tool is None:
        pytest.skip("neither kustomize nor kubectl is installed: the in-test renderer is not cross-checked")
    argv = [tool, "build", str(K8S)] if tool.endswith("kustomize") else [tool, "kustomize", str(K8S)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr

    def key(d: Doc) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    theirs = sorted((d for d in yaml.safe_load_all(result.stdout) if d), key=key)
    assert theirs == sorted(docs, key=key)


def test_workers_sit_behind_a_headless_service_the_gateway_resolves(docs: list[Doc]) -> None:
    service = find(docs, "Service", "worker")
    assert service["spec"]["clusterIP"] == "None", "headless: DNS answers with every ready pod"
    pod_labels = find(docs, "Deployment", "worker")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    worker_port = port_of(container(docs, "worker"), "grpc")
    assert worker_port == int(env_of(container(docs, "worker"))["WORKER_PORT"])
    assert [p["port"] for p in service["spec"]["ports"]] == [worker_port]
    namespace = service["metadata"]["namespace"]
    gateway = container(docs, "gateway")
    target = env_of(gateway)["WORKER_ADDR"].replace("$(POD_NAMESPACE)", namespace)
    assert target == f"dns:///worker.{namespace}.svc.cluster.local:{worker_port}"
    downward = {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert gateway["env"][0] == {"name": "POD_NAMESPACE", "valueFrom": downward}
    cache_target = env_of(gateway)["CACHE_ADDR"].replace("$(POD_NAMESPACE)", namespace)
    cache_port = port_of(container(docs, "cache-service"), "grpc")
    assert cache_target == f"cache.{namespace}.svc.cluster.local:{cache_port}"
    assert cache_port in [p["port"] for p in find(docs, "Service", "cache")["spec"]["ports"]]


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_variable_is_a_setting_of_the_service(docs: list[Doc], name: str) -> None:
    fields = settings_env_fields(SETTINGS[name])
    env = env_of(container(docs, name))
    unknown = set(env) - set(fields) - {"POD_NAMESPACE"}
    assert not unknown, f"{name} sets variables its settings never read: {sorted(unknown)}"
    host_var = {"worker": "WORKER_HOST", "cache-service": "CACHE_HOST", "gateway": "GATEWAY_HOST"}[name]
    assert env[host_var] == "0.0.0.0", "a pod is reached on its own address, not on loopback"


def test_probes_ask_health_ready_and_grpc_health(docs: list[Doc]) -> None:
    gateway = container(docs, "gateway")
    http = port_of(gateway, "http")
    assert http == int(env_of(gateway)["GATEWAY_PORT"])
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    for name in ("worker", "cache-service"):
        c = container(docs, name)
        grpc_port = port_of(c, "grpc")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": grpc_port}, f"{name} {probe}"


def test_scrape_annotations_point_at_each_metrics_endpoint(docs: list[Doc]) -> None:
    expected = {
        "worker": port_of(container(docs, "worker"), "metrics"),
        "cache-service": port_of(container(docs, "cache-service"), "metrics"),
        "gateway": port_of(container(docs, "gateway"), "http"),  # /metrics beside the API
    }
    assert int(env_of(container(docs, "worker"))["WORKER_METRICS_PORT"]) == expected["worker"]
    assert int(env_of(container(docs, "cache-service"))["CACHE_METRICS_PORT"]) == expected["cache-service"]
    for name, port in expected.items():
        annotations = find(docs, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }, name


def test_the_bundled_prometheus_scrapes_services_that_exist(docs: list[Doc]) -> None:
    """deploy/prometheus.yml (baked into the image) names Services and ports of these manifests too."""
    jobs = {job["job_name"]: job for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    (worker_sd,) = jobs["worker"]["dns_sd_configs"]
    assert worker_sd["names"] == ["worker"] and find(docs, "Service", "worker")["spec"]["clusterIP"] == "None"
    assert worker_sd["port"] == port_of(container(docs, "worker"), "metrics")
    for job, service in (("cache_service", "cache"), ("gateway", "gateway")):
        (target,) = jobs[job]["static_configs"][0]["targets"]
        host, port = target.rsplit(":", 1)
        assert host == service, job
        assert int(port) in [p["port"] for p in find(docs, "Service", service)["spec"]["ports"]], job
    assert run([promtool(), "check", "config", str(PROMETHEUS)]).returncode == 0


def test_services_target_ports_their_pods_have(docs: list[Doc]) -> None:
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"].items()
        (pods,) = [d for d in deployments if selector <= d["spec"]["template"]["metadata"]["labels"].items()]
        names = {p["name"] for c in pods["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in names, f"{service['metadata']['name']}: {port['targetPort']}"


def dockerfile_uid(path: Path) -> int:
    (user,) = [i for i in parse(path.read_text()) if i.cmd == "USER"]
    return int(re.match(r"\d+", user.value[0]).group())  # type: ignore[union-attr]


def test_pods_run_as_the_images_own_unprivileged_user(docs: list[Doc]) -> None:
    uid_of = {"llmserve": dockerfile_uid(DOCKERFILE)}
    uid_of |= {f"llmserve-{p.parent.name}": dockerfile_uid(p) for p in SIDE_DOCKERFILES}
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        images = {c["image"].split(":")[0] for c in pod.get("initContainers", []) + pod["containers"]}
        (image,) = images
        assert image in uid_of, f"{deployment['metadata']['name']}: `make images` does not build {image}"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == uid_of[image], deployment["metadata"]["name"]


def test_workers_get_time_to_drain(docs: list[Doc]) -> None:
    """The grace period covers the drain timeout (30 s by default), or Kubernetes kills streams mid-way."""
    drain = GatewaySettings().gateway_drain_timeout_s
    for name in ("worker", "gateway", "cache-service"):
        grace = find(docs, "Deployment", name)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > drain, name


def test_two_gateways_route_over_the_workers(docs: list[Doc]) -> None:
    """Gateways are stateless and choose alike, so the Deployment runs two; each routes cache-aware."""
    assert find(docs, "Deployment", "gateway")["spec"]["replicas"] == 2
    settings = GatewaySettings(**{k.lower(): v for k, v in env_of(container(docs, "gateway")).items()})
    assert settings.gateway_routing == "cache_aware"


def test_workers_have_a_cpu_limit_their_threads_follow(docs: list[Doc]) -> None:
    """Without a CPU limit (or exclusive cores) every replica runs one thread per core of the node, and
    replicas on one node oversubscribe it (common/cpus.py)."""
    workers = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "worker"]
    assert workers
    for container in workers[0]["spec"]["template"]["spec"]["containers"]:
        assert container["resources"]["limits"]["cpu"]
