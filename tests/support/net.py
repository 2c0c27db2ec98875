"""Polling for process-level tests. Starting processes, ports and health probes: scripts/launch.py."""

from __future__ import annotations

import time
from collections.abc import Callable

# Re-exported only for bench/quant_study.py, which still imports it from here.
from scripts.launch import free_port as free_port


def wait_for(condition: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
