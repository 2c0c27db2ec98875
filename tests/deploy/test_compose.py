"""docker-compose.yml: everything it names exists in the project and is read by the service it is given to."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from compose_spec import PyCompose
from pydantic_settings import BaseSettings

from cache_service.settings import CacheSettings
from common import healthcheck
from gateway.settings import GatewaySettings
from tests.deploy.files import (
    APP_IMAGE,
    COMPOSE,
    PROMETHEUS,
    ROOT,
    app_services,
    interpolate,
    load_compose,
    parse_as_field,
    service_env,
    service_env_names,
    settings_env_fields,
    volume_parts,
)
from worker.server.settings import WorkerSettings

APP_SETTINGS: dict[str, type[BaseSettings]] = {
    "worker": WorkerSettings,
    "cache_service": CacheSettings,
    "gateway": GatewaySettings,
}
# Read by the process, not its settings class: common/logs.py, which the worker and the gateway configure.
PROCESS_VARIABLES: dict[str, set[str]] = {
    "worker": {"LOG_FORMAT"},
    "gateway": {"LOG_FORMAT"},
    "cache_service": {"LOG_FORMAT"},
}
EXPECTED_SERVICES = {"redis", "model-init", "worker", "cache_service", "gateway", "prometheus", "grafana"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def settings_for(service: str, services: dict[str, dict[str, Any]]) -> BaseSettings:
    """The service's settings class built from the compose environment alone."""
    cls = APP_SETTINGS[service]
    env = service_env(services[service])
    fields = settings_env_fields(cls)
    kwargs = {fields[name]: value for name, value in env.items()}
    return cls(**kwargs)


