"""How `make test` shares out the work between its two pytest-xdist processes (`--dist loadfile`).

Each unit of work is a whole test file, so a module's fixtures start their processes once. Files that
share a session fixture's processes are one unit, so those processes start in one xdist process rather
than once in each (the pair of workers the fleet and scale-out files share takes ~20 s to start on two
cores).

Units go out in collection order, and the slowest go first (SLOW_UNITS), so that the short files fill in
around them at the end: xdist's own order (most tests first) had put a one-test file of 14 s last, and one
process ran it alone for ~20 s while the other had finished.
"""

from __future__ import annotations

import os

import pytest
from xdist.scheduler import LoadFileScheduling

# Test file -> the unit it runs in, where that is not the file alone.
SHARED_UNITS = {
    "tests/observability/test_fleet.py": "worker_pair",
    "tests/observability/test_scale_out.py": "worker_pair",
}


# The units of more than ~8 s (`--durations=0` of `make test`, per file, AVX2 EPYC, 2026-12-06): processes
# started or models loaded. Slowest first; a unit not named here keeps xdist's order after them.
SLOW_UNITS = (
    "tests/e2e/test_lora_serving.py",
    "worker_pair",
    "tests/engine/test_lora_model.py",
    "tests/e2e/test_gateway_errors.py",
    "tests/engine/test_real_model.py",
    "tests/cache/test_embedder_backends.py",
    "tests/observability/test_live_metrics.py",
    "tests/cache/test_index_sketch.py",
    "tests/e2e/test_stuck_clients.py",
    "tests/e2e/test_gateway_cache.py",
    "tests/e2e/test_fuzz.py",
    "tests/observability/test_preemption_metrics.py",
    "tests/cache/test_embeddings_reduced_dtype.py",
    "tests/e2e/test_sampling_boundaries.py",
    "tests/cache/test_service.py",
    "tests/e2e/test_embeddings.py",
    "tests/cache/test_embedding_models.py",
    "tests/e2e/test_responses_api.py",
)


def unit_of(nodeid: str) -> str:
    """The unit a test runs in: its file's, or the shared one its file names in SHARED_UNITS."""
    path = nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(path, path)


class SharedFileScheduling(LoadFileScheduling):
    """xdist's file units (pytest-xdist 3.8's scope hook), with the files of SHARED_UNITS joined."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def slowest_first(nodeids: list[str]) -> list[str]:
    """`nodeids` by unit: SLOW_UNITS in their order, then the other units by their number of tests (xdist's
    own order), each unit's tests together and in their own order."""
    rank = {unit: i for i, unit in enumerate(SLOW_UNITS)}
    sizes: dict[str, int] = {}
    for unit in map(unit_of, nodeids):
        sizes[unit] = sizes.get(unit, 0) + 1
    first_seen = {unit: i for i, unit in enumerate(sizes)}

    def key(nodeid: str) -> tuple[int, int, int]:
        unit = unit_of(nodeid)
        return rank.get(unit, len(rank)), -sizes[unit], first_seen[unit]

    return sorted(nodeids, key=key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the collection in `slowest_first` order: the order the units are handed out in."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    position = {nodeid: i for i, nodeid in enumerate(slowest_first([item.nodeid for item in items]))}
    items.sort(key=lambda item: position[item.nodeid])


def pytest_terminal_summary(terminalreporter) -> None:
    """The CPU the run met, named at the end (where CI keeps it): kernels and numerics differ by kind."""
    from worker.model.cpu_kind import cpu_info

    terminalreporter.write_line(f"CPU: {cpu_info().describe()}")


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, each pytest process runs torch on one thread: two processes of two threads each on two
    cores stall each other's OpenMP barriers (the in-process kernel tests took 4x as long; the suite 227 ->
    198 s). tests/engine/test_thread_counts.py sets two threads itself to test the kernels' splits; the
    services the tests start choose their own threads."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadFileScheduling | None:
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own scheduler for any other mode
    config.option.loadscopereorder = False  # the units in the collection's order (slowest_first)
    return SharedFileScheduling(config, log)
