"""How `make test` shares out the work between its two pytest-xdist processes (`--dist loadfile`).

Each unit of work is a whole test file, so a module's fixtures start their processes once. Files that
share a session fixture's processes are one unit, so those processes start in one xdist process rather
than once in each (the pair of workers the fleet and scale-out files share takes ~20 s to start on two
cores).
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


def unit_of(nodeid: str) -> str:
    """The unit a test runs in: its file's, or the shared one its file names in SHARED_UNITS."""
    path = nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(path, path)


class SharedFileScheduling(LoadFileScheduling):
    """xdist's file units (pytest-xdist 3.8's scope hook), with the files of SHARED_UNITS joined."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


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
    return SharedFileScheduling(config, log)
