"""deploy/Dockerfile: parses, lints clean, and builds from what it copies.

No Docker engine runs here, so the build is replayed: the files its COPY lines bring (after the
.dockerignore filter) go into a scratch /app, its `make` steps run there, and every module of the
image must import from that copy alone.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cache_service.settings import CacheSettings
from gateway.settings import GatewaySettings
from tests.deploy.dockerfile_parser import Instruction, parse
from tests.deploy.files import (
    DOCKERFILE,
    ROOT,
    SIDE_DOCKERFILES,
    app_services,
    dockerignore_patterns,
    excluded,
    hadolint,
    load_compose,
    run,
    volume_parts,
)
from worker.server.settings import WorkerSettings

PACKAGES = ("worker", "gateway", "cache_service", "common", "scripts", "tools")


@pytest.fixture(scope="module")
def instructions() -> tuple[Instruction, ...]:
    return parse(DOCKERFILE.read_text())


def of(instructions: tuple[Instruction, ...], cmd: str) -> list[Instruction]:
    return [i for i in instructions if i.cmd == cmd.upper()]


ALL_DOCKERFILES = pytest.mark.parametrize(
    "path", [DOCKERFILE, *SIDE_DOCKERFILES], ids=lambda p: p.relative_to(ROOT).as_posix()
)


@ALL_DOCKERFILES
def test_hadolint_is_clean(path: Path) -> None:
    result = run([hadolint(), "--no-color", "--failure-threshold", "info", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


@ALL_DOCKERFILES
def test_every_stage_starts_from_the_base_image_argument(path: Path) -> None:
    """One base for every image: python:3.11-slim, or the one deploy/base/ builds from Debian's packages."""
    instructions = parse(path.read_text())
    first_arg = instructions[0]
    assert first_arg.cmd == "ARG" and first_arg.value == ("BASE_IMAGE=python:3.11-slim",)
    stages = of(instructions, "from")
    assert stages and all(stage.value[0] == "${BASE_IMAGE}" for stage in stages)
    assert len(stages[-1].value) == 1, "the last stage is the image"


def test_build_time_wheels_stay_out_of_the_final_image(instructions: tuple[Instruction, ...]) -> None:
    """deploy/wheels/ (the CPU torch wheel) reaches the dependency stage only; the image gets its venv."""
    final = max(i for i, ins in enumerate(instructions) if ins.cmd == "FROM")
    copies = [(i, ins) for i, ins in enumerate(instructions) if ins.cmd == "COPY"]
    wheel_copies = [i for i, ins in copies if "deploy/wheels/" in ins.value]
    assert wheel_copies and all(i < final for i in wheel_copies)
    from_stages = {ins.flags: ins.value for ins in instructions[final:] if ins.cmd == "COPY" and ins.flags}
    assert from_stages[("--from=deps",)] == ("/app/.venv/", ".venv/")
    # Besides the venv, only the compiled kernels come from a build stage (not the compiler).
    assert from_stages.get(("--from=kernels",)) == ("/app/worker/kernels/build/", "worker/kernels/build/")
    assert set(from_stages) == {("--from=deps",), ("--from=kernels",)}


def test_exposed_ports_are_the_settings_defaults(instructions: tuple[Instruction, ...]) -> None:
    exposed = {int(p) for e in of(instructions, "expose") for p in e.value}
    worker, cache, gateway = WorkerSettings(), CacheSettings(), GatewaySettings()
    assert exposed == {worker.port, worker.metrics_port, cache.port, cache.metrics_port, gateway.gateway_port}


@ALL_DOCKERFILES
def test_runs_as_an_unprivileged_numeric_user(path: Path) -> None:
    """Numeric, so that Kubernetes' runAsNonRoot can check it without reading /etc/passwd."""
    (user,) = of(parse(path.read_text()), "user")
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", user.value[0])


def test_workdir_and_venv_path_match_compose(instructions: tuple[Instruction, ...]) -> None:
    workdirs = {w.value for w in of(instructions, "workdir")}
    assert workdirs == {("/app",)}, "the venv is built and used at the same path"
    env = dict(zip(*[iter(v for e in of(instructions, "env") for v in e.value)] * 2, strict=True))
    assert env["PATH"].startswith("/app/.venv/bin:"), "the Makefile's venv is .venv under WORKDIR"
    models_mount = volume_parts(load_compose()["services"]["worker"]["volumes"][0])[1]
    assert models_mount == "/app/models"


def replay_copies(instructions: tuple[Instruction, ...], app: Path) -> list[str]:
    """Copy what each COPY brings from the context into `app`; return the `make` steps in order.

    Copies from another stage (the venv) are left to the real build; copies outside WORKDIR (the wheels)
    are checked for their source only.
    """
    patterns = dockerignore_patterns()
    make_steps: list[str] = []
    for ins in instructions:
        if ins.cmd == "COPY":
            if ins.flags:
                stages = (("--from=deps",), ("--from=kernels",))
                assert ins.flags in stages, f"unexpected COPY flags {ins.flags}"
                continue
            *sources, dest = ins.value
            for source in sources:
                src = ROOT / source
                assert src.exists(), f"COPY {source}: not in the repository"
                assert not excluded(source.rstrip("/"), patterns), f"COPY {source}: excluded by .dockerignore"
                if dest.startswith("/"):
                    continue
                files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
                for path in files:
                    rel = path.relative_to(ROOT).as_posix()
                    if excluded(rel, patterns):
                        continue
                    target = app / dest / (path.name if src.is_file() else path.relative_to(src))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
        elif ins.cmd == "RUN" and ins.value[0].startswith("make "):
            make_steps.append(ins.value[0])
    return make_steps


