"""scripts/launch.py's start of several services at once, on real child processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scripts.launch import Service, StartError, start_together


def sleeper(name: str, log_dir: Path, ready, code: str = "import time; time.sleep(60)") -> Service:
    return Service(name, [sys.executable, "-c", code], {}, log_dir / f"{name}.log", ready)


def test_services_start_together_each_launched_before_any_is_waited_for(tmp_path: Path) -> None:
    second: list[Service] = []
    # The first is ready only once the second runs: a start one after the other would time out here.
    first = sleeper("first", tmp_path, lambda: bool(second) and second[0].alive)
    second.append(sleeper("second", tmp_path, lambda: True))
    try:
        started = start_together([first, second[0]], timeout_s=10)
        assert [s.alive for s in started] == [True, True]
    finally:
        first.stop(timeout_s=5)
        second[0].stop(timeout_s=5)


def test_one_that_fails_to_start_stops_the_others(tmp_path: Path) -> None:
    healthy = sleeper("healthy", tmp_path, lambda: True)
    broken = sleeper("broken", tmp_path, lambda: False, code="raise SystemExit('no model here')")
    with pytest.raises(StartError, match="broken"):
        start_together([healthy, broken], timeout_s=10)
    assert healthy.proc is not None and healthy.proc.poll() is not None, "left running"
    assert "no model here" in broken.log_tail()