def test_compose_file_is_yaml_with_the_whole_stack(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == EXPECTED_SERVICES
    assert "version" not in yaml.safe_load(COMPOSE.read_text()), "the version key is obsolete in Compose v2"


@pytest.mark.parametrize("path", [COMPOSE, ROOT / "deploy" / "docker-compose.gpu.yml"], ids=lambda p: p.name)
def test_compose_file_follows_the_compose_spec(path: Path) -> None:
    """Validated by the compose_spec parser (unknown keys, enum values, durations, ports are errors).

    Compose interpolates variables and resolves YAML merge keys before it validates; so does this test.
    """
    resolved = yaml.safe_load(interpolate(path.read_text()))
    parsed = PyCompose.from_json(json.dumps(resolved))
    assert parsed.service_names() == list(resolved["services"])


@pytest.mark.parametrize("service", sorted(APP_SETTINGS))
def test_every_environment_variable_is_read_by_the_service(
    service: str, services: dict[str, dict[str, Any]]
) -> None:
    cls = APP_SETTINGS[service]
    fields = settings_env_fields(cls)
    env = service_env(services[service])
    unknown = sorted(
        set(service_env_names(services[service])) - set(fields) - PROCESS_VARIABLES.get(service, set())
    )
    assert not unknown, f"{service} sets variables its settings never read: {unknown}"
    settings = settings_for(service, services)
    for name, raw in env.items():
        field = fields[name]
        assert getattr(settings, field) == parse_as_field(cls, field, raw), name


@pytest.mark.parametrize("service", sorted(PROCESS_VARIABLES))
def test_process_variables_pass_through_to_the_services_that_read_them(
    service: str, services: dict[str, dict[str, Any]]
) -> None:
    """LOG_FORMAT=json in the shell or .env reaches every service, as under `make run`."""
    listed = set(service_env_names(services[service]))
    assert PROCESS_VARIABLES[service] <= listed, (
        f"{service}: list {PROCESS_VARIABLES[service] - listed} in compose"
    )
    assert not PROCESS_VARIABLES[service] & set(service_env(services[service])), (
        "pass through, without a value"
    )


@pytest.mark.parametrize("service", sorted(APP_SETTINGS))
def test_every_setting_can_be_given_to_the_container(
    service: str, services: dict[str, dict[str, Any]]
) -> None:
    """Each setting's variable is listed (set, or passed through from the shell / .env)."""
    missing = sorted(
        set(settings_env_fields(APP_SETTINGS[service])) - set(service_env_names(services[service]))
    )
    assert not missing, (
        f"{service}: add these to docker-compose.yml (without a value to pass through): {missing}"
    )


def test_tunables_pass_through_so_the_services_own_defaults_apply(
    services: dict[str, dict[str, Any]],
) -> None:
    """A default copied into compose would drift from the settings class; only container facts are set."""
    # mounts and service names
    container_facts = {
        "WORKER_MODEL",
        "REDIS_URL",
        "GATEWAY_REDIS_URL",
        "WORKER_ADDR",
        "CACHE_ADDR",
        "CACHE_ONNX_DIR",
    }
    for name in APP_SETTINGS:
        for var, value in service_env(services[name]).items():
            is_fact = var in container_facts or var.endswith(("_HOST", "_PORT"))
            assert is_fact, f"{name}: {var}={value} duplicates a setting's default; list it without a value"
    pass_through = set(service_env_names(services["worker"])) - set(service_env(services["worker"]))
    assert {"WORKER_DEVICE", "WORKER_KV_CACHE_GB", "WORKER_PRICE_PER_HOUR_USD"} <= pass_through


def test_services_bind_every_interface_inside_their_containers(services: dict[str, dict[str, Any]]) -> None:
    assert service_env(services["worker"])["WORKER_HOST"] == "0.0.0.0"
    assert service_env(services["cache_service"])["CACHE_HOST"] == "0.0.0.0"
    assert service_env(services["gateway"])["GATEWAY_HOST"] == "0.0.0.0"


def test_worker_can_be_scaled(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker, "a published host port would collide between replicas"
    assert not worker.get("deploy", {}).get("replicas"), "replica count is for --scale to choose"


def test_worker_replicas_take_their_cpu_limit_from_one_variable(services: dict[str, dict[str, Any]]) -> None:
    """Scaled replicas on one host share its cores unless each gets a limit, which the worker's default
    thread count follows (common/cpus.py); 0, compose's "no limit", is the default for a single replica."""
    cpus = services["worker"]["cpus"]
    assert cpus == "${WORKER_CPU_LIMIT:-0.0}"
    assert float(interpolate(cpus)) == 0


def test_addresses_point_at_services_and_their_ports(services: dict[str, dict[str, Any]]) -> None:
    worker = settings_for("worker", services)
    cache = settings_for("cache_service", services)
    gateway = settings_for("gateway", services)
    assert isinstance(worker, WorkerSettings) and isinstance(cache, CacheSettings)
    assert isinstance(gateway, GatewaySettings)

    (worker_target,) = gateway.worker_addrs
    match = re.fullmatch(r"dns:///([\w.-]+):(\d+)", worker_target)
    assert match, f"WORKER_ADDR={worker_target!r}: one dns:/// target resolving to every replica"
    assert match.group(1) == "worker" and int(match.group(2)) == worker.port

    cache_host, cache_port = gateway.cache_addr.rsplit(":", 1)
    assert cache_host in names_of("cache_service", services) and int(cache_port) == cache.port

    redis = urlparse(cache.redis_url)
    assert redis.scheme == "redis" and redis.hostname == "redis" and (redis.port or 6379) == 6379


def names_of(service: str, services: dict[str, dict[str, Any]]) -> set[str]:
    """The DNS names a service answers to on the default network."""
    aliases = (services[service].get("networks") or {}).get("default", {}) or {}
    return {service, *aliases.get("aliases", [])}


def test_exposed_ports_match_the_settings(services: dict[str, dict[str, Any]]) -> None:
    worker = settings_for("worker", services)
    cache = settings_for("cache_service", services)
    gateway = settings_for("gateway", services)
    assert {int(p) for p in services["worker"]["expose"]} == {worker.port, worker.metrics_port}
    assert {int(p) for p in services["cache_service"]["expose"]} == {cache.port, cache.metrics_port}
    (published,) = services["gateway"]["ports"]
    assert published.rsplit(":", 1)[1] == str(gateway.gateway_port)


def test_prometheus_scrapes_each_service_where_it_serves_metrics(services: dict[str, dict[str, Any]]) -> None:
    worker = settings_for("worker", services)
    cache = settings_for("cache_service", services)
    gateway = settings_for("gateway", services)
    jobs = {job["job_name"]: job for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    (worker_sd,) = jobs["worker"]["dns_sd_configs"]
    assert worker_sd["names"] == ["worker"] and worker_sd["port"] == worker.metrics_port
    (cache_target,) = jobs["cache_service"]["static_configs"][0]["targets"]
    host, port = cache_target.rsplit(":", 1)
    assert host in names_of("cache_service", services) and int(port) == cache.metrics_port
    (gateway_target,) = jobs["gateway"]["static_configs"][0]["targets"]
    assert gateway_target == f"gateway:{gateway.gateway_port}"
    assert jobs["gateway"].get("metrics_path", "/metrics") == "/metrics"


def test_commands_name_modules_and_make_targets_that_exist(compose: dict[str, Any]) -> None:
    makefile = (ROOT / "Makefile").read_text()
    for name, service in app_services(compose).items():
        command = service["command"]
        if command[:2] == ["python", "-m"]:
            module = command[2]
            assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{name}: {module}"
        elif command[0] == "make":
            for target in (arg for arg in command[1:] if "=" not in arg):
                assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{name}: make {target}"
        else:
            pytest.fail(f"{name}: unexpected command {command}")


def test_model_init_writes_where_the_worker_reads(services: dict[str, dict[str, Any]]) -> None:
    init, worker = services["model-init"], services["worker"]
    (model_dir,) = [arg.split("=", 1)[1] for arg in init["command"] if arg.startswith("MODEL_DIR=")]
    assert service_env(worker)["WORKER_MODEL"] == model_dir
    (init_volume,) = init["volumes"]
    (worker_volume,) = worker["volumes"]
    assert volume_parts(init_volume) == ["models", "/app/models"]
    assert volume_parts(worker_volume) == ["models", "/app/models", "ro"]
    # One variable picks the source for both: the named volume, or a host folder that holds the model.
    assert init_volume.split(":/app/")[0] == worker_volume.split(":/app/")[0] == "${LLMSERVE_MODELS:-models}"
    assert model_dir.startswith("models/"), "relative to the image's WORKDIR /app"
    assert worker["depends_on"]["model-init"]["condition"] == "service_completed_successfully"


def test_depends_on_waits_for_health(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
    assert services["gateway"]["depends_on"]["worker"]["condition"] == "service_healthy"
    assert services["gateway"]["depends_on"]["cache_service"]["condition"] == "service_healthy"
    assert services["cache_service"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_healthchecks_probe_the_ports_the_services_listen_on(services: dict[str, dict[str, Any]]) -> None:
    parser_checks = {
        "worker": ("grpc", f"127.0.0.1:{settings_for('worker', services).port}"),  # type: ignore[attr-defined]
        "cache_service": ("grpc", f"127.0.0.1:{settings_for('cache_service', services).port}"),  # type: ignore[attr-defined]
        "gateway": (
            "http",
            f"http://127.0.0.1:{settings_for('gateway', services).gateway_port}/health",  # type: ignore[attr-defined]
        ),
    }
    for name, (kind, target) in parser_checks.items():
        test = services[name]["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "common.healthcheck"], name
        assert test[4:] == [kind, target], name
    assert Path(healthcheck.__file__).resolve() == ROOT / "common" / "healthcheck.py"


def test_bind_mounts_and_volumes_exist(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume_parts(volume)[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source}"
            else:
                assert source in declared, f"{name}: undeclared volume {source}"
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()


def test_only_the_base_image_is_pulled_outside_a_profile(services: dict[str, dict[str, Any]]) -> None:
    """Every image the default profile runs is built here from BASE_IMAGE (Redis and Prometheus from Debian's
    packages); an upstream image (Grafana) only behind a profile, so `up` works with no Docker Hub."""
    for name, service in services.items():
        if "profiles" in service:
            continue
        build = service.get("build")
        assert build, f"{name}: the image {service.get('image')} would be pulled"
        assert build["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}", name
        assert service["image"].startswith("llmserve"), name
    assert {name for name, s in services.items() if s.get("image") == APP_IMAGE} == {
        "model-init",
        "worker",
        "cache_service",
        "gateway",
    }
    assert services["grafana"]["profiles"] == ["dashboard"]


def test_make_compose_up_scales_the_workers_on_the_local_model() -> None:
    """`WORKERS=2 make compose-up` (as `WORKERS=2 make run`) brings two worker replicas up on the stack
    `make images` built: before, scaling needed a bare `up --scale`, which without these variables moved
    the stack onto the empty models volume and the Docker Hub base."""
    for workers, expected in ((None, "1"), ("2", "2")):
        env = {k: v for k, v in os.environ.items() if k != "WORKERS"}
        if workers:
            env["WORKERS"] = workers
        dry = subprocess.run(
            ["make", "--no-print-directory", "-n", "compose-up"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert dry.returncode == 0, dry.stderr
        up = shlex.split(dry.stdout.strip().splitlines()[-1])
        assert up[up.index("deploy/compose.sh") :] == [
            "deploy/compose.sh",
            "up",
            "-d",
            "--scale",
            f"worker={expected}",
        ]
        assert "LLMSERVE_MODELS=./models" in up and any(a.startswith("BASE_IMAGE=") for a in up)