def final_stage_env(instructions: tuple[Instruction, ...]) -> dict[str, str]:
    """The ENV values the image's last stage sets (without ${...} expansion: none is used here)."""
    final = max(i for i, ins in enumerate(instructions) if ins.cmd == "FROM")
    pairs = [v for ins in instructions[final:] if ins.cmd == "ENV" for v in ins.value]
    return {k: v for k, v in zip(pairs[::2], pairs[1::2], strict=True) if "$" not in v}


def fake_venv(where: Path) -> Path:
    """A stand-in for the image's .venv: this interpreter, with the Makefile's install stamp."""
    (where / "bin").mkdir(parents=True)
    python = where / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    (where / ".installed").touch()
    return where


def test_build_steps_work_from_the_copied_files_alone(
    instructions: tuple[Instruction, ...], tmp_path: Path
) -> None:
    app = tmp_path / "app"
    app.mkdir()
    make_steps = replay_copies(instructions, app)
    assert make_steps == ["make protos"]
    assert not list((app / "common" / "gen").glob("*_pb2*.py")), "generated stubs must be built, not copied"
    assert not (app / "requirements-dev.txt").exists(), "tests and lint stay out of the image"
    # The deps stage runs the Makefile's venv recipe for the runtime requirements, word for word.
    recipe = run(["make", "--no-print-directory", "-n", "venv", "REQUIREMENTS=requirements.txt"], cwd=app)
    assert recipe.returncode == 0, recipe.stderr
    (venv_step,) = [r for r in of(instructions, "run") if r.value[0].startswith("python3 -m venv")]
    assert venv_step.value[0].split(" && ") == recipe.stdout.strip().splitlines()
    assert "-r requirements.txt" in recipe.stdout and "requirements-dev" not in recipe.stdout
    os.utime(app / "requirements.txt", (0, 0))  # older than the stamp: the venv counts as installed
    venv = fake_venv(tmp_path / "venv")
    image_env = os.environ | final_stage_env(instructions)  # make protos and make model read REQUIREMENTS
    protos = run(["make", "protos", f"VENV={venv}"], cwd=app, env=image_env)
    assert protos.returncode == 0, protos.stdout + protos.stderr
    assert (app / "common" / "gen" / "worker_pb2_grpc.py").is_file()
    for name, service in app_services(load_compose()).items():
        if service["command"][0] == "make":  # e.g. model-init's `make model`
            dry = run([*service["command"], f"VENV={venv}", "-n"], cwd=app, env=image_env)
            assert dry.returncode == 0, f"{name}: {dry.stdout}{dry.stderr}"

    modules = sorted(
        ".".join(p.relative_to(app).with_suffix("").parts)
        for package in PACKAGES
        for p in (app / package).rglob("*.py")
        if p.name != "__main__.py"
    )
    for package in ("worker", "gateway", "cache_service"):
        assert (app / package / "__main__.py").is_file(), f"python -m {package} needs {package}/__main__.py"
    script = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", script, *modules],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_copied_sources_include_the_services_but_not_local_state() -> None:
    patterns = dockerignore_patterns()
    for keep in (
        "requirements.txt",
        "Makefile",
        "protos/worker.proto",
        "worker/server/settings.py",
        "gateway/app.py",
    ):
        assert not excluded(keep, patterns), keep
    for drop in (
        ".venv/bin/python",
        "models/SmolLM2-135M-Instruct/model.safetensors",
        ".git/HEAD",
        "worker/__pycache__/x.cpython-311.pyc",
        "common/gen/worker_pb2.py",
        "tests/__init__.py",
    ):
        assert excluded(drop, patterns), drop


def test_compose_commands_run_in_the_image(instructions: tuple[Instruction, ...]) -> None:
    (cmd,) = of(instructions, "cmd")
    assert cmd.json and list(cmd.value) == ["python", "-m", "gateway"]
    for name, service in app_services(load_compose()).items():
        if service["command"][0] == "make":
            assert "make" in shlex.split(" ".join(r.value[0] for r in of(instructions, "run"))), name


def test_the_venv_byte_code_step_passes_over_files_for_a_newer_python(
    instructions: tuple[Instruction, ...], tmp_path: Path
) -> None:
    """torch (requirements.txt) ships py312_intrinsics.py, Python 3.12 syntax, among its test helpers: on the
    base's Python 3.11 the compileall step failed on it and `make images` stopped. The step, replayed on a
    copy of that folder of torch, compiles the rest and succeeds."""
    (step,) = [r.value[0] for r in of(instructions, "run") if "compileall" in r.value[0]]
    torch_root = Path(importlib.util.find_spec("torch").origin).parent
    helpers = torch_root / "testing" / "_internal"
    newer = helpers / "py312_intrinsics.py"
    if not newer.is_file():
        pytest.skip(f"this torch has no {newer.name}")
    scratch = tmp_path / ".venv" / "lib" / "site-packages" / "torch" / "testing" / "_internal"
    scratch.mkdir(parents=True)
    for name in (newer.name, "__init__.py", "common_dtype.py"):
        shutil.copy2(helpers / name, scratch / name)
    command = step.replace(".venv/bin/python", shlex.quote(sys.executable), 1)
    result = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert list((scratch / "__pycache__").glob("common_dtype.*.pyc")), "the other modules get their byte-code"
