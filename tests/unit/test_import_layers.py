"""Every import of the project, read from the source (ast, nested imports included): services meet only at
the wire, the shared package imports no service, the worker's layers import only the layers below them,
and neither product code nor the tests import the benchmarks or the studies."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "cache_service", "worker")
PRODUCT = (*SERVICES, "common", "scripts", "tools")
# The worker's layers, bottom up; the package's own __init__ and __main__ (the process glue) are on top.
WORKER_LAYERS = ("worker.kernels", "worker.engine", "worker.model", "worker.server")


def modules(*packages: str) -> Iterator[tuple[str, Path]]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "gen" not in path.relative_to(ROOT).parts:  # generated stubs
                yield ".".join(path.relative_to(ROOT).with_suffix("").parts), path


def imports(path: Path) -> set[str]:
    """Absolute names of every module `path` imports, wherever in the file the import is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def layer_of(module: str) -> int:
    for rank, layer in enumerate(WORKER_LAYERS):
        if module == layer or module.startswith(layer + "."):
            return rank
    return len(WORKER_LAYERS)  # worker/__init__.py, worker/__main__.py


def violations(packages: tuple[str, ...], allowed) -> list[str]:
    found = []
    for module, path in modules(*packages):
        for name in sorted(imports(path)):
            if not allowed(module, name):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


def test_no_service_imports_another_service() -> None:
    def allowed(module: str, name: str) -> bool:
        return top(name) not in SERVICES or top(name) == top(module)

    assert violations(SERVICES, allowed) == []


def test_the_shared_package_imports_no_service_and_no_launcher() -> None:
    def allowed(module: str, name: str) -> bool:
        return top(name) not in (*SERVICES, "scripts", "tools")

    assert violations(("common",), allowed) == []


def test_each_worker_layer_imports_only_the_layers_below_it() -> None:
    def allowed(module: str, name: str) -> bool:
        if top(name) != "worker" or name == "worker":
            return True
        return layer_of(name) <= layer_of(module)

    assert violations(("worker",), allowed) == []


def test_no_service_imports_the_offline_tools() -> None:
    assert violations(SERVICES + ("common",), lambda module, name: top(name) != "tools") == []


@pytest.mark.parametrize("package", [*PRODUCT, "tests"])
def test_product_and_tests_import_no_benchmark_or_study(package: str) -> None:
    if not (ROOT / package).is_dir():
        pytest.skip(f"no {package}/")

    def allowed(module: str, name: str) -> bool:
        return top(name) not in ("bench", "studies")

    assert violations((package,), allowed) == []
